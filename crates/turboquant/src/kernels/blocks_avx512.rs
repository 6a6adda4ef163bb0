//! AVX-512 kernels for ggml's q8_0 and q4_0 blocks (`crate::ggml`): eight-query key dots
//! by VNNI and 16-lane value sums.

use std::arch::x86_64::*;

#[allow(unused_imports)]
use crate::ggml::dots::TilePlan;
use crate::ggml::dots::VALUE_TILE;
use crate::ggml::read_f16;
use crate::ggml::{BlockType, BLOCK};

/// Dots of every key row with up to eight q8_0 queries, as `avx2::dots8` gives them,
/// with the eight queries in the lanes of one register: per key block and per four
/// coordinates, the keys' four levels broadcast to every lane and multiplied with each
/// query's four codes by one `vpdpbusd`, which takes unsigned bytes on one side: the
/// queries go in as y + 128, and 128·Σx (one more `vpdpbusd` against 128s) is taken off
/// the total. The integer sums are exact, so each lane is the query's `sumi`; the scales
/// then as the other kernels apply them.
///
/// # Safety
/// AVX2, AVX-512 VNNI and VL must be present; as `avx2::dots8`.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
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
    // Per block and group of four codes: the eight queries' four codes + 128, query by
    // query (an absent query is 128s: a zero query).
    let mut yt = vec![128u8; blocks * 8 * 32];
    for (qi, q) in queries.chunks_exact(qrow).enumerate() {
        for b in 0..blocks {
            let codes = &q[b * (2 + BLOCK) + 2..(b + 1) * (2 + BLOCK)];
            for (j, c) in codes.iter().enumerate() {
                yt[(b * 8 + j / 4) * 32 + qi * 4 + j % 4] = (*c as i8 as i16 + 128) as u8;
            }
        }
    }
    let dq = super::blocks_avx2::query_scales(queries, qrow, blocks);
    let c128 = _mm256_set1_epi8(-128);
    for (tk, k) in keys.chunks_exact(row).enumerate() {
        super::blocks_avx2::prefetch_ahead(keys, row, tk);
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            let kb = &k[b * bb..(b + 1) * bb];
            // SAFETY: kb is one whole block.
            let x = unsafe { super::blocks_avx2::key_levels(t, kb) };
            let mut s = _mm256_setzero_si256();
            let mut cs = _mm256_setzero_si256();
            for j in 0..8 {
                let xj = _mm256_permutevar8x32_epi32(x, _mm256_set1_epi32(j as i32));
                // SAFETY: yt holds 8 groups of 32 bytes per block.
                let y = unsafe { _mm256_loadu_si256(yt.as_ptr().add((b * 8 + j) * 32).cast()) };
                s = _mm256_dpbusd_epi32(s, y, xj);
                cs = _mm256_dpbusd_epi32(cs, c128, xj);
            }
            let sumi = _mm256_sub_epi32(s, cs);
            // SAFETY: AVX2 is present; dq holds eight scales for block b.
            acc = unsafe {
                super::blocks_avx2::add_block_term(t, acc, sumi, kb, &dq[b * 8..b * 8 + 8])
            };
        }
        // SAFETY: AVX2 is present; out is as the caller's contract says.
        unsafe { super::blocks_avx2::store_sums(acc, g, out, stride, tk) };
    }
}

/// Sixteen coordinates of a q8_0 or q4_0 block, `half` 0 or 1, as
/// [`BlockType::dequantize_row`] makes them: the level (an exact float) times the scale.
#[target_feature(enable = "avx512f")]
unsafe fn levels16(t: BlockType, block: &[u8], half: usize) -> __m512 {
    let scale = _mm512_set1_ps(read_f16(block, 0));
    let levels = if t == BlockType::Q8_0 {
        // SAFETY: a q8_0 block is 34 bytes: 2 + 16·half + 16 ≤ 34.
        let codes = unsafe { _mm_loadu_si128(block[2 + 16 * half..].as_ptr().cast()) };
        _mm512_cvtepi8_epi32(codes)
    } else {
        // Low nibbles are coordinates 0..16, high nibbles 16..32.
        // SAFETY: a q4_0 block is 18 bytes: its 16 code bytes follow the scale.
        let packed = unsafe { _mm_loadu_si128(block[2..].as_ptr().cast()) };
        let nibbles = if half == 0 {
            packed
        } else {
            _mm_srli_epi16::<4>(packed)
        };
        let codes = _mm512_cvtepu8_epi32(_mm_and_si128(nibbles, _mm_set1_epi8(0x0F)));
        _mm512_sub_epi32(codes, _mm512_set1_epi32(8))
    };
    _mm512_mul_ps(_mm512_cvtepi32_ps(levels), scale)
}

/// `BlockType::accumulate_rows` for q8_0 and q4_0 rows: per tile of rows, per sixteen
/// coordinates, each live row's values made once in a register and fused-added into the
/// output rows that weigh it, rows in order (zero weights skipped, as the portable code
/// skips them).
///
/// # Safety
/// AVX-512F must be present; `t` is q8_0 or q4_0, `rows` whole rows of `row` bytes for
/// `d` coordinates, `weights` `g · n` and `out` `g · d` floats (`g = out.len() / d`).
#[target_feature(enable = "avx512f")]
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
    let mut plan = TilePlan::new(g);
    let mut t0 = 0;
    while t0 < n {
        let m = (n - t0).min(VALUE_TILE);
        // The next tile's rows, while this one is summed (see `avx2::PREFETCH_ROWS`).
        for k in 0..VALUE_TILE {
            super::blocks_avx2::prefetch_ahead(rows, row, t0 + k);
        }
        plan.plan(weights, n, t0, m);
        if plan.full {
            // The common case (every row weighed by every output row): eight rows in
            // eight registers, the weights broadcast from memory.
            for b in 0..d / BLOCK {
                for half in 0..2 {
                    let mut xs = [_mm512_setzero_ps(); VALUE_TILE];
                    for (k, x) in xs.iter_mut().enumerate() {
                        let at = (t0 + k) * row + b * bb;
                        // SAFETY: row t0 + k < n holds the whole block b.
                        *x = unsafe { levels16(t, &rows[at..at + bb], half) };
                    }
                    let col = b * BLOCK + 16 * half;
                    for qi in 0..g {
                        let w: &[f32; VALUE_TILE] = weights[qi * n + t0..][..VALUE_TILE]
                            .try_into()
                            .unwrap_or(&[0.0; VALUE_TILE]);
                        // SAFETY: qi < g and col + 16 ≤ d: sixteen floats of row qi.
                        unsafe {
                            let p = out.as_mut_ptr().add(qi * d + col);
                            let mut acc = _mm512_loadu_ps(p);
                            for (x, &w) in xs.iter().zip(w) {
                                acc = _mm512_fmadd_ps(_mm512_set1_ps(w), *x, acc);
                            }
                            _mm512_storeu_ps(p, acc);
                        }
                    }
                }
            }
            t0 += m;
            continue;
        }
        for b in 0..d / BLOCK {
            for half in 0..2 {
                let mut xs = [_mm512_setzero_ps(); VALUE_TILE];
                for k in (0..m).filter(|&k| plan.need[k]) {
                    let at = (t0 + k) * row + b * bb;
                    // SAFETY: row t0 + k < n holds the whole block b.
                    xs[k] = unsafe { levels16(t, &rows[at..at + bb], half) };
                }
                let col = b * BLOCK + 16 * half;
                for qi in 0..g {
                    if plan.live(qi).is_empty() {
                        continue;
                    }
                    // SAFETY: qi < g and col + 16 ≤ d: sixteen floats of output row qi.
                    unsafe {
                        let p = out.as_mut_ptr().add(qi * d + col);
                        let mut acc = _mm512_loadu_ps(p);
                        for &(w, k) in plan.live(qi) {
                            acc = _mm512_fmadd_ps(_mm512_set1_ps(w), xs[k], acc);
                        }
                        _mm512_storeu_ps(p, acc);
                    }
                }
            }
        }
        t0 += m;
    }
}
