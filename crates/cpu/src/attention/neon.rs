//! NEON register tiles for the attention products over f16 or f32 rows, as the x86 ones: scores for 8 rows ×
//! 2 keys (16 accumulators of 4 lanes, then one horizontal sum each), outputs for 4 rows ×
//! 16 dims. f16 rows are widened by `fcvtl` (base ARMv8; stable Rust has no f16 vector type
//! for the intrinsic, so it is written as one instruction of inline assembly). The weighted
//! sums fuse each term in key order, so they equal the plain loops bit for bit.

use std::arch::aarch64::*;
use std::arch::asm;

use half::f16;

use super::row_offsets;

const R: usize = 8;

/// Eight f16 at `p` as two vectors of four f32 (exact: every f16 is an f32).
#[inline(always)]
unsafe fn widen8(p: *const f16) -> (float32x4_t, float32x4_t) {
    // SAFETY (caller): p points at 8 readable f16.
    let h = unsafe { vld1q_u16(p as *const u16) };
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: fcvtl/fcvtl2 only read and write the named registers.
    unsafe {
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    (lo, hi)
}

/// Cache rows the NEON tiles read, widened to f32 lanes as they are loaded.
pub trait Load: Copy {
    /// 8 values at `p` as two vectors of four f32.
    ///
    /// # Safety
    /// `p` must be readable for 8 values.
    unsafe fn load8(p: *const Self) -> (float32x4_t, float32x4_t);
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> (float32x4_t, float32x4_t) {
        // SAFETY (caller): 8 readable f16 at p.
        unsafe { widen8(p) }
    }
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> (float32x4_t, float32x4_t) {
        // SAFETY (caller): 8 readable f32 at p.
        unsafe { (vld1q_f32(p), vld1q_f32(p.add(4))) }
    }
}

/// `out[r][j] = scale · q_r · k_j`.
///
/// # Safety
/// NEON must be present; `d` is a multiple of 8, every key row holds `d` values, `q` at least
/// `rows × d` and `out` at least `rows × keys.len()`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn scores<K: Load>(
    q: &[f32],
    keys: &[&[K]],
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
            let mut a = [vdupq_n_f32(0.0); R];
            let mut b = [vdupq_n_f32(0.0); R];
            for c in (0..d).step_by(8) {
                // SAFETY: c + 8 ≤ d, the rows' length (caller's contract).
                let ((x0, x1), (y0, y1)) = unsafe { (K::load8(ka.add(c)), K::load8(kb.add(c))) };
                for r in 0..R {
                    // SAFETY: qr[r] + c + 8 ≤ rows × d ≤ q.len().
                    let (q0, q1) = unsafe {
                        (
                            vld1q_f32(qp.add(qr[r] + c)),
                            vld1q_f32(qp.add(qr[r] + c + 4)),
                        )
                    };
                    a[r] = vfmaq_f32(vfmaq_f32(a[r], q0, x0), q1, x1);
                    b[r] = vfmaq_f32(vfmaq_f32(b[r], q0, y0), q1, y1);
                }
            }
            for r in 0..nr {
                out[(r0 + r) * span + j] = vaddvq_f32(a[r]) * scale;
                if j + 1 < span {
                    out[(r0 + r) * span + j + 1] = vaddvq_f32(b[r]) * scale;
                }
            }
            j += 2;
        }
    }
}

/// `out[r] = Σ_j p[r][j] · v_j`, each output a chain of fused multiply-adds in key order
/// from zero (what the plain loops compute).
///
/// # Safety
/// NEON must be present; `d` is a multiple of 16, every value row holds `d` values, `p` at
/// least `rows × vals.len()` and `out` at least `rows × d`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn weighted<V: Load>(
    p: &[f32],
    vals: &[&[V]],
    rows: usize,
    d: usize,
    out: &mut [f32],
) {
    // 4 rows × 16 dims: 16 accumulators of the 32 vector registers.
    const R4: usize = 4;
    let span = vals.len();
    let (pp, o) = (p.as_ptr(), out.as_mut_ptr());
    for r0 in (0..rows).step_by(R4) {
        let nr = (rows - r0).min(R4);
        let pr: [usize; R4] = row_offsets(r0, rows, span);
        for c0 in (0..d).step_by(16) {
            let mut acc = [[vdupq_n_f32(0.0); 4]; R4];
            for (j, v) in vals.iter().enumerate() {
                let vp = v.as_ptr();
                // SAFETY: c0 + 16 ≤ d, the rows' length.
                let ((v0, v1), (v2, v3)) =
                    unsafe { (V::load8(vp.add(c0)), V::load8(vp.add(c0 + 8))) };
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: pr[r] + j < rows × span ≤ p.len().
                    let w = vdupq_n_f32(unsafe { *pp.add(pr[r] + j) });
                    a[0] = vfmaq_f32(a[0], w, v0);
                    a[1] = vfmaq_f32(a[1], w, v1);
                    a[2] = vfmaq_f32(a[2], w, v2);
                    a[3] = vfmaq_f32(a[3], w, v3);
                }
            }
            for (r, a) in acc.iter().enumerate().take(nr) {
                for (k, x) in a.iter().enumerate() {
                    // SAFETY: (r0 + r) · d + c0 + 4k + 4 ≤ rows × d ≤ out.len().
                    unsafe { vst1q_f32(o.add((r0 + r) * d + c0 + 4 * k), *x) };
                }
            }
        }
    }
}
