//! Vectorizable math for the CPU hot loops: `exp` and `tanh` as plain arithmetic (no libm
//! call, no branch), so a loop over them compiles to SIMD, and [`widest!`], which compiles a
//! loop body for AVX-512 or AVX2 when this CPU has them (elsewhere as it is: NEON on aarch64).

/// `e^x` for `x` in f32's range, within 2 ulp: `2^n · p(r)` with `x = n·ln2 + r`,
/// `|r| ≤ ln2/2` and `p` the degree-6 Taylor polynomial (remainder below 1.2e-7).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for |n| < 2^10.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let p = r.mul_add(1.0 / 720.0, 1.0 / 120.0);
    let p = r.mul_add(p, 1.0 / 24.0);
    let p = r.mul_add(p, 1.0 / 6.0);
    let p = r.mul_add(p, 0.5);
    let p = r.mul_add(p, 1.0);
    let p = r.mul_add(p, 1.0);
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `tanh(x) = 1 − 2/(e^{2x} + 1)`, saturating to ±1.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// Softmax numerators: `x ← e^(x − m)` in place, a masked score (−∞) becoming exactly 0 (so
/// callers may skip it), and returns their sum. A numerator below e^-87 (f32's normal range
/// ends at e^-87.3) is 0 too: it weighs less than 1e-38 of the largest, and kept (`exp`
/// clamps it to e^-87) it turns the weighted value sums' FMAs subnormal, which x86 runs
/// through microcode assists. Both passes vectorize: the exponentials as a plain map, the sum
/// in 16 lanes added pairwise at the end.
pub fn exp_shifted_sum(x: &mut [f32], m: f32) -> f32 {
    crate::widest!(exp_shifted_sum_body(x, m))
}

#[inline(always)]
fn exp_shifted_sum_body(x: &mut [f32], m: f32) -> f32 {
    for v in x.iter_mut() {
        let y = *v - m;
        let e = exp(y);
        *v = if *v == f32::NEG_INFINITY || y < -87.0 {
            0.0
        } else {
            e
        };
    }
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    lanes.iter().sum::<f32>() + tail
}

/// Runs `$body(args)` compiled for AVX-512 or AVX2 when this CPU has them (the body must be
/// `#[inline(always)]` plain Rust: it is compiled into each variant).
#[macro_export]
macro_rules! widest {
    ($body:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            unsafe fn wide<R>(f: impl FnOnce() -> R) -> R { f() }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn narrow<R>(f: impl FnOnce() -> R) -> R { f() }
            let cpu = $crate::features();
            if cpu.avx512 {
                // SAFETY: the feature was detected.
                unsafe { wide(|| $body($($arg),*)) }
            } else if cpu.avx2 {
                // SAFETY: as above.
                unsafe { narrow(|| $body($($arg),*)) }
            } else {
                $body($($arg),*)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        $body($($arg),*)
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Vec<f32> {
        let mut v: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 400.0).collect();
        v.extend((-300..=300).map(|i| i as f32 * 0.5));
        v.extend([f32::INFINITY, f32::NEG_INFINITY, 1e-30, -1e-30, 0.0]);
        v
    }

    #[test]
    fn numerators_that_would_underflow_are_zero_and_the_rest_stay_normal() {
        // 86.9 below the largest is kept (a normal float), 87.1 and 300 below are not.
        let mut x = vec![100.0, 100.0 - 86.9, 100.0 - 87.1, -200.0, f32::NEG_INFINITY];
        let want = ((x[1] - 100.0) as f64).exp();
        let sum = exp_shifted_sum(&mut x, 100.0);
        assert_eq!(x[0], 1.0);
        assert!(x[1].is_normal(), "{}", x[1]);
        assert!(
            (x[1] as f64 - want).abs() < 3e-7 * want,
            "{} vs {want}",
            x[1]
        );
        assert_eq!(&x[2..], &[0.0, 0.0, 0.0]);
        assert_eq!(sum, 1.0 + x[1]);
    }

    #[test]
    fn exp_shifted_sum_matches_libm_and_zeroes_masked_scores() {
        for n in [0usize, 5, 16, 37] {
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 7 == 3 {
                        f32::NEG_INFINITY
                    } else {
                        (i as f32 * 0.37).sin() * 9.0
                    }
                })
                .collect();
            let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want: Vec<f64> = x.iter().map(|&v| ((v - m) as f64).exp()).collect();
            let mut got = x.clone();
            let sum = exp_shifted_sum(&mut got, m);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                if x[i] == f32::NEG_INFINITY {
                    assert_eq!(*g, 0.0, "masked score {i} of {n}");
                } else {
                    assert!((*g as f64 - w).abs() <= 3e-7 * w, "{i} of {n}: {g} vs {w}");
                }
            }
            let want_sum: f64 = want.iter().sum();
            assert!(
                (sum as f64 - want_sum).abs() <= 1e-6 * want_sum.max(1.0),
                "sum of {n}"
            );
        }
    }

    #[test]
    fn exp_and_tanh_are_within_a_few_ulp_of_libm() {
        for x in grid() {
            if x.is_finite() && x.abs() < 87.0 {
                let (a, b) = (exp(x), x.exp());
                assert!((a - b).abs() <= 3e-7 * b, "exp({x}): {a} vs {b}");
            }
            let (a, b) = (tanh(x), x.tanh());
            assert!((a - b).abs() <= 3e-7, "tanh({x}): {a} vs {b}");
        }
    }
}
