//! NEON kernels for aarch64 (Apple Silicon, ARM servers): scores and weighted sums on the
//! codes (tiles of 4, 2 or 1 queries, so a record is unpacked once per tile), and the encoder's
//! quantizer and bit packer.
//!
//! Codes are unpacked 16 at a time in coordinate order, so queries and accumulators need no
//! lane permutation (unlike the x86 backends): the 2·w bytes holding 16 codes of width w are
//! read as one 64-bit word (w ≤ 4) or one 128-bit load (w ≤ 8); one `tbl` per 8 codes gathers
//! each code's two bytes into a 16-bit lane, which a per-lane shift and a mask reduce to the
//! code. Centroids come from `tbl` lookups into the codebook split into byte planes (plane b
//! holds byte b of each level), re-interleaved into four f32x4 registers by `zip`: one 16-byte
//! `tbl` per plane up to 16 levels, one four-register `tbl` per 64 levels above (chained by
//! `tbx`: 1 up to 6 bits, 2 for 7, 4 for 8). Coordinates past the last whole group of 16,
//! and segments that do not start on a byte, are read one code at a time. Every width is
//! scored and summed here; the encoder's NEON path is for widths up to 4.
//!
//! Encoding counts, for 16 values at a time, the thresholds at or below each value (`fcmge`),
//! exactly the portable rule, so both write identical bytes; codes are packed by per-lane
//! shifts and pairwise adds (w = 1, 2, 4) or one 64-bit word (w = 3).
//!
//! NEON is part of the aarch64 baseline, so nothing is detected at run time; a switch still
//! routes calls to the portable backend so tests can compare the two on one machine.

use std::arch::aarch64::*;

use super::{Ctx, Seg};
use crate::bits;
use crate::codec::read_f16;

/// Widest code the 16-at-a-time unpacker handles (2·w bytes must fit one 128-bit load).
const MAX_WIDTH: usize = 8;

/// Widest code whose 16 codes fit one 64-bit word (2·w bytes) and whose codebook fits one
/// 16-byte `tbl` per byte plane.
const NARROW: usize = 4;

/// Per-segment registers and loop bounds.
struct SegTab {
    /// Byte plane b: byte b (little-endian) of each of the first 16 codebook levels.
    planes: [uint8x16_t; 4],
    /// For codes wider than [`NARROW`]: byte plane b of levels 64·c..64·c + 64 as
    /// `wide[b][c]`, one four-register `tbl` each (`chunks` of them: 1 up to 6 bits, 2 for
    /// 7, 4 for 8).
    wide: Option<Box<[[uint8x16x4_t; 4]; 4]>>,
    chunks: usize,
    /// Byte indices gathering the 16-bit window of codes 0..8 (`gather[0]`) and 8..16.
    gather: [uint8x16_t; 2],
    /// Right shifts (as negative left shifts) bringing each code to bit 0.
    shift: [int16x8_t; 2],
    mask: uint16x8_t,
    width: usize,
    /// Whole groups of 16 codes read by the vector path (0 for unaligned segments).
    groups: usize,
}

#[target_feature(enable = "neon")]
fn u8x16(a: &[u8; 16]) -> uint8x16_t {
    // SAFETY: `a` is exactly 16 readable bytes.
    unsafe { vld1q_u8(a.as_ptr()) }
}

#[target_feature(enable = "neon")]
fn i16x8(a: &[i16; 8]) -> int16x8_t {
    // SAFETY: `a` is exactly 8 readable i16 values.
    unsafe { vld1q_s16(a.as_ptr()) }
}

/// The codebook of `seg` as four byte planes.
#[target_feature(enable = "neon")]
fn planes(seg: &Seg) -> [uint8x16_t; 4] {
    let mut p = [[0u8; 16]; 4];
    for (i, v) in seg.table.iter().take(16).enumerate() {
        for (b, byte) in v.to_le_bytes().into_iter().enumerate() {
            p[b][i] = byte;
        }
    }
    [u8x16(&p[0]), u8x16(&p[1]), u8x16(&p[2]), u8x16(&p[3])]
}

/// The codebook of a wide `seg` as byte planes of 64 levels (`chunks` of them).
#[target_feature(enable = "neon")]
fn wide_planes(seg: &Seg, chunks: usize) -> Box<[[uint8x16x4_t; 4]; 4]> {
    let mut p = [[0u8; 256]; 4];
    for (i, v) in seg.table.iter().take(64 * chunks).enumerate() {
        for (b, byte) in v.to_le_bytes().into_iter().enumerate() {
            p[b][i] = byte;
        }
    }
    let four = |b: usize, c: usize| {
        let at = |k: usize| -> &[u8; 16] {
            p[b][64 * c + 16 * k..64 * c + 16 * k + 16]
                .try_into()
                .expect("16 bytes")
        };
        uint8x16x4_t(u8x16(at(0)), u8x16(at(1)), u8x16(at(2)), u8x16(at(3)))
    };
    Box::new(std::array::from_fn(|b| std::array::from_fn(|c| four(b, c))))
}

#[target_feature(enable = "neon")]
fn seg_tab(seg: &Seg) -> SegTab {
    let w = seg.width as usize;
    // Code k starts at bit w·k of the group: byte (w·k)/8, bit (w·k)%8. Its 16-bit window is
    // that byte and the next one; for k = 15 the next byte may lie past the group's 2·w
    // bytes (then it is byte 8, a zero of the padded register, and is masked off anyway).
    let gather = |half: usize| -> [u8; 16] {
        std::array::from_fn(|i| ((w * (8 * half + i / 2)) / 8 + i % 2) as u8)
    };
    let shift =
        |half: usize| -> [i16; 8] { std::array::from_fn(|i| -(((w * (8 * half + i)) % 8) as i16)) };
    let vector = seg.bit_offset.is_multiple_of(8) && (1..=MAX_WIDTH).contains(&w);
    let chunks = (1usize << w.min(MAX_WIDTH)).div_ceil(64);
    SegTab {
        planes: planes(seg),
        wide: (w > NARROW).then(|| wide_planes(seg, chunks)),
        chunks,
        gather: [u8x16(&gather(0)), u8x16(&gather(1))],
        shift: [i16x8(&shift(0)), i16x8(&shift(1))],
        mask: vdupq_n_u16(((1u32 << w) - 1) as u16),
        width: w,
        groups: if vector { seg.len / 16 } else { 0 },
    }
}

/// 8 bytes of `rec` at `off`, zero-filled past its end.
#[inline(always)]
fn load_u64(rec: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    match rec.get(off..off + 8) {
        Some(s) => a.copy_from_slice(s),
        None => {
            let rest = rec.get(off..).unwrap_or(&[]);
            a[..rest.len().min(8)].copy_from_slice(&rest[..rest.len().min(8)]);
        }
    }
    u64::from_le_bytes(a)
}

/// 16 bytes of `rec` at `off`, zero-filled past its end.
#[inline(always)]
fn load_u128(rec: &[u8], off: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    let rest = rec.get(off..).unwrap_or(&[]);
    let n = rest.len().min(16);
    a[..n].copy_from_slice(&rest[..n]);
    a
}

/// The 2·w bytes of the 16 codes of width w at byte `off` of `rec` (zeros after them or
/// past the record's end in a wider read).
#[inline]
#[target_feature(enable = "neon")]
fn group_bytes(rec: &[u8], off: usize, w: usize) -> uint8x16_t {
    if w <= NARROW {
        vcombine_u8(vcreate_u8(load_u64(rec, off)), vdup_n_u8(0))
    } else {
        u8x16(&load_u128(rec, off))
    }
}

/// The 16 codes packed in the low 16·w bits of `bytes`, one per byte, in order. A code of
/// up to 8 bits spans at most two bytes; for w = 8 the 16th code's second window byte is
/// index 16, which `tbl` reads as zero, and the mask drops it anyway.
#[inline]
#[target_feature(enable = "neon")]
fn codes16(bytes: uint8x16_t, t: &SegTab) -> uint8x16_t {
    let lo = vreinterpretq_u16_u8(vqtbl1q_u8(bytes, t.gather[0]));
    let hi = vreinterpretq_u16_u8(vqtbl1q_u8(bytes, t.gather[1]));
    let lo = vandq_u16(vshlq_u16(lo, t.shift[0]), t.mask);
    let hi = vandq_u16(vshlq_u16(hi, t.shift[1]), t.mask);
    vcombine_u8(vmovn_u16(lo), vmovn_u16(hi))
}

/// Centroids of 16 codes of segment table `t`, in order, as four f32x4.
#[inline]
#[target_feature(enable = "neon")]
fn centroids16(codes: uint8x16_t, t: &SegTab) -> [float32x4_t; 4] {
    let [b0, b1, b2, b3] = match &t.wide {
        None => std::array::from_fn(|b| vqtbl1q_u8(t.planes[b], codes)),
        Some(wide) => std::array::from_fn(|b| {
            // Levels 64·c.. of chunk c: indices out of its range (≥ 64 after the
            // wrapping subtraction) keep what an earlier chunk found.
            let mut v = vqtbl4q_u8(wide[b][0], codes);
            for c in 1..t.chunks {
                let idx = vsubq_u8(codes, vdupq_n_u8((64 * c) as u8));
                v = vqtbx4q_u8(v, wide[b][c], idx);
            }
            v
        }),
    };
    interleave(b0, b1, b2, b3)
}

/// Four byte planes of 16 values into the values, in order, as four f32x4.
#[inline]
#[target_feature(enable = "neon")]
fn interleave(b0: uint8x16_t, b1: uint8x16_t, b2: uint8x16_t, b3: uint8x16_t) -> [float32x4_t; 4] {
    // u16 lane k of lo01 = bytes 0, 1 of level codes[k] (k < 8); hi01 the same for k ≥ 8.
    let lo01 = vreinterpretq_u16_u8(vzip1q_u8(b0, b1));
    let hi01 = vreinterpretq_u16_u8(vzip2q_u8(b0, b1));
    let lo23 = vreinterpretq_u16_u8(vzip1q_u8(b2, b3));
    let hi23 = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));
    [
        vreinterpretq_f32_u16(vzip1q_u16(lo01, lo23)),
        vreinterpretq_f32_u16(vzip2q_u16(lo01, lo23)),
        vreinterpretq_f32_u16(vzip1q_u16(hi01, hi23)),
        vreinterpretq_f32_u16(vzip2q_u16(hi01, hi23)),
    ]
}

/// For every code of record `rec`: `f(state, j, centroids of coordinates j..j+16)` for each
/// whole group of 16, `tail(state, coordinate, centroid)` for the rest.
#[inline]
#[target_feature(enable = "neon")]
fn walk<S: ?Sized>(
    ctx: &Ctx,
    tabs: &[SegTab],
    rec: &[u8],
    state: &mut S,
    mut f: impl FnMut(&mut S, usize, &[float32x4_t; 4]),
    mut tail: impl FnMut(&mut S, usize, f32),
) {
    for (seg, t) in ctx.segs.iter().zip(tabs) {
        let byte0 = seg.bit_offset / 8;
        let w = t.width;
        for gi in 0..t.groups {
            let codes = codes16(group_bytes(rec, byte0 + 2 * w * gi, w), t);
            f(state, seg.start + 16 * gi, &centroids16(codes, t));
        }
        for k in 16 * t.groups..seg.len {
            let i = bits::read(rec, seg.bit_offset + k * w, seg.width);
            tail(state, seg.start + k, seg.table[i as usize]);
        }
    }
}

/// Loads `x[j..j + 16]` as four f32x4 (panics, never reads out of bounds, if short).
#[inline]
#[target_feature(enable = "neon")]
fn load16(x: &[f32], j: usize) -> [float32x4_t; 4] {
    let s = &x[j..j + 16];
    // SAFETY: `s` holds 16 floats; each load reads 4 of them.
    unsafe {
        [
            vld1q_f32(s.as_ptr()),
            vld1q_f32(s.as_ptr().add(4)),
            vld1q_f32(s.as_ptr().add(8)),
            vld1q_f32(s.as_ptr().add(12)),
        ]
    }
}

/// Σ over sign bits of ±sq (the QJL inner product ⟨S q', sign⟩).
fn sign_dot(rec: &[u8], sb: usize, sq: &[f32], sqsum: f32) -> f32 {
    let mut pos = 0.0f32;
    for (j, &v) in sq.iter().enumerate() {
        if bits::read(rec, sb + j, 1) == 1 {
            pos += v;
        }
    }
    2.0 * pos - sqsum
}

/// Tiles of 4, 2 or 1 consecutive queries covering `0..g`.
fn tiles(g: usize) -> impl Iterator<Item = (usize, usize)> {
    super::query_tiles(g, 4)
}

/// Scores of `g` queries (`q`, `sq`, `sqsum` as prepared by the caller, coordinate order)
/// against the records of `chunk`, written to `out[qi·n + base + r]`.
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
    // SAFETY: this module is compiled only where NEON is enabled for the whole build
    // (the cfg on `mod neon`), so the CPU has it.
    unsafe { scores_neon(ctx, q, sq, sqsum, g, chunk, out, n, base) }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon")]
fn scores_neon(
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
    let tabs: Vec<SegTab> = ctx.segs.iter().map(|s| seg_tab(s)).collect();
    for (qi, tile) in tiles(g) {
        let args = (q, sq, sqsum, qi, n, base);
        match tile {
            4 => scores_tile::<4>(ctx, &tabs, args, chunk, out),
            2 => scores_tile::<2>(ctx, &tabs, args, chunk, out),
            _ => scores_tile::<1>(ctx, &tabs, args, chunk, out),
        }
    }
}

type ScoreArgs<'a> = (&'a [f32], &'a [f32], &'a [f32], usize, usize, usize);

#[target_feature(enable = "neon")]
fn scores_tile<const G: usize>(
    ctx: &Ctx,
    tabs: &[SegTab],
    (q, sq, sqsum, qi0, n, base): ScoreArgs<'_>,
    chunk: &[u8],
    out: &mut [f32],
) {
    let d = ctx.dim;
    let qs: [&[f32]; G] = std::array::from_fn(|k| &q[(qi0 + k) * d..(qi0 + k + 1) * d]);
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        // Four accumulators per query: independent FMA chains.
        let mut acc = ([[vdupq_n_f32(0.0); 4]; G], [0.0f32; G]);
        walk(
            ctx,
            tabs,
            rec,
            &mut acc,
            |(acc, _), j, c| {
                for (a, qk) in acc.iter_mut().zip(&qs) {
                    let qv = load16(qk, j);
                    for m in 0..4 {
                        a[m] = vfmaq_f32(a[m], c[m], qv[m]);
                    }
                }
            },
            |(_, tail), j, c| {
                for (t, qk) in tail.iter_mut().zip(&qs) {
                    *t += qk[j] * c;
                }
            },
        );
        let norm = read_f16(rec, ctx.norm_offset);
        for k in 0..G {
            let a = &acc.0[k];
            let mut dot =
                vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3]))) + acc.1[k];
            if let Some((sb, go, scale)) = ctx.qjl {
                let qk = qi0 + k;
                dot += read_f16(rec, go)
                    * scale
                    * sign_dot(rec, sb, &sq[qk * d..(qk + 1) * d], sqsum[qk]);
            }
            out[(qi0 + k) * n + base + r] = norm * dot;
        }
    }
}

/// Adds `Σ_r weights[qi·n + base + r] · x̂_r` (rotated domain, coordinate order) over the
/// records of `chunk` into `acc` (and the QJL sign sums into `acc_s`), for `g` weight rows.
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
    // SAFETY: this module is compiled only where NEON is enabled for the whole build
    // (the cfg on `mod neon`), so the CPU has it.
    unsafe { accumulate_neon(ctx, weights, g, n, base, chunk, acc, acc_s) }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon")]
fn accumulate_neon(
    ctx: &Ctx,
    weights: &[f32],
    g: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
    acc_s: &mut [f32],
) {
    let tabs: Vec<SegTab> = ctx.segs.iter().map(|s| seg_tab(s)).collect();
    let d = ctx.dim;
    for (qi, tile) in tiles(g) {
        let rows = &mut acc[qi * d..(qi + tile) * d];
        let rows_s = &mut acc_s[qi * d..(qi + tile) * d];
        let args = (weights, qi, n, base);
        match tile {
            4 => accumulate_tile::<4>(ctx, &tabs, args, chunk, rows, rows_s),
            2 => accumulate_tile::<2>(ctx, &tabs, args, chunk, rows, rows_s),
            _ => accumulate_tile::<1>(ctx, &tabs, args, chunk, rows, rows_s),
        }
    }
}

/// Records added per pass in `accumulate_tile`: each accumulator group is loaded and stored
/// once per `RECORDS` records instead of once per record (as in the AVX2 backend).
const RECORDS: usize = 4;

/// `rows` / `rows_s`: the tile's `G` accumulator rows of `dim` values each.
#[target_feature(enable = "neon")]
fn accumulate_tile<const G: usize>(
    ctx: &Ctx,
    tabs: &[SegTab],
    (weights, qi0, n, base): (&[f32], usize, usize, usize),
    chunk: &[u8],
    rows: &mut [f32],
    rows_s: &mut [f32],
) {
    let d = ctx.dim;
    // Records some row weighs, gathered until RECORDS are pending, then added in one pass
    // (in record order, so each coordinate sees the same FMA sequence as one at a time).
    let mut pending: [(&[u8], [f32; G]); RECORDS] = [(&[], [0.0; G]); RECORDS];
    let mut held = 0;
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        let s: [f32; G] = std::array::from_fn(|k| weights[(qi0 + k) * n + base + r] * norm);
        if s.iter().all(|&v| v == 0.0) {
            continue;
        }
        if let Some((sb, go, scale)) = ctx.qjl {
            let gs = read_f16(rec, go) * scale;
            for (k, row) in rows_s.chunks_exact_mut(d).enumerate() {
                let t = s[k] * gs;
                for (j, av) in row.iter_mut().enumerate() {
                    *av += if bits::read(rec, sb + j, 1) == 1 {
                        t
                    } else {
                        -t
                    };
                }
            }
        }
        pending[held] = (rec, s);
        held += 1;
        if held == RECORDS {
            add_records(ctx, tabs, rows, pending);
            held = 0;
        }
    }
    for &one in &pending[..held] {
        add_records(ctx, tabs, rows, [one]);
    }
}

/// Adds `Σ_r s_r[k] · ĉ_r` (each record's centroids) into row k of `rows`, for `R` records.
// Indexed loops: m and r each address several arrays at once (row quarter, centroids, weights).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "neon")]
fn add_records<const G: usize, const R: usize>(
    ctx: &Ctx,
    tabs: &[SegTab],
    rows: &mut [f32],
    records: [(&[u8], [f32; G]); R],
) {
    let d = ctx.dim;
    let recs: [&[u8]; R] = std::array::from_fn(|r| records[r].0);
    let s: [[f32; G]; R] = std::array::from_fn(|r| records[r].1);
    let mut sv = [[vdupq_n_f32(0.0); G]; R];
    for r in 0..R {
        for k in 0..G {
            sv[r][k] = vdupq_n_f32(s[r][k]);
        }
    }
    walk_records(
        ctx,
        tabs,
        recs,
        rows,
        |rows, j, c| {
            for k in 0..G {
                let row = &mut rows[k * d + j..k * d + j + 16];
                let p = row.as_mut_ptr();
                for m in 0..4 {
                    // SAFETY: `row` holds 16 floats; each access covers 4 of them.
                    unsafe {
                        let a = p.add(4 * m);
                        let mut v = vld1q_f32(a);
                        for r in 0..R {
                            v = vfmaq_f32(v, c[r][m], sv[r][k]);
                        }
                        vst1q_f32(a, v);
                    }
                }
            }
        },
        |rows, j, c| {
            for k in 0..G {
                for r in 0..R {
                    rows[k * d + j] += s[r][k] * c[r];
                }
            }
        },
    );
}

/// `walk` for `R` records in step (the accumulator's blocking): `f(state, j, centroids of
/// coordinates j..j+16 of each record)` per whole group of 16, `tail(state, coordinate,
/// centroid of each record)` for the rest.
#[inline]
#[target_feature(enable = "neon")]
fn walk_records<S: ?Sized, const R: usize>(
    ctx: &Ctx,
    tabs: &[SegTab],
    recs: [&[u8]; R],
    state: &mut S,
    mut f: impl FnMut(&mut S, usize, &[[float32x4_t; 4]; R]),
    mut tail: impl FnMut(&mut S, usize, [f32; R]),
) {
    for (seg, t) in ctx.segs.iter().zip(tabs) {
        let byte0 = seg.bit_offset / 8;
        let w = t.width;
        for gi in 0..t.groups {
            let mut c = [[vdupq_n_f32(0.0); 4]; R];
            for r in 0..R {
                let codes = codes16(group_bytes(recs[r], byte0 + 2 * w * gi, w), t);
                c[r] = centroids16(codes, t);
            }
            f(state, seg.start + 16 * gi, &c);
        }
        for k in 16 * t.groups..seg.len {
            let mut c = [0.0f32; R];
            for r in 0..R {
                c[r] = seg.table[bits::read(recs[r], seg.bit_offset + k * w, seg.width) as usize];
            }
            tail(state, seg.start + k, c);
        }
    }
}

/// Nearest-level indices and their centroids for `ys` (one segment's rotated values): the
/// number of thresholds at or below each value, as in the portable quantizer.
pub(crate) fn quantize(seg: &Seg, ys: &[f32], idx: &mut [u8], cents: &mut [f32]) {
    // SAFETY: this module is compiled only where NEON is enabled for the whole build
    // (the cfg on `mod neon`), so the CPU has it.
    unsafe { quantize_neon(seg, ys, idx, cents) }
}

#[target_feature(enable = "neon")]
fn quantize_neon(seg: &Seg, ys: &[f32], idx: &mut [u8], cents: &mut [f32]) {
    let levels = 1usize << seg.width.min(4);
    let thresholds = &seg.thresholds[..levels - 1];
    let planes = planes(seg);
    let groups = ys.len() / 16;
    for gi in 0..groups {
        let y = load16(ys, 16 * gi);
        let mut cnt = [vdupq_n_u32(0); 4];
        for &th in thresholds {
            let tv = vdupq_n_f32(th);
            for (c, yv) in cnt.iter_mut().zip(&y) {
                // A true comparison is all ones (−1): subtracting it counts one.
                *c = vsubq_u32(*c, vcgeq_f32(*yv, tv));
            }
        }
        let lo = vcombine_u16(vmovn_u32(cnt[0]), vmovn_u32(cnt[1]));
        let hi = vcombine_u16(vmovn_u32(cnt[2]), vmovn_u32(cnt[3]));
        let codes = vcombine_u8(vmovn_u16(lo), vmovn_u16(hi));
        let dst = &mut idx[16 * gi..16 * gi + 16];
        let cdst = &mut cents[16 * gi..16 * gi + 16];
        let [b0, b1, b2, b3] = std::array::from_fn(|b| vqtbl1q_u8(planes[b], codes));
        let c = interleave(b0, b1, b2, b3);
        // SAFETY: `dst` holds 16 bytes and `cdst` 16 floats; each store writes inside them.
        unsafe {
            vst1q_u8(dst.as_mut_ptr(), codes);
            for (m, cm) in c.iter().enumerate() {
                vst1q_f32(cdst.as_mut_ptr().add(4 * m), *cm);
            }
        }
    }
    for j in groups * 16..ys.len() {
        let k = thresholds.iter().filter(|&&t| ys[j] >= t).count();
        idx[j] = k as u8;
        cents[j] = seg.table[k];
    }
}

/// `bits::pack` for a byte-aligned start: 16 codes → 2·w whole bytes per step (w ≤ 4), the
/// rest through `bits::pack`. Same bytes, same `false` for a too-short `dst`.
pub(crate) fn pack(codes: &[u8], width: u8, dst: &mut [u8], bit_offset: usize) -> bool {
    // SAFETY: this module is compiled only where NEON is enabled for the whole build
    // (the cfg on `mod neon`), so the CPU has it.
    unsafe { pack_neon(codes, width, dst, bit_offset) }
}

#[target_feature(enable = "neon")]
fn pack_neon(codes: &[u8], width: u8, dst: &mut [u8], bit_offset: usize) -> bool {
    let w = width as usize;
    if !bit_offset.is_multiple_of(8) || !(1..=NARROW).contains(&w) {
        return bits::pack(codes, width, dst, bit_offset);
    }
    if (bit_offset + codes.len() * w).div_ceil(8) > dst.len() {
        return false;
    }
    let mask = vdupq_n_u8(((1u32 << w) - 1) as u8);
    let shl: [i8; 16] = std::array::from_fn(|k| ((w * k) % 8) as i8);
    // SAFETY: `shl` is exactly 16 readable bytes.
    let shl = unsafe { vld1q_s8(shl.as_ptr()) };
    let mut byte = bit_offset / 8;
    let mut it = codes.chunks_exact(16);
    for c in &mut it {
        let word = if w == 3 {
            c.iter()
                .enumerate()
                .fold(0u64, |acc, (k, &x)| acc | (u64::from(x & 7) << (3 * k)))
        } else {
            // SAFETY: `c` is exactly 16 readable bytes.
            let v = vandq_u8(unsafe { vld1q_u8(c.as_ptr()) }, mask);
            // Each code moved to its bit position within its byte; the 8/w codes sharing a
            // byte sit in adjacent lanes with disjoint bits, so pairwise adds OR them.
            let mut x = vshlq_u8(v, shl);
            for _ in 0..(8 / w).trailing_zeros() {
                x = vpaddq_u8(x, x);
            }
            vgetq_lane_u64::<0>(vreinterpretq_u64_u8(x))
        };
        dst[byte..byte + 2 * w].copy_from_slice(&word.to_le_bytes()[..2 * w]);
        byte += 2 * w;
    }
    bits::pack(it.remainder(), width, dst, byte * 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every width's unpacking and codebook lookup against `bits::read` and the table, bit
    /// for bit, on synthetic codebooks (no fitting: cheap under qemu) and random codes: one
    /// record of two segments, the second starting on a byte, each with a scalar tail.
    #[test]
    fn walk_reads_every_width_as_the_table_does() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for w in 1..=8u8 {
            let levels = 1usize << w;
            let mut table = [0f32; 256];
            for t in table.iter_mut().take(levels) {
                *t = f32::from_bits((next() as u32 & 0x007f_ffff) | 0x3f00_0000)
                    * if next() & 1 == 0 { 1.0 } else { -1.0 };
            }
            let (len0, len1) = (40usize, 37usize);
            let off1 = (len0 * w as usize).div_ceil(8) * 8;
            let bytes = (off1 + len1 * w as usize).div_ceil(8);
            let codes: Vec<u8> = (0..len0 + len1)
                .map(|_| (next() as usize % levels) as u8)
                .collect();
            let mut rec = vec![0u8; bytes];
            assert!(bits::pack(&codes[..len0], w, &mut rec, 0));
            assert!(bits::pack(&codes[len0..], w, &mut rec, off1));
            let seg = |start, len, bit_offset| Seg {
                start,
                len,
                width: w,
                bit_offset,
                table,
                thresholds: [f32::INFINITY; 16],
                lane_blocks: 0,
            };
            let ctx = Ctx {
                dim: len0 + len1,
                stride: bytes,
                segs: vec![seg(0, len0, 0), seg(len0, len1, off1)],
                norm_offset: 0,
                qjl: None,
                wide: w > 4,
                perm: (0..(len0 + len1) as u32).collect(),
                perm_planes: (0..(len0 + len1) as u32).collect(),
            };
            // SAFETY: NEON is part of the aarch64 baseline this module is built for.
            let got = unsafe {
                let tabs: Vec<SegTab> = ctx.segs.iter().map(|s| seg_tab(s)).collect();
                let mut got = vec![f32::NAN; ctx.dim];
                walk(
                    &ctx,
                    &tabs,
                    &rec,
                    &mut got,
                    |got, j, c| {
                        for (m, v) in c.iter().enumerate() {
                            vst1q_f32(got[j + 4 * m..].as_mut_ptr(), *v);
                        }
                    },
                    |got, j, c| got[j] = c,
                );
                got
            };
            for (j, (&code, g)) in codes.iter().zip(&got).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    table[code as usize].to_bits(),
                    "width {w} coordinate {j}"
                );
            }
        }
    }
}
