//! AVX2 backend: the AVX-512 backend's arithmetic on 256-bit vectors, each tile taken as two
//! halves of 8 rows (the 32-byte halves of every plane vector). Decode runs both halves in
//! one pass; prefill runs four activation rows over one half at a time (the second half
//! pass finds the tile in cache). Without `vpdpbusd`, a dot of 4 byte pairs is `vpmaddubsw`
//! (pairs to 16 bits; no pair can saturate), several of which add up in 16 bits before one
//! `vpmaddwd` by ones widens them; Q8_0's signed bytes take the sign trick (`|w|·sign(y,
//! w)`), so its integer dot is exact without an offset.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::{QuantizedActs, BLOCK};
use super::layout::{Layout, TILE_ROWS, VEC};
use super::{Fmt, Out};

/// How far ahead the tile is prefetched into L2 (see the AVX-512 backend).
const PREFETCH: usize = 8192;

/// Rows per half tile.
const HALF: usize = TILE_ROWS / 2;

/// Whether this CPU runs this backend.
pub(crate) fn available() -> bool {
    crate::features().avx2
}

/// Output columns of `tiles` for activation rows `rows`.
///
/// # Safety
/// As [`super::avx512::run`], with [`available`].
#[target_feature(enable = "avx2,fma,f16c")]
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
        if rows.len() == 1 {
            // One row (decode): both halves in one pass, so each broadcast activation word
            // and each unit's scalar work serves 16 rows.
            let col0 = t * TILE_ROWS;
            let cols = (out.n - col0).min(TILE_ROWS);
            rows_halves::<F, 1, 2>(lay, tile, 0, acts, rows.start, out, col0, cols);
            continue;
        }
        for h in 0..2 {
            let col0 = t * TILE_ROWS + h * HALF;
            if col0 >= out.n {
                break;
            }
            let cols = (out.n - col0).min(HALF);
            let mut m = rows.start;
            while m + 4 <= rows.end {
                rows_halves::<F, 4, 1>(lay, tile, h, acts, m, out, col0, cols);
                m += 4;
            }
            match rows.end - m {
                3 => rows_halves::<F, 3, 1>(lay, tile, h, acts, m, out, col0, cols),
                2 => rows_halves::<F, 2, 1>(lay, tile, h, acts, m, out, col0, cols),
                1 => rows_halves::<F, 1, 1>(lay, tile, h, acts, m, out, col0, cols),
                _ => {}
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The four group vectors of quad `quad` for half `h` (8 rows × 4 weights each); unsigned,
/// except Q8_0's, which stay signed.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unpack<F: Fmt>(lay: &Layout, planes: *const u8, quad: usize, h: usize) -> [__m256i; 4] {
    let g = F::G;
    let half = h * (VEC / 2);
    if g.bits == 8 {
        let v = planes.add(4 * quad * VEC + half);
        return [
            load(v),
            load(v.add(VEC)),
            load(v.add(2 * VEC)),
            load(v.add(3 * VEC)),
        ];
    }
    let nib = _mm256_set1_epi8(0x0F);
    let lo0 = load(planes.add(2 * quad * VEC + half));
    let lo1 = load(planes.add((2 * quad + 1) * VEC + half));
    let mut w = [
        _mm256_and_si256(lo0, nib),
        _mm256_and_si256(_mm256_srli_epi16::<4>(lo0), nib),
        _mm256_and_si256(lo1, nib),
        _mm256_and_si256(_mm256_srli_epi16::<4>(lo1), nib),
    ];
    let hi = planes.add(lay.hi_offset + half);
    if g.bits == 5 {
        let hv = load(hi.add((quad / 2) * VEC));
        let b4 = _mm256_set1_epi8(0x10);
        let hs = if quad.is_multiple_of(2) {
            [
                _mm256_slli_epi16::<4>(hv),
                _mm256_slli_epi16::<3>(hv),
                _mm256_slli_epi16::<2>(hv),
                _mm256_slli_epi16::<1>(hv),
            ]
        } else {
            [
                hv,
                _mm256_srli_epi16::<1>(hv),
                _mm256_srli_epi16::<2>(hv),
                _mm256_srli_epi16::<3>(hv),
            ]
        };
        for (wi, hi) in w.iter_mut().zip(hs) {
            *wi = _mm256_or_si256(*wi, _mm256_and_si256(hi, b4));
        }
    } else if g.bits == 6 {
        let hv = load(hi.add(quad * VEC));
        let b45 = _mm256_set1_epi8(0x30);
        let hs = [
            _mm256_slli_epi16::<4>(hv),
            _mm256_slli_epi16::<2>(hv),
            hv,
            _mm256_srli_epi16::<2>(hv),
        ];
        for (wi, hi) in w.iter_mut().zip(hs) {
            *wi = _mm256_or_si256(*wi, _mm256_and_si256(hi, b45));
        }
    }
    w
}

/// The byte products of 4 weights by 4 broadcast activations, as 16-bit pair sums: `w`
/// unsigned (or, `SIGNED`, signed through the sign trick) times signed `y`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pair_products<const SIGNED: bool>(w: __m256i, y: __m256i) -> __m256i {
    if SIGNED {
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
    } else {
        _mm256_maddubs_epi16(w, y)
    }
}

/// How many [`pair_products`] of `bits`-bit weights add up in 16-bit lanes before they must
/// be widened to 32 bits: each pair sum is at most `2·w_max·127` (activations are clamped to
/// ±127; Q8_0's magnitudes reach 128). Widening (`vpmaddwd` by ones) once per 8 products
/// (4-bit) instead of once per product halves the multiplies of a dot.
const fn products_per_widening(bits: u32) -> usize {
    let w_max = if bits == 8 { 128 } else { (1 << bits) - 1 };
    i16::MAX as usize / (2 * w_max * 127)
}

#[inline(always)]
fn sub_sum(sums: &[i32], k0: usize, sub: usize) -> i32 {
    if sub == 32 {
        sums[k0 / 16] + sums[k0 / 16 + 1]
    } else {
        sums[k0 / 16]
    }
}

/// `H` halves of a tile from half `h0` (columns `col0..col0 + cols`) for `MR` consecutive
/// activation rows from `m0`. Decode takes one row and both halves (a broadcast activation
/// word feeds 16 rows); prefill takes four rows and one half (a weight vector feeds 4 rows).
// Indices name a row and a half across several parallel register arrays.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_halves<F: Fmt, const MR: usize, const H: usize>(
    lay: &Layout,
    tile: *const u8,
    h0: usize,
    acts: &QuantizedActs,
    m0: usize,
    out: Out,
    col0: usize,
    cols: usize,
) {
    let g = F::G;
    let subs_per_unit = BLOCK / g.sub;
    let quads = g.sub / 16;
    let signed = g.bits == 8;
    let widen = products_per_widening(g.bits);
    let yq: [*const u8; MR] = std::array::from_fn(|j| acts.row_q(m0 + j).as_ptr() as *const u8);
    let yd: [&[f32]; MR] = std::array::from_fn(|j| acts.row_d(m0 + j));
    let ys: [&[i32]; MR] = std::array::from_fn(|j| acts.row_sums(m0 + j));
    let yf: [&[f32]; MR] = std::array::from_fn(|j| acts.row_fsums(m0 + j));
    let zero = _mm256_setzero_si256();
    let ones = _mm256_set1_epi16(1);
    let mut facc = [[_mm256_setzero_ps(); H]; MR];
    for b in 0..lay.nsb {
        let planes = tile.add(lay.planes(b));
        let meta = tile.add(lay.meta(b));
        let dv: [__m256; H] = std::array::from_fn(|x| {
            let p = meta.add(2 * HALF * (h0 + x)) as *const __m128i;
            _mm256_cvtph_ps(_mm_loadu_si128(p))
        });
        let mut fmin = [[_mm256_setzero_ps(); H]; MR];
        for u in 0..g.sb / BLOCK {
            if h0 == 0 {
                let unit_bytes = lay.plane_bytes / (g.sb / BLOCK);
                let pf = planes.add(u * unit_bytes + PREFETCH);
                for l in (0..unit_bytes).step_by(VEC) {
                    _mm_prefetch::<_MM_HINT_T1>(pf.add(l) as *const i8);
                }
            }
            let mut unit = [[zero; H]; MR];
            for i in 0..subs_per_unit {
                let s = u * subs_per_unit + i;
                let mut dot = [[zero; H]; MR];
                let mut pairs = [[zero; H]; MR];
                let mut pending = 0;
                for q in 0..quads {
                    let quad = s * quads + q;
                    let w: [[__m256i; 4]; H] =
                        std::array::from_fn(|x| unpack::<F>(lay, planes, quad, h0 + x));
                    let k = b * g.sb + quad * 16;
                    for gi in 0..4 {
                        for j in 0..MR {
                            let y4 = (yq[j].add(k + 4 * gi) as *const i32).read_unaligned();
                            let y = _mm256_set1_epi32(y4);
                            for x in 0..H {
                                let p = if signed {
                                    pair_products::<true>(w[x][gi], y)
                                } else {
                                    pair_products::<false>(w[x][gi], y)
                                };
                                pairs[j][x] = _mm256_add_epi16(pairs[j][x], p);
                            }
                        }
                        pending += 1;
                        if pending == widen {
                            for j in 0..MR {
                                for x in 0..H {
                                    let wide = _mm256_madd_epi16(pairs[j][x], ones);
                                    dot[j][x] = _mm256_add_epi32(dot[j][x], wide);
                                    pairs[j][x] = zero;
                                }
                            }
                            pending = 0;
                        }
                    }
                }
                debug_assert_eq!(pending, 0, "a sub-block's groups are a multiple of {widen}");
                let k0 = b * g.sb + s * g.sub;
                let scv: [__m256i; H] = std::array::from_fn(|x| {
                    if !g.scales {
                        return zero;
                    }
                    let sp = meta.add(lay.scales_offset + s * TILE_ROWS + HALF * (h0 + x));
                    let sp = _mm_loadl_epi64(sp as *const __m128i);
                    if g.signed_scales {
                        _mm256_cvtepi8_epi32(sp)
                    } else {
                        _mm256_cvtepu8_epi32(sp)
                    }
                });
                for j in 0..MR {
                    for x in 0..H {
                        let corr = if g.offset != 0 {
                            let ysum = sub_sum(ys[j], k0, g.sub);
                            _mm256_sub_epi32(dot[j][x], _mm256_set1_epi32(g.offset * ysum))
                        } else {
                            dot[j][x]
                        };
                        unit[j][x] = if g.scales {
                            _mm256_add_epi32(unit[j][x], _mm256_mullo_epi32(corr, scv[x]))
                        } else {
                            corr
                        };
                    }
                }
            }
            let ku = (b * g.sb) / BLOCK + u;
            for j in 0..MR {
                let yd = _mm256_set1_ps(yd[j][ku]);
                for x in 0..H {
                    let dd = _mm256_mul_ps(dv[x], yd);
                    facc[j][x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(unit[j][x]), dd, facc[j][x]);
                }
            }
            if g.mins {
                for x in 0..H {
                    let mp = meta.add(lay.mins_offset + u * TILE_ROWS + HALF * (h0 + x));
                    let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(mp as *const __m128i));
                    let mnf = _mm256_cvtepi32_ps(mins);
                    for j in 0..MR {
                        fmin[j][x] = _mm256_fmadd_ps(mnf, _mm256_set1_ps(yf[j][ku]), fmin[j][x]);
                    }
                }
            }
        }
        if g.mins {
            for x in 0..H {
                let p = meta.add(lay.dmin_offset + 2 * HALF * (h0 + x)) as *const __m128i;
                let dminv = _mm256_cvtph_ps(_mm_loadu_si128(p));
                for j in 0..MR {
                    facc[j][x] = _mm256_fnmadd_ps(fmin[j][x], dminv, facc[j][x]);
                }
            }
        }
    }
    let mut row = [0f32; TILE_ROWS];
    for (j, acc) in facc.iter().enumerate() {
        for (x, v) in acc.iter().enumerate() {
            _mm256_storeu_ps(row.as_mut_ptr().add(x * HALF), *v);
        }
        let dst = out.ptr.add((m0 + j) * out.n + col0);
        std::ptr::copy_nonoverlapping(row.as_ptr(), dst, cols);
    }
}
