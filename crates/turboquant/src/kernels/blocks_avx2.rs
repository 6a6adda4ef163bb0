//! AVX2 kernels for ggml's q8_0 and q4_0 blocks (`crate::ggml`): key dots against q8_0
//! queries and value sums, and the prefetch and scale helpers the AVX-512 ones share.

use std::arch::x86_64::*;

#[allow(unused_imports)]
use crate::ggml::dots::TilePlan;
use crate::ggml::dots::VALUE_TILE;
use crate::ggml::read_f16;
use crate::ggml::{BlockType, BLOCK};

/// The 32 signed levels of a q8_0 or q4_0 key block.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn key_levels(t: BlockType, k: &[u8]) -> __m256i {
    // SAFETY: k holds a whole block: 34 bytes (q8_0) or 18 (q4_0).
    if t == BlockType::Q8_0 {
        unsafe { _mm256_loadu_si256(k[2..].as_ptr().cast()) }
    } else {
        let packed = unsafe { _mm_loadu_si128(k[2..].as_ptr().cast()) };
        let low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
        let high = _mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0x0F));
        _mm256_sub_epi8(_mm256_set_m128i(high, low), _mm256_set1_epi8(8))
    }
}

/// Dots of every key row with up to eight q8_0 queries (see `BlockType::dots`): per key
/// block, each query's integer sum as `sum_i8` forms it, the eight reduced together
/// (integer adds: exact in any order), then per query `block_term`'s float operations in
/// its order, lane by lane. Four queries or fewer (a decode step's group of query heads
/// sharing a kv head, on most models) take `dots4`, which does half the integer work.
///
/// # Safety
/// AVX2 must be present; `keys` is whole rows of `row` bytes, `queries` at most eight
/// rows of `qrow` bytes covering as many blocks, and `out` holds `stride` floats for each
/// query but the last and the key rows' count for the last.
#[target_feature(enable = "avx2")]
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
    if g <= 4 {
        // SAFETY: as this function's contract, with at most four queries.
        return unsafe { dots4(t, keys, row, queries, qrow, out, stride) };
    }
    let blocks = row / t.block_bytes();
    let dq = query_scales(queries, qrow, blocks);
    let zero = [0u8; 2 + BLOCK];
    let ones = _mm256_set1_epi16(1);
    for (tk, k) in keys.chunks_exact(row).enumerate() {
        prefetch_ahead(keys, row, tk);
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            let kb = &k[b * t.block_bytes()..(b + 1) * t.block_bytes()];
            // SAFETY: kb is one whole block.
            let x = unsafe { key_levels(t, kb) };
            let ax = _mm256_sign_epi8(x, x);
            let mut quads = [_mm256_setzero_si256(); 8];
            for (qi, quad) in quads.iter_mut().enumerate() {
                let q = if qi < g {
                    &queries[qi * qrow + b * (2 + BLOCK)..]
                } else {
                    &zero[..]
                };
                // SAFETY: q has the block's 32 codes after its 2-byte scale.
                let y = unsafe { _mm256_loadu_si256(q[2..].as_ptr().cast()) };
                let pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
                *quad = _mm256_madd_epi16(pairs, ones);
            }
            // Eight vectors of eight partial sums → one vector of the eight totals.
            let h01 = _mm256_hadd_epi32(quads[0], quads[1]);
            let h23 = _mm256_hadd_epi32(quads[2], quads[3]);
            let h45 = _mm256_hadd_epi32(quads[4], quads[5]);
            let h67 = _mm256_hadd_epi32(quads[6], quads[7]);
            let h0123 = _mm256_hadd_epi32(h01, h23);
            let h4567 = _mm256_hadd_epi32(h45, h67);
            let sumi = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(h0123, h4567),
                _mm256_permute2x128_si256::<0x31>(h0123, h4567),
            );
            // SAFETY: AVX2 is present; dq holds eight scales for block b.
            acc = unsafe { add_block_term(t, acc, sumi, kb, &dq[b * 8..b * 8 + 8]) };
        }
        // SAFETY: AVX2 is present; out holds stride floats per query (the caller's
        // contract).
        unsafe { store_sums(acc, g, out, stride, tk) };
    }
}

/// `dots8` for at most four queries, in the four lanes of 128-bit registers: the same
/// integer sums (exact) and the same float operations per lane, so the same floats.
///
/// # Safety
/// As `dots8`, with at most four queries.
#[target_feature(enable = "avx2")]
unsafe fn dots4(
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
    let dq8 = query_scales(queries, qrow, blocks);
    // The query codes by block, four queries per block (an absent query is zeros).
    let mut ys = vec![0u8; blocks * 4 * BLOCK];
    for (qi, q) in queries.chunks_exact(qrow).enumerate() {
        for b in 0..blocks {
            let codes = &q[b * (2 + BLOCK) + 2..(b + 1) * (2 + BLOCK)];
            ys[(b * 4 + qi) * BLOCK..][..BLOCK].copy_from_slice(codes);
        }
    }
    let ones = _mm256_set1_epi16(1);
    for (tk, k) in keys.chunks_exact(row).enumerate() {
        prefetch_ahead(keys, row, tk);
        let mut acc = _mm_setzero_ps();
        for b in 0..blocks {
            let kb = &k[b * bb..(b + 1) * bb];
            // SAFETY: kb is one whole block.
            let x = unsafe { key_levels(t, kb) };
            let ax = _mm256_sign_epi8(x, x);
            let mut quads = [_mm256_setzero_si256(); 4];
            for (qi, quad) in quads.iter_mut().enumerate() {
                // SAFETY: ys holds four blocks of 32 codes per key block.
                let y = unsafe { _mm256_loadu_si256(ys[(b * 4 + qi) * BLOCK..].as_ptr().cast()) };
                let pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
                *quad = _mm256_madd_epi16(pairs, ones);
            }
            // Four vectors of eight partial sums → the four totals.
            let h01 = _mm256_hadd_epi32(quads[0], quads[1]);
            let h23 = _mm256_hadd_epi32(quads[2], quads[3]);
            let h = _mm256_hadd_epi32(h01, h23);
            let sumi = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            // `add_block_term`'s operations, in four lanes.
            let fi = _mm_cvtepi32_ps(sumi);
            let dk = _mm_set1_ps(read_f16(kb, 0));
            // SAFETY: dq8 holds eight scales per block.
            let dqv = unsafe { _mm_loadu_ps(dq8[b * 8..].as_ptr()) };
            let term = if t == BlockType::Q8_0 {
                _mm_mul_ps(fi, _mm_mul_ps(dk, dqv))
            } else {
                _mm_mul_ps(_mm_mul_ps(fi, dk), dqv)
            };
            acc = _mm_add_ps(acc, term);
        }
        let mut sums = [0f32; 4];
        // SAFETY: sums has four floats.
        unsafe { _mm_storeu_ps(sums.as_mut_ptr(), acc) };
        for (qi, &v) in sums.iter().enumerate().take(g) {
            out[qi * stride + tk] = v;
        }
    }
}

/// Per block, the eight queries' scales of a many-query dot kernel (zero past the last
/// query).
/// Rows ahead of the one being read whose bytes are prefetched: a decode step reads the
/// cache cold (the weights streamed since the last step evicted it), where demand loads
/// alone left the kernels waiting on DRAM.
pub(crate) const PREFETCH_ROWS: usize = 8;

/// Asks for every cache line of `bytes` in all cache levels (a hint: never faults).
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8]) {
    let p = bytes.as_ptr() as *const i8;
    // SAFETY: prefetching has no architectural effect and cannot fault; the addresses
    // stay within `bytes`.
    unsafe {
        for off in (0..bytes.len()).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(p.add(off));
        }
        if let Some(last) = bytes.len().checked_sub(1) {
            _mm_prefetch::<_MM_HINT_T0>(p.add(last));
        }
    }
}

/// Prefetches row `t + PREFETCH_ROWS` of `rows` (rows of `row` bytes), if there is one.
#[inline(always)]
pub(crate) fn prefetch_ahead(rows: &[u8], row: usize, t: usize) {
    let at = (t + PREFETCH_ROWS) * row;
    if let Some(next) = rows.get(at..at + row) {
        prefetch(next);
    }
}

pub(crate) fn query_scales(queries: &[u8], qrow: usize, blocks: usize) -> Vec<f32> {
    let mut dq = vec![0f32; blocks * 8];
    for (qi, q) in queries.chunks_exact(qrow).enumerate() {
        for b in 0..blocks {
            dq[b * 8 + qi] = read_f16(q, b * (2 + BLOCK));
        }
    }
    dq
}

/// `acc` plus one key block's eight terms, from the eight queries' integer sums `sumi`
/// and their scales `dq`: `block_term`'s float operations in its order, lane by lane
/// (q8_0 is sumi·(dk·dq), q4_0 (sumi·dk)·dq).
///
/// # Safety
/// AVX2 must be present; `kb` is a whole block, `dq` eight floats.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn add_block_term(
    t: BlockType,
    acc: __m256,
    sumi: __m256i,
    kb: &[u8],
    dq: &[f32],
) -> __m256 {
    let fi = _mm256_cvtepi32_ps(sumi);
    let dk = _mm256_set1_ps(read_f16(kb, 0));
    // SAFETY: dq holds eight floats.
    let dqv = unsafe { _mm256_loadu_ps(dq.as_ptr()) };
    let term = if t == BlockType::Q8_0 {
        _mm256_mul_ps(fi, _mm256_mul_ps(dk, dqv))
    } else {
        _mm256_mul_ps(_mm256_mul_ps(fi, dk), dqv)
    };
    _mm256_add_ps(acc, term)
}

/// Key row `tk`'s dots with the first `g` of eight queries, from their lanes in `acc`.
///
/// # Safety
/// AVX2 must be present; `out` holds `stride` floats for each of the `g` queries but the
/// last, and more than `tk` for the last.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn store_sums(acc: __m256, g: usize, out: &mut [f32], stride: usize, tk: usize) {
    let mut sums = [0f32; 8];
    // SAFETY: sums has eight floats.
    unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), acc) };
    for (qi, &v) in sums.iter().enumerate().take(g) {
        out[qi * stride + tk] = v;
    }
}

/// `ggml::dots::axpy_portable` of each row `k` of `xs` (rows of `o.len()`) with weight
/// `ws[k]` in turn, zero weights skipped, eight lanes at a time with the output held in
/// a register across the rows: every element sees the same fused adds in the same order.
///
/// # Safety
/// AVX2 and FMA must be present; `xs` holds at least `ws.len()` rows of `o.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy_tile(ws: &[f32], xs: &[f32], o: &mut [f32]) {
    let d = o.len();
    // The rows weighed, in order, with their broadcast weights.
    let mut live = [(_mm256_setzero_ps(), 0usize); 8];
    let mut m = 0;
    for (k, &w) in ws.iter().enumerate().take(8) {
        if w != 0.0 {
            live[m] = (_mm256_set1_ps(w), k * d);
            m += 1;
        }
    }
    let live = &live[..m];
    let mut j = 0;
    while j + 8 <= d {
        // SAFETY: j + 8 ≤ d, and every row k < ws.len() of xs has d floats.
        unsafe {
            let mut acc = _mm256_loadu_ps(o.as_ptr().add(j));
            for &(wv, at) in live {
                acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs.as_ptr().add(at + j)), acc);
            }
            _mm256_storeu_ps(o.as_mut_ptr().add(j), acc);
        }
        j += 8;
    }
    for (jj, o) in o.iter_mut().enumerate().skip(j) {
        for (k, &w) in ws.iter().enumerate() {
            if w != 0.0 {
                *o = w.mul_add(xs[k * d + jj], *o);
            }
        }
    }
}

/// Eight coordinates of a q8_0 or q4_0 block, `quarter` 0 to 3, as
/// [`BlockType::dequantize_row`] makes them: the level (an exact float) times `scale`,
/// the block's.
///
/// # Safety
/// AVX2 must be present; `block` is one whole block of `t`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn levels8(t: BlockType, block: &[u8], quarter: usize, scale: __m256) -> __m256 {
    let levels = if t == BlockType::Q8_0 {
        // SAFETY: a q8_0 block is 34 bytes: 2 + 8·quarter + 8 ≤ 34.
        let codes = unsafe { _mm_loadl_epi64(block[2 + 8 * quarter..].as_ptr().cast()) };
        _mm256_cvtepi8_epi32(codes)
    } else {
        // Low nibbles of the 16 code bytes are coordinates 0..16, high nibbles 16..32.
        // SAFETY: a q4_0 block is 18 bytes: 2 + 8·(quarter % 2) + 8 ≤ 18.
        let packed = unsafe { _mm_loadl_epi64(block[2 + 8 * (quarter % 2)..].as_ptr().cast()) };
        let nibbles = if quarter < 2 {
            packed
        } else {
            _mm_srli_epi16::<4>(packed)
        };
        let codes = _mm256_cvtepu8_epi32(_mm_and_si128(nibbles, _mm_set1_epi8(0x0F)));
        _mm256_sub_epi32(codes, _mm256_set1_epi32(8))
    };
    _mm256_mul_ps(_mm256_cvtepi32_ps(levels), scale)
}

/// `BlockType::accumulate_rows` for q8_0 and q4_0 rows, as `avx512::accumulate` sums
/// them in eight lanes: per tile of rows, per eight coordinates, each weighed row's
/// values made once in a register and fused-added into every output row that weighs it,
/// rows in order (zero weights skipped, as the portable code skips them). No row is
/// dequantized to memory.
///
/// # Safety
/// AVX2 and FMA must be present; `t` is q8_0 or q4_0, `rows` whole rows of `row` bytes
/// for `d` coordinates, `weights` `g · n` and `out` `g · d` floats (`g = out.len() / d`).
#[target_feature(enable = "avx2,fma")]
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
    let blocks = d / BLOCK;
    let mut plan = TilePlan::new(g);
    // The tile's block scales, row by row, read once per tile.
    let mut scales = vec![_mm256_setzero_ps(); VALUE_TILE * blocks];
    // A whole tile's block of 32 coordinates, rewritten whole for every block: zeroed
    // once here, where zeroing it per block was a memset call and 5% of a decode step's
    // attention over q8_0.
    let mut xs = [[_mm256_setzero_ps(); VALUE_TILE]; 4];
    let mut t0 = 0;
    while t0 < n {
        let m = (n - t0).min(VALUE_TILE);
        for k in 0..VALUE_TILE {
            prefetch_ahead(rows, row, t0 + k);
        }
        plan.plan(weights, n, t0, m);
        if plan.full {
            // The common case (every row weighed by every output row): a block's 32
            // coordinates of the tile's eight rows made once (32 vectors, held in L1),
            // then per output row four independent chains of fused adds, one per eight
            // coordinates, rows in order in each (one chain at a time waited on the
            // FMA's latency).
            for b in 0..blocks {
                for k in 0..VALUE_TILE {
                    let at = (t0 + k) * row + b * bb;
                    let block = &rows[at..at + bb];
                    let sc = _mm256_set1_ps(read_f16(block, 0));
                    for (quarter, x) in xs.iter_mut().enumerate() {
                        // SAFETY: block is one whole block of t.
                        x[k] = unsafe { levels8(t, block, quarter, sc) };
                    }
                }
                let col = b * BLOCK;
                for qi in 0..g {
                    let w = &weights[qi * n + t0..][..VALUE_TILE];
                    // SAFETY: qi < g and col + 32 ≤ d: 32 floats of row qi.
                    unsafe {
                        let p = out.as_mut_ptr().add(qi * d + col);
                        let mut acc: [__m256; 4] =
                            std::array::from_fn(|c| _mm256_loadu_ps(p.add(8 * c)));
                        for (k, &w) in w.iter().enumerate() {
                            let wv = _mm256_set1_ps(w);
                            for c in 0..4 {
                                acc[c] = _mm256_fmadd_ps(wv, xs[c][k], acc[c]);
                            }
                        }
                        for (c, a) in acc.iter().enumerate() {
                            _mm256_storeu_ps(p.add(8 * c), *a);
                        }
                    }
                }
            }
            t0 += m;
            continue;
        }
        for k in (0..m).filter(|&k| plan.need[k]) {
            for b in 0..blocks {
                scales[k * blocks + b] = _mm256_set1_ps(read_f16(rows, (t0 + k) * row + b * bb));
            }
        }
        for b in 0..blocks {
            for quarter in 0..4 {
                let mut xs = [_mm256_setzero_ps(); VALUE_TILE];
                for k in (0..m).filter(|&k| plan.need[k]) {
                    let at = (t0 + k) * row + b * bb;
                    // SAFETY: row t0 + k < n holds the whole block b.
                    xs[k] =
                        unsafe { levels8(t, &rows[at..at + bb], quarter, scales[k * blocks + b]) };
                }
                let col = b * BLOCK + 8 * quarter;
                for qi in 0..g {
                    if plan.live(qi).is_empty() {
                        continue;
                    }
                    // SAFETY: qi < g and col + 8 ≤ d: eight floats of output row qi.
                    unsafe {
                        let p = out.as_mut_ptr().add(qi * d + col);
                        let mut acc = _mm256_loadu_ps(p);
                        for &(w, k) in plan.live(qi) {
                            acc = _mm256_fmadd_ps(_mm256_set1_ps(w), xs[k], acc);
                        }
                        _mm256_storeu_ps(p, acc);
                    }
                }
            }
        }
        t0 += m;
    }
}

/// Σ x_j·y_j over 32 signed bytes, exactly: |x| times y with x's sign, in pairs of at
/// most 2·128·127 (an i16), then in i32.
#[target_feature(enable = "avx2")]
fn sum_i8(x: __m256i, y: __m256i) -> i32 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    let pairs = _mm256_maddubs_epi16(ax, sy);
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(quads),
        _mm256_extracti128_si256::<1>(quads),
    );
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// # Safety
/// AVX2 must be present; `keys` holds whole blocks of `t` (q8_0 or q4_0) and `query` the
/// q8_0 blocks for as many coordinates.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot(t: BlockType, keys: &[u8], query: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (k, q) in keys
        .chunks_exact(t.block_bytes())
        .zip(query.chunks_exact(2 + BLOCK))
    {
        // SAFETY: q holds 34 bytes, k a whole block of t: the loads stay inside.
        let (x, y) = unsafe { (key_levels(t, k), _mm256_loadu_si256(q[2..].as_ptr().cast())) };
        sumf += t.block_term(k, q, sum_i8(x, y));
    }
    sumf
}
