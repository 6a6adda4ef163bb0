//! The two products of attention over cache rows, for a block of query rows at once: scores
//! `scale · q_r · k_j` and weighted sums `Σ_j p[r][j] · v_j`. The rows are f16 (an f16
//! cache's own, widened as they are loaded: `vcvtph2ps` on x86-64, `fcvtl` on ARM) or f32
//! (what a quantized cache decoded for a prefill). AVX-512 (16 lanes) or AVX2 (8 lanes) on
//! x86-64 and NEON on ARM (4 lanes) when the head width is a multiple of 16, else plain loops
//! (the reference the SIMD ones are tested against). The engine's attention reads the rows
//! straight from its cache buffers and merges key blocks; this module only multiplies.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;
use half::f16;

#[cfg(target_arch = "aarch64")]
use neon::Load as SimdLoad;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
use portable::Load as SimdLoad;
#[cfg(target_arch = "x86_64")]
use x86::Load as SimdLoad;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod portable {
    /// No SIMD loads where there is no SIMD kernel.
    pub trait Load {}
    impl Load for half::f16 {}
    impl Load for f32 {}
}

/// What the products read a cache row as: f16 (an f16 cache's own rows, widened in
/// registers) or f32 (rows a quantized cache decoded for a prefill). Sealed: the SIMD loads
/// behind it are this crate's.
pub trait Elem: Copy + Sync + SimdLoad {
    /// The value as an f32 (exact for both).
    fn to_f32(self) -> f32;
}

impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// Offsets of `n` rows of width `w` from `r0`, the last row repeated past `rows` (the SIMD
/// tiles' partial last tile: its results are dropped).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
fn row_offsets<const N: usize>(r0: usize, rows: usize, w: usize) -> [usize; N] {
    std::array::from_fn(|r| (r0 + r).min(rows - 1) * w)
}

/// `out[r][j] = scale · q_r · k_j` (`q`: `rows × d`); the SIMD kernels prefetch the
/// keys ahead and `prefetch` (any rows, usually the block's values) alongside.
pub fn scores<K: Elem, P>(
    q: &[f32],
    keys: &[&[K]],
    prefetch: &[&[P]],
    rows: usize,
    scale: f32,
    out: &mut [f32],
) {
    let d = keys.first().map_or(0, |k| k.len());
    assert!(q.len() >= rows * d && out.len() >= rows * keys.len());
    assert!(keys.iter().all(|k| k.len() == d));
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) {
        if crate::features().avx512 {
            // SAFETY: AVX-512F detected; every row has d values, asserted above.
            return unsafe { x86::scores512(q, keys, prefetch, rows, d, scale, out) };
        }
        if crate::features().avx2 {
            // SAFETY: AVX2, FMA and F16C detected; lengths asserted above.
            return unsafe { x86::scores256(q, keys, prefetch, rows, d, scale, out) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    if d.is_multiple_of(16) && crate::features().neon {
        // SAFETY: NEON detected; every row has d values, asserted above.
        return unsafe { neon::scores(q, keys, rows, d, scale, out) };
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
pub fn weighted<V: Elem>(p: &[f32], vals: &[&[V]], rows: usize, out: &mut [f32]) {
    let d = vals.first().map_or(0, |v| v.len());
    let span = vals.len();
    assert!(p.len() >= rows * span && out.len() >= rows * d);
    assert!(vals.iter().all(|v| v.len() == d));
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) {
        if crate::features().avx512 {
            // SAFETY: AVX-512F detected; lengths asserted above.
            return unsafe { x86::weighted512(p, vals, rows, d, out) };
        }
        if crate::features().avx2 {
            // SAFETY: AVX2, FMA and F16C detected; lengths asserted above.
            return unsafe { x86::weighted256(p, vals, rows, d, out) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    if d.is_multiple_of(16) && crate::features().neon {
        // SAFETY: NEON detected; lengths asserted above.
        return unsafe { neon::weighted(p, vals, rows, d, out) };
    }
    weighted_portable(p, vals, rows, out);
}

/// [`weighted`] in plain loops: each output a chain of fused multiply-adds in key order
/// from zero, zero weights skipped (a fused add of 0·v leaves a finite sum as it was).
fn weighted_portable<V: Elem>(p: &[f32], vals: &[&[V]], rows: usize, out: &mut [f32]) {
    let d = vals.first().map_or(0, |v| v.len());
    let span = vals.len();
    out[..rows * d].fill(0.0);
    for r in 0..rows {
        for (j, v) in vals.iter().enumerate() {
            let w = p[r * span + j];
            if w == 0.0 {
                continue;
            }
            for (o, x) in out[r * d..(r + 1) * d].iter_mut().zip(*v) {
                *o = w.mul_add(x.to_f32(), *o);
            }
        }
    }
}
