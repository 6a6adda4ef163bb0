//! CPU fast path of dense attention over f16 caches, decode and prefill: reads f16 K/V rows
//! straight from the cache buffers, each row once for a pass of query rows (all query heads
//! of a group at a few positions, widened in registers by `kvlab_cpu::attention`), with no
//! dtype-converted copy of the cache, no transposed GEMM and no mask tensor. A few passes
//! split their keys into blocks attended on all cores and merged exactly (flash decoding's
//! split softmax); many passes (a prefill chunk) are spread over the cores whole. Same
//! semantics as the general path in `attend`.

use candle_core::{DType, Storage, Tensor};
use half::f16;

use super::pool;
use super::storage::AttendSpec;
use crate::error::Result;
use kvlab_cpu::attention;
use kvlab_cpu::vmath::exp_shifted_sum;

use super::split_softmax::{merge, Partial};

/// Query rows (`group × t`) per kv head up to which the fast path is used.
pub const MAX_ROWS: usize = 32;

/// Row-major view of a `[n_kv, s, d]` f16 tensor whose rows are contiguous.
struct Rows<'a> {
    data: &'a [f16],
    offset: usize,
    head_stride: usize,
    row_stride: usize,
}

impl Rows<'_> {
    fn row(&self, head: usize, j: usize, d: usize) -> &[f16] {
        let at = self.offset + head * self.head_stride + j * self.row_stride;
        &self.data[at..at + d]
    }
}

/// Passes from which a call's passes, rather than each pass's key blocks, are spread over
/// the cores: a prefill chunk (512 positions are 64 passes at a group of 4) keeps every core
/// on its own query rows with no merge across cores, while a turn's few new tokens still
/// split each pass's keys, as decode does.
const PARALLEL_PASSES: usize = 8;

/// `Some(output)` when the fast path applies (CPU, f32 queries, f16 K/V with contiguous
/// rows), else `None` for the general path. The queries go in passes of consecutive
/// positions, at most [`MAX_ROWS`] query rows each, every pass reading the keys it sees
/// once for all its rows. Prefill takes it too: at 8k keys a 512-position chunk took 0.56×
/// the time of the general path, which converts every visible key and value to f32 and
/// multiplies them by candle's GEMM.
pub fn try_attend(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttendSpec) -> Result<Option<Tensor>> {
    let (n_heads, t, d) = q.dims3()?;
    let (n_kv, s, _) = k.dims3()?;
    let group = n_heads / n_kv;
    // Query positions per pass.
    let per_pass = MAX_ROWS / group.max(1);
    // f32 caches go through candle's GEMM, which measured as fast; f16 ones would need a
    // converted copy of every visible key first (3× slower at 4k keys).
    if !q.device().is_cpu()
        || q.dtype() != DType::F32
        || k.dtype() != DType::F16
        || v.dtype() != DType::F16
        || per_pass == 0
        || k.stride()[2] != 1
        || v.stride()[2] != 1
    {
        return Ok(None);
    }
    let q = q.contiguous()?;
    let starts: Vec<usize> = (0..t).step_by(per_pass).collect();
    let pass = |a: usize, split_keys: bool| -> Result<Tensor> {
        let tb = per_pass.min(t - a);
        let qv: Vec<f32> = q.narrow(1, a, tb)?.flatten_all()?.to_vec1()?;
        let pass = AttendSpec {
            query_start: spec.query_start + a,
            ..*spec
        };
        let out = run(&qv, k, v, &pass, (n_kv, group, tb, d, s), split_keys)?;
        Ok(Tensor::from_vec(out, (n_heads, tb, d), q.device())?)
    };
    let mut parts = if starts.len() >= PARALLEL_PASSES {
        // Latest positions first: under causal masks they see the most keys, and the pool's
        // shared cursor then ends on the cheap passes.
        let latest_first: Vec<usize> = starts.iter().rev().copied().collect();
        let mut done = pool::map_on_compute_pool(&latest_first, || (), |_, &a| pass(a, false));
        done.reverse();
        done.into_iter().collect::<Result<Vec<_>>>()?
    } else {
        starts
            .iter()
            .map(|&a| pass(a, true))
            .collect::<Result<Vec<_>>>()?
    };
    Ok(Some(if parts.len() == 1 {
        parts.remove(0)
    } else {
        Tensor::cat(&parts, 1)?
    }))
}

fn run(
    q: &[f32],
    k: &Tensor,
    v: &Tensor,
    spec: &AttendSpec,
    (n_kv, group, t, d, s): (usize, usize, usize, usize, usize),
    split_keys: bool,
) -> Result<Vec<f32>> {
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (k_off, k_hs, k_rs) = (kl.start_offset(), kl.stride()[0], kl.stride()[1]);
    let (v_off, v_hs, v_rs) = (vl.start_offset(), vl.stride()[0], vl.stride()[1]);
    let (Storage::Cpu(kc), Storage::Cpu(vc)) = (&*ks, &*vs) else {
        return Err(crate::error::EngineError::invalid(
            "fast attention on a non-CPU tensor",
        ));
    };
    let kr = Rows {
        data: kc.as_slice::<f16>()?,
        offset: k_off,
        head_stride: k_hs,
        row_stride: k_rs,
    };
    let vr = Rows {
        data: vc.as_slice::<f16>()?,
        offset: v_off,
        head_stride: v_hs,
        row_stride: v_rs,
    };
    let scale = spec.scale as f32;
    let n_rows = group * t;
    // Visible key index range [lo_r, hi_r) per query row (row r = g·t + i).
    let range = |i: usize| {
        let (lo, hi) = spec.visible(spec.query_start + i, s);
        (
            lo.saturating_sub(spec.key_start),
            hi.saturating_sub(spec.key_start),
        )
    };
    let (lo, hi) = (0..t).fold((usize::MAX, 0), |(l, h), i| {
        let (a, b) = range(i);
        (l.min(a), h.max(b))
    });
    if hi <= lo {
        return Err(crate::error::EngineError::invalid(
            "attend: queries see no stored key",
        ));
    }
    let mut out = vec![0f32; n_kv * n_rows * d];
    // Long contexts are cut into key blocks attended on all cores, each with its own
    // running max, then merged exactly (the split-softmax of flash decoding).
    let blocks: Vec<(usize, usize)> = (lo..hi)
        .step_by(KEY_BLOCK)
        .map(|a| (a, (a + KEY_BLOCK).min(hi)))
        .collect();
    for h in 0..n_kv {
        let qh = &q[h * n_rows * d..(h + 1) * n_rows * d];
        let partial = |&(a, b): &(usize, usize)| {
            block_partial(qh, &kr, &vr, h, (a, b), &range, (group, t, d), scale)
        };
        // Off the pool when the caller already spreads passes over it (nesting would block).
        let parts: Vec<Partial> = if split_keys && blocks.len() > 1 {
            pool::map_on_compute_pool(&blocks, || (), |_, b| partial(b))
        } else {
            blocks.iter().map(partial).collect()
        };
        merge(&parts, d, &mut out[h * n_rows * d..(h + 1) * n_rows * d]);
    }
    Ok(out)
}

/// Keys per block of the split softmax: small enough that a sliding layer's 512-key window
/// still splits across two cores, large enough that the merge stays negligible.
const KEY_BLOCK: usize = 256;

/// A key block as two small matrix products over the cache's own rows (no converted copy):
/// scores for 8 query rows × 2 keys at a time, outputs for 8 rows × 32 dims, each f16 row
/// widened in registers ([`kvlab_cpu::attention`]); the softmax's exponentials are
/// [`kvlab_cpu::vmath::exp`], vectorized.
#[allow(clippy::too_many_arguments)]
fn block_partial(
    qh: &[f32],
    kr: &Rows<'_>,
    vr: &Rows<'_>,
    h: usize,
    (a, b): (usize, usize),
    range: &(dyn Fn(usize) -> (usize, usize) + Sync),
    (group, t, d): (usize, usize, usize),
    scale: f32,
) -> Partial {
    let n_rows = group * t;
    let span = b - a;
    let keys: Vec<&[f16]> = (a..b).map(|j| kr.row(h, j, d)).collect();
    let vals: Vec<&[f16]> = (a..b).map(|j| vr.row(h, j, d)).collect();
    let mut sc = vec![0f32; n_rows * span];
    attention::scores(qh, &keys, &vals, n_rows, scale, &mut sc);
    // Keys a row may not see (causal, or outside its window) score −∞.
    for i in 0..t {
        let (lo, hi) = range(i);
        for g in 0..group {
            let sr = &mut sc[(g * t + i) * span..(g * t + i + 1) * span];
            for (jj, x) in sr.iter_mut().enumerate() {
                let j = a + jj;
                if j < lo || j >= hi {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
    let mut max = vec![f32::NEG_INFINITY; n_rows];
    let mut sum = vec![0f32; n_rows];
    for r in 0..n_rows {
        let sr = &mut sc[r * span..(r + 1) * span];
        let m = sr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            // No visible key in this block for this row: it contributes nothing.
            sr.fill(0.0);
            continue;
        }
        sum[r] = exp_shifted_sum(sr, m);
        max[r] = m;
    }
    let mut out = vec![0f32; n_rows * d];
    attention::weighted(&sc, &vals, n_rows, &mut out);
    Partial { max, sum, out }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;
    use crate::kv::attend::attend_dense;

    /// Largest |fast − general| over the output (the general path on f32 copies of K/V).
    fn fast_minus_general(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttendSpec) -> Result<f32> {
        let fast = try_attend(q, k, v, spec)?
            .ok_or_else(|| crate::error::EngineError::invalid("no fast path"))?;
        let general = attend_dense(q, &k.to_dtype(DType::F32)?, &v.to_dtype(DType::F32)?, spec)?;
        Ok((fast - general)?.abs()?.max_all()?.to_scalar::<f32>()?)
    }

    #[test]
    fn fast_path_matches_the_general_path() -> Result<()> {
        let dev = Device::Cpu;
        // A cache buffer of 40 slots holding 29 tokens from slot 3: a strided view, like the
        // dense storage hands out.
        let buf = Tensor::randn(0f32, 1.0, (2, 40, 16), &dev)?.to_dtype(DType::F16)?;
        let k = buf.narrow(1, 3, 29)?;
        let v = (buf.narrow(1, 5, 29)? * 0.5)?;
        // t 13 (8 query heads on 2 kv heads: 8 positions a pass) takes two passes; the
        // both-ways span 118..127 crosses the passes' boundary.
        for (t, window, both_ways) in [
            (1, None, None),
            (3, Some(8), None),
            (4, None, None),
            (1, Some(8), None),
            (13, None, None),
            (13, Some(8), None),
            (13, Some(4), Some((118, 127))),
            (13, None, Some((118, 127))),
        ] {
            let q = Tensor::randn(0f32, 1.0, (8, t, 16), &dev)?;
            let spec = AttendSpec {
                query_start: 100 + 29 - t,
                key_start: 100,
                window,
                scale: 0.3,
                both_ways,
            };
            let d = fast_minus_general(&q, &k, &v, &spec)?;
            assert!(d < 1e-5, "t {t} window {window:?} {both_ways:?}: {d}");
        }
        Ok(())
    }

    #[test]
    fn long_contexts_split_into_blocks_match_the_general_path() -> Result<()> {
        let dev = Device::Cpu;
        // 2600 keys: three blocks of the split softmax, the last one partial.
        let k = Tensor::randn(0f32, 1.0, (2, 2600, 16), &dev)?.to_dtype(DType::F16)?;
        let v = Tensor::randn(0f32, 1.0, (2, 2600, 16), &dev)?.to_dtype(DType::F16)?;
        // 200 positions are 13 passes (16 a pass): spread over the cores, not their keys.
        for (t, window) in [
            (1, None),
            (2, Some(1500)),
            (1, Some(300)),
            (200, None),
            (200, Some(300)),
        ] {
            let q = Tensor::randn(0f32, 1.0, (4, t, 16), &dev)?;
            let spec = AttendSpec {
                query_start: 2600 - t,
                key_start: 0,
                window,
                scale: 0.5,
                both_ways: None,
            };
            let d = fast_minus_general(&q, &k, &v, &spec)?;
            assert!(d < 1e-5, "t {t} window {window:?}: {d}");
        }
        Ok(())
    }
}
