//! AVX2 kernels for x86-64 CPUs without AVX-512 (most desktop parts). Same structure and
//! lane order as the AVX-512 backend (see `x86.rs`), with 8-lane registers: a 128-coordinate
//! block is read as two halves of 8 lanes. 16-entry codebooks (4-bit) are scored and summed
//! in their own order (`Ctx::perm_planes`): centroids made from 32 code bytes at a time by
//! byte-plane `pshufb` lookups (`plane_centroids`); a 4-bit segment's coordinates past its
//! last whole 128-coordinate block by two 8-entry `vpermps` lookups and a blend on the
//! code's top bit. A 4-bit lane block's scores are formed in 16-bit fixed point
//! (`FixedQueries`, `fixed_chunk`): the query and the centroids as integers, multiplied and
//! added in pairs by `pmaddwd`, one float conversion per 64 coordinates; its sums stay in
//! floats. Wide codebooks (5 to 8 bits) are
//! scored and summed from whole code words (`WideBook`), in coordinate order but for a 5-bit
//! segment's whole 32-code blocks, made floats by byte planes as the 4-bit ones
//! (`centroids32`, in `Ctx::perm_planes` order); their sums run here on AVX-512 CPUs too. The QJL sign term of `prod` stays scalar (that variant is not
//! meant for the hot path).
//!
//! Safety contract of the `unsafe fn`s: as in `x86.rs`, with AVX2+FMA instead of AVX-512F.

use std::arch::x86_64::*;

use super::{Ctx, Seg};
use crate::bits;
use crate::codec::read_f16;

struct SegRegs {
    table_lo: __m256,
    table_hi: __m256,
    shifts: __m256i,
    mask: __m256i,
    width: usize,
    /// For w = 3: dword index of each lane's first and second dword, and the bit shifts.
    lane_lo: __m256i,
    lane_hi: __m256i,
    lane_shift: __m256i,
    lane_shift_hi: __m256i,
    lane_blocks: usize,
    general_from: usize,
    general_groups: usize,
    /// For w = 4: byte b of every centroid's f32 bits, a 16-entry `pshufb` table in both
    /// 128-bit halves, for b = 0..4 (`plane_centroids`).
    planes: [__m256i; 4],
    /// For w = 4: the low and high byte of every centroid in 16-bit fixed point
    /// (`fixed_table`), as `pshufb` tables (`fixed_chunk`).
    fixed_planes: [__m256i; 2],
}

#[target_feature(enable = "avx2,fma")]
fn seg_regs(seg: &Seg) -> SegRegs {
    let w = seg.width as i32;
    let lo: [i32; 8] = std::array::from_fn(|i| (8 * w * i as i32) / 32);
    let hi: [i32; 8] = std::array::from_fn(|i| ((8 * w * i as i32) / 32 + 1).min(7));
    let sh: [i32; 8] = std::array::from_fn(|i| (8 * w * i as i32) % 32);
    let sh_hi: [i32; 8] = std::array::from_fn(|i| 32 - sh[i]);
    let general_from = seg.lane_blocks * 128;
    // SAFETY: every source has exactly 8 32-bit values (one 256-bit load each).
    unsafe {
        SegRegs {
            table_lo: _mm256_loadu_ps(seg.table.as_ptr()),
            table_hi: _mm256_loadu_ps(seg.table.as_ptr().add(8)),
            shifts: _mm256_setr_epi32(0, w, 2 * w, 3 * w, 4 * w, 5 * w, 6 * w, 7 * w),
            mask: _mm256_set1_epi32((1 << w) - 1),
            width: seg.width as usize,
            lane_lo: _mm256_loadu_si256(lo.as_ptr() as *const __m256i),
            lane_hi: _mm256_loadu_si256(hi.as_ptr() as *const __m256i),
            lane_shift: _mm256_loadu_si256(sh.as_ptr() as *const __m256i),
            lane_shift_hi: _mm256_loadu_si256(sh_hi.as_ptr() as *const __m256i),
            lane_blocks: seg.lane_blocks,
            general_from,
            general_groups: if seg.bit_offset.is_multiple_of(8) {
                (seg.len - general_from) / 16
            } else {
                0
            },
            planes: std::array::from_fn(|b| {
                let bytes: [u8; 16] =
                    std::array::from_fn(|k| seg.table[k].to_bits().to_le_bytes()[b]);
                _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast()))
            }),
            fixed_planes: {
                let (ints, _) = fixed_table::<16>(seg);
                std::array::from_fn(|b| {
                    let bytes: [u8; 16] = std::array::from_fn(|k| ints[k].to_le_bytes()[b]);
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast()))
                })
            },
        }
    }
}

/// Centroids of the codes in the low bits of each lane of `idx`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lookup(idx: __m256i, r: &SegRegs) -> __m256 {
    if r.width < 4 {
        return _mm256_permutevar8x32_ps(r.table_lo, idx);
    }
    lookup16(r.table_lo, r.table_hi, idx)
}

/// The entries of a 16-entry table held as two eight-entry halves that bits 0–3 of each lane
/// of `idx` name: a permute per half picks by the low three bits, bit 3 the half (blendv
/// reads the sign bit).
#[inline]
#[target_feature(enable = "avx2")]
fn lookup16(lo: __m256, hi: __m256, idx: __m256i) -> __m256 {
    let (lo, hi) = (
        _mm256_permutevar8x32_ps(lo, idx),
        _mm256_permutevar8x32_ps(hi, idx),
    );
    _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
}

/// Lane i ← the w bytes (little-endian) holding codes 8i..8i+7 of the half block at `p`.
///
/// # Safety
/// `p` must point at 8·w readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lanes(p: *const u8, r: &SegRegs) -> __m256i {
    // SAFETY (all arms): the reads cover exactly 8·w bytes from `p`.
    unsafe {
        match r.width {
            1 => _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)),
            2 => _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
            4 => _mm256_loadu_si256(p as *const __m256i),
            _ => {
                // 8·w bytes = 2w dwords; the masked load never touches bytes past them.
                let m: [i32; 8] = std::array::from_fn(|i| if i < 2 * r.width { -1 } else { 0 });
                let mask = _mm256_loadu_si256(m.as_ptr() as *const __m256i);
                let v = _mm256_maskload_epi32(p as *const i32, mask);
                let lo = _mm256_permutevar8x32_epi32(v, r.lane_lo);
                let hi = _mm256_permutevar8x32_epi32(v, r.lane_hi);
                _mm256_or_si256(
                    _mm256_srlv_epi32(lo, r.lane_shift),
                    _mm256_sllv_epi32(hi, r.lane_shift_hi),
                )
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn lane_centroids(x: __m256i, sub: usize, r: &SegRegs) -> __m256 {
    let count = _mm_cvtsi32_si128((sub * r.width) as i32);
    lookup(_mm256_and_si256(_mm256_srl_epi32(x, count), r.mask), r)
}

/// Centroids of 8 codes packed in the low 8·w bits of `word`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn centroids8(word: u32, r: &SegRegs) -> __m256 {
    let v = _mm256_set1_epi32(word as i32);
    lookup(_mm256_and_si256(_mm256_srlv_epi32(v, r.shifts), r.mask), r)
}

fn load_u64(buf: &[u8], off: usize) -> u64 {
    // Whole words (nearly every read) as one load; the record's last bytes zero-padded.
    if let Some(Ok(a)) = buf.get(off..off.saturating_add(8)).map(<[u8; 8]>::try_from) {
        return u64::from_le_bytes(a);
    }
    let mut a = [0u8; 8];
    let rest = buf.get(off..).unwrap_or(&[]);
    let k = rest.len().min(8);
    a[..k].copy_from_slice(&rest[..k]);
    u64::from_le_bytes(a)
}

/// The sums of the lanes of each of `Q` vectors, four at a time by `hadd` (queries past
/// `Q` padded with zeros), each in the same order whatever `Q` is: a query's score does not
/// depend on the tile it was scored in.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsums<const Q: usize>(v: &[__m256; Q]) -> [f32; Q] {
    let mut out = [0f32; Q];
    for q0 in (0..Q).step_by(4) {
        let at = |k: usize| v.get(q0 + k).copied().unwrap_or(_mm256_setzero_ps());
        let s = _mm256_hadd_ps(_mm256_hadd_ps(at(0), at(1)), _mm256_hadd_ps(at(2), at(3)));
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let mut four = [0f32; 4];
        // SAFETY: four holds 4 floats.
        unsafe { _mm_storeu_ps(four.as_mut_ptr(), s) };
        for (k, &x) in four.iter().enumerate().take(Q - q0) {
            out[q0 + k] = x;
        }
    }
    out
}

/// The centroids of the 64 4-bit codes in the 32 bytes at `p`, as eight vectors of eight
/// floats: vector `4·hf + g` lane `4·L + e` is the centroid of nibble `hf` of byte
/// `16·L + 4·g + e`. Each f32 is assembled from its four bytes, looked up by `pshufb` in
/// `r.planes` and interleaved by unpacks: in-lane shuffles, where two cross-lane `vpermps`
/// and a blend per 8 codes bound the scoring loop (about 1.4× the rate in a one-core test).
///
/// # Safety
/// `p` must point at 32 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_centroids(p: *const u8, r: &SegRegs) -> [__m256; 8] {
    // SAFETY: the caller's contract.
    let v = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    let m = _mm256_set1_epi8(0x0F);
    let nibbles = [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
    ];
    let mut out = [_mm256_setzero_ps(); 8];
    for (hf, idx) in nibbles.into_iter().enumerate() {
        let b: [__m256i; 4] = std::array::from_fn(|k| _mm256_shuffle_epi8(r.planes[k], idx));
        let (w01l, w01h) = (
            _mm256_unpacklo_epi8(b[0], b[1]),
            _mm256_unpackhi_epi8(b[0], b[1]),
        );
        let (w23l, w23h) = (
            _mm256_unpacklo_epi8(b[2], b[3]),
            _mm256_unpackhi_epi8(b[2], b[3]),
        );
        out[4 * hf] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(w01l, w23l));
        out[4 * hf + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(w01l, w23l));
        out[4 * hf + 2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(w01h, w23h));
        out[4 * hf + 3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(w01h, w23h));
    }
    out
}

/// Calls `f(position, centroids of 8 coordinates)` for every 8-coordinate SIMD slot of the
/// record (positions in SIMD order: `Ctx::perm_planes`), then `tail(coordinate, centroid)`
/// for the rest. 4-bit lane blocks go by `plane_centroids`, other widths lane by lane.
/// With `FIXED`, the 4-bit lane blocks are left out (`fixed_chunk` scores them).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn walk<const FIXED: bool>(
    ctx: &Ctx,
    regs: &[SegRegs],
    rec: &[u8],
    mut f: impl FnMut(usize, __m256),
    mut tail: impl FnMut(usize, f32),
) {
    let rp = rec.as_ptr();
    for (seg, rg) in ctx.segs.iter().zip(regs) {
        let byte0 = seg.bit_offset / 8;
        let w = rg.width;
        if w == 4 && !FIXED {
            for chunk in 0..2 * rg.lane_blocks {
                // SAFETY: the block's 64 bytes lie inside this record's code area.
                let c = unsafe { plane_centroids(rp.add(byte0 + 32 * chunk), rg) };
                for (k, c) in c.into_iter().enumerate() {
                    f(seg.start + 64 * chunk + 8 * k, c);
                }
            }
        }
        for blk in (if w == 4 { rg.lane_blocks } else { 0 })..rg.lane_blocks {
            for h in 0..2 {
                // SAFETY: the half block's 8·w bytes lie inside this record's code area.
                let x = unsafe { lanes(rp.add(byte0 + 16 * w * blk + 8 * w * h), rg) };
                let j0 = seg.start + blk * 128 + 8 * h;
                for sub in 0..8 {
                    f(j0 + 16 * sub, lane_centroids(x, sub, rg));
                }
            }
        }
        for gi in 0..rg.general_groups {
            let word = load_u64(rec, byte0 + (rg.general_from + 16 * gi) * w / 8);
            let j = seg.start + rg.general_from + 16 * gi;
            f(j, centroids8(word as u32, rg));
            f(j + 8, centroids8((word >> (8 * w)) as u32, rg));
        }
        for kk in rg.general_from + 16 * rg.general_groups..seg.len {
            let i = bits::read(rec, seg.bit_offset + kk * w, seg.width);
            tail(seg.start + kk, seg.table[i as usize]);
        }
    }
}

/// `walk` for `R` records in step: calls `f(position, centroids of 8 coordinates of each
/// record)` for every 8-coordinate SIMD slot (positions in SIMD order), then `tail(coordinate,
/// centroid of each record)` for the rest. The accumulator's blocking; scores keep `walk`,
/// whose single-record code LLVM schedules better (through this one they ran ~1.4× slower).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn walk_records<const R: usize>(
    ctx: &Ctx,
    regs: &[SegRegs],
    recs: [&[u8]; R],
    mut f: impl FnMut(usize, [__m256; R]),
    mut tail: impl FnMut(usize, [f32; R]),
) {
    // Plain loops over r, not `array::from_fn`: a closure passed through from_fn need not
    // inline here, and the lookups must.
    for (seg, rg) in ctx.segs.iter().zip(regs) {
        let byte0 = seg.bit_offset / 8;
        let w = rg.width;
        if w == 4 {
            // 4-bit lane blocks by `plane_centroids`, in `Ctx::perm_planes` order, as `walk`.
            for chunk in 0..2 * rg.lane_blocks {
                // Slot k of every record together: `ck[k][r]`.
                let mut ck = [[_mm256_setzero_ps(); R]; 8];
                for r in 0..R {
                    // SAFETY: the block's 64 bytes lie inside each record's code area.
                    let c =
                        unsafe { plane_centroids(recs[r].as_ptr().add(byte0 + 32 * chunk), rg) };
                    for (k, v) in c.into_iter().enumerate() {
                        ck[k][r] = v;
                    }
                }
                for (k, c) in ck.into_iter().enumerate() {
                    f(seg.start + 64 * chunk + 8 * k, c);
                }
            }
        }
        for blk in (if w == 4 { rg.lane_blocks } else { 0 })..rg.lane_blocks {
            for h in 0..2 {
                let at = byte0 + 16 * w * blk + 8 * w * h;
                let mut x = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    // SAFETY: the half block's 8·w bytes lie inside each record's code area.
                    x[r] = unsafe { lanes(recs[r].as_ptr().add(at), rg) };
                }
                let j0 = seg.start + blk * 128 + 8 * h;
                for sub in 0..8 {
                    let mut c = [_mm256_setzero_ps(); R];
                    for r in 0..R {
                        c[r] = lane_centroids(x[r], sub, rg);
                    }
                    f(j0 + 16 * sub, c);
                }
            }
        }
        for gi in 0..rg.general_groups {
            let at = byte0 + (rg.general_from + 16 * gi) * w / 8;
            let j = seg.start + rg.general_from + 16 * gi;
            let (mut lo, mut hi) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
            for r in 0..R {
                let word = load_u64(recs[r], at);
                lo[r] = centroids8(word as u32, rg);
                hi[r] = centroids8((word >> (8 * w)) as u32, rg);
            }
            f(j, lo);
            f(j + 8, hi);
        }
        for kk in rg.general_from + 16 * rg.general_groups..seg.len {
            let at = seg.bit_offset + kk * w;
            let mut c = [0.0f32; R];
            for r in 0..R {
                c[r] = seg.table[bits::read(recs[r], at, seg.width) as usize];
            }
            tail(seg.start + kk, c);
        }
    }
}

/// The largest magnitude of a query coordinate and of a centroid in 16-bit fixed point. A
/// lane of `fixed_chunk` adds 8 products (two per `pmaddwd`, four of them), so
/// 8 · `FIXED_ONE`² must stay within an i32: 8 · 16383² < 2³¹.
const FIXED_ONE: f32 = 16383.0;

/// A segment's first `N` centroids (16 at 4 bits, 32 at 5) as integers `round(c / step)`
/// with `step` = the largest |c| / `FIXED_ONE` (so each is within `step / 2` of its
/// centroid: ~3·10⁻⁵ of the largest), and that `step`. An all-zero codebook has step 0 and
/// zeros.
fn fixed_table<const N: usize>(seg: &Seg) -> ([i16; N], f32) {
    let top = seg.table[..N].iter().fold(0f32, |m, c| m.max(c.abs()));
    if top == 0.0 || !top.is_finite() {
        return ([0; N], 0.0);
    }
    let step = top / FIXED_ONE;
    (
        std::array::from_fn(|k| (seg.table[k] / step).round() as i16),
        step,
    )
}

/// Position `m` (0..16) of the i16 vector `ab` (0: `unpacklo`, 1: `unpackhi`) that the
/// fixed-point kernels make from 32 lookup bytes: the byte it came from.
fn fixed_byte(ab: usize, m: usize) -> usize {
    8 * ab + if m < 8 { m } else { 16 + m - 8 }
}

/// One 64-coordinate chunk a record's codes are scored by in fixed point: two halves of a
/// narrow codec's 4-bit lane block (`fixed_chunk`), or two whole 32-code blocks of a wide
/// codec's byte-aligned 5-bit segment (`fixed_chunk5`).
#[derive(Clone, Copy, Debug)]
struct FixedChunk {
    /// The segment (index into `Ctx::segs`).
    seg: usize,
    /// The chunk's first code byte in a record.
    at: usize,
    /// Its first coordinate.
    base: usize,
    width: u8,
}

impl FixedChunk {
    /// The coordinate of position `p` (0..64) of the kernel's i16 order.
    fn coordinate(&self, p: usize) -> usize {
        let (hi, ab, m) = (p / 32, (p / 16) % 2, p % 16);
        match self.width {
            // Nibble `hi` of byte `fixed_byte(ab, m)`.
            4 => self.base + 2 * fixed_byte(ab, m) + hi,
            // Code `fixed_byte(ab, m)` of 32-code block `hi`.
            _ => self.base + 32 * hi + fixed_byte(ab, m),
        }
    }
}

/// The fixed-point chunks of a record of `ctx`, in the order `FixedQueries` holds them.
/// 5-bit segments are those `planes32` reads, their whole pairs of 32-code blocks.
fn fixed_chunks(ctx: &Ctx) -> Vec<FixedChunk> {
    let mut out = Vec::new();
    for (i, seg) in ctx.segs.iter().enumerate() {
        let byte0 = seg.bit_offset / 8;
        let chunk = |c: usize, bytes: usize| FixedChunk {
            seg: i,
            at: byte0 + bytes * c,
            base: seg.start + 64 * c,
            width: seg.width,
        };
        if !ctx.wide && seg.width == 4 && seg.lane_blocks > 0 {
            out.extend((0..2 * seg.lane_blocks).map(|c| chunk(c, 32)));
        } else if ctx.wide && seg.width == 5 && seg.bit_offset.is_multiple_of(8) {
            out.extend((0..seg.len / 64).map(|c| chunk(c, 40)));
        }
    }
    out
}

/// Queries made ready for the fixed-point scoring (`fixed_chunks`): each chunk's 64
/// coordinates as i16 (to `FIXED_ONE` of the chunk's largest |q|), in the kernels' order,
/// and the float that takes the chunk's integer dot back to a score (the query's step times
/// the codebook's).
#[derive(Clone, Debug)]
pub(crate) struct FixedQueries {
    /// Chunks per query.
    chunks: usize,
    /// `g × chunks × 64`.
    q: Vec<i16>,
    /// `g × chunks`.
    scale: Vec<f32>,
}

impl FixedQueries {
    /// `None` where the codec has no fixed-point chunks, a query coordinate is not finite
    /// (NaN and ∞ must reach the score as the float kernel carries them), or a chunk's step
    /// would not be a normal float.
    pub(crate) fn new(ctx: &Ctx, rotated: &[f32]) -> Option<FixedQueries> {
        let d = ctx.dim;
        let plan = fixed_chunks(ctx);
        let chunks = plan.len();
        if chunks == 0 || !rotated.iter().all(|v| v.is_finite()) {
            return None;
        }
        let steps: Vec<f32> = ctx
            .segs
            .iter()
            .map(|s| match s.width {
                4 => fixed_table::<16>(s).1,
                _ => fixed_table::<32>(s).1,
            })
            .collect();
        let g = rotated.len() / d;
        let mut out = FixedQueries {
            chunks,
            q: vec![0; g * chunks * 64],
            scale: vec![0.0; g * chunks],
        };
        let mut vals = [0f32; 64];
        for (qi, rq) in rotated.chunks_exact(d).enumerate() {
            for (c, ch) in plan.iter().enumerate() {
                let ci = qi * chunks + c;
                for (p, v) in vals.iter_mut().enumerate() {
                    *v = rq[ch.coordinate(p)];
                }
                let top = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
                let qs = top / FIXED_ONE;
                let dst = &mut out.q[ci * 64..(ci + 1) * 64];
                if qs > 0.0 {
                    for (o, v) in dst.iter_mut().zip(&vals) {
                        *o = (v / qs).round() as i16;
                    }
                }
                out.scale[ci] = qs * steps[ch.seg];
                if top > 0.0 && !out.scale[ci].is_normal() {
                    // Queries near f32's smallest: the step would lose its precision (or
                    // vanish); the float kernel scores them.
                    return None;
                }
            }
        }
        Some(out)
    }
}

/// The fixed-point dots of queries `q` (each at its chunk's 64 i16) with the 64 4-bit codes
/// in the 32 bytes at `p`, added into `sums` lane-wise: each code's centroid looked up as the
/// low and high byte of an i16 (`SegRegs::fixed_planes`) by two `pshufb`, interleaved by
/// unpacks, multiplied and added in pairs by `pmaddwd`. Integers: the order is exact.
///
/// # Safety
/// `p` must point at 32 readable bytes and each `q[k]` at 64 readable i16.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fixed_chunk<const Q: usize>(
    p: *const u8,
    r: &SegRegs,
    q: [*const i16; Q],
    sums: &mut [__m256i; Q],
) {
    // SAFETY: the caller's contract.
    let v = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    let m = _mm256_set1_epi8(0x0F);
    let nibbles = [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
    ];
    for (hf, idx) in nibbles.into_iter().enumerate() {
        let lo = _mm256_shuffle_epi8(r.fixed_planes[0], idx);
        let hi = _mm256_shuffle_epi8(r.fixed_planes[1], idx);
        let (a, b) = (_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
        for k in 0..Q {
            // SAFETY: the caller's contract: 64 i16 at q[k].
            let (qa, qb) = unsafe {
                (
                    _mm256_loadu_si256(q[k].add(32 * hf) as *const __m256i),
                    _mm256_loadu_si256(q[k].add(32 * hf + 16) as *const __m256i),
                )
            };
            sums[k] = _mm256_add_epi32(
                sums[k],
                _mm256_add_epi32(_mm256_madd_epi16(a, qa), _mm256_madd_epi16(b, qb)),
            );
        }
    }
}

/// Σ over sign bits of ±sq (the QJL inner product ⟨S q', sign⟩), scalar.
fn sign_dot(rec: &[u8], sb: usize, sq: &[f32], sqsum: f32) -> f32 {
    let mut pos = 0.0f32;
    for (j, &v) in sq.iter().enumerate() {
        if bits::read(rec, sb + j, 1) == 1 {
            pos += v;
        }
    }
    2.0 * pos - sqsum
}

/// # Safety
/// See the module contract; `fixed` (if any) was made by `FixedQueries::new` for this `ctx`
/// from the same `g` queries.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores(
    ctx: &Ctx,
    q: &[f32],
    fixed: Option<&FixedQueries>,
    sq: &[f32],
    sqsum: &[f32],
    g: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let d = ctx.dim;
    let regs: Vec<SegRegs> = ctx.segs.iter().map(|s| seg_regs(s)).collect();
    assert!(q.len() >= g * d);
    if let Some(f) = fixed {
        assert!(f.q.len() >= g * f.chunks * 64 && f.scale.len() >= g * f.chunks);
    }
    let chunks = match fixed {
        Some(_) => fixed_chunks(ctx),
        None => Vec::new(),
    };
    if let Some(f) = fixed {
        assert!(f.chunks == chunks.len());
    }
    let t = Tile {
        ctx,
        regs: &regs,
        q,
        fixed,
        chunks: &chunks,
        // Whether any coordinate is left to the float walk.
        rest: fixed.is_none()
            || ctx
                .segs
                .iter()
                .any(|s| s.width != 4 || s.lane_blocks * 128 != s.len),
        sq,
        sqsum,
    };
    // Queries in tiles of 8, 4, 2, 1: each record's codes are unpacked and looked up once per
    // tile, not once per query (a decode step's group of query heads is one tile).
    for (q0, tile) in super::query_tiles(g, 8) {
        // SAFETY (each arm): module contract; the tile's queries lie within q's g rows.
        unsafe {
            match tile {
                8 => scores_tile::<8>(&t, q0, chunk, out, n, base),
                4 => scores_tile::<4>(&t, q0, chunk, out, n, base),
                2 => scores_tile::<2>(&t, q0, chunk, out, n, base),
                _ => scores_tile::<1>(&t, q0, chunk, out, n, base),
            }
        }
    }
}

/// What every query tile of one `scores` call reads.
struct Tile<'a> {
    ctx: &'a Ctx,
    regs: &'a [SegRegs],
    q: &'a [f32],
    fixed: Option<&'a FixedQueries>,
    /// With `fixed`: the fixed-point chunks of a record (`fixed_chunks`).
    chunks: &'a [FixedChunk],
    /// Whether the float walk has coordinates to score (all but the fixed chunks).
    rest: bool,
    sq: &'a [f32],
    sqsum: &'a [f32],
}

/// Scores of queries `q0..q0 + Q` against every record of `chunk`.
///
/// # Safety
/// See the module contract; `t.q` holds at least `(q0 + Q)·d` values and `t.fixed` (if
/// any) as many queries.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_tile<const Q: usize>(
    t: &Tile,
    q0: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let (ctx, q) = (t.ctx, t.q);
    let d = ctx.dim;
    assert!(q.len() >= (q0 + Q) * d);
    let qp: [*const f32; Q] = std::array::from_fn(|k| q[(q0 + k) * d..].as_ptr());
    let rows = fixed_rows::<Q>(t.fixed, q0);
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        // One accumulator register per query: each centroid vector feeds Q FMAs, in the
        // same order per query as one query alone would run them.
        let mut acc = [_mm256_setzero_ps(); Q];
        if t.fixed.is_some() {
            // SAFETY: module contract; the chunks are this codec's and the rows hold as many
            // (asserted in `scores`).
            unsafe {
                add_fixed(t.chunks, rec, rows, &mut acc, |at, ch, qc, sums| {
                    fixed_chunk::<Q>(at, &t.regs[ch.seg], qc, sums)
                });
            }
        }
        let mut tail = [0.0f32; Q];
        if t.rest {
            let fma = |j: usize, c: __m256| {
                for k in 0..Q {
                    // SAFETY: module contract; every position + 8 ≤ d.
                    acc[k] = _mm256_fmadd_ps(c, unsafe { _mm256_loadu_ps(qp[k].add(j)) }, acc[k]);
                }
            };
            let rest = |j: usize, c: f32| {
                for k in 0..Q {
                    tail[k] += q[(q0 + k) * d + j] * c;
                }
            };
            // SAFETY: module contract.
            unsafe {
                if t.fixed.is_some() {
                    walk::<true>(ctx, t.regs, rec, fma, rest);
                } else {
                    walk::<false>(ctx, t.regs, rec, fma, rest);
                }
            }
        }
        let dots = hsums(&acc);
        if ctx.qjl.is_none() {
            for k in 0..Q {
                out[(q0 + k) * n + base + r] = norm * (dots[k] + tail[k]);
            }
            continue;
        }
        for k in 0..Q {
            let qi = q0 + k;
            let mut dot = dots[k] + tail[k];
            if let Some((sb, go, scale)) = ctx.qjl {
                dot += read_f16(rec, go)
                    * scale
                    * sign_dot(rec, sb, &t.sq[qi * d..(qi + 1) * d], t.sqsum[qi]);
            }
            out[qi * n + base + r] = norm * dot;
        }
    }
}

/// # Safety
/// See the module contract.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
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
    let d = ctx.dim;
    let regs: Vec<SegRegs> = ctx.segs.iter().map(|s| seg_regs(s)).collect();
    assert!(acc.len() >= g * d && acc_s.len() >= g * d);
    // Weight rows in tiles of 8, 4, 2, 1, as in `scores`: codes unpacked once per tile.
    for (q0, tile) in super::query_tiles(g, 8) {
        // SAFETY (each arm): module contract; the tile's rows lie within acc's g rows.
        unsafe {
            match tile {
                8 => accumulate_tile::<8>(ctx, &regs, weights, q0, n, base, chunk, acc, acc_s),
                4 => accumulate_tile::<4>(ctx, &regs, weights, q0, n, base, chunk, acc, acc_s),
                2 => accumulate_tile::<2>(ctx, &regs, weights, q0, n, base, chunk, acc, acc_s),
                _ => accumulate_tile::<1>(ctx, &regs, weights, q0, n, base, chunk, acc, acc_s),
            }
        }
    }
}

/// Records added per pass in `accumulate_tile`: each accumulator slot is loaded and stored
/// once per `RECORDS` records instead of once per record (stores, not FMAs, bound the
/// one-record loop).
const RECORDS: usize = 4;

/// Weighted sums of rows `q0..q0 + Q` over every record of `chunk`.
///
/// # Safety
/// See the module contract; `acc` and `acc_s` hold at least `(q0 + Q)·d` values.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_tile<const Q: usize>(
    ctx: &Ctx,
    regs: &[SegRegs],
    weights: &[f32],
    q0: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
    acc_s: &mut [f32],
) {
    let d = ctx.dim;
    assert!(acc.len() >= (q0 + Q) * d && acc_s.len() >= (q0 + Q) * d);
    let ap: [*mut f32; Q] = std::array::from_fn(|k| acc[(q0 + k) * d..].as_mut_ptr());
    // Records some row weighs, gathered until RECORDS are pending, then added in one pass
    // (in record order, so each coordinate sees the same FMA sequence as one at a time).
    let mut pending: [(&[u8], [f32; Q]); RECORDS] = [(&[], [0.0; Q]); RECORDS];
    let mut held = 0;
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        let s: [f32; Q] = std::array::from_fn(|k| weights[(q0 + k) * n + base + r] * norm);
        // A record no row weighs (masked out) is skipped; one that some row weighs is added
        // to every row of the tile (a zero weight adds zero).
        if s.iter().all(|&x| x == 0.0) {
            continue;
        }
        if let Some((sb, go, scale)) = ctx.qjl {
            add_signs(
                rec,
                sb,
                read_f16(rec, go),
                scale,
                &s,
                &mut acc_s[q0 * d..],
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
#[target_feature(enable = "avx2,fma")]
unsafe fn add_records<const Q: usize, const R: usize>(
    ctx: &Ctx,
    regs: &[SegRegs],
    ap: &[*mut f32; Q],
    records: [(&[u8], [f32; Q]); R],
) {
    let recs: [&[u8]; R] = std::array::from_fn(|r| records[r].0);
    let s: [[f32; Q]; R] = std::array::from_fn(|r| records[r].1);
    let sv: [[__m256; Q]; R] =
        std::array::from_fn(|r| std::array::from_fn(|k| _mm256_set1_ps(s[r][k])));
    // SAFETY: module contract; every position + 8 ≤ d, each row has d values.
    unsafe {
        walk_records(
            ctx,
            regs,
            recs,
            |j, c| {
                for k in 0..Q {
                    let p = ap[k].add(j);
                    let mut a = _mm256_loadu_ps(p);
                    for r in 0..R {
                        a = _mm256_fmadd_ps(c[r], sv[r][k], a);
                    }
                    _mm256_storeu_ps(p, a);
                }
            },
            |j, c| {
                for k in 0..Q {
                    for r in 0..R {
                        *ap[k].add(j) += s[r][k] * c[r];
                    }
                }
            },
        );
    }
}

/// The QJL sign term: row k of `rows_s` (rows of `d`) gains ±`s[k] · γ · scale` per sign bit.
fn add_signs<const Q: usize>(
    rec: &[u8],
    sb: usize,
    gamma: f32,
    scale: f32,
    s: &[f32; Q],
    rows_s: &mut [f32],
    d: usize,
) {
    for (k, &sk) in s.iter().enumerate() {
        let t = sk * gamma * scale;
        for (kk, av) in rows_s[k * d..(k + 1) * d].iter_mut().enumerate() {
            *av += if bits::read(rec, sb + kk, 1) == 1 {
                t
            } else {
                -t
            };
        }
    }
}

/// Wide codes (5 to 8 bits, any codec without QJL) scored in AVX2, as `x86::scores_wide`
/// does in AVX-512: 8 codes per word (two 4w-bit halves shifted lane by lane), their
/// centroids from registers (4 and 5 bits) or by eight scalar loads (6 to 8), fused with up
/// to 8 queries per decoded record.
///
/// # Safety
/// See the module contract; `ctx.qjl` is `None` and no segment has lane blocks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores_wide(
    ctx: &Ctx,
    q: &[f32],
    fixed: Option<&FixedQueries>,
    g: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let p5 = planes32(ctx);
    let chunks = match fixed {
        Some(f) => {
            let c = fixed_chunks(ctx);
            assert!(f.chunks == c.len() && f.q.len() >= g * f.chunks * 64);
            // `fixed_chunks` and `planes32` pick the same 5-bit segments.
            assert!(c.iter().all(|ch| p5[ch.seg].is_some()));
            assert!(f.scale.len() >= g * f.chunks);
            c
        }
        None => Vec::new(),
    };
    // Each segment's first 32-code block left to the float loops.
    let mut first = vec![0usize; ctx.segs.len()];
    for ch in &chunks {
        first[ch.seg] += 2;
    }
    let t = WideTile {
        ctx,
        p5: &p5,
        q,
        fixed,
        chunks: &chunks,
        first: &first,
    };
    for (qi, tile) in super::query_tiles(g, 8) {
        // SAFETY: forwarded contract; qi + tile ≤ g.
        unsafe {
            match tile {
                8 => scores_wide_tile::<8>(&t, qi, chunk, out, n, base),
                4 => scores_wide_tile::<4>(&t, qi, chunk, out, n, base),
                2 => scores_wide_tile::<2>(&t, qi, chunk, out, n, base),
                _ => scores_wide_tile::<1>(&t, qi, chunk, out, n, base),
            }
        }
    }
}

/// What every query tile of one `scores_wide` call reads.
struct WideTile<'a> {
    ctx: &'a Ctx,
    p5: &'a [Option<Planes32>],
    q: &'a [f32],
    fixed: Option<&'a FixedQueries>,
    /// With `fixed`: the fixed-point chunks of a record (`fixed_chunks`).
    chunks: &'a [FixedChunk],
    /// Per segment, its first 32-code block not scored in fixed point.
    first: &'a [usize],
}

/// Groups `from..groups` of eight `W`-bit codes of `seg` in record `rec`, scored against
/// the `G` queries into `acc`; returns the codes done through them (`8 · groups`). Codes come eight to a
/// word (two 4W-bit halves shifted lane by lane, or by scalar shifts), their centroids from
/// registers at 4 and 5 bits (`lookup16`, `lookup32`) and by eight scalar loads above.
///
/// # Safety
/// AVX2 and FMA must be present; each query holds `seg.start + 8 · groups` floats or more.
#[target_feature(enable = "avx2,fma")]
unsafe fn wide_groups<const W: usize, const G: usize>(
    seg: &Seg,
    rec: &[u8],
    qs: &[&[f32]; G],
    (from, groups): (usize, usize),
    acc: &mut [__m256; G],
) -> usize {
    let book = WideBook::<W>::new(seg);
    for gi in from..groups {
        let word = load_u64(rec, seg.bit_offset / 8 + W * gi);
        let c = book.centroids(word);
        let j = seg.start + 8 * gi;
        for k in 0..G {
            // SAFETY: j + 8 ≤ seg.start + 8 · groups, within every query (the contract).
            let qv = unsafe { _mm256_loadu_ps(qs[k].as_ptr().add(j)) };
            acc[k] = _mm256_fmadd_ps(c, qv, acc[k]);
        }
    }
    8 * groups
}

/// Weighted sums over wide codes (5 to 8 bits, any codec without QJL) in AVX2, as `accumulate`
/// does for narrow ones: each record some row weighs decoded once per tile of up to 8 rows,
/// in coordinate order (wide codecs have no lane blocks), its centroids from `WideBook`.
///
/// # Safety
/// See the module contract; `ctx.qjl` is `None` and no segment has lane blocks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn accumulate_wide(
    ctx: &Ctx,
    weights: &[f32],
    g: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
) {
    assert!(acc.len() >= g * ctx.dim);
    let p5 = planes32(ctx);
    for (q0, tile) in super::query_tiles(g, 8) {
        // SAFETY (each arm): forwarded contract; the tile's rows lie within acc's g rows.
        unsafe {
            match tile {
                8 => accumulate_wide_tile::<8>(ctx, &p5, weights, q0, n, base, chunk, acc),
                4 => accumulate_wide_tile::<4>(ctx, &p5, weights, q0, n, base, chunk, acc),
                2 => accumulate_wide_tile::<2>(ctx, &p5, weights, q0, n, base, chunk, acc),
                _ => accumulate_wide_tile::<1>(ctx, &p5, weights, q0, n, base, chunk, acc),
            }
        }
    }
}

/// Weighted sums of rows `q0..q0 + Q` over every record of `chunk`, wide codes.
///
/// # Safety
/// See `accumulate_wide`; `acc` holds at least `(q0 + Q)·d` values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_wide_tile<const Q: usize>(
    ctx: &Ctx,
    p5: &[Option<Planes32>],
    weights: &[f32],
    q0: usize,
    n: usize,
    base: usize,
    chunk: &[u8],
    acc: &mut [f32],
) {
    let d = ctx.dim;
    assert!(acc.len() >= (q0 + Q) * d);
    let ap: [*mut f32; Q] = std::array::from_fn(|k| acc[(q0 + k) * d..].as_mut_ptr());
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let norm = read_f16(rec, ctx.norm_offset);
        let s: [f32; Q] = std::array::from_fn(|k| weights[(q0 + k) * n + base + r] * norm);
        // A record no row weighs (masked out) is skipped, as the narrow kernels skip it.
        if s.iter().all(|&x| x == 0.0) {
            continue;
        }
        let sv: [__m256; Q] = std::array::from_fn(|k| _mm256_set1_ps(s[k]));
        for (seg, p5) in ctx.segs.iter().zip(p5) {
            let w = seg.width as usize;
            let groups = if seg.bit_offset.is_multiple_of(8) {
                seg.len / 8
            } else {
                0
            };
            // SAFETY: each position + 8 ≤ seg.start + seg.len ≤ d, inside every row.
            let from = unsafe {
                blocks32(seg, p5.as_ref(), rec, 0, |j, c| {
                    for k in 0..Q {
                        let p = ap[k].add(j);
                        _mm256_storeu_ps(p, _mm256_fmadd_ps(c, sv[k], _mm256_loadu_ps(p)));
                    }
                })
            };
            // SAFETY: forwarded contract; the groups lie inside the record and the segment,
            // and every row at ap[k] holds d values.
            let whole = unsafe {
                match w {
                    4 => wide_sums::<4, Q>(seg, rec, &sv, (from, groups), &ap),
                    5 => wide_sums::<5, Q>(seg, rec, &sv, (from, groups), &ap),
                    6 => wide_sums::<6, Q>(seg, rec, &sv, (from, groups), &ap),
                    7 => wide_sums::<7, Q>(seg, rec, &sv, (from, groups), &ap),
                    8 => wide_sums::<8, Q>(seg, rec, &sv, (from, groups), &ap),
                    _ => 0,
                }
            };
            for kk in whole..seg.len {
                let c = seg.table[bits::read(rec, seg.bit_offset + kk * w, seg.width) as usize];
                for k in 0..Q {
                    // SAFETY: seg.start + kk < d, inside row k.
                    unsafe { *ap[k].add(seg.start + kk) += s[k] * c };
                }
            }
        }
    }
}

/// Groups `from..groups` of eight `W`-bit codes of `seg` in record `rec`, each centroid
/// times `sv[k]` added into row k at `ap[k]`; returns the codes done through them
/// (`8 · groups`).
///
/// # Safety
/// AVX2 and FMA must be present; every `ap[k]` points at a row holding
/// `seg.start + 8 · groups` floats or more.
#[target_feature(enable = "avx2,fma")]
unsafe fn wide_sums<const W: usize, const Q: usize>(
    seg: &Seg,
    rec: &[u8],
    sv: &[__m256; Q],
    (from, groups): (usize, usize),
    ap: &[*mut f32; Q],
) -> usize {
    let book = WideBook::<W>::new(seg);
    for gi in from..groups {
        let c = book.centroids(load_u64(rec, seg.bit_offset / 8 + W * gi));
        let j = seg.start + 8 * gi;
        for k in 0..Q {
            // SAFETY: j + 8 ≤ seg.start + 8 · groups, within every row (the contract).
            unsafe {
                let p = ap[k].add(j);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(c, sv[k], _mm256_loadu_ps(p)));
            }
        }
    }
    8 * groups
}

/// A `W`-bit codebook (5 to 8 bits, or a 4-bit segment of a wide codec) ready to map eight
/// codes of one little-endian word to their centroids: from registers at 4 and 5 bits
/// (`lookup16`, `lookup32`), by eight scalar loads above. Shared by the wide scores and sums.
struct WideBook<'a, const W: usize> {
    table: &'a [f32; 256],
    shifts: __m256i,
    mask: __m256i,
    /// A 4- or 5-bit codebook's centroids in registers (the first two or all four quarters).
    quarters: [__m256; 4],
}

impl<'a, const W: usize> WideBook<'a, W> {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(seg: &'a Seg) -> Self {
        let wi = W as i32;
        // SAFETY: the table holds 256 floats.
        let quarters =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(seg.table.as_ptr().add(8 * k)) });
        WideBook {
            table: &seg.table,
            shifts: _mm256_setr_epi32(0, wi, 2 * wi, 3 * wi, 0, wi, 2 * wi, 3 * wi),
            mask: _mm256_set1_epi32((1 << W) - 1),
            quarters,
        }
    }

    /// The centroids of the eight codes in the low `8·W` bits of `word`, in code order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn centroids(&self, word: u64) -> __m256 {
        if W <= 5 {
            // Codes as lanes: two 4W-bit halves shifted lane by lane.
            let (a, b) = (word as u32 as i32, (word >> (4 * W)) as u32 as i32);
            let v = _mm256_setr_epi32(a, a, a, a, b, b, b, b);
            let idx = _mm256_and_si256(_mm256_srlv_epi32(v, self.shifts), self.mask);
            if W == 4 {
                lookup16(self.quarters[0], self.quarters[1], idx)
            } else {
                lookup32(&self.quarters, idx)
            }
        } else {
            // Eight scalar loads: on Zen 3 a gather of eight (microcoded) took about twice
            // as long as eight loads from L1 and the inserts that join them. Every index is
            // below 2^W ≤ 256, the table's length.
            let m = (1u64 << W) - 1;
            let at = |k: usize| self.table[((word >> (W * k)) & m) as usize];
            _mm256_setr_ps(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7))
        }
    }
}

/// A 5-bit segment's codebook as byte planes, and the shuffles that unpack its codes: built
/// once per call for each byte-aligned 5-bit segment of a wide codec (`planes32`).
struct Planes32 {
    /// Byte b of the f32 bits of centroids 0–15 (`lo`) and 16–31 (`hi`), a 16-entry `pshufb`
    /// table in both 128-bit halves.
    lo: [__m256i; 4],
    hi: [__m256i; 4],
    /// For codes 0–7 and 8–15 of each half (`ctrl[0]`, `ctrl[1]`): the two bytes holding
    /// each code, as a 16-bit window, and the power of two that shifts the code to the
    /// window's top five bits.
    ctrl: [__m256i; 2],
    mul: [__m256i; 2],
    /// `fixed[h][b]`: byte b of centroids 16·h..16·h + 16 in 16-bit fixed point
    /// (`fixed_table`), a `pshufb` table (`fixed_chunk5`).
    fixed: [[__m256i; 2]; 2],
}

/// `Planes32` for every segment of `ctx` that `centroids32` reads (byte-aligned, 5 bits, in a
/// wide codec), `None` for the others.
#[target_feature(enable = "avx2")]
fn planes32(ctx: &Ctx) -> Vec<Option<Planes32>> {
    ctx.segs
        .iter()
        .map(|seg| {
            if !(ctx.wide && seg.width == 5 && seg.bit_offset.is_multiple_of(8)) {
                return None;
            }
            let plane = |first: usize, b: usize| {
                let bytes: [u8; 16] =
                    std::array::from_fn(|k| seg.table[first + k].to_bits().to_le_bytes()[b]);
                // SAFETY: `bytes` holds the 16 bytes read.
                unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast())) }
            };
            // The 32 codes' 20 bytes are loaded as bytes 0–15 (low half) and 4–19 (high
            // half): codes 16–31 start at byte 6 of the high half.
            let shuffle = |part: usize| {
                let mut ctrl = [0u8; 32];
                let mut mul = [0u16; 16];
                for half in 0..2 {
                    for i in 0..8 {
                        let bit = 5 * (8 * part + i);
                        let byte = 6 * half + bit / 8;
                        let shift = bit % 8;
                        ctrl[16 * half + 2 * i] = byte as u8;
                        // A code that ends inside its first byte needs no second one (the
                        // last code of the high half would name byte 16, past the half).
                        ctrl[16 * half + 2 * i + 1] =
                            if shift + 5 > 8 { byte as u8 + 1 } else { 0x80 };
                        mul[8 * half + i] = 1 << (11 - shift);
                    }
                }
                // SAFETY: both arrays hold 32 bytes.
                unsafe {
                    (
                        _mm256_loadu_si256(ctrl.as_ptr().cast()),
                        _mm256_loadu_si256(mul.as_ptr().cast()),
                    )
                }
            };
            let (c0, m0) = shuffle(0);
            let (c1, m1) = shuffle(1);
            let (ints, _) = fixed_table::<32>(seg);
            let fixed = |h: usize, b: usize| {
                let bytes: [u8; 16] = std::array::from_fn(|k| ints[16 * h + k].to_le_bytes()[b]);
                // SAFETY: `bytes` holds the 16 bytes read.
                unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast())) }
            };
            Some(Planes32 {
                lo: std::array::from_fn(|b| plane(0, b)),
                hi: std::array::from_fn(|b| plane(16, b)),
                ctrl: [c0, c1],
                mul: [m0, m1],
                fixed: std::array::from_fn(|h| std::array::from_fn(|b| fixed(h, b))),
            })
        })
        .collect()
}

/// Calls `f(position, centroids of 8 coordinates)` for every 8-coordinate slot of the
/// whole 32-code blocks from block `first` on of a 5-bit segment read by byte planes (`p5`: `planes32`'s entry
/// for `seg`, in `Ctx::perm_planes` order); returns the 8-code groups done (none without
/// `p5`), where the word-by-word loop takes over.
///
/// # Safety
/// AVX2 and FMA must be present; `rec` is a whole record of the codec `seg` belongs to.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn blocks32(
    seg: &Seg,
    p5: Option<&Planes32>,
    rec: &[u8],
    first: usize,
    mut f: impl FnMut(usize, __m256),
) -> usize {
    let Some(p5) = p5 else { return 0 };
    for blk in first..seg.len / 32 {
        // SAFETY: the block's 20 bytes lie inside the record's code area.
        let c = unsafe { centroids32(rec.as_ptr().add(seg.bit_offset / 8 + 20 * blk), p5) };
        for (v, c) in c.into_iter().enumerate() {
            f(seg.start + 32 * blk + 8 * v, c);
        }
    }
    4 * (seg.len / 32)
}

/// The 32 5-bit codes in the 20 bytes at `p` as bytes in code order, cut out as 16-bit
/// windows (`pshufb`) and shifted to their place by a multiply and a shift, and the same
/// bytes shifted so that each code's bit 4 is its byte's top bit (what `blendv` reads; bits
/// shifted in from the byte below land in bits 0–2).
///
/// # Safety
/// `p` must point at 20 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn codes32(p: *const u8, r: &Planes32) -> (__m256i, __m256i) {
    // SAFETY: bytes 0–15 and 4–19 of the caller's 20.
    let v = unsafe { _mm256_loadu2_m128i(p.add(4).cast(), p.cast()) };
    let codes: [__m256i; 2] = std::array::from_fn(|part| {
        let w = _mm256_shuffle_epi8(v, r.ctrl[part]);
        _mm256_srli_epi16::<11>(_mm256_mullo_epi16(w, r.mul[part]))
    });
    let idx = _mm256_packus_epi16(codes[0], codes[1]);
    (idx, _mm256_slli_epi16::<3>(idx))
}

/// `fixed_chunk` for two 32-code blocks of a 5-bit segment (the 40 bytes at `p`): each
/// code's i16 centroid looked up as two bytes, each by two `pshufb` (codes 0–15 and 16–31)
/// and a blend on bit 4, then as `fixed_chunk`. A lane adds 8 products, as there.
///
/// # Safety
/// `p` must point at 40 readable bytes and each `q[k]` at 64 readable i16.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fixed_chunk5<const Q: usize>(
    p: *const u8,
    r: &Planes32,
    q: [*const i16; Q],
    sums: &mut [__m256i; Q],
) {
    for blk in 0..2 {
        // SAFETY: the caller's contract: block `blk`'s 20 bytes.
        let (idx, high) = unsafe { codes32(p.add(20 * blk), r) };
        let b: [__m256i; 2] = std::array::from_fn(|k| {
            _mm256_blendv_epi8(
                _mm256_shuffle_epi8(r.fixed[0][k], idx),
                _mm256_shuffle_epi8(r.fixed[1][k], idx),
                high,
            )
        });
        let (a, c) = (
            _mm256_unpacklo_epi8(b[0], b[1]),
            _mm256_unpackhi_epi8(b[0], b[1]),
        );
        for k in 0..Q {
            // SAFETY: the caller's contract: 64 i16 at q[k].
            let (qa, qc) = unsafe {
                (
                    _mm256_loadu_si256(q[k].add(32 * blk) as *const __m256i),
                    _mm256_loadu_si256(q[k].add(32 * blk + 16) as *const __m256i),
                )
            };
            sums[k] = _mm256_add_epi32(
                sums[k],
                _mm256_add_epi32(_mm256_madd_epi16(a, qa), _mm256_madd_epi16(c, qc)),
            );
        }
    }
}

/// The rows of queries `q0..q0 + Q` of `fixed`: their i16 chunks and their steps (null,
/// and never read, without fixed-point queries).
fn fixed_rows<const Q: usize>(
    fixed: Option<&FixedQueries>,
    q0: usize,
) -> ([*const i16; Q], [*const f32; Q]) {
    match fixed {
        Some(f) => (
            std::array::from_fn(|k| f.q[(q0 + k) * f.chunks * 64..].as_ptr()),
            std::array::from_fn(|k| f.scale[(q0 + k) * f.chunks..].as_ptr()),
        ),
        None => ([std::ptr::null(); Q], [std::ptr::null(); Q]),
    }
}

/// Adds record `rec`'s fixed-point dots with `Q` queries (`rows`: `fixed_rows`) into `acc`,
/// chunk by chunk: `dots(chunk's first code byte, chunk, each query's 64 i16, sums)` forms a
/// chunk's integer sums (`fixed_chunk` or `fixed_chunk5`), converted to floats with its steps.
///
/// # Safety
/// `chunks` are this record's (`fixed_chunks`), and `rows` point at as many chunks of 64 i16
/// and steps per query.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_fixed<const Q: usize>(
    chunks: &[FixedChunk],
    rec: &[u8],
    (fq, fs): ([*const i16; Q], [*const f32; Q]),
    acc: &mut [__m256; Q],
    mut dots: impl FnMut(*const u8, &FixedChunk, [*const i16; Q], &mut [__m256i; Q]),
) {
    for (ci, ch) in chunks.iter().enumerate() {
        let mut sums = [_mm256_setzero_si256(); Q];
        // SAFETY: the caller's contract: the chunk lies in the record's code area, and each
        // query row holds chunk `ci`'s 64 i16 and its step.
        unsafe {
            let qc = std::array::from_fn(|k| fq[k].add(64 * ci));
            dots(rec.as_ptr().add(ch.at), ch, qc, &mut sums);
        }
        for k in 0..Q {
            // SAFETY: as above.
            let step = unsafe { _mm256_broadcast_ss(&*fs[k].add(ci)) };
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[k]), step, acc[k]);
        }
    }
}

/// The centroids of the 32 5-bit codes in the 20 bytes at `p`, as four vectors of eight
/// floats: vector `g` lane `4·L + e` is the centroid of code `16·L + 4·g + e`. The codes are
/// cut out as 16-bit windows (`pshufb`), shifted to their place by a multiply and a shift and
/// packed to bytes in code order; each f32 is then assembled from its four bytes, each looked
/// up by two `pshufb` (codes 0–15 and 16–31) and a byte blend on the code's bit 4, and
/// interleaved by unpacks as in `plane_centroids`. Where one 8-code word at a time went
/// through scalar shifts and two-level permutes, this scored 5-bit keys about 1.7× faster.
///
/// # Safety
/// `p` must point at 20 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn centroids32(p: *const u8, r: &Planes32) -> [__m256; 4] {
    // SAFETY: the caller's contract.
    let (idx, high) = unsafe { codes32(p, r) };
    let b: [__m256i; 4] = std::array::from_fn(|k| {
        _mm256_blendv_epi8(
            _mm256_shuffle_epi8(r.lo[k], idx),
            _mm256_shuffle_epi8(r.hi[k], idx),
            high,
        )
    });
    let (w01l, w01h) = (
        _mm256_unpacklo_epi8(b[0], b[1]),
        _mm256_unpackhi_epi8(b[0], b[1]),
    );
    let (w23l, w23h) = (
        _mm256_unpacklo_epi8(b[2], b[3]),
        _mm256_unpackhi_epi8(b[2], b[3]),
    );
    [
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(w01l, w23l)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(w01l, w23l)),
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(w01h, w23h)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(w01h, w23h)),
    ]
}

/// The centroids of eight 5-bit codes (`idx`, one per lane) from a 32-entry table held as
/// four eight-entry quarters: [`lookup16`] in each half, bit 4 picks the half. The table's
/// own floats, as a gather returns them, in seven single-cycle instructions where the gather
/// (eight loads) was the wide scoring's bottleneck on AVX2.
#[inline]
#[target_feature(enable = "avx2")]
fn lookup32(quarters: &[__m256; 4], idx: __m256i) -> __m256 {
    let low = lookup16(quarters[0], quarters[1], idx);
    let high = lookup16(quarters[2], quarters[3], idx);
    _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32::<27>(idx)))
}

#[target_feature(enable = "avx2,fma")]
unsafe fn scores_wide_tile<const G: usize>(
    t: &WideTile,
    qi0: usize,
    chunk: &[u8],
    out: &mut [f32],
    n: usize,
    base: usize,
) {
    let (ctx, q, p5) = (t.ctx, t.q, t.p5);
    let d = ctx.dim;
    let qs: [&[f32]; G] = std::array::from_fn(|k| &q[(qi0 + k) * d..(qi0 + k + 1) * d]);
    let rows = fixed_rows::<G>(t.fixed, qi0);
    for (r, rec) in chunk.chunks_exact(ctx.stride).enumerate() {
        let mut acc = [_mm256_setzero_ps(); G];
        if t.fixed.is_some() {
            // SAFETY: module contract; the chunks are this codec's, each 5-bit segment's has
            // its planes, and the rows hold as many (all asserted in `scores_wide`).
            unsafe {
                add_fixed(t.chunks, rec, rows, &mut acc, |at, ch, qc, sums| {
                    if let Some(planes) = &p5[ch.seg] {
                        fixed_chunk5::<G>(at, planes, qc, sums)
                    }
                });
            }
        }
        let mut tail = [0.0f32; G];
        for (si, (seg, p5)) in ctx.segs.iter().zip(p5).enumerate() {
            if 32 * t.first[si] == seg.len {
                continue;
            }
            let w = seg.width as usize;
            let groups = if seg.bit_offset.is_multiple_of(8) {
                seg.len / 8
            } else {
                0
            };
            // SAFETY: each position + 8 ≤ seg.start + seg.len ≤ d, inside every query.
            let from = unsafe {
                blocks32(seg, p5.as_ref(), rec, t.first[si], |j, c| {
                    for k in 0..G {
                        acc[k] = _mm256_fmadd_ps(c, _mm256_loadu_ps(qs[k].as_ptr().add(j)), acc[k]);
                    }
                })
            };
            // Each width's loop compiled apart (its shifts, masks and lookup fixed); a width
            // without one goes through the scalar tail below. This walk is written out here
            // and again in `accumulate_wide_tile` on purpose: one shared walk taking the
            // per-group work as a closure scored 5-bit codes 8% slower (31.2 -> 28.9 M
            // key-queries/s, three alternating runs), its accumulators no longer in registers.
            // SAFETY: forwarded contract; the groups lie inside the record and the segment.
            let whole = unsafe {
                match w {
                    4 => wide_groups::<4, G>(seg, rec, &qs, (from, groups), &mut acc),
                    5 => wide_groups::<5, G>(seg, rec, &qs, (from, groups), &mut acc),
                    6 => wide_groups::<6, G>(seg, rec, &qs, (from, groups), &mut acc),
                    7 => wide_groups::<7, G>(seg, rec, &qs, (from, groups), &mut acc),
                    8 => wide_groups::<8, G>(seg, rec, &qs, (from, groups), &mut acc),
                    _ => 0,
                }
            };
            for kk in whole..seg.len {
                let c = seg.table[bits::read(rec, seg.bit_offset + kk * w, seg.width) as usize];
                for k in 0..G {
                    tail[k] += qs[k][seg.start + kk] * c;
                }
            }
        }
        let norm = read_f16(rec, ctx.norm_offset);
        let dots = hsums(&acc);
        for k in 0..G {
            out[(qi0 + k) * n + base + r] = norm * (dots[k] + tail[k]);
        }
    }
}
