//! x86-64 register tiles for the attention products over f16 or f32 rows: scores for 8 rows × 2 keys (16 accumulators,
//! then one horizontal sum each), outputs for 8 rows × 32 dims (AVX-512) or 4 × 16 (AVX2).
//! At depth the cache rows come from DRAM, where demand loads alone streamed about 4 GB/s
//! per core (the kernels ran at a third of their in-cache speed): the scores pass prefetches
//! the key rows [`PREFETCH_KEYS`] ahead and each value row as its key is scored, so the
//! weighted pass that follows reads its values from L2; the AVX-512 weighted pass reads them
//! [`VALUE_ROWS`] whole rows at a time, in address order, rather than in 32-dimension
//! strips down all 256 rows (1 KB apart at d512).

use std::arch::x86_64::*;

use half::f16;

use super::row_offsets;

const R: usize = 8;

/// Keys ahead of the one being scored whose rows are prefetched: covers DRAM latency at
/// a row's in-cache scoring time (about 0.1 µs for 8 rows × 512 dims).
const PREFETCH_KEYS: usize = 4;

/// Asks for every cache line of `row` in all cache levels (a hint: never faults).
#[inline(always)]
fn prefetch_row<T>(row: &[T]) {
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
fn prefetch_for_key<K, P>(keys: &[&[K]], prefetch: &[&[P]], j: usize) {
    if let Some(k) = keys.get(j + PREFETCH_KEYS) {
        prefetch_row(k);
    }
    if let Some(v) = prefetch.get(j) {
        prefetch_row(v);
    }
}

/// Cache rows the x86 tiles read, widened to f32 lanes as they are loaded.
pub trait Load: Copy {
    /// 16 values at `p` as f32 lanes.
    ///
    /// # Safety
    /// AVX-512F must be present and `p` readable for 16 values.
    unsafe fn load16(p: *const Self) -> __m512;
    /// 8 values at `p` as f32 lanes.
    ///
    /// # Safety
    /// AVX2 and F16C must be present and `p` readable for 8 values.
    unsafe fn load8(p: *const Self) -> __m256;
}

// The loads are inlined into the `target_feature` kernels that call them, where the
// intrinsics' features are enabled.
impl Load for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY (caller): AVX-512F present, 16 readable f16 at p.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY (caller): F16C present, 8 readable f16 at p.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY (caller): AVX-512F present, 16 readable f32 at p.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY (caller): AVX present, 8 readable f32 at p.
        unsafe { _mm256_loadu_ps(p) }
    }
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
pub(super) unsafe fn scores512<K: Load, P>(
    q: &[f32],
    keys: &[&[K]],
    prefetch: &[&[P]],
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
                let (x, y) = (K::load16(ka.add(c)), K::load16(kb.add(c)));
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
pub(super) unsafe fn weighted512<V: Load>(
    p: &[f32],
    vals: &[&[V]],
    rows: usize,
    d: usize,
    out: &mut [f32],
) {
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
                    let v0 = V::load16(vp);
                    let v1 = if two {
                        V::load16(vp.add(16))
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
pub(super) unsafe fn scores256<K: Load, P>(
    q: &[f32],
    keys: &[&[K]],
    prefetch: &[&[P]],
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
                let x = K::load8(kp.add(c));
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
pub(super) unsafe fn weighted256<V: Load>(
    p: &[f32],
    vals: &[&[V]],
    rows: usize,
    d: usize,
    out: &mut [f32],
) {
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
                let (v0, v1) = (V::load8(vp), V::load8(vp.add(8)));
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
