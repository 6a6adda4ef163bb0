//! AVX-512 kernels.
//!
//! Lane blocks (128 coordinates = 16·w bytes): lane i of a register receives the w bytes
//! holding coordinates 8i..8i+7 (a zero-extending load for w = 1, 2, a plain load for w = 4,
//! a masked load plus two dword permutes for w = 3); then each of the 8 codes per lane is
//! isolated with one shift and one mask and mapped to its centroid with one `vpermps` over
//! the 16-entry codebook register. Position 16·s + i of a block therefore holds coordinate
//! 8i + s, so queries and accumulators are kept in that order (`Ctx::perm`). Remaining
//! coordinates take 16 codes from a 64-bit word with a per-lane variable shift, then scalar.
//! Queries are processed in tiles of 1, 2, 4 or 8 so each record is unpacked once per tile,
//! and weighted sums add 4 records per pass (each accumulator slot stored once per 4).
//!
//! Safety contract of the `unsafe fn`s: the caller checked AVX-512F; `q`/`acc` hold at least
//! `g · dim` values, `weights` `g · n`, `out` `g · n`; `chunk` holds whole records of the
//! layout described by `ctx` (so every segment's code bytes lie inside each record).

use std::arch::x86_64::*;

use super::{Ctx, Seg};
use crate::bits;
use crate::codec::read_f16;

/// Nearest-level indices and their centroid values for `ys` (one segment): a 4-step
/// branch-free binary search per 16 values, thresholds looked up with `vpermps`.
///
/// # Safety
/// The CPU must support AVX-512F; `idx` and `cents` must be at least as long as `ys`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn quantize_avx512(seg: &Seg, ys: &[f32], idx: &mut [u8], cents: &mut [f32]) {
    assert!(idx.len() >= ys.len() && cents.len() >= ys.len());
    // SAFETY: the tables are [f32; 16] (one 512-bit load each).
    let (th, tab) = unsafe {
        (
            _mm512_loadu_ps(seg.thresholds.as_ptr()),
            _mm512_loadu_ps(seg.table.as_ptr()),
        )
    };
    let one = _mm512_set1_epi32(1);
    let groups = ys.len() / 16;
    for gi in 0..groups {
        // SAFETY: 16·gi + 16 ≤ ys.len() ≤ idx.len(), cents.len().
        unsafe {
            let y = _mm512_loadu_ps(ys.as_ptr().add(16 * gi));
            let mut i = _mm512_setzero_si512();
            for step in (0..seg.width).rev() {
                let cand = _mm512_add_epi32(i, _mm512_set1_epi32(1 << step));
                let t = _mm512_permutexvar_ps(_mm512_sub_epi32(cand, one), th);
                let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(y, t);
                i = _mm512_mask_mov_epi32(i, m, cand);
            }
            _mm_storeu_si128(
                idx.as_mut_ptr().add(16 * gi) as *mut __m128i,
                _mm512_cvtepi32_epi8(i),
            );
            _mm512_storeu_ps(
                cents.as_mut_ptr().add(16 * gi),
                _mm512_permutexvar_ps(i, tab),
            );
        }
    }
    let levels = 1usize << seg.width;
    for j in groups * 16..ys.len() {
        let k = seg.thresholds[..levels - 1]
            .iter()
            .filter(|&&t| ys[j] >= t)
            .count();
        idx[j] = k as u8;
        cents[j] = seg.table[k];
    }
}

/// `bits::pack` for a byte-aligned start using BMI2 `pext`: 8 codes → w bytes per step.
///
/// # Safety
/// The CPU must support BMI2.
#[target_feature(enable = "bmi2")]
pub(crate) unsafe fn pack_pext(codes: &[u8], width: u8, dst: &mut [u8], bit_offset: usize) -> bool {
    if !bit_offset.is_multiple_of(8) || width == 0 || width > 8 {
        return bits::pack(codes, width, dst, bit_offset);
    }
    let w = width as usize;
    let end = (bit_offset + codes.len() * w).div_ceil(8);
    if end > dst.len() {
        return false;
    }
    let mask = 0x0101_0101_0101_0101u64 * ((1u64 << w) - 1);
    let mut byte = bit_offset / 8;
    let mut it = codes.chunks_exact(8);
    for c in &mut it {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        let packed = _pext_u64(u64::from_le_bytes(a), mask).to_le_bytes();
        dst[byte..byte + w].copy_from_slice(&packed[..w]);
        byte += w;
    }
    bits::pack(it.remainder(), width, dst, byte * 8)
}

/// Per-segment registers and loop bounds.
struct SegRegs {
    table: __m512,
    shifts: __m512i,
    mask: __m512i,
    width: usize,
    /// For w = 3: dword index of each lane's first and second dword, and the bit shift.
    lane_lo: __m512i,
    lane_hi: __m512i,
    lane_shift: __m512i,
    lane_shift_hi: __m512i,
    lane_blocks: usize,
    /// First coordinate (relative to the segment) after the byte-lane blocks.
    general_from: usize,
    /// 16-code groups read from 64-bit words after the byte-lane blocks.
    general_groups: usize,
}

#[target_feature(enable = "avx512f")]
fn seg_regs(seg: &Seg) -> SegRegs {
    let w = seg.width as i32;
    // SAFETY: `table` is a [f32; 16], exactly one unaligned 512-bit load.
    let table = unsafe { _mm512_loadu_ps(seg.table.as_ptr()) };
    let general_from = seg.lane_blocks * 128;
    // Lane i's 8 codes start at bit 8·w·i: dword (8wi)/32, shift (8wi)%32.
    let lo: [i32; 16] = std::array::from_fn(|i| (8 * w * i as i32) / 32);
    let hi: [i32; 16] = std::array::from_fn(|i| ((8 * w * i as i32) / 32 + 1).min(15));
    let sh: [i32; 16] = std::array::from_fn(|i| (8 * w * i as i32) % 32);
    let sh_hi: [i32; 16] = std::array::from_fn(|i| 32 - sh[i]);
    // SAFETY: each array has exactly 16 i32 values (one 512-bit load).
    let (lane_lo, lane_hi, lane_shift, lane_shift_hi) = unsafe {
        (
            _mm512_loadu_si512(lo.as_ptr() as *const __m512i),
            _mm512_loadu_si512(hi.as_ptr() as *const __m512i),
            _mm512_loadu_si512(sh.as_ptr() as *const __m512i),
            _mm512_loadu_si512(sh_hi.as_ptr() as *const __m512i),
        )
    };
    let aligned = seg.bit_offset.is_multiple_of(8);
    SegRegs {
        table,
        shifts: _mm512_setr_epi32(
            0,
            w,
            2 * w,
            3 * w,
            4 * w,
            5 * w,
            6 * w,
            7 * w,
            0,
            w,
            2 * w,
            3 * w,
            4 * w,
            5 * w,
            6 * w,
            7 * w,
        ),
        mask: _mm512_set1_epi32((1 << w) - 1),
        width: seg.width as usize,
        lane_lo,
        lane_hi,
        lane_shift,
        lane_shift_hi,
        lane_blocks: seg.lane_blocks,
        general_from,
        general_groups: if aligned {
            (seg.len - general_from) / 16
        } else {
            0
        },
    }
}

/// Centroids of the 16 codes packed in the low 16·w bits of `word`.
#[inline]
#[target_feature(enable = "avx512f")]
fn centroids16(word: u64, r: &SegRegs) -> __m512 {
    let lo = _mm512_set1_epi32(word as u32 as i32);
    let hi = _mm512_set1_epi32((word >> (8 * r.width)) as u32 as i32);
    let v = _mm512_mask_blend_epi32(0xFF00, lo, hi);
    let idx = _mm512_and_si512(_mm512_srlv_epi32(v, r.shifts), r.mask);
    _mm512_permutexvar_ps(idx, r.table)
}

/// 8 bytes at `off` of `chunk`, zero-filled past its end.
#[inline(always)]
fn load_u64(chunk: &[u8], off: usize) -> u64 {
    match chunk.get(off..off + 8) {
        Some(s) => {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_le_bytes(a)
        }
        None => {
            let mut a = [0u8; 8];
            let rest = chunk.get(off..).unwrap_or(&[]);
            let k = rest.len().min(8);
            a[..k].copy_from_slice(&rest[..k]);
            u64::from_le_bytes(a)
        }
    }
}

#[inline(always)]
fn load_u16(buf: &[u8], off: usize) -> u16 {
    let lo = buf.get(off).copied().unwrap_or(0);
    let hi = buf.get(off + 1).copied().unwrap_or(0);
    u16::from_le_bytes([lo, hi])
}

/// Lane i ← the w bytes (little-endian) holding codes 8i..8i+7 of the block at `p`.
///
/// # Safety
/// `p` must point at 16·w readable bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn lanes(p: *const u8, r: &SegRegs) -> __m512i {
    // SAFETY (all arms): the reads cover exactly 16·w bytes from `p`.
    unsafe {
        match r.width {
            1 => _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)),
            2 => _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i)),
            4 => _mm512_loadu_si512(p as *const __m512i),
            _ => {
                // 16·w bytes = 4w dwords; the masked load never touches bytes past them.
                let mask: __mmask16 = ((1u32 << (4 * r.width)) - 1) as __mmask16;
                let v = _mm512_maskz_loadu_epi32(mask, p as *const i32);
                let lo = _mm512_permutexvar_epi32(r.lane_lo, v);
                let hi = _mm512_permutexvar_epi32(r.lane_hi, v);
                // Shift counts of 32 yield 0, which is what lanes starting on a dword need.
                _mm512_or_si512(
                    _mm512_srlv_epi32(lo, r.lane_shift),
                    _mm512_sllv_epi32(hi, r.lane_shift_hi),
                )
            }
        }
    }
}

/// Centroids of code `sub` (0..8) of every lane in `x`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_centroids(x: __m512i, sub: usize, r: &SegRegs) -> __m512 {
    let count = _mm_cvtsi32_si128((sub * r.width) as i32);
    let idx = _mm512_and_si512(_mm512_srl_epi32(x, count), r.mask);
    _mm512_permutexvar_ps(idx, r.table)
}

/// # Safety
/// See the module contract.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn scores(
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
    let regs: Vec<SegRegs> = ctx.segs.iter().map(|s| seg_regs(s)).collect();
    for (qi, tile) in super::query_tiles(g, 8) {
        // Up to 8 queries share each decoded code (a group of 8 query heads per KV head,
        // as in Gemma 4 E2B, decodes each key once).
        // SAFETY: forwarded module contract; qi + tile ≤ g.
        unsafe {
            match tile {
                8 => scores_tile::<8>(ctx, &regs, q, sq, sqsum, qi, chunk, out, n, base),
                4 => scores_tile::<4>(ctx, &regs, q, sq, sqsum, qi, chunk, out, n, base),
                2 => scores_tile::<2>(ctx, &regs, q, sq, sqsum, qi, chunk, out, n, base),
                _ => scores_tile::<1>(ctx, &regs, q, sq, sqsum, qi, chunk, out, n, base),
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn scores_tile<const G: usize>(
    ctx: &Ctx,
    regs: &[SegRegs],
    q: &[f32],
    sq: &[f32],
    sqsum: &[f32],
    qi0: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let d = ctx.dim;
    let stride = ctx.stride;
    let qs: [&[f32]; G] = std::array::from_fn(|k| &q[(qi0 + k) * d..(qi0 + k + 1) * d]);
    let qp: [*const f32; G] = std::array::from_fn(|k| qs[k].as_ptr());
    for r in 0..chunk.len() / stride {
        let off = r * stride;
        let rec = &chunk[off..off + stride];
        let rp = rec.as_ptr();
        let mut acc = [_mm512_setzero_ps(); G];
        let mut tail = [0.0f32; G];
        for (seg, rg) in ctx.segs.iter().zip(regs) {
            let byte0 = seg.bit_offset / 8;
            for blk in 0..rg.lane_blocks {
                // SAFETY: lane blocks lie inside the segment's code bytes of this record.
                let x = unsafe { lanes(rp.add(byte0 + 16 * rg.width * blk), rg) };
                let j0 = seg.start + blk * 128;
                for sub in 0..8 {
                    let c = lane_centroids(x, sub, rg);
                    for k in 0..G {
                        // SAFETY: j0 + 16·sub + 16 ≤ seg.start + seg.len ≤ d.
                        let qv = unsafe { _mm512_loadu_ps(qp[k].add(j0 + 16 * sub)) };
                        acc[k] = _mm512_fmadd_ps(c, qv, acc[k]);
                    }
                }
            }
            let w = rg.width;
            for gi in 0..rg.general_groups {
                let byte = off + byte0 + (rg.general_from + 16 * gi) * w / 8;
                let c = centroids16(load_u64(chunk, byte), rg);
                let j = seg.start + rg.general_from + 16 * gi;
                for k in 0..G {
                    // SAFETY: j + 16 ≤ seg.start + seg.len ≤ d.
                    let qv = unsafe { _mm512_loadu_ps(qp[k].add(j)) };
                    acc[k] = _mm512_fmadd_ps(c, qv, acc[k]);
                }
            }
            for kk in rg.general_from + 16 * rg.general_groups..seg.len {
                let i = bits::read(rec, seg.bit_offset + kk * w, seg.width);
                let c = seg.table[i as usize];
                for k in 0..G {
                    tail[k] += qs[k][seg.start + kk] * c;
                }
            }
        }
        let norm = read_f16(rec, ctx.norm_offset);
        let mut qjl = [0.0f32; G];
        if let Some((sb, go, scale)) = ctx.qjl {
            let sqs: [&[f32]; G] = std::array::from_fn(|k| &sq[(qi0 + k) * d..(qi0 + k + 1) * d]);
            let mut pos = [_mm512_setzero_ps(); G];
            let mut pos_tail = [0.0f32; G];
            let groups = if sb % 8 == 0 { d / 16 } else { 0 };
            for gi in 0..groups {
                let m = load_u16(rec, sb / 8 + 2 * gi);
                for k in 0..G {
                    // SAFETY: 16·gi + 16 ≤ d.
                    let v = unsafe { _mm512_loadu_ps(sqs[k].as_ptr().add(16 * gi)) };
                    pos[k] = _mm512_mask_add_ps(pos[k], m, pos[k], v);
                }
            }
            for j in groups * 16..d {
                if bits::read(rec, sb + j, 1) == 1 {
                    for (p, row) in pos_tail.iter_mut().zip(&sqs) {
                        *p += row[j];
                    }
                }
            }
            let gamma = read_f16(rec, go) * scale;
            for k in 0..G {
                let p = _mm512_reduce_add_ps(pos[k]) + pos_tail[k];
                qjl[k] = gamma * (2.0 * p - sqsum[qi0 + k]);
            }
        }
        for k in 0..G {
            let dot = _mm512_reduce_add_ps(acc[k]) + tail[k];
            out[(qi0 + k) * n + base + r] = norm * (dot + qjl[k]);
        }
    }
}

/// # Safety
/// See the module contract.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn accumulate(
    ctx: &Ctx,
    weights: &[f32],
    g: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
    acc_s: &mut [f32],
) {
    let regs: Vec<SegRegs> = ctx.segs.iter().map(|s| seg_regs(s)).collect();
    for (qi, tile) in super::query_tiles(g, 8) {
        // SAFETY: forwarded module contract; qi + tile ≤ g.
        unsafe {
            match tile {
                8 => accumulate_tile::<8>(ctx, &regs, weights, qi, n, base, chunk, acc, acc_s),
                4 => accumulate_tile::<4>(ctx, &regs, weights, qi, n, base, chunk, acc, acc_s),
                2 => accumulate_tile::<2>(ctx, &regs, weights, qi, n, base, chunk, acc, acc_s),
                _ => accumulate_tile::<1>(ctx, &regs, weights, qi, n, base, chunk, acc, acc_s),
            }
        }
    }
}

/// Records added per pass in `accumulate_tile`: each accumulator slot is loaded and stored
/// once per `RECORDS` records instead of once per record (stores, not FMAs, bound the
/// one-record loop), as in the AVX2 and NEON backends.
const RECORDS: usize = 4;

/// Weighted sums of rows `qi0..qi0 + G` over every record of `chunk`.
///
/// # Safety
/// See the module contract.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_tile<const G: usize>(
    ctx: &Ctx,
    regs: &[SegRegs],
    weights: &[f32],
    qi0: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
    acc_s: &mut [f32],
) {
    let d = ctx.dim;
    let stride = ctx.stride;
    assert!(acc.len() >= (qi0 + G) * d && acc_s.len() >= (qi0 + G) * d);
    let ap: [*mut f32; G] = std::array::from_fn(|k| acc[(qi0 + k) * d..].as_mut_ptr());
    // Records some row weighs, gathered until RECORDS are pending, then added in one pass
    // (in record order, so each coordinate sees the same FMA sequence as one at a time).
    let mut pending: [(&[u8], [f32; G]); RECORDS] = [(&[], [0.0; G]); RECORDS];
    let mut held = 0;
    for (r, rec) in chunk.chunks_exact(stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        let s: [f32; G] = std::array::from_fn(|k| weights[(qi0 + k) * n + base + r] * norm);
        // A record no row weighs (masked out) is skipped; one that some row weighs is added
        // to every row of the tile (a zero weight adds zero).
        if s.iter().all(|&v| v == 0.0) {
            continue;
        }
        if let Some((sb, go, scale)) = ctx.qjl {
            add_signs(
                rec,
                sb,
                read_f16(rec, go) * scale,
                &s,
                &mut acc_s[qi0 * d..],
                d,
            );
        }
        pending[held] = (rec, s);
        held += 1;
        if held == RECORDS {
            // SAFETY: module contract; the rows lie within acc (asserted above).
            unsafe { add_records(ctx, regs, &ap, pending) };
            held = 0;
        }
    }
    for &one in &pending[..held] {
        // SAFETY: as above.
        unsafe { add_records(ctx, regs, &ap, [one]) };
    }
}

/// Adds `Σ_r s_r[k] · ĉ_r` (each record's centroids) into row k at `ap[k]`, for `R` records.
///
/// # Safety
/// See the module contract; every `ap[k]` points at `d` writable values.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add_records<const G: usize, const R: usize>(
    ctx: &Ctx,
    regs: &[SegRegs],
    ap: &[*mut f32; G],
    records: [(&[u8], [f32; G]); R],
) {
    let recs: [&[u8]; R] = std::array::from_fn(|r| records[r].0);
    let s: [[f32; G]; R] = std::array::from_fn(|r| records[r].1);
    let sv: [[__m512; G]; R] =
        std::array::from_fn(|r| std::array::from_fn(|k| _mm512_set1_ps(s[r][k])));
    // Plain loops over r, not `array::from_fn`, inside: the lookups must inline.
    for (seg, rg) in ctx.segs.iter().zip(regs) {
        let byte0 = seg.bit_offset / 8;
        let w = rg.width;
        for blk in 0..rg.lane_blocks {
            let at = byte0 + 16 * w * blk;
            let mut x = [_mm512_setzero_si512(); R];
            for r in 0..R {
                // SAFETY: lane blocks lie inside the segment's code bytes of each record.
                x[r] = unsafe { lanes(recs[r].as_ptr().add(at), rg) };
            }
            let j0 = seg.start + blk * 128;
            for sub in 0..8 {
                let mut c = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    c[r] = lane_centroids(x[r], sub, rg);
                }
                for k in 0..G {
                    // SAFETY: j0 + 16·sub + 16 ≤ d and row k has d values.
                    unsafe {
                        let p = ap[k].add(j0 + 16 * sub);
                        let mut a = _mm512_loadu_ps(p);
                        for r in 0..R {
                            a = _mm512_fmadd_ps(c[r], sv[r][k], a);
                        }
                        _mm512_storeu_ps(p, a);
                    }
                }
            }
        }
        for gi in 0..rg.general_groups {
            let at = byte0 + (rg.general_from + 16 * gi) * w / 8;
            let j = seg.start + rg.general_from + 16 * gi;
            let mut c = [_mm512_setzero_ps(); R];
            for r in 0..R {
                c[r] = centroids16(load_u64(recs[r], at), rg);
            }
            for k in 0..G {
                // SAFETY: j + 16 ≤ d and row k has d values.
                unsafe {
                    let p = ap[k].add(j);
                    let mut a = _mm512_loadu_ps(p);
                    for r in 0..R {
                        a = _mm512_fmadd_ps(c[r], sv[r][k], a);
                    }
                    _mm512_storeu_ps(p, a);
                }
            }
        }
        for kk in rg.general_from + 16 * rg.general_groups..seg.len {
            let at = seg.bit_offset + kk * w;
            for r in 0..R {
                let c = seg.table[bits::read(recs[r], at, seg.width) as usize];
                for k in 0..G {
                    // SAFETY: seg.start + kk < d and row k has d values.
                    unsafe { *ap[k].add(seg.start + kk) += s[r][k] * c };
                }
            }
        }
    }
}

/// The QJL sign term: row k of `rows_s` (rows of `d`) gains ±`s[k] · γ·scale` per sign bit.
#[target_feature(enable = "avx512f")]
fn add_signs<const G: usize>(
    rec: &[u8],
    sb: usize,
    gamma_scale: f32,
    s: &[f32; G],
    rows_s: &mut [f32],
    d: usize,
) {
    let t: [f32; G] = std::array::from_fn(|k| s[k] * gamma_scale);
    let groups = if sb.is_multiple_of(8) { d / 16 } else { 0 };
    for gi in 0..groups {
        let m = load_u16(rec, sb / 8 + 2 * gi);
        for k in 0..G {
            let row = &mut rows_s[k * d + 16 * gi..k * d + 16 * gi + 16];
            let v = _mm512_mask_blend_ps(m, _mm512_set1_ps(-t[k]), _mm512_set1_ps(t[k]));
            // SAFETY: `row` has exactly 16 values.
            unsafe {
                _mm512_storeu_ps(
                    row.as_mut_ptr(),
                    _mm512_add_ps(_mm512_loadu_ps(row.as_ptr()), v),
                );
            }
        }
    }
    for j in groups * 16..d {
        let plus = bits::read(rec, sb + j, 1) == 1;
        for k in 0..G {
            rows_s[k * d + j] += if plus { t[k] } else { -t[k] };
        }
    }
}

/// Wide codes (5 to 8 bits, any codec without QJL) scored in AVX-512: each record's codes
/// are unpacked 16 at a time (bytes widened for 8 bits; else two 8-code words, each split
/// in two 32-bit halves and shifted lane by lane), mapped to their centroids by one
/// two-register permute (5 bits) or one gather from the 256-entry table, and fused with up
/// to 8 queries, so a record is decoded once per tile of queries rather
/// than once per query. Coordinates in order (the codec keeps no lane blocks when wide).
///
/// # Safety
/// See the module contract; `ctx.qjl` is `None` and no segment has lane blocks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn scores_wide(
    ctx: &Ctx,
    q: &[f32],
    g: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    for (qi, tile) in super::query_tiles(g, 8) {
        // SAFETY: forwarded contract; qi + tile ≤ g.
        unsafe {
            match tile {
                8 => scores_wide_tile::<8>(ctx, q, qi, chunk, out, n, base),
                4 => scores_wide_tile::<4>(ctx, q, qi, chunk, out, n, base),
                2 => scores_wide_tile::<2>(ctx, q, qi, chunk, out, n, base),
                _ => scores_wide_tile::<1>(ctx, q, qi, chunk, out, n, base),
            }
        }
    }
}

/// The centroids of the 16 codes of width `w` starting at byte `at` of `rec` (zero past
/// its end): codes 0..4 and 4..8 in the first word's two 4w-bit halves, 8..16 likewise in
/// the word at `at + w`.
#[inline]
#[target_feature(enable = "avx512f")]
fn wide_centroids16(rec: &[u8], at: usize, w: usize, shifts: __m512i, seg: &Seg) -> __m512 {
    let idx = if w == 8 {
        // Byte codes: widened as they are.
        match rec.get(at..at + 16) {
            // SAFETY: the slice holds the 16 bytes loaded.
            Some(b) => _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(b.as_ptr().cast()) }),
            None => {
                let (lo, hi) = (load_u64(rec, at), load_u64(rec, at + 8));
                _mm512_cvtepu8_epi32(_mm_set_epi64x(hi as i64, lo as i64))
            }
        }
    } else {
        let (lo, hi) = (load_u64(rec, at), load_u64(rec, at + w));
        let (a, b) = (lo as u32 as i32, (lo >> (4 * w)) as u32 as i32);
        let (c, d) = (hi as u32 as i32, (hi >> (4 * w)) as u32 as i32);
        let v = _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
        _mm512_and_si512(
            _mm512_srlv_epi32(v, shifts),
            _mm512_set1_epi32((1 << w) - 1),
        )
    };
    if w == 5 {
        // 32 levels: one two-register permute, no memory access.
        // SAFETY: the table holds 256 floats; these loads read its first 32.
        let (t0, t1) = unsafe {
            (
                _mm512_loadu_ps(seg.table.as_ptr()),
                _mm512_loadu_ps(seg.table.as_ptr().add(16)),
            )
        };
        return _mm512_permutex2var_ps(t0, idx, t1);
    }
    // SAFETY: every index is below 2^w ≤ 256, the table's length.
    unsafe { _mm512_i32gather_ps::<4>(idx, seg.table.as_ptr()) }
}

/// Records scored together by `scores_wide_tile`: each query load serves both.
const WIDE_RECORDS: usize = 2;

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn scores_wide_tile<const G: usize>(
    ctx: &Ctx,
    q: &[f32],
    qi0: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let d = ctx.dim;
    let qs: [&[f32]; G] = std::array::from_fn(|k| &q[(qi0 + k) * d..(qi0 + k + 1) * d]);
    let recs: Vec<&[u8]> = chunk.chunks_exact(ctx.stride).collect();
    for (pair, r0) in recs.chunks(WIDE_RECORDS).zip((0..).step_by(WIDE_RECORDS)) {
        // An odd last record is scored twice, its second result dropped.
        let pr: [&[u8]; WIDE_RECORDS] = std::array::from_fn(|i| pair[i.min(pair.len() - 1)]);
        let mut acc = [[_mm512_setzero_ps(); G]; WIDE_RECORDS];
        let mut tail = [[0.0f32; G]; WIDE_RECORDS];
        for seg in &ctx.segs {
            let w = seg.width as usize;
            let wi = w as i32;
            let shifts = _mm512_setr_epi32(
                0,
                wi,
                2 * wi,
                3 * wi,
                0,
                wi,
                2 * wi,
                3 * wi,
                0,
                wi,
                2 * wi,
                3 * wi,
                0,
                wi,
                2 * wi,
                3 * wi,
            );
            let groups = if seg.bit_offset.is_multiple_of(8) {
                seg.len / 16
            } else {
                0
            };
            for gi in 0..groups {
                let at = seg.bit_offset / 8 + 2 * w * gi;
                let c: [__m512; WIDE_RECORDS] =
                    std::array::from_fn(|i| wide_centroids16(pr[i], at, w, shifts, seg));
                let j = seg.start + 16 * gi;
                for k in 0..G {
                    // SAFETY: j + 16 ≤ seg.start + seg.len ≤ d.
                    let qv = unsafe { _mm512_loadu_ps(qs[k].as_ptr().add(j)) };
                    for i in 0..WIDE_RECORDS {
                        acc[i][k] = _mm512_fmadd_ps(c[i], qv, acc[i][k]);
                    }
                }
            }
            for kk in 16 * groups..seg.len {
                for (rec, t) in pr.iter().zip(tail.iter_mut()) {
                    let c = seg.table[bits::read(rec, seg.bit_offset + kk * w, seg.width) as usize];
                    for k in 0..G {
                        t[k] += qs[k][seg.start + kk] * c;
                    }
                }
            }
        }
        for (i, rec) in pair.iter().enumerate() {
            let norm = read_f16(rec, ctx.norm_offset);
            for k in 0..G {
                out[(qi0 + k) * n + base + r0 + i] =
                    norm * (_mm512_reduce_add_ps(acc[i][k]) + tail[i][k]);
            }
        }
    }
}
