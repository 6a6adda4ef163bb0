//! The interleaved tile layout every kernel reads, and the one-time repack into it from ggml
//! blocks.
//!
//! A matrix `[n, k]` is cut into tiles of [`TILE_ROWS`] rows (the last one padded with zero
//! rows). A tile holds, for each superblock `b` of `k`, a *planes* part and a *meta* part:
//! first every superblock's planes, then every superblock's meta, so each plane vector starts
//! on a 64-byte boundary.
//!
//! Planes hold the stored integers as 64-byte vectors of "16 rows × 4 consecutive weights"
//! (byte `4r + j` is row `r`, weight `j` of a group of four), so one vector feeds one integer
//! dot instruction that yields 16 outputs at once, against 4 activation bytes broadcast:
//! - `lo` (4, 5 and 6-bit formats): vector `v` packs groups `2v` (low nibbles) and `2v + 1`
//!   (high nibbles), i.e. weights `8v..8v+4` and `8v+4..8v+8`;
//! - `full` (8-bit): vector `v` is group `v` (weights `4v..4v+4`);
//! - `hi`, the bits above the low four: 5-bit formats, vector `v` holds in bit `i` the fifth
//!   bit of group `8v + i`; 6-bit, vector `v` holds in bits `2i..2i+2` the top two bits of
//!   group `4v + i`.
//!
//! Meta holds the 16 rows' f16 scale `d`, then (K formats) `dmin`, the sub-block scales
//! `[sub][row]` and the sub-block mins `[sub][row]`. Sizes equal ggml's blocks except the
//! K formats' 6-bit scales, which are held as bytes (+2.8% for Q4K, +2.3% for Q5K).

use half::f16;
use rayon::prelude::*;

use super::format::{decode_block, Decoded, Geometry, QFormat};

/// Rows per tile: one 512-bit vector of 32-bit sums.
pub const TILE_ROWS: usize = 16;
/// Bytes of one plane vector (16 rows × 4 weights).
pub const VEC: usize = 64;

/// Byte offsets of one format's tile parts, for a given row length `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The weight type.
    pub format: QFormat,
    /// Its geometry.
    pub geometry: Geometry,
    /// Superblocks per row.
    pub nsb: usize,
    /// Plane bytes per superblock.
    pub plane_bytes: usize,
    /// Where the `hi` plane starts within a superblock's planes.
    pub hi_offset: usize,
    /// Meta bytes per superblock.
    pub meta_bytes: usize,
    /// Where `dmin`, the scales and the mins start within a superblock's meta.
    pub dmin_offset: usize,
    /// See `dmin_offset`.
    pub scales_offset: usize,
    /// See `dmin_offset`.
    pub mins_offset: usize,
    /// Bytes of one tile, padded to a multiple of [`VEC`].
    pub tile_bytes: usize,
}

impl Layout {
    /// The layout of `format` rows of `k` weights (`k` a multiple of the superblock).
    pub fn new(format: QFormat, k: usize) -> Layout {
        let g = format.geometry();
        let nsb = k / g.sb;
        let rows = TILE_ROWS;
        let lo = if g.bits == 8 {
            g.sb * rows
        } else {
            g.sb * rows / 2
        };
        let hi = match g.bits {
            5 => g.sb * rows / 8,
            6 => g.sb * rows / 4,
            _ => 0,
        };
        let nsub = g.sb / g.sub;
        let dmin_offset = 2 * rows;
        let scales_offset = dmin_offset + if g.mins { 2 * rows } else { 0 };
        let mins_offset = scales_offset + if g.scales { nsub * rows } else { 0 };
        let meta_bytes = mins_offset + if g.mins { nsub * rows } else { 0 };
        let plane_bytes = lo + hi;
        Layout {
            format,
            geometry: g,
            nsb,
            plane_bytes,
            hi_offset: lo,
            meta_bytes,
            dmin_offset,
            scales_offset,
            mins_offset,
            tile_bytes: (nsb * (plane_bytes + meta_bytes)).div_ceil(VEC) * VEC,
        }
    }

    /// Offset of superblock `b`'s planes within a tile.
    pub fn planes(&self, b: usize) -> usize {
        b * self.plane_bytes
    }

    /// Offset of superblock `b`'s meta within a tile.
    pub fn meta(&self, b: usize) -> usize {
        self.nsb * self.plane_bytes + b * self.meta_bytes
    }
}

/// 64-byte aligned storage unit.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub [u8; VEC]);

/// Writes the 16 decoded rows of superblock `b` into `tile`.
fn write_superblock(lay: &Layout, tile: &mut [u8], b: usize, rows: &[Decoded]) {
    let g = lay.geometry;
    let p = lay.planes(b);
    let m = lay.meta(b);
    for (r, dec) in rows.iter().enumerate() {
        tile[m + 2 * r..m + 2 * r + 2].copy_from_slice(&dec.d.to_le_bytes());
        if g.mins {
            let o = m + lay.dmin_offset + 2 * r;
            tile[o..o + 2].copy_from_slice(&dec.dmin.to_le_bytes());
        }
        let nsub = g.sb / g.sub;
        for s in 0..nsub {
            if g.scales {
                tile[m + lay.scales_offset + s * TILE_ROWS + r] = dec.scales[s];
            }
            if g.mins {
                tile[m + lay.mins_offset + s * TILE_ROWS + r] = dec.mins[s];
            }
        }
        for (k, &q) in dec.q.iter().enumerate() {
            let (grp, j) = (k / 4, k % 4);
            let byte = 4 * r + j;
            if g.bits == 8 {
                tile[p + grp * VEC + byte] = q;
                continue;
            }
            let lo = p + (grp / 2) * VEC + byte;
            tile[lo] |= (q & 0x0F) << (4 * (grp % 2));
            match g.bits {
                5 => {
                    tile[p + lay.hi_offset + (grp / 8) * VEC + byte] |= ((q >> 4) & 1) << (grp % 8)
                }
                6 => {
                    tile[p + lay.hi_offset + (grp / 4) * VEC + byte] |=
                        ((q >> 4) & 3) << (2 * (grp % 4))
                }
                _ => {}
            }
        }
    }
}

/// Reads back row `r`'s stored integer `k` of superblock `b` (for dequantization and the
/// portable kernel).
#[inline]
pub(crate) fn stored_q(lay: &Layout, tile: &[u8], b: usize, r: usize, k: usize) -> u8 {
    let g = lay.geometry;
    let p = lay.planes(b);
    let (grp, j) = (k / 4, k % 4);
    let byte = 4 * r + j;
    if g.bits == 8 {
        return tile[p + grp * VEC + byte];
    }
    let lo = (tile[p + (grp / 2) * VEC + byte] >> (4 * (grp % 2))) & 0x0F;
    let hi = match g.bits {
        5 => (tile[p + lay.hi_offset + (grp / 8) * VEC + byte] >> (grp % 8)) & 1,
        6 => (tile[p + lay.hi_offset + (grp / 4) * VEC + byte] >> (2 * (grp % 4))) & 3,
        _ => 0,
    };
    lo | (hi << 4)
}

/// Row `r`'s f32 scales of superblock `b`: `(d, dmin)`.
#[inline]
pub(crate) fn row_scales(lay: &Layout, tile: &[u8], b: usize, r: usize) -> (f32, f32) {
    let m = lay.meta(b);
    let d = f16::from_bits(u16::from_le_bytes([tile[m + 2 * r], tile[m + 2 * r + 1]])).to_f32();
    let dmin = if lay.geometry.mins {
        let o = m + lay.dmin_offset + 2 * r;
        f16::from_bits(u16::from_le_bytes([tile[o], tile[o + 1]])).to_f32()
    } else {
        0.0
    };
    (d, dmin)
}

/// Row `r`'s integer scale and min of sub-block `s` of superblock `b` (1 and 0 without).
#[inline]
pub(crate) fn sub_scale_min(lay: &Layout, tile: &[u8], b: usize, r: usize, s: usize) -> (i32, i32) {
    let g = lay.geometry;
    let m = lay.meta(b);
    let sc = if !g.scales {
        1
    } else {
        let v = tile[m + lay.scales_offset + s * TILE_ROWS + r];
        if g.signed_scales {
            v as i8 as i32
        } else {
            v as i32
        }
    };
    let mn = if g.mins {
        tile[m + lay.mins_offset + s * TILE_ROWS + r] as i32
    } else {
        0
    };
    (sc, mn)
}

/// Repacks `rows` ggml rows of `format` (`bytes`, row-major blocks) into tiles, in parallel.
pub(crate) fn repack(format: QFormat, bytes: &[u8], rows: usize, k: usize) -> (Layout, Vec<Line>) {
    let lay = Layout::new(format, k);
    let g = lay.geometry;
    let row_bytes = lay.nsb * g.ggml_block;
    let tiles = rows.div_ceil(TILE_ROWS);
    let lines_per_tile = lay.tile_bytes / VEC;
    let mut data = vec![Line([0; VEC]); tiles * lines_per_tile];
    let zero_block = Decoded {
        d: 0,
        dmin: 0,
        scales: vec![0; g.sb / g.sub],
        mins: vec![0; g.sb / g.sub],
        q: vec![if g.bits == 8 { 0 } else { g.offset as u8 }; g.sb],
    };
    data.par_chunks_mut(lines_per_tile.max(1))
        .enumerate()
        .for_each(|(t, lines)| {
            // SAFETY: `Line` is 64 plain bytes with no padding; the slice covers exactly the
            // tile's lines.
            let tile = unsafe {
                std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, lines.len() * VEC)
            };
            for b in 0..lay.nsb {
                let decoded: Vec<Decoded> = (0..TILE_ROWS)
                    .map(|i| {
                        let row = t * TILE_ROWS + i;
                        if row < rows {
                            let at = row * row_bytes + b * g.ggml_block;
                            decode_block(format, &bytes[at..at + g.ggml_block])
                        } else {
                            zero_block.clone()
                        }
                    })
                    .collect();
                write_superblock(&lay, tile, b, &decoded);
            }
        });
    (lay, data)
}

/// Row `r` of a repacked matrix as f32 (`out.len() == k`), as ggml dequantizes it.
pub(crate) fn dequantize_row(lay: &Layout, tile: &[u8], r: usize, out: &mut [f32]) {
    let g = lay.geometry;
    for b in 0..lay.nsb {
        let (d, dmin) = row_scales(lay, tile, b, r);
        for s in 0..g.sb / g.sub {
            let (sc, mn) = sub_scale_min(lay, tile, b, r, s);
            let (dsc, m) = (d * sc as f32, dmin * mn as f32);
            for k in s * g.sub..(s + 1) * g.sub {
                let q = stored_q(lay, tile, b, r, k);
                let q = if g.bits == 8 {
                    q as i8 as i32
                } else {
                    q as i32 - g.offset
                };
                out[b * g.sb + k] = dsc * q as f32 - m;
            }
        }
    }
}
