//! Element-wise tails of the decoder's matmuls, each one pass over memory on the CPU:
//! GELU (tanh form) of a gate times an up projection, and the final logit softcap
//! `c·tanh(x/c)`. candle's CPU ops call libm's `tanh` per element and allocate a tensor per
//! step (`gelu`, `*`, `/`, `tanh`, `*`); here `tanh` comes from one exponential written as
//! plain arithmetic, so the loops vectorize (compiled for AVX-512 or AVX2 when the CPU has
//! them). Other devices and dtypes keep candle's ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};

use crate::error::Result;

/// `gelu_tanh(gate) · up`, element-wise, for tensors of one shape.
pub fn gelu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if fusable(gate) && fusable(up) && gate.shape() == up.shape() {
        return Ok(gate.apply_op2_no_bwd(up, &GeluMul)?);
    }
    Ok((gate.gelu()? * up)?)
}

/// `cap · tanh(x / cap)`, element-wise.
pub fn softcap(x: &Tensor, cap: f64) -> Result<Tensor> {
    if fusable(x) {
        return Ok(x.apply_op1_no_bwd(&Softcap(cap as f32))?);
    }
    Ok(((x / cap)?.tanh()? * cap)?)
}

fn fusable(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// `e^x` for `x` in f32's range, within 2 ulp: `2^n · p(r)` with `x = n·ln2 + r`,
/// `|r| ≤ ln2/2` and `p` the degree-6 Taylor polynomial (remainder below 1.2e-7).
#[inline(always)]
fn exp(x: f32) -> f32 {
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
fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// GELU, tanh form: `x·σ(2u)` with `u = √(2/π)·(x + 0.044715·x³)`, which equals
/// `½x(1 + tanh u)`.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // √(2/π)
    let u = K * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

#[inline(always)]
fn gelu_mul_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = gelu_tanh(g) * u;
    }
}

#[inline(always)]
fn softcap_body(x: &[f32], cap: f32, out: &mut [f32]) {
    let inv = 1.0 / cap;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = cap * tanh(v * inv);
    }
}

/// Runs `$body` compiled for AVX-512 or AVX2 when this CPU has them.
macro_rules! widest {
    ($body:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            unsafe fn wide(f: impl FnOnce()) { f() }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn narrow(f: impl FnOnce()) { f() }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature was just detected.
                unsafe { wide(|| $body($($arg),*)) }
            } else if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
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

/// The contiguous f32 data of a CPU tensor's storage.
fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("fused op on a non-f32 tensor")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("fused op on a non-contiguous tensor"),
    }
}

struct GeluMul;

impl CustomOp2 for GeluMul {
    fn name(&self) -> &'static str {
        "kvlab-gelu-mul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (g, u) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let mut out = vec![0f32; g.len()];
        widest!(gelu_mul_body(g, u, &mut out));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

struct Softcap(f32);

impl CustomOp1 for Softcap {
    fn name(&self) -> &'static str {
        "kvlab-softcap"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_slice(s, l)?;
        let mut out = vec![0f32; x.len()];
        widest!(softcap_body(x, self.0, &mut out));
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn grid() -> Vec<f32> {
        // Dense around 0, then out to where GELU and tanh saturate, and both infinities.
        let mut v: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 400.0).collect();
        v.extend((-300..=300).map(|i| i as f32 * 0.5));
        v.extend([f32::INFINITY, f32::NEG_INFINITY, 1e-30, -1e-30, 0.0]);
        v
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

    /// Against candle's own ops (`gelu` is the tanh form) on a grid and at the extremes.
    #[test]
    fn fused_ops_equal_candles_unfused_ones() -> Result<()> {
        let dev = Device::Cpu;
        let g = grid();
        let n = g.len();
        let u: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let (gt, ut) = (
            Tensor::new(g.as_slice(), &dev)?,
            Tensor::new(u.as_slice(), &dev)?,
        );
        let fused: Vec<f32> = gelu_mul(&gt, &ut)?.to_vec1()?;
        let plain: Vec<f32> = (gt.gelu()? * &ut)?.to_vec1()?;
        for i in (0..n).filter(|&i| g[i].is_finite()) {
            let tol = 2e-6 * plain[i].abs().max(1.0);
            assert!(
                (fused[i] - plain[i]).abs() <= tol,
                "gelu·up({}): {} vs {}",
                g[i],
                fused[i],
                plain[i]
            );
        }
        let fused: Vec<f32> = softcap(&gt, 30.0)?.to_vec1()?;
        let plain: Vec<f32> = (((&gt / 30.0)?.tanh()? * 30.0)?).to_vec1()?;
        for i in 0..n {
            assert!(
                (fused[i] - plain[i]).abs() <= 1e-5,
                "softcap({}): {} vs {}",
                g[i],
                fused[i],
                plain[i]
            );
        }
        // A NaN stays NaN, for the engine's non-finite check.
        let nan = Tensor::new(&[f32::NAN, 1.0], &dev)?;
        assert!(softcap(&nan, 30.0)?.to_vec1::<f32>()?[0].is_nan());
        assert!(gelu_mul(&nan, &nan)?.to_vec1::<f32>()?[0].is_nan());
        Ok(())
    }
}
