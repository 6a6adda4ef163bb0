//! AVX-512 VNNI backend: one `vpdpbusd` multiplies a plane vector (16 rows × 4 unsigned
//! weights) by 4 broadcast activation bytes and adds 16 row sums at once. Up to four
//! activation rows share each unpacked weight vector (prefill), so a tile is read once per
//! four rows. Q8_0's signed bytes are flipped to unsigned (`q + 128`) and corrected through
//! the activation sums, which leaves the integer dot exactly that of the signed bytes.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::{QuantizedActs, BLOCK};
use super::layout::{Layout, TILE_ROWS, VEC};
use super::{Fmt, Out};

/// How far ahead of the unit being multiplied the tile is prefetched, into L2: a one-row
/// matmul does a lot of work per byte, so without it fewer loads are in flight than the
/// memory bandwidth needs (measured on a Zen 4 with 2 threads: 21.7 GB/s without, 24.8 with;
/// streaming reads alone, 26–30).
const PREFETCH: usize = 8192;

/// Whether this CPU runs this backend.
pub(crate) fn available() -> bool {
    crate::features().avx512_vnni
}

/// Output columns of `tiles` for activation rows `rows`.
///
/// # Safety
/// [`available`] must hold; `data` is the matrix laid out by `lay`, `acts` its activations,
/// and `out` an output of `acts.rows × out.n` floats written by no one else in these columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
pub(crate) unsafe fn run<F: Fmt>(
    lay: &Layout,
    data: &[u8],
    acts: &QuantizedActs,
    rows: Range<usize>,
    tiles: Range<usize>,
    out: Out,
) {
    for t in tiles {
        let tile = data.as_ptr().add(t * lay.tile_bytes);
        let cols = (out.n - t * TILE_ROWS).min(TILE_ROWS);
        let mut m = rows.start;
        while m + 4 <= rows.end {
            tile_rows::<F, 4>(lay, tile, acts, m, out, t, cols);
            m += 4;
        }
        match rows.end - m {
            3 => tile_rows::<F, 3>(lay, tile, acts, m, out, t, cols),
            2 => tile_rows::<F, 2>(lay, tile, acts, m, out, t, cols),
            1 => tile_rows::<F, 1>(lay, tile, acts, m, out, t, cols),
            _ => {}
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// The four group vectors (16 rows × 4 weights each, unsigned) of quad `quad` (weights
/// `16·quad..16·quad + 16` of the superblock whose planes start at `planes`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack<F: Fmt>(lay: &Layout, planes: *const u8, quad: usize) -> [__m512i; 4] {
    let g = F::G;
    if g.bits == 8 {
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        let v = planes.add(4 * quad * VEC);
        return [
            _mm512_xor_si512(load(v), flip),
            _mm512_xor_si512(load(v.add(VEC)), flip),
            _mm512_xor_si512(load(v.add(2 * VEC)), flip),
            _mm512_xor_si512(load(v.add(3 * VEC)), flip),
        ];
    }
    let nib = _mm512_set1_epi8(0x0F);
    let lo0 = load(planes.add(2 * quad * VEC));
    let lo1 = load(planes.add((2 * quad + 1) * VEC));
    let mut w = [
        _mm512_and_si512(lo0, nib),
        _mm512_and_si512(_mm512_srli_epi16::<4>(lo0), nib),
        _mm512_and_si512(lo1, nib),
        _mm512_and_si512(_mm512_srli_epi16::<4>(lo1), nib),
    ];
    let hi = planes.add(lay.hi_offset);
    if g.bits == 5 {
        // Bit i of the hi vector (group 8v + i) moves to bit 4; 16-bit shifts never carry a
        // neighbour's bit into bit 4 for these distances.
        let h = load(hi.add((quad / 2) * VEC));
        let b4 = _mm512_set1_epi8(0x10);
        let hs = if quad.is_multiple_of(2) {
            [
                _mm512_slli_epi16::<4>(h),
                _mm512_slli_epi16::<3>(h),
                _mm512_slli_epi16::<2>(h),
                _mm512_slli_epi16::<1>(h),
            ]
        } else {
            [
                h,
                _mm512_srli_epi16::<1>(h),
                _mm512_srli_epi16::<2>(h),
                _mm512_srli_epi16::<3>(h),
            ]
        };
        for i in 0..4 {
            w[i] = _mm512_or_si512(w[i], _mm512_and_si512(hs[i], b4));
        }
    } else if g.bits == 6 {
        let h = load(hi.add(quad * VEC));
        let b45 = _mm512_set1_epi8(0x30);
        let hs = [
            _mm512_slli_epi16::<4>(h),
            _mm512_slli_epi16::<2>(h),
            h,
            _mm512_srli_epi16::<2>(h),
        ];
        for i in 0..4 {
            w[i] = _mm512_or_si512(w[i], _mm512_and_si512(hs[i], b45));
        }
    }
    w
}

/// The sum of activation row bytes over sub-block `[k0, k0 + sub)`.
#[inline(always)]
fn sub_sum(sums: &[i32], k0: usize, sub: usize) -> i32 {
    if sub == 32 {
        sums[k0 / 16] + sums[k0 / 16 + 1]
    } else {
        sums[k0 / 16]
    }
}

/// One tile for `MR` consecutive activation rows from `m0`, in the portable kernel's order
/// of operations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
unsafe fn tile_rows<F: Fmt, const MR: usize>(
    lay: &Layout,
    tile: *const u8,
    acts: &QuantizedActs,
    m0: usize,
    out: Out,
    t: usize,
    cols: usize,
) {
    let g = F::G;
    let subs_per_unit = BLOCK / g.sub;
    let quads = g.sub / 16;
    let off = if g.bits == 8 { 128 } else { g.offset };
    let yq: [*const u8; MR] = std::array::from_fn(|j| acts.row_q(m0 + j).as_ptr() as *const u8);
    let yd: [&[f32]; MR] = std::array::from_fn(|j| acts.row_d(m0 + j));
    let ys: [&[i32]; MR] = std::array::from_fn(|j| acts.row_sums(m0 + j));
    let yf: [&[f32]; MR] = std::array::from_fn(|j| acts.row_fsums(m0 + j));
    let zero = _mm512_setzero_si512();
    let mut facc = [_mm512_setzero_ps(); MR];
    for b in 0..lay.nsb {
        let planes = tile.add(lay.planes(b));
        let meta = tile.add(lay.meta(b));
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(meta as *const __m256i));
        let mut fmin = [_mm512_setzero_ps(); MR];
        for u in 0..g.sb / BLOCK {
            let unit_bytes = lay.plane_bytes / (g.sb / BLOCK);
            let pf = planes.add(u * unit_bytes + PREFETCH);
            for l in (0..unit_bytes).step_by(VEC) {
                _mm_prefetch::<_MM_HINT_T1>(pf.add(l) as *const i8);
            }
            let mut unit = [zero; MR];
            for i in 0..subs_per_unit {
                let s = u * subs_per_unit + i;
                // Two accumulators per row when there are few rows: one chain of eight
                // dependent dot instructions per unit would hold back the loads behind it.
                let mut dot = [zero; MR];
                let mut dot2 = [zero; MR];
                for q in 0..quads {
                    let quad = s * quads + q;
                    let w = unpack::<F>(lay, planes, quad);
                    let k = b * g.sb + quad * 16;
                    for (i, wi) in w.iter().enumerate() {
                        for j in 0..MR {
                            let y = (yq[j].add(k + 4 * i) as *const i32).read_unaligned();
                            let y = _mm512_set1_epi32(y);
                            if MR <= 2 && i % 2 == 1 {
                                dot2[j] = _mm512_dpbusd_epi32(dot2[j], *wi, y);
                            } else {
                                dot[j] = _mm512_dpbusd_epi32(dot[j], *wi, y);
                            }
                        }
                    }
                }
                if MR <= 2 {
                    for j in 0..MR {
                        dot[j] = _mm512_add_epi32(dot[j], dot2[j]);
                    }
                }
                let k0 = b * g.sb + s * g.sub;
                let scv = if g.scales {
                    let sp = meta.add(lay.scales_offset + s * TILE_ROWS) as *const __m128i;
                    if g.signed_scales {
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(sp))
                    } else {
                        _mm512_cvtepu8_epi32(_mm_loadu_si128(sp))
                    }
                } else {
                    zero
                };
                for j in 0..MR {
                    let corr = if off != 0 {
                        let ysum = sub_sum(ys[j], k0, g.sub);
                        _mm512_sub_epi32(dot[j], _mm512_set1_epi32(off * ysum))
                    } else {
                        dot[j]
                    };
                    unit[j] = if g.scales {
                        _mm512_add_epi32(unit[j], _mm512_mullo_epi32(corr, scv))
                    } else {
                        corr
                    };
                }
            }
            let ku = (b * g.sb) / BLOCK + u;
            for j in 0..MR {
                let dd = _mm512_mul_ps(dv, _mm512_set1_ps(yd[j][ku]));
                facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(unit[j]), dd, facc[j]);
            }
            if g.mins {
                let mp = meta.add(lay.mins_offset + u * TILE_ROWS) as *const __m128i;
                let mnf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(mp)));
                for j in 0..MR {
                    fmin[j] = _mm512_fmadd_ps(mnf, _mm512_set1_ps(yf[j][ku]), fmin[j]);
                }
            }
        }
        if g.mins {
            let dminv = _mm512_cvtph_ps(_mm256_loadu_si256(
                meta.add(lay.dmin_offset) as *const __m256i
            ));
            for j in 0..MR {
                facc[j] = _mm512_fnmadd_ps(fmin[j], dminv, facc[j]);
            }
        }
    }
    for (j, acc) in facc.iter().enumerate() {
        let dst = out.ptr.add((m0 + j) * out.n + t * TILE_ROWS);
        if cols == TILE_ROWS {
            _mm512_storeu_ps(dst, *acc);
        } else {
            _mm512_mask_storeu_ps(dst, ((1u32 << cols) - 1) as __mmask16, *acc);
        }
    }
}
