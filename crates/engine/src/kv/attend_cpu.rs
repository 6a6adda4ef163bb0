//! CPU fast path of dense attention for decode-sized query blocks: reads f16 K/V rows
//! straight from the cache buffers, each row once for all query heads of its group (widened
//! in registers by `f16_kernels`), with no dtype-converted copy of the cache, no transposed
//! GEMM and no mask tensor; the keys are split into blocks attended on all cores and merged
//! exactly (flash decoding's split softmax). Same semantics as the general path in `attend`.

use candle_core::{DType, Storage, Tensor};

use super::pool;
use super::storage::AttendSpec;
use crate::error::Result;
use crate::vmath::exp_shifted_sum;

/// Query rows (`group × t`) per kv head up to which the fast path is used.
pub const MAX_ROWS: usize = 32;

/// Row-major view of a `[n_kv, s, d]` tensor whose rows are contiguous.
struct Rows<'a, T> {
    data: &'a [T],
    offset: usize,
    head_stride: usize,
    row_stride: usize,
}

impl<T> Rows<'_, T> {
    fn row(&self, head: usize, j: usize, d: usize) -> &[T] {
        let at = self.offset + head * self.head_stride + j * self.row_stride;
        &self.data[at..at + d]
    }
}

/// `Some(output)` when the fast path applies (CPU, f32 queries, f16 K/V with contiguous
/// rows, few query rows), else `None` for the general path.
pub fn try_attend(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttendSpec) -> Result<Option<Tensor>> {
    let (n_heads, t, d) = q.dims3()?;
    let (n_kv, s, _) = k.dims3()?;
    let group = n_heads / n_kv;
    // f32 caches go through candle's GEMM, which measured as fast; f16 ones would need a
    // converted copy of every visible key first (3× slower at 4k keys).
    if !q.device().is_cpu()
        || q.dtype() != DType::F32
        || k.dtype() != DType::F16
        || v.dtype() != DType::F16
        || group * t > MAX_ROWS
        || k.stride()[2] != 1
        || v.stride()[2] != 1
    {
        return Ok(None);
    }
    let q = q.contiguous()?;
    let qv: Vec<f32> = q.flatten_all()?.to_vec1()?;
    let out = run::<half::f16>(&qv, k, v, spec, (n_kv, group, t, d, s))?;
    Ok(Some(Tensor::from_vec(out, (n_heads, t, d), q.device())?))
}

/// Element types the fast path reads, with its two inner loops over one cache row for all
/// query rows at once.
trait Elem: candle_core::WithDType {
    /// `out[r][j] = scale · q_r · k_j` over the block's key rows, fetching `vals` (the
    /// block's value rows, for the pass after) into the caches as it goes.
    fn scores(
        q: &[f32],
        keys: &[&[Self]],
        vals: &[&[Self]],
        rows: usize,
        scale: f32,
        out: &mut [f32],
    );
    /// `out[r] = Σ_j p[r][j] · v_j` over the block's value rows.
    fn weighted(p: &[f32], vals: &[&[Self]], rows: usize, out: &mut [f32]);
}

impl Elem for half::f16 {
    fn scores(
        q: &[f32],
        keys: &[&[Self]],
        vals: &[&[Self]],
        rows: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        f16_kernels::scores(q, keys, vals, rows, scale, out);
    }
    fn weighted(p: &[f32], vals: &[&[Self]], rows: usize, out: &mut [f32]) {
        f16_kernels::weighted(p, vals, rows, out);
    }
}

fn run<T: Elem>(
    q: &[f32],
    k: &Tensor,
    v: &Tensor,
    spec: &AttendSpec,
    (n_kv, group, t, d, s): (usize, usize, usize, usize, usize),
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
        data: kc.as_slice::<T>()?,
        offset: k_off,
        head_stride: k_hs,
        row_stride: k_rs,
    };
    let vr = Rows {
        data: vc.as_slice::<T>()?,
        offset: v_off,
        head_stride: v_hs,
        row_stride: v_rs,
    };
    let scale = spec.scale as f32;
    let n_rows = group * t;
    // Visible key index range [lo_r, hi_r) per query row (row r = g·t + i).
    let range = |i: usize| {
        let qp = spec.query_start + i;
        let lo = match spec.window {
            Some(w) => spec.key_start.max((qp + 1).saturating_sub(w)),
            None => spec.key_start,
        };
        let hi = (spec.key_start + s).min(qp + 1);
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
            block_partial::<T>(qh, &kr, &vr, h, (a, b), &range, (group, t, d), scale)
        };
        let parts: Vec<Partial> = if blocks.len() > 1 {
            pool::map_on_compute_pool(&blocks, || (), |_, b| partial(b))
        } else {
            blocks.iter().map(partial).collect()
        };
        let oh = &mut out[h * n_rows * d..(h + 1) * n_rows * d];
        for r in 0..n_rows {
            let m = parts
                .iter()
                .map(|p| p.max[r])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            let o = &mut oh[r * d..(r + 1) * d];
            for p in &parts {
                if p.sum[r] == 0.0 {
                    continue;
                }
                let w = (p.max[r] - m).exp();
                sum += w * p.sum[r];
                for (x, y) in o.iter_mut().zip(&p.out[r * d..(r + 1) * d]) {
                    *x += w * y;
                }
            }
            let inv = 1.0 / sum;
            o.iter_mut().for_each(|x| *x *= inv);
        }
    }
    Ok(out)
}

/// Keys per block of the split softmax: small enough that a sliding layer's 512-key window
/// still splits across two cores, large enough that the merge stays negligible.
const KEY_BLOCK: usize = 256;

/// One key block's share of every query row: its max score, the sum of exp(score − max)
/// and the value rows weighted by those (unnormalized) exponentials.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

/// A key block as two small matrix products over the cache's own rows (no converted copy):
/// scores for 8 query rows × 2 keys at a time, outputs for 8 rows × 32 dims, each f16 row
/// widened in registers ([`f16_kernels`]); the softmax's exponentials are
/// [`crate::vmath::exp`], vectorized.
#[allow(clippy::too_many_arguments)]
fn block_partial<T: Elem>(
    qh: &[f32],
    kr: &Rows<'_, T>,
    vr: &Rows<'_, T>,
    h: usize,
    (a, b): (usize, usize),
    range: &(dyn Fn(usize) -> (usize, usize) + Sync),
    (group, t, d): (usize, usize, usize),
    scale: f32,
) -> Partial {
    let n_rows = group * t;
    let span = b - a;
    let keys: Vec<&[T]> = (a..b).map(|j| kr.row(h, j, d)).collect();
    let vals: Vec<&[T]> = (a..b).map(|j| vr.row(h, j, d)).collect();
    let mut sc = vec![0f32; n_rows * span];
    T::scores(qh, &keys, &vals, n_rows, scale, &mut sc);
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
    T::weighted(&sc, &vals, n_rows, &mut out);
    Partial { max, sum, out }
}

/// The two products over f16 rows: AVX-512 (f16 widened by `vcvtph2ps`, 16 lanes) or AVX2
/// with F16C (8 lanes) on x86-64 when the head width is a multiple of 16, else plain loops.
mod f16_kernels {
    use half::f16;

    /// `out[r][j] = scale · q_r · k_j` (`q`: `rows × d`); the SIMD kernels prefetch the
    /// keys ahead and `prefetch` (any rows, usually the block's values) alongside.
    pub fn scores(
        q: &[f32],
        keys: &[&[f16]],
        prefetch: &[&[f16]],
        rows: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let d = keys.first().map_or(0, |k| k.len());
        assert!(q.len() >= rows * d && out.len() >= rows * keys.len());
        assert!(keys.iter().all(|k| k.len() == d));
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(16) {
            if super::x86::avx512() {
                // SAFETY: AVX-512F detected; every row has d values, asserted above.
                return unsafe { super::x86::scores512(q, keys, prefetch, rows, d, scale, out) };
            }
            if super::x86::avx2() {
                // SAFETY: AVX2, FMA and F16C detected; lengths asserted above.
                return unsafe { super::x86::scores256(q, keys, prefetch, rows, d, scale, out) };
            }
        }
        let _ = prefetch; // the plain loops leave fetching to the hardware
        let span = keys.len();
        for r in 0..rows {
            for (j, k) in keys.iter().enumerate() {
                let s: f32 = q[r * d..(r + 1) * d]
                    .iter()
                    .zip(*k)
                    .map(|(a, b)| a * b.to_f32())
                    .sum();
                out[r * span + j] = s * scale;
            }
        }
    }

    /// `out[r] = Σ_j p[r][j] · v_j` (`p`: `rows × span`, `out`: `rows × d`).
    pub fn weighted(p: &[f32], vals: &[&[f16]], rows: usize, out: &mut [f32]) {
        let d = vals.first().map_or(0, |v| v.len());
        let span = vals.len();
        assert!(p.len() >= rows * span && out.len() >= rows * d);
        assert!(vals.iter().all(|v| v.len() == d));
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(16) {
            if super::x86::avx512() {
                // SAFETY: AVX-512F detected; lengths asserted above.
                return unsafe { super::x86::weighted512(p, vals, rows, d, out) };
            }
            if super::x86::avx2() {
                // SAFETY: AVX2, FMA and F16C detected; lengths asserted above.
                return unsafe { super::x86::weighted256(p, vals, rows, d, out) };
            }
        }
        out[..rows * d].fill(0.0);
        for r in 0..rows {
            for (j, v) in vals.iter().enumerate() {
                let w = p[r * span + j];
                if w == 0.0 {
                    continue;
                }
                for (o, x) in out[r * d..(r + 1) * d].iter_mut().zip(*v) {
                    *o += w * x.to_f32();
                }
            }
        }
    }
}

/// x86-64 register tiles for [`f16_kernels`]: scores for 8 rows × 2 keys (16 accumulators,
/// then one horizontal sum each), outputs for 8 rows × 32 dims (AVX-512) or 4 × 16 (AVX2).
/// At depth the cache rows come from DRAM, where demand loads alone streamed about 4 GB/s
/// per core (the kernels ran at a third of their in-cache speed): the scores pass prefetches
/// the key rows [`PREFETCH_KEYS`] ahead and each value row as its key is scored, so the
/// weighted pass that follows reads its values from L2; the AVX-512 weighted pass reads them
/// [`VALUE_ROWS`] whole rows at a time, in address order, rather than in 32-dimension
/// strips down all 256 rows (1 KB apart at d512).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    pub fn avx512() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    pub fn avx2() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    const R: usize = 8;

    /// Keys ahead of the one being scored whose rows are prefetched: covers DRAM latency at
    /// a row's in-cache scoring time (about 0.1 µs for 8 rows × 512 dims).
    const PREFETCH_KEYS: usize = 4;

    /// Asks for every cache line of `row` in all cache levels (a hint: never faults).
    #[inline(always)]
    fn prefetch_row(row: &[f16]) {
        let p = row.as_ptr() as *const i8;
        let bytes = std::mem::size_of_val(row);
        // SAFETY: prefetching is a hint with no architectural effect (it cannot fault); the
        // addresses stay within `row` (its last byte covers a line the stride might skip).
        unsafe {
            for off in (0..bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.add(off));
            }
            if bytes > 0 {
                _mm_prefetch::<_MM_HINT_T0>(p.add(bytes - 1));
            }
        }
    }

    /// The prefetches issued while key `j` is scored.
    #[inline(always)]
    fn prefetch_for_key(keys: &[&[f16]], prefetch: &[&[f16]], j: usize) {
        if let Some(k) = keys.get(j + PREFETCH_KEYS) {
            prefetch_row(k);
        }
        if let Some(v) = prefetch.get(j) {
            prefetch_row(v);
        }
    }

    /// Offsets of `n` rows of width `w` from `r0`, the last row repeated past `rows` (its
    /// results are dropped).
    fn row_offsets<const N: usize>(r0: usize, rows: usize, w: usize) -> [usize; N] {
        std::array::from_fn(|r| (r0 + r).min(rows - 1) * w)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum8(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores512(
        q: &[f32],
        keys: &[&[f16]],
        prefetch: &[&[f16]],
        rows: usize,
        d: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let span = keys.len();
        let qp = q.as_ptr();
        for r0 in (0..rows).step_by(R) {
            let nr = (rows - r0).min(R);
            let qr: [usize; R] = row_offsets(r0, rows, d);
            let mut j = 0;
            while j < span {
                // Two keys at a time share each query load; an odd last key goes twice.
                let (ka, kb) = (keys[j].as_ptr(), keys[(j + 1).min(span - 1)].as_ptr());
                prefetch_for_key(keys, prefetch, j);
                prefetch_for_key(keys, prefetch, j + 1);
                let mut a = [_mm512_setzero_ps(); R];
                let mut b = [_mm512_setzero_ps(); R];
                for c in (0..d).step_by(16) {
                    let (x, y) = (load16(ka.add(c)), load16(kb.add(c)));
                    for r in 0..R {
                        let qv = _mm512_loadu_ps(qp.add(qr[r] + c));
                        a[r] = _mm512_fmadd_ps(qv, x, a[r]);
                        b[r] = _mm512_fmadd_ps(qv, y, b[r]);
                    }
                }
                for r in 0..nr {
                    out[(r0 + r) * span + j] = _mm512_reduce_add_ps(a[r]) * scale;
                    if j + 1 < span {
                        out[(r0 + r) * span + j + 1] = _mm512_reduce_add_ps(b[r]) * scale;
                    }
                }
                j += 2;
            }
        }
    }

    /// Value rows per pass of [`weighted512`]: the pass reads each of them whole (16 KB at
    /// d512, in L1), so the rows stream in address order; the output tile is loaded and
    /// stored once per pass (16 KB at 8 rows × d512). 16 measured faster than 8 (fewer
    /// output loads and stores per value row).
    const VALUE_ROWS: usize = 16;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted512(p: &[f32], vals: &[&[f16]], rows: usize, d: usize, out: &mut [f32]) {
        let span = vals.len();
        let (pp, o) = (p.as_ptr(), out.as_mut_ptr());
        out[..rows * d].fill(0.0);
        for r0 in (0..rows).step_by(R) {
            let nr = (rows - r0).min(R);
            let pr: [usize; R] = row_offsets(r0, rows, span);
            // Rows past `rows` (a partial tile) accumulate into a scratch row, never read.
            let mut spare = [0f32; 32];
            let spare = spare.as_mut_ptr();
            let acc_at = |r: usize, c0: usize| -> *mut f32 {
                if r < nr {
                    o.add((r0 + r) * d + c0)
                } else {
                    spare
                }
            };
            // Sub-blocks of value rows in key order, each swept strip by strip: every output
            // value still sums its terms in key order (the same result as one pass per strip).
            for j0 in (0..span).step_by(VALUE_ROWS) {
                let j1 = (j0 + VALUE_ROWS).min(span);
                let mut c0 = 0;
                while c0 < d {
                    let two = c0 + 32 <= d;
                    let mut a0 = [_mm512_setzero_ps(); R];
                    let mut a1 = [_mm512_setzero_ps(); R];
                    for r in 0..R {
                        let at = acc_at(r, c0);
                        a0[r] = _mm512_loadu_ps(at);
                        if two {
                            a1[r] = _mm512_loadu_ps(at.add(16));
                        }
                    }
                    for (v, j) in vals[j0..j1].iter().zip(j0..) {
                        let vp = v.as_ptr().add(c0);
                        let v0 = load16(vp);
                        let v1 = if two {
                            load16(vp.add(16))
                        } else {
                            _mm512_setzero_ps()
                        };
                        for r in 0..R {
                            let w = _mm512_set1_ps(*pp.add(pr[r] + j));
                            a0[r] = _mm512_fmadd_ps(w, v0, a0[r]);
                            a1[r] = _mm512_fmadd_ps(w, v1, a1[r]);
                        }
                    }
                    for r in 0..R {
                        let at = acc_at(r, c0);
                        _mm512_storeu_ps(at, a0[r]);
                        if two {
                            _mm512_storeu_ps(at.add(16), a1[r]);
                        }
                    }
                    c0 += if two { 32 } else { 16 };
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores256(
        q: &[f32],
        keys: &[&[f16]],
        prefetch: &[&[f16]],
        rows: usize,
        d: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let span = keys.len();
        let qp = q.as_ptr();
        for r0 in (0..rows).step_by(R) {
            let nr = (rows - r0).min(R);
            let qr: [usize; R] = row_offsets(r0, rows, d);
            for (j, k) in keys.iter().enumerate() {
                let kp = k.as_ptr();
                prefetch_for_key(keys, prefetch, j);
                let mut a = [_mm256_setzero_ps(); R];
                for c in (0..d).step_by(8) {
                    let x = load8(kp.add(c));
                    for r in 0..R {
                        a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(qr[r] + c)), x, a[r]);
                    }
                }
                for r in 0..nr {
                    out[(r0 + r) * span + j] = hsum8(a[r]) * scale;
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted256(p: &[f32], vals: &[&[f16]], rows: usize, d: usize, out: &mut [f32]) {
        // 4 rows × 16 dims: 8 accumulators of the 16 ymm registers.
        const R4: usize = 4;
        let span = vals.len();
        let (pp, o) = (p.as_ptr(), out.as_mut_ptr());
        for r0 in (0..rows).step_by(R4) {
            let nr = (rows - r0).min(R4);
            let pr: [usize; R4] = row_offsets(r0, rows, span);
            for c0 in (0..d).step_by(16) {
                let mut a0 = [_mm256_setzero_ps(); R4];
                let mut a1 = [_mm256_setzero_ps(); R4];
                for (j, v) in vals.iter().enumerate() {
                    let vp = v.as_ptr().add(c0);
                    let (v0, v1) = (load8(vp), load8(vp.add(8)));
                    for r in 0..R4 {
                        let w = _mm256_set1_ps(*pp.add(pr[r] + j));
                        a0[r] = _mm256_fmadd_ps(w, v0, a0[r]);
                        a1[r] = _mm256_fmadd_ps(w, v1, a1[r]);
                    }
                }
                for r in 0..nr {
                    _mm256_storeu_ps(o.add((r0 + r) * d + c0), a0[r]);
                    _mm256_storeu_ps(o.add((r0 + r) * d + c0 + 8), a1[r]);
                }
            }
        }
    }
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
        for (t, window) in [(1, None), (3, Some(8)), (4, None), (1, Some(8))] {
            let q = Tensor::randn(0f32, 1.0, (8, t, 16), &dev)?;
            let spec = AttendSpec {
                query_start: 100 + 29 - t,
                key_start: 100,
                window,
                scale: 0.3,
            };
            let d = fast_minus_general(&q, &k, &v, &spec)?;
            assert!(d < 1e-5, "t {t} window {window:?}: {d}");
        }
        Ok(())
    }

    #[test]
    fn long_contexts_split_into_blocks_match_the_general_path() -> Result<()> {
        let dev = Device::Cpu;
        // 2600 keys: three blocks of the split softmax, the last one partial.
        let k = Tensor::randn(0f32, 1.0, (2, 2600, 16), &dev)?.to_dtype(DType::F16)?;
        let v = Tensor::randn(0f32, 1.0, (2, 2600, 16), &dev)?.to_dtype(DType::F16)?;
        for (t, window) in [(1, None), (2, Some(1500)), (1, Some(300))] {
            let q = Tensor::randn(0f32, 1.0, (4, t, 16), &dev)?;
            let spec = AttendSpec {
                query_start: 2600 - t,
                key_start: 0,
                window,
                scale: 0.5,
            };
            let d = fast_minus_general(&q, &k, &v, &spec)?;
            assert!(d < 1e-5, "t {t} window {window:?}: {d}");
        }
        Ok(())
    }

    /// Every variant of both block products (AVX-512, AVX2 and the plain loops) against an
    /// f64 reference, at head widths, row counts and key counts that leave partial tiles.
    #[test]
    fn block_products_match_an_f64_reference() {
        use half::f16;
        let mut rng = kvlab_turboquant::Rng::new(11, 3);
        for d in [16usize, 40, 512] {
            for rows in [1usize, 3, 8, 9] {
                for span in [1usize, 5, 256] {
                    let q: Vec<f32> = (0..rows * d).map(|_| rng.symmetric()).collect();
                    let kv: Vec<Vec<f16>> = (0..2 * span)
                        .map(|_| (0..d).map(|_| f16::from_f32(rng.symmetric())).collect())
                        .collect();
                    let keys: Vec<&[f16]> = kv[..span].iter().map(|v| v.as_slice()).collect();
                    let vals: Vec<&[f16]> = kv[span..].iter().map(|v| v.as_slice()).collect();
                    let p: Vec<f32> = (0..rows * span).map(|_| rng.uniform() as f32).collect();
                    let want_s: Vec<f64> = (0..rows * span)
                        .map(|i| {
                            let (r, j) = (i / span, i % span);
                            0.5 * (0..d)
                                .map(|c| q[r * d + c] as f64 * keys[j][c].to_f64())
                                .sum::<f64>()
                        })
                        .collect();
                    let want_o: Vec<f64> = (0..rows * d)
                        .map(|i| {
                            let (r, c) = (i / d, i % d);
                            (0..span)
                                .map(|j| p[r * span + j] as f64 * vals[j][c].to_f64())
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
                    f16_kernels::scores(&q, &keys, &vals, rows, 0.5, &mut s);
                    f16_kernels::weighted(&p, &vals, rows, &mut o);
                    check("dispatched", &s, &o);
                    #[cfg(target_arch = "x86_64")]
                    if d % 16 == 0 {
                        if x86::avx512() {
                            // SAFETY: detected; lengths as the dispatcher asserts.
                            unsafe {
                                x86::scores512(&q, &keys, &vals, rows, d, 0.5, &mut s);
                                x86::weighted512(&p, &vals, rows, d, &mut o);
                            }
                            check("avx512", &s, &o);
                        }
                        if x86::avx2() {
                            // SAFETY: as above.
                            unsafe {
                                x86::scores256(&q, &keys, &vals, rows, d, 0.5, &mut s);
                                x86::weighted256(&p, &vals, rows, d, &mut o);
                            }
                            check("avx2", &s, &o);
                        }
                    }
                }
            }
        }
    }
}
