//! Grouped-query attention over dense K/V held in any float dtype: queries are grouped per
//! kv head (no repeated keys), processed in blocks whose key range is cut to what the causal
//! and sliding masks let them see, and masked only where a block needs it.

use candle_core::{DType, Tensor};

use super::storage::AttendSpec;
use crate::error::{EngineError, Result};
use kvlab_cpu::vmath::exp_shifted_sum;
use rayon::prelude::*;

/// Query rows per block: bounds the score matrix for long prefills.
const QUERY_BLOCK: usize = 256;

/// Attention of `q` `[n_heads, t, d]` over `k`, `v` `[n_kv, s, d]` (views allowed).
pub fn attend_dense(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttendSpec) -> Result<Tensor> {
    let (n_heads, t, d) = q.dims3()?;
    let (n_kv, s, dk) = k.dims3()?;
    if dk != d || v.dims3()? != (n_kv, s, d) || n_kv == 0 || n_heads % n_kv != 0 {
        return Err(EngineError::invalid(format!(
            "attend: q {:?} does not fit k {:?} / v {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )));
    }
    if t == 0 {
        return Ok(q.clone());
    }
    if let Some(out) = super::attend_cpu::try_attend(q, k, v, spec)? {
        return Ok(out);
    }
    let group = n_heads / n_kv;
    let q = q.contiguous()?.reshape((n_kv, group, t, d))?;
    let mut outs = Vec::with_capacity(t.div_ceil(QUERY_BLOCK));
    let mut a = 0;
    while a < t {
        let b = (a + QUERY_BLOCK).min(t);
        outs.push(attend_block(&q, k, v, spec, a, b)?);
        a = b;
    }
    let out = if outs.len() == 1 {
        outs.remove(0)
    } else {
        Tensor::cat(&outs, 2)?
    };
    Ok(out.reshape((n_heads, t, d))?)
}

/// Query rows `a..b` of `q` `[n_kv, group, t, d]` → `[n_kv, group, b − a, d]`.
fn attend_block(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttendSpec,
    a: usize,
    b: usize,
) -> Result<Tensor> {
    let (n_kv, group, t, d) = q.dims4()?;
    let s = k.dim(1)?;
    let q_first = spec.query_start + a;
    let q_last = spec.query_start + b - 1;
    let key_end = spec.key_start + s;
    // Visible key positions for this block: [lo, hi), the union of its queries' ranges
    // (each contiguous, their starts and ends rising but for a both-ways span's).
    let ranges: Vec<(usize, usize)> = (q_first..=q_last).map(|qp| spec.visible(qp, s)).collect();
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(key_end);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(lo);
    if hi <= lo {
        return Err(EngineError::invalid(format!(
            "attend: queries {q_first}..={q_last} see no stored key (keys {}..{key_end})",
            spec.key_start
        )));
    }
    let sb = hi - lo;
    let tb = b - a;
    let mut k = k.narrow(1, lo - spec.key_start, sb)?;
    let mut v = v.narrow(1, lo - spec.key_start, sb)?;
    let cdt = q.dtype();
    if k.dtype() != cdt {
        k = k.to_dtype(cdt)?;
        v = v.to_dtype(cdt)?;
    }
    if !k.device().is_cpu() {
        // GPU matmuls want plain batch strides; the CPU gemm reads views directly.
        k = k.contiguous()?;
        v = v.contiguous()?;
    }
    let qb = if tb == t {
        q.reshape((n_kv, group * t, d))?
    } else {
        q.narrow(2, a, tb)?
            .contiguous()?
            .reshape((n_kv, group * tb, d))?
    };
    let mut scores = qb.matmul(&k.t()?)?;
    if spec.scale != 1.0 {
        scores = (scores * spec.scale)?;
    }
    if scores.dtype() != DType::F32 {
        scores = scores.to_dtype(DType::F32)?;
    }
    // A mask is needed only if some (query, key) pair in range is hidden.
    if ranges.iter().any(|&r| r != (lo, hi)) {
        let mut m = vec![0f32; tb * sb];
        for (i, &(a, b)) in ranges.iter().enumerate() {
            for j in 0..sb {
                if !(a..b).contains(&(lo + j)) {
                    m[i * sb + j] = f32::NEG_INFINITY;
                }
            }
        }
        let mask = Tensor::from_vec(m, (1, 1, tb, sb), scores.device())?;
        scores = scores
            .reshape((n_kv, group, tb, sb))?
            .broadcast_add(&mask)?
            .reshape((n_kv, group * tb, sb))?;
    }
    let probs = softmax_rows(&scores)?.to_dtype(v.dtype())?;
    let out = probs.matmul(&v)?;
    Ok(out.reshape((n_kv, group, tb, d))?)
}

/// Softmax over the last dimension of f32 `scores`, as the cache paths take it
/// ([`exp_shifted_sum`]): a weight under e^-87 of its row's largest is 0, not a subnormal.
/// Real attention rows span that much, and subnormal weights sent the value product's FMAs
/// through x86's microcode assists (E2B's f16 prefill attention ran 2–3× slower in the model
/// than on random keys, whose scores never spread so far). A row with every key masked
/// (all −∞) weighs nothing.
fn softmax_rows(scores: &Tensor) -> Result<Tensor> {
    if !scores.device().is_cpu() {
        return Ok(candle_nn::ops::softmax_last_dim(scores)?);
    }
    let dims = scores.dims().to_vec();
    let n = *dims.last().unwrap_or(&1);
    let mut x: Vec<f32> = scores.flatten_all()?.to_vec1()?;
    // Rows in parallel, on the pool candle's own softmax used.
    x.par_chunks_mut(n.max(1)).for_each(|row| {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        let inv = 1.0 / exp_shifted_sum(row, m);
        row.iter_mut().for_each(|w| *w *= inv);
    });
    Ok(Tensor::from_vec(x, dims, scores.device())?)
}
