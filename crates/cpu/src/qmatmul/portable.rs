//! The reference kernel: plain Rust over the tile layout, one output at a time. It runs where
//! no SIMD backend applies, and the tests hold every SIMD backend to it bit for bit: all
//! backends share one order of operations. Per 32-weight unit: integer dots per sub-block,
//! the offset correction and the sub-block scales in integers, then `acc = fma(unit, d·dy,
//! acc)`; the K formats' mins gather `fmin = fma(min, Σy, fmin)` over the superblock, then
//! `acc = fma(fmin, −dmin, acc)`.

use std::ops::Range;

use super::activation::{QuantizedActs, BLOCK};
use super::layout::{row_scales, stored_q, sub_scale_min, Layout, TILE_ROWS};
use super::Out;

/// Computes output columns of tiles `tiles` for activation rows `rows`.
pub(crate) fn run(
    lay: &Layout,
    data: &[u8],
    acts: &QuantizedActs,
    rows: Range<usize>,
    tiles: Range<usize>,
    out: Out,
) {
    let g = lay.geometry;
    let subs_per_unit = BLOCK / g.sub;
    for t in tiles {
        let tile = &data[t * lay.tile_bytes..(t + 1) * lay.tile_bytes];
        for m in rows.clone() {
            let (yq, yd) = (acts.row_q(m), acts.row_d(m));
            let (ys, yf) = (acts.row_sums(m), acts.row_fsums(m));
            for r in 0..TILE_ROWS {
                let col = t * TILE_ROWS + r;
                if col >= out.n {
                    break;
                }
                let mut acc = 0f32;
                for b in 0..lay.nsb {
                    let (d, dmin) = row_scales(lay, tile, b, r);
                    let mut fmin = 0f32;
                    for u in 0..g.sb / BLOCK {
                        let ku = b * g.sb + u * BLOCK;
                        let mut unit = 0i32;
                        for i in 0..subs_per_unit {
                            let s = u * subs_per_unit + i;
                            let k0 = b * g.sb + s * g.sub;
                            let mut dot = 0i32;
                            for k in 0..g.sub {
                                let q = stored_q(lay, tile, b, r, s * g.sub + k);
                                let q = if g.bits == 8 {
                                    q as i8 as i32
                                } else {
                                    q as i32
                                };
                                dot += q * yq[k0 + k] as i32;
                            }
                            let ysum: i32 = ys[k0 / 16..(k0 + g.sub) / 16].iter().sum();
                            let corr = dot - g.offset * ysum;
                            let (sc, _) = sub_scale_min(lay, tile, b, r, s);
                            unit += if g.scales { corr * sc } else { corr };
                        }
                        acc = (unit as f32).mul_add(d * yd[ku / BLOCK], acc);
                        if g.mins {
                            let (_, mn) = sub_scale_min(lay, tile, b, r, u);
                            fmin = (mn as f32).mul_add(yf[ku / BLOCK], fmin);
                        }
                    }
                    if g.mins {
                        acc = fmin.mul_add(-dmin, acc);
                    }
                }
                // SAFETY: `col < out.n` and `m` is a row of the output; each (m, col) is
                // written by one tile only.
                unsafe { *out.ptr.add(m * out.n + col) = acc };
            }
        }
    }
}
