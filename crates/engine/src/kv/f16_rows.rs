//! The two inner loops of dense f16 decode attention, for several query rows at once: the
//! scores of rows of f32 queries against one f16 key row, and the accumulation of one f16
//! value row into rows of f32 outputs. Each f16 row is read and widened once for all query
//! rows, straight from the cache (no f32 copy of it). On x86-64 with AVX2, FMA and F16C
//! (checked at run time) they use 8-wide widening loads and fused multiply-adds; elsewhere the
//! row is widened once and goes through the f32 forms (`dots_f32`, `axpys_f32`), which f32
//! caches use directly.

use half::f16;

/// Whether the SIMD kernels run on this CPU (checked once by the caller, passed down).
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[r] = q[r·d..(r+1)·d] · k` for every row `r` (`d = k.len()`, `q.len() = out.len()·d`).
pub fn dots(simd: bool, q: &[f32], k: &[f16], out: &mut [f32]) {
    assert_eq!(q.len(), out.len() * k.len(), "query rows × key width");
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is `simd_available()`, so AVX2, FMA and F16C are present; the
        // lengths were checked above.
        unsafe { x86::dots(q, k, out) };
        return;
    }
    let _ = simd;
    dots_portable(q, k, out);
}

/// `out[r·d..(r+1)·d] += p[r] · v` for every row `r` (`d = v.len()`, `out.len() = p.len()·d`).
pub fn axpys(simd: bool, p: &[f32], v: &[f16], out: &mut [f32]) {
    assert_eq!(out.len(), p.len() * v.len(), "output rows × value width");
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: as in `dots`.
        unsafe { x86::axpys(p, v, out) };
        return;
    }
    let _ = simd;
    axpys_portable(p, v, out);
}

fn dots_portable(q: &[f32], k: &[f16], out: &mut [f32]) {
    let mut row = vec![0f32; k.len()];
    half::slice::HalfFloatSliceExt::convert_to_f32_slice(k, &mut row);
    dots_f32(q, &row, out);
}

fn axpys_portable(p: &[f32], v: &[f16], out: &mut [f32]) {
    let mut row = vec![0f32; v.len()];
    half::slice::HalfFloatSliceExt::convert_to_f32_slice(v, &mut row);
    axpys_f32(p, &row, out);
}

/// [`dots`] for an f32 key row (f32 caches, and the portable f16 path after widening).
pub fn dots_f32(q: &[f32], k: &[f32], out: &mut [f32]) {
    for (o, qr) in out.iter_mut().zip(q.chunks_exact(k.len().max(1))) {
        *o = dot(qr, k);
    }
}

/// [`axpys`] for an f32 value row.
pub fn axpys_f32(p: &[f32], v: &[f32], out: &mut [f32]) {
    for (&w, o) in p.iter().zip(out.chunks_exact_mut(v.len().max(1))) {
        if w != 0.0 {
            o.iter_mut().zip(v).for_each(|(x, y)| *x += w * y);
        }
    }
}

/// Dot product with 32 independent accumulators, so the compiler keeps several SIMD FMA
/// chains in flight instead of one serial sum.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..32 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + ra.iter().zip(rb).map(|(x, y)| x * y).sum::<f32>()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    /// Sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// 8 f16 at `k[c..c + 8]` widened to f32.
    ///
    /// # Safety
    /// `c + 8 <= k.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(k: &[f16], c: usize) -> __m256 {
        // SAFETY: in bounds by the caller's contract; unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(k.as_ptr().add(c).cast()) })
    }

    /// See [`super::dots`]. Four query rows at a time share each widened key chunk.
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; `q.len() == out.len() * k.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dots(q: &[f32], k: &[f16], out: &mut [f32]) {
        let d = k.len();
        let d8 = d / 8 * 8;
        let rows = out.len();
        let mut r0 = 0;
        while r0 < rows {
            let n = (rows - r0).min(4);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < d8 {
                // SAFETY: c + 8 <= d8 <= d.
                let kv = unsafe { load8(k, c) };
                for (i, a) in acc.iter_mut().enumerate().take(n) {
                    // SAFETY: (r0 + i)·d + c + 8 <= (r0 + n)·d <= q.len().
                    let qv = unsafe { _mm256_loadu_ps(q.as_ptr().add((r0 + i) * d + c)) };
                    *a = _mm256_fmadd_ps(qv, kv, *a);
                }
                c += 8;
            }
            for (i, a) in acc.iter().enumerate().take(n) {
                let qr = &q[(r0 + i) * d..(r0 + i + 1) * d];
                let tail: f32 = (d8..d).map(|j| qr[j] * k[j].to_f32()).sum();
                out[r0 + i] = hsum(*a) + tail;
            }
            r0 += n;
        }
    }

    /// See [`super::axpys`]. Each widened value chunk is added into every row.
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; `out.len() == p.len() * v.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpys(p: &[f32], v: &[f16], out: &mut [f32]) {
        let d = v.len();
        let d8 = d / 8 * 8;
        let mut c = 0;
        while c < d8 {
            // SAFETY: c + 8 <= d8 <= d.
            let vv = unsafe { load8(v, c) };
            for (r, &w) in p.iter().enumerate() {
                if w == 0.0 {
                    continue;
                }
                // SAFETY: r·d + c + 8 <= p.len()·d = out.len().
                unsafe {
                    let o = out.as_mut_ptr().add(r * d + c);
                    _mm256_storeu_ps(
                        o,
                        _mm256_fmadd_ps(_mm256_set1_ps(w), vv, _mm256_loadu_ps(o)),
                    );
                }
            }
            c += 8;
        }
        for (r, &w) in p.iter().enumerate() {
            for j in d8..d {
                out[r * d + j] += w * v[j].to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_turboquant::Rng;

    fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
    }

    /// Both paths against a plain f64 reference, at widths with and without a tail and with 1
    /// to 9 query rows (a partial group of four included); zero weights leave rows untouched.
    #[test]
    fn simd_and_portable_rows_match_an_f64_reference() {
        let mut rng = Rng::new(3, 1);
        for d in [8, 19, 64, 256] {
            for rows in [1, 3, 4, 5, 9] {
                let q = random(&mut rng, rows * d);
                let k: Vec<f16> = random(&mut rng, d).into_iter().map(f16::from_f32).collect();
                let mut p = random(&mut rng, rows);
                p[0] = 0.0;
                let base = random(&mut rng, rows * d);
                for simd in [false, simd_available()] {
                    let mut s = vec![0f32; rows];
                    dots(simd, &q, &k, &mut s);
                    let mut o = base.clone();
                    axpys(simd, &p, &k, &mut o);
                    for r in 0..rows {
                        let want: f64 = (0..d)
                            .map(|j| f64::from(q[r * d + j]) * f64::from(k[j].to_f32()))
                            .sum();
                        assert!((f64::from(s[r]) - want).abs() < 1e-4, "d {d} rows {rows}");
                        for j in 0..d {
                            let want = f64::from(base[r * d + j])
                                + f64::from(p[r]) * f64::from(k[j].to_f32());
                            assert!((f64::from(o[r * d + j]) - want).abs() < 1e-5);
                        }
                    }
                    assert_eq!(o[..d], base[..d], "a zero weight adds nothing");
                }
            }
        }
    }
}
