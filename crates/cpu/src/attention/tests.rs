//! The block products of every backend, over f16 and f32 rows, against an f64 reference, and
//! NEON's weighted sums against the plain loops bit for bit.

use half::f16;

use super::*;
use crate::test_rng::Rng;

/// Every variant of both block products (AVX-512, AVX2, NEON and the plain loops) against an
/// f64 reference, at head widths, row counts and key counts that leave partial tiles.
#[test]
fn block_products_match_an_f64_reference() {
    products_match_an_f64_reference(f16::from_f32);
}

/// The same for f32 rows (a quantized cache's decoded rows).
#[test]
fn block_products_over_f32_rows_match_an_f64_reference() {
    products_match_an_f64_reference(|x| x);
}

fn products_match_an_f64_reference<T: Elem + std::fmt::Debug>(of: fn(f32) -> T) {
    let mut rng = Rng::new(11);
    for d in [16usize, 40, 512] {
        for rows in [1usize, 3, 8, 9] {
            for span in [1usize, 5, 256] {
                let q: Vec<f32> = (0..rows * d).map(|_| rng.symmetric()).collect();
                let kv: Vec<Vec<T>> = (0..2 * span)
                    .map(|_| (0..d).map(|_| of(rng.symmetric())).collect())
                    .collect();
                let keys: Vec<&[T]> = kv[..span].iter().map(|v| v.as_slice()).collect();
                let vals: Vec<&[T]> = kv[span..].iter().map(|v| v.as_slice()).collect();
                let p: Vec<f32> = (0..rows * span)
                    .map(|_| (rng.symmetric() + 1.0) / 2.0)
                    .collect();
                let want_s: Vec<f64> = (0..rows * span)
                    .map(|i| {
                        let (r, j) = (i / span, i % span);
                        0.5 * (0..d)
                            .map(|c| q[r * d + c] as f64 * keys[j][c].to_f32() as f64)
                            .sum::<f64>()
                    })
                    .collect();
                let want_o: Vec<f64> = (0..rows * d)
                    .map(|i| {
                        let (r, c) = (i / d, i % d);
                        (0..span)
                            .map(|j| p[r * span + j] as f64 * vals[j][c].to_f32() as f64)
                            .sum::<f64>()
                    })
                    .collect();
                let check = |what: &str, s: &[f32], o: &[f32]| {
                    for (a, b) in s.iter().zip(&want_s) {
                        assert!(
                            (*a as f64 - b).abs() < 1e-4,
                            "{what} scores d {d} rows {rows} span {span}"
                        );
                    }
                    for (a, b) in o.iter().zip(&want_o) {
                        assert!(
                            (*a as f64 - b).abs() < 1e-4,
                            "{what} outputs d {d} rows {rows} span {span}"
                        );
                    }
                };
                let (mut s, mut o) = (vec![0f32; rows * span], vec![0f32; rows * d]);
                scores(&q, &keys, &vals, rows, 0.5, &mut s);
                weighted(&p, &vals, rows, &mut o);
                check("dispatched", &s, &o);
                #[cfg(target_arch = "x86_64")]
                if d % 16 == 0 {
                    if crate::features().avx512 {
                        // SAFETY: detected; lengths as the dispatcher asserts.
                        unsafe {
                            x86::scores512(&q, &keys, &vals, rows, d, 0.5, &mut s);
                            x86::weighted512(&p, &vals, rows, d, &mut o);
                        }
                        check("avx512", &s, &o);
                    }
                    if crate::features().avx2 {
                        // SAFETY: as above.
                        unsafe {
                            x86::scores256(&q, &keys, &vals, rows, d, 0.5, &mut s);
                            x86::weighted256(&p, &vals, rows, d, &mut o);
                        }
                        check("avx2", &s, &o);
                    }
                }
                #[cfg(target_arch = "aarch64")]
                if d % 16 == 0 {
                    assert!(crate::features().neon, "NEON did not run");
                    // SAFETY: detected; lengths as the dispatcher asserts.
                    unsafe {
                        neon::scores(&q, &keys, rows, d, 0.5, &mut s);
                        neon::weighted(&p, &vals, rows, d, &mut o);
                    }
                    check("neon", &s, &o);
                }
                // Where the SIMD weighted sum fuses its terms in key order (NEON), it is the
                // plain loops' float exactly.
                let mut plain = vec![0f32; rows * d];
                weighted_portable(&p, &vals, rows, &mut plain);
                check("plain", &s, &plain);
                #[cfg(target_arch = "aarch64")]
                if d % 16 == 0 {
                    weighted(&p, &vals, rows, &mut o);
                    assert_eq!(
                        o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "neon weighted against the plain loops, d {d} rows {rows} span {span}"
                    );
                }
            }
        }
    }
}
