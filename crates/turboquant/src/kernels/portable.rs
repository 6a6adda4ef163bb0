//! Portable scalar kernels: the fallback on CPUs without AVX-512 and the cross-check for it.
//! Codes are read 8 at a time (w bytes → one u64) on byte-aligned segments.

use super::{Ctx, Seg};
use crate::bits;
use crate::codec::read_f16;

/// Calls `f8(first coordinate, 8 centroids)` for each aligned group of 8 coordinates of
/// `seg` in record `rec`, then `f(coordinate, centroid)` for the rest.
#[inline(always)]
fn for_each_code(
    rec: &[u8],
    seg: &Seg,
    mut f8: impl FnMut(usize, &[f32; 8]),
    mut f: impl FnMut(usize, f32),
) {
    let w = seg.width as usize;
    let mask = (1u64 << w) - 1;
    let groups = if seg.bit_offset.is_multiple_of(8) {
        seg.len / 8
    } else {
        0
    };
    let byte0 = seg.bit_offset / 8;
    for gi in 0..groups {
        let off = byte0 + gi * w;
        // One 8-byte load where the record allows it (bits past the group are never used);
        // byte-wise only for the last group of a record.
        let word = match rec
            .get(off..off + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
        {
            Some(b) => u64::from_le_bytes(b),
            None => rec[off..off + w]
                .iter()
                .rev()
                .fold(0u64, |acc, &b| (acc << 8) | b as u64),
        };
        let c: [f32; 8] = std::array::from_fn(|s| seg.table[((word >> (s * w)) & mask) as usize]);
        f8(seg.start + 8 * gi, &c);
    }
    for k in groups * 8..seg.len {
        let i = bits::read(rec, seg.bit_offset + k * w, seg.width);
        f(seg.start + k, seg.table[i as usize]);
    }
}

/// The centroids of record `rec`'s codes, coordinate by coordinate, into `out` (`dim`).
pub(crate) fn centroids(ctx: &Ctx, rec: &[u8], out: &mut [f32]) {
    let cells = std::cell::Cell::from_mut(out).as_slice_of_cells();
    for seg in &ctx.segs {
        for_each_code(
            rec,
            seg,
            |j, c| cells[j..j + 8].iter().zip(c).for_each(|(o, &c)| o.set(c)),
            |j, c| cells[j].set(c),
        );
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    ctx: &Ctx,
    q: &[f32],
    sq: &[f32],
    sqsum: &[f32],
    g: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let d = ctx.dim;
    // Each record's centroids decoded once for all queries (the query heads of a group).
    let mut cent = vec![0.0f32; d];
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        centroids(ctx, rec, &mut cent);
        for qi in 0..g {
            let qv = &q[qi * d..(qi + 1) * d];
            // 8 independent partial sums: no serial add chain, and they vectorize.
            let mut lanes = [0.0f32; 8];
            let (whole, rest) = (d / 8 * 8, d % 8);
            for (qs, cs) in qv[..whole]
                .chunks_exact(8)
                .zip(cent[..whole].chunks_exact(8))
            {
                for s in 0..8 {
                    lanes[s] += qs[s] * cs[s];
                }
            }
            let mut dot: f32 = (0..rest).map(|i| qv[whole + i] * cent[whole + i]).sum();
            dot += lanes.iter().sum::<f32>();
            if let Some((sb, go, scale)) = ctx.qjl {
                let sqv = &sq[qi * d..(qi + 1) * d];
                let mut pos = 0.0f32;
                for (k, &v) in sqv.iter().enumerate() {
                    if bits::read(rec, sb + k, 1) == 1 {
                        pos += v;
                    }
                }
                dot += read_f16(rec, go) * scale * (2.0 * pos - sqsum[qi]);
            }
            out[qi * n + base + r] = norm * dot;
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate(
    ctx: &Ctx,
    weights: &[f32],
    g: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
    acc_s: &mut [f32],
) {
    let d = ctx.dim;
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        for qi in 0..g {
            let s = weights[qi * n + base + r] * norm;
            if s == 0.0 {
                continue;
            }
            let a = &mut acc[qi * d..(qi + 1) * d];
            for seg in &ctx.segs {
                // Both closures would borrow `a` mutably: tail coordinates (only for segments
                // whose length is not a multiple of 8) are collected and applied after.
                let mut tail = Vec::new();
                for_each_code(
                    rec,
                    seg,
                    |j, c| {
                        for k in 0..8 {
                            a[j + k] += s * c[k];
                        }
                    },
                    |j, c| tail.push((j, c)),
                );
                for (j, c) in tail {
                    a[j] += s * c;
                }
            }
            if let Some((sb, go, scale)) = ctx.qjl {
                let t = s * read_f16(rec, go) * scale;
                for (k, av) in acc_s[qi * d..(qi + 1) * d].iter_mut().enumerate() {
                    *av += if bits::read(rec, sb + k, 1) == 1 {
                        t
                    } else {
                        -t
                    };
                }
            }
        }
    }
}
