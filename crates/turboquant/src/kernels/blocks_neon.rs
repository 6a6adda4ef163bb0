//! NEON kernels for ggml's q8_0 and q4_0 blocks (`crate::ggml`): key dots against q8_0
//! queries (armv8.0: widening multiplies, no `sdot`) and value sums.

use std::arch::aarch64::*;

use crate::ggml::dots::VALUE_TILE;
use crate::ggml::read_f16;
use crate::ggml::{BlockType, BLOCK};

/// Σ x_j·y_j over 32 signed bytes, exactly: products of at most 128·127 in i16, summed
/// pairwise into i32.
#[target_feature(enable = "neon")]
fn sum_i8(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
    let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(x0), vget_low_s8(y0)));
    acc = vpadalq_s16(acc, vmull_high_s8(x0, y0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(x1), vget_low_s8(y1)));
    acc = vpadalq_s16(acc, vmull_high_s8(x1, y1));
    vaddvq_s32(acc)
}

/// The 32 signed levels of a q8_0 or q4_0 key block, coordinates 0..16 and 16..32.
#[inline(always)]
unsafe fn key_levels(t: BlockType, k: &[u8]) -> (int8x16_t, int8x16_t) {
    // SAFETY (caller): k holds a whole block, 34 bytes (q8_0) or 18 (q4_0).
    unsafe {
        if t == BlockType::Q8_0 {
            (
                vld1q_s8(k[2..].as_ptr().cast()),
                vld1q_s8(k[18..].as_ptr().cast()),
            )
        } else {
            let packed = vld1q_u8(k[2..].as_ptr());
            let eight = vdupq_n_s8(8);
            (
                vsubq_s8(
                    vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0F))),
                    eight,
                ),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(packed)), eight),
            )
        }
    }
}

/// Dots of every key row with up to eight q8_0 queries (see `BlockType::dots`): each key
/// block loaded and unpacked once, each query's integer sum formed exactly (`sum_i8`), and
/// its `block_term` added in block order: the portable dot's float.
///
/// # Safety
/// `t` is q8_0 or q4_0; `keys` is whole rows of `row` bytes, `queries` at most eight rows
/// of `qrow` bytes covering as many blocks, and `out` holds `stride` floats for each
/// query but the last and the key rows' count for the last.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dots8(
    t: BlockType,
    keys: &[u8],
    row: usize,
    queries: &[u8],
    qrow: usize,
    out: &mut [f32],
    stride: usize,
) {
    let g = queries.len() / qrow;
    let bb = t.block_bytes();
    let blocks = row / bb;
    for (tk, k) in keys.chunks_exact(row).enumerate() {
        let mut acc = [0f32; 8];
        for b in 0..blocks {
            let kb = &k[b * bb..(b + 1) * bb];
            // SAFETY: kb is one whole block.
            let (x0, x1) = unsafe { key_levels(t, kb) };
            for (qi, a) in acc.iter_mut().enumerate().take(g) {
                let q = &queries[qi * qrow + b * (2 + BLOCK)..][..2 + BLOCK];
                // SAFETY: q holds the block's 2-byte scale and 32 codes.
                let (y0, y1) = unsafe {
                    (
                        vld1q_s8(q[2..].as_ptr().cast()),
                        vld1q_s8(q[18..].as_ptr().cast()),
                    )
                };
                *a += t.block_term(kb, q, sum_i8(x0, x1, y0, y1));
            }
        }
        for (qi, a) in acc.iter().enumerate().take(g) {
            out[qi * stride + tk] = *a;
        }
    }
}

/// Eight coordinates (`unit` 0..4 of a block) of a q8_0 or q4_0 block, as
/// [`BlockType::dequantize_row`] makes them: the level (an exact float) times the scale.
#[inline(always)]
unsafe fn levels8(t: BlockType, block: &[u8], unit: usize) -> (float32x4_t, float32x4_t) {
    let scale = read_f16(block, 0);
    // SAFETY (caller): block is whole; the 8-byte loads stay inside its codes.
    let wide = unsafe {
        if t == BlockType::Q8_0 {
            vmovl_s8(vld1_s8(block[2 + 8 * unit..].as_ptr().cast()))
        } else {
            // Coordinates 0..16 are the low nibbles of the 16 code bytes, 16..32 the high.
            let packed = vld1_u8(block[2 + 8 * (unit % 2)..].as_ptr());
            let nib = if unit < 2 {
                vand_u8(packed, vdup_n_u8(0x0F))
            } else {
                vshr_n_u8::<4>(packed)
            };
            vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(nib)), vdupq_n_s16(8))
        }
    };
    let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
    let hi = vcvtq_f32_s32(vmovl_high_s16(wide));
    (vmulq_n_f32(lo, scale), vmulq_n_f32(hi, scale))
}

/// `BlockType::accumulate_rows` for q8_0 and q4_0 rows: per tile of rows, per eight
/// coordinates, each weighed row's values made once in registers and fused-added into
/// the output rows that weigh it, rows in order (zero weights skipped, as the portable
/// code skips them).
///
/// # Safety
/// `t` is q8_0 or q4_0, `rows` whole rows of `row` bytes for `d` coordinates, `weights`
/// `g · n` and `out` `g · d` floats (`g = out.len() / d`).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn accumulate(
    t: BlockType,
    rows: &[u8],
    row: usize,
    d: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    let n = rows.len() / row;
    let g = out.len() / d;
    let bb = t.block_bytes();
    let zero = vdupq_n_f32(0.0);
    let mut t0 = 0;
    while t0 < n {
        let m = (n - t0).min(VALUE_TILE);
        let need: [bool; VALUE_TILE] =
            std::array::from_fn(|k| k < m && (0..g).any(|qi| weights[qi * n + t0 + k] != 0.0));
        for b in 0..d / BLOCK {
            for unit in 0..4 {
                let mut xs = [(zero, zero); VALUE_TILE];
                for (k, x) in xs.iter_mut().enumerate() {
                    if need[k] {
                        let at = (t0 + k) * row + b * bb;
                        // SAFETY: row t0 + k < n holds the whole block b.
                        *x = unsafe { levels8(t, &rows[at..at + bb], unit) };
                    }
                }
                let col = b * BLOCK + 8 * unit;
                for qi in 0..g {
                    let w = &weights[qi * n + t0..][..m];
                    if w.iter().all(|&w| w == 0.0) {
                        continue;
                    }
                    // SAFETY: qi < g and col + 8 ≤ d: eight floats of output row qi.
                    unsafe {
                        let p = out.as_mut_ptr().add(qi * d + col);
                        let (mut a0, mut a1) = (vld1q_f32(p), vld1q_f32(p.add(4)));
                        for (&(x0, x1), &w) in xs.iter().zip(w) {
                            if w != 0.0 {
                                a0 = vfmaq_n_f32(a0, x0, w);
                                a1 = vfmaq_n_f32(a1, x1, w);
                            }
                        }
                        vst1q_f32(p, a0);
                        vst1q_f32(p.add(4), a1);
                    }
                }
            }
        }
        t0 += m;
    }
}
