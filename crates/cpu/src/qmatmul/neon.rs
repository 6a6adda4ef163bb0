//! NEON backend (aarch64): the tile taken as four quarters of 4 rows (the 16-byte quarters of
//! every plane vector). A dot of 4 byte pairs per row is two widening multiplies, a pairwise
//! add and a pairwise add-accumulate (no 16-bit sum can overflow: weights are below 64, or
//! Q8_0's signed bytes against activations within ±127). Stored integers are used signed, so
//! Q8_0 needs no offset.

use std::arch::aarch64::*;
use std::ops::Range;

use half::f16;

use super::activation::{QuantizedActs, BLOCK};
use super::layout::{Layout, TILE_ROWS, VEC};
use super::{Fmt, Out};

/// Rows per quarter tile.
const QUARTER: usize = TILE_ROWS / 4;

/// Output columns of `tiles` for activation rows `rows`.
///
/// # Safety
/// As [`super::portable::run`]'s contract, with NEON present.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn run<F: Fmt>(
    lay: &Layout,
    data: &[u8],
    acts: &QuantizedActs,
    rows: Range<usize>,
    tiles: Range<usize>,
    out: Out,
) {
    for t in tiles {
        for h in 0..4 {
            let col0 = t * TILE_ROWS + h * QUARTER;
            if col0 >= out.n {
                break;
            }
            let cols = (out.n - col0).min(QUARTER);
            let tile = data.as_ptr().add(t * lay.tile_bytes);
            let mut m = rows.start;
            while m + 4 <= rows.end {
                quarter_rows::<F, 4>(lay, tile, h, acts, m, out, col0, cols);
                m += 4;
            }
            match rows.end - m {
                3 => quarter_rows::<F, 3>(lay, tile, h, acts, m, out, col0, cols),
                2 => quarter_rows::<F, 2>(lay, tile, h, acts, m, out, col0, cols),
                1 => quarter_rows::<F, 1>(lay, tile, h, acts, m, out, col0, cols),
                _ => {}
            }
        }
    }
}

/// The four group vectors of quad `quad` for quarter `h` (4 rows × 4 weights each).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn unpack<F: Fmt>(lay: &Layout, planes: *const u8, quad: usize, h: usize) -> [int8x16_t; 4] {
    let g = F::G;
    let part = h * (VEC / 4);
    if g.bits == 8 {
        let v = planes.add(4 * quad * VEC + part);
        return [
            vld1q_s8(v as *const i8),
            vld1q_s8(v.add(VEC) as *const i8),
            vld1q_s8(v.add(2 * VEC) as *const i8),
            vld1q_s8(v.add(3 * VEC) as *const i8),
        ];
    }
    let nib = vdupq_n_u8(0x0F);
    let lo0 = vld1q_u8(planes.add(2 * quad * VEC + part));
    let lo1 = vld1q_u8(planes.add((2 * quad + 1) * VEC + part));
    let mut w = [
        vandq_u8(lo0, nib),
        vshrq_n_u8::<4>(lo0),
        vandq_u8(lo1, nib),
        vshrq_n_u8::<4>(lo1),
    ];
    let hi = planes.add(lay.hi_offset + part);
    if g.bits == 5 {
        let hv = vld1q_u8(hi.add((quad / 2) * VEC));
        let b4 = vdupq_n_u8(0x10);
        for (i, wi) in w.iter_mut().enumerate() {
            // Bit p of the hi byte to bit 4 (a negative left shift shifts right).
            let p = (quad % 2) * 4 + i;
            let moved = vshlq_u8(hv, vdupq_n_s8(4 - p as i8));
            *wi = vorrq_u8(*wi, vandq_u8(moved, b4));
        }
    } else if g.bits == 6 {
        let hv = vld1q_u8(hi.add(quad * VEC));
        let b45 = vdupq_n_u8(0x30);
        for (i, wi) in w.iter_mut().enumerate() {
            let moved = vshlq_u8(hv, vdupq_n_s8(4 - 2 * i as i8));
            *wi = vorrq_u8(*wi, vandq_u8(moved, b45));
        }
    }
    w.map(|v| vreinterpretq_s8_u8(v))
}

/// `acc[r] += Σ_j w[4r + j]·y[j]` for the 4 rows of `w`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot4(acc: int32x4_t, w: int8x16_t, y: int8x16_t) -> int32x4_t {
    let p0 = vmull_s8(vget_low_s8(w), vget_low_s8(y));
    let p1 = vmull_high_s8(w, y);
    vpadalq_s16(acc, vpaddq_s16(p0, p1))
}

/// Four bytes at `p` widened to 32-bit lanes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn widen4(p: *const u8, signed: bool) -> int32x4_t {
    let v = vreinterpret_u8_u32(vdup_n_u32((p as *const u32).read_unaligned()));
    if signed {
        vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(v))))
    } else {
        vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(v))))
    }
}

/// Four f16 at `p` as f32 lanes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn halves4(p: *const u8) -> float32x4_t {
    let mut v = [0f32; 4];
    for (i, o) in v.iter_mut().enumerate() {
        *o = f16::from_bits((p.add(2 * i) as *const u16).read_unaligned()).to_f32();
    }
    vld1q_f32(v.as_ptr())
}

#[inline(always)]
fn sub_sum(sums: &[i32], k0: usize, sub: usize) -> i32 {
    if sub == 32 {
        sums[k0 / 16] + sums[k0 / 16 + 1]
    } else {
        sums[k0 / 16]
    }
}

/// Quarter `h` of a tile for `MR` consecutive activation rows from `m0`, in the portable
/// kernel's order of operations.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "neon")]
unsafe fn quarter_rows<F: Fmt, const MR: usize>(
    lay: &Layout,
    tile: *const u8,
    h: usize,
    acts: &QuantizedActs,
    m0: usize,
    out: Out,
    col0: usize,
    cols: usize,
) {
    let g = F::G;
    let subs_per_unit = BLOCK / g.sub;
    let quads = g.sub / 16;
    let off = if g.bits == 8 { 0 } else { g.offset };
    let yq: [*const u8; MR] = std::array::from_fn(|j| acts.row_q(m0 + j).as_ptr() as *const u8);
    let yd: [&[f32]; MR] = std::array::from_fn(|j| acts.row_d(m0 + j));
    let ys: [&[i32]; MR] = std::array::from_fn(|j| acts.row_sums(m0 + j));
    let yf: [&[f32]; MR] = std::array::from_fn(|j| acts.row_fsums(m0 + j));
    let zero = vdupq_n_s32(0);
    let mut facc = [vdupq_n_f32(0.0); MR];
    for b in 0..lay.nsb {
        let planes = tile.add(lay.planes(b));
        let meta = tile.add(lay.meta(b));
        let dv = halves4(meta.add(2 * QUARTER * h));
        let mut fmin = [vdupq_n_f32(0.0); MR];
        for u in 0..g.sb / BLOCK {
            let mut unit = [zero; MR];
            for i in 0..subs_per_unit {
                let s = u * subs_per_unit + i;
                let mut dot = [zero; MR];
                for q in 0..quads {
                    let quad = s * quads + q;
                    let w = unpack::<F>(lay, planes, quad, h);
                    let k = b * g.sb + quad * 16;
                    for (i, wi) in w.iter().enumerate() {
                        for j in 0..MR {
                            let y4 = (yq[j].add(k + 4 * i) as *const u32).read_unaligned();
                            let y = vreinterpretq_s8_u32(vdupq_n_u32(y4));
                            dot[j] = dot4(dot[j], *wi, y);
                        }
                    }
                }
                let k0 = b * g.sb + s * g.sub;
                let scv = if g.scales {
                    let sp = meta.add(lay.scales_offset + s * TILE_ROWS + QUARTER * h);
                    widen4(sp, g.signed_scales)
                } else {
                    zero
                };
                for j in 0..MR {
                    let corr = vsubq_s32(dot[j], vdupq_n_s32(off * sub_sum(ys[j], k0, g.sub)));
                    unit[j] = if g.scales {
                        vmlaq_s32(unit[j], corr, scv)
                    } else {
                        corr
                    };
                }
            }
            let ku = (b * g.sb) / BLOCK + u;
            for j in 0..MR {
                let dd = vmulq_f32(dv, vdupq_n_f32(yd[j][ku]));
                facc[j] = vfmaq_f32(facc[j], vcvtq_f32_s32(unit[j]), dd);
            }
            if g.mins {
                let mp = meta.add(lay.mins_offset + u * TILE_ROWS + QUARTER * h);
                let mnf = vcvtq_f32_s32(widen4(mp, false));
                for j in 0..MR {
                    fmin[j] = vfmaq_f32(fmin[j], mnf, vdupq_n_f32(yf[j][ku]));
                }
            }
        }
        if g.mins {
            let dminv = halves4(meta.add(lay.dmin_offset + 2 * QUARTER * h));
            for j in 0..MR {
                facc[j] = vfmsq_f32(facc[j], fmin[j], dminv);
            }
        }
    }
    for (j, acc) in facc.iter().enumerate() {
        let dst = out.ptr.add((m0 + j) * out.n + col0);
        if cols == QUARTER {
            vst1q_f32(dst, *acc);
        } else {
            let mut tmp = [0f32; QUARTER];
            vst1q_f32(tmp.as_mut_ptr(), *acc);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, cols);
        }
    }
}
