//! Element-wise tails of the decoder's matmuls, each one pass over memory on the CPU:
//! GELU (tanh form) of a gate times an up projection, and the final logit softcap
//! `c·tanh(x/c)`. candle's CPU ops call libm's `tanh` per element and allocate a tensor per
//! step (`gelu`, `*`, `/`, `tanh`, `*`); here `tanh` comes from [`kvlab_cpu::vmath`]'s
//! exponential, so the loops vectorize, and long ones (a prefill's) are split over the
//! compute pool. Other devices and dtypes keep candle's ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};

use crate::error::Result;
use kvlab_cpu::vmath::{exp, tanh};
use kvlab_cpu::widest;

/// `gelu_tanh(gate) · up`, element-wise, for tensors of one shape.
pub fn gelu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if fusable(gate) && fusable(up) && gate.shape() == up.shape() {
        return Ok(gate.apply_op2_no_bwd(up, &GeluMul)?);
    }
    Ok((gate.gelu()? * up)?)
}

/// RMS norm of each row of `x` over its last dim, times `weight`: candle's
/// `candle_nn::ops::rms_norm` float for float (the same per-row loop), with a prefill's rows
/// split over the compute pool rather than rayon's (whose threads would compete with the
/// pool's spinning workers for the same cores).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let dim = x.dims().last().copied().unwrap_or(0);
    if fusable(x) && fusable(weight) && weight.dims() == [dim] && dim > 0 {
        return Ok(x.apply_op2_no_bwd(weight, &RmsNorm(eps))?);
    }
    Ok(candle_nn::ops::rms_norm(x, weight, eps)?)
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

/// Elements per piece of [`on_pieces`]: a prefill's FFN activations (tokens × intermediate
/// width, millions of elements) split over the cores; a decode step's (one token) stays one
/// piece on the calling thread.
const PIECE: usize = 1 << 15;

/// `f(offset, piece)` for consecutive pieces of `out`, on the compute pool (candle's barrier
/// pool, where the matmuls around run) when there is more than one.
fn on_pieces(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    on_pieces_of(out, 1, f)
}

/// [`on_pieces`] with every piece a whole number of `unit`-element rows.
fn on_pieces_of(out: &mut [f32], unit: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let piece = (PIECE / unit.max(1)).max(1) * unit.max(1);
    if out.len() <= piece {
        return f(0, out);
    }
    let pieces: Vec<std::sync::Mutex<&mut [f32]>> =
        out.chunks_mut(piece).map(std::sync::Mutex::new).collect();
    candle_core::utils::barrier_pool().execute_chunked(pieces.len(), |range| {
        for i in range {
            // Each piece is taken by exactly one index: the lock is never contended.
            if let Ok(mut p) = pieces[i].lock() {
                f(i * piece, &mut p);
            }
        }
    });
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
        on_pieces(&mut out, |at, o| {
            let r = at..at + o.len();
            widest!(gelu_mul_body(&g[r.clone()], &u[r], o))
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// One row of [`rms_norm`], as candle's CPU kernel computes it.
fn rms_row(src: &[f32], alpha: &[f32], eps: f32, dst: &mut [f32]) {
    let sum2 = src.iter().map(|&v| v * v).sum::<f32>();
    let m = (sum2 / src.len() as f32 + eps).sqrt();
    for ((d, &s), &a) in dst.iter_mut().zip(src).zip(alpha) {
        *d = s / m * a;
    }
}

struct RmsNorm(f32);

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "kvlab-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let dim = w.len();
        let mut out = vec![0f32; x.len()];
        on_pieces_of(&mut out, dim, |at, o| {
            for (src, dst) in x[at..at + o.len()]
                .chunks_exact(dim)
                .zip(o.chunks_exact_mut(dim))
            {
                rms_row(src, w, self.0, dst);
            }
        });
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
        on_pieces(&mut out, |at, o| {
            widest!(softcap_body(&x[at..at + o.len()], self.0, o))
        });
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

    /// Inputs long enough to be split over the compute pool give the floats of one pass.
    #[test]
    fn long_inputs_split_in_pieces_equal_one_pass() -> Result<()> {
        let n = 3 * PIECE + 5;
        let g: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 2001) as f32 / 100.0 - 10.0)
            .collect();
        let u: Vec<f32> = (0..n).map(|i| 1.0 + (i % 11) as f32 * 0.125).collect();
        let dev = Device::Cpu;
        let (gt, ut) = (
            Tensor::new(g.as_slice(), &dev)?,
            Tensor::new(u.as_slice(), &dev)?,
        );
        let mut want = vec![0f32; n];
        gelu_mul_body(&g, &u, &mut want);
        let got: Vec<f32> = gelu_mul(&gt, &ut)?.to_vec1()?;
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        softcap_body(&g, 30.0, &mut want);
        let got: Vec<f32> = softcap(&gt, 30.0)?.to_vec1()?;
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        Ok(())
    }

    /// The RMS norm is candle's, bit for bit: a decode step's row and a prefill's many rows
    /// split in pieces over the pool.
    #[test]
    fn rms_norm_equals_candles() -> Result<()> {
        let dev = Device::Cpu;
        let dim = 640;
        let w: Vec<f32> = (0..dim).map(|i| 0.5 + (i % 13) as f32 * 0.1).collect();
        let wt = Tensor::new(w.as_slice(), &dev)?;
        for rows in [1usize, 7, 200] {
            let x: Vec<f32> = (0..rows * dim)
                .map(|i| ((i * 31) % 1999) as f32 / 97.0 - 10.0)
                .collect();
            let xt = Tensor::from_vec(x, (rows, dim), &dev)?;
            let got: Vec<f32> = rms_norm(&xt, &wt, 1e-6)?.flatten_all()?.to_vec1()?;
            let want: Vec<f32> = candle_nn::ops::rms_norm(&xt, &wt, 1e-6)?
                .flatten_all()?
                .to_vec1()?;
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{rows} rows"
            );
        }
        Ok(())
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
