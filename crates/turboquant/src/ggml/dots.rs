//! Dot products of key blocks with quantized queries and weighted sums of value blocks, as
//! ggml's portable code computes them (the reference), and the choice of SIMD kernel
//! (`crate::kernels::blocks_*`, the same floats) for the CPU this runs on.

use super::codes::{check_len, read_f16, round_away, write_f16};
use super::{BlockType, BLOCK};
use crate::error::{Error, Result};
#[cfg(all(
    target_arch = "aarch64",
    target_feature = "neon",
    target_endian = "little"
))]
use crate::kernels::blocks_neon as neon;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{blocks_avx2 as avx2, blocks_avx512 as avx512};

impl BlockType {
    /// Whether a query dotted with keys of this type is quantized to q8_1 (q4_1 and q5_1,
    /// whose minimum needs the query's sum) rather than q8_0: ggml's `vec_dot_type`. Their dot
    /// uses that sum as stored (an f16), so it is not the plain product of the floats that
    /// [`BlockType::dequantize_row`] and [`BlockType::dequantize_query`] give.
    pub fn query_is_q8_1(self) -> bool {
        self.row().affine
    }

    /// Bytes of a query of `n` coordinates quantized for keys of this type: 34 a block in
    /// q8_0, 36 in q8_1 (its scale, and the scale times the codes' sum, both f16).
    pub fn query_bytes(self, n: usize) -> Result<usize> {
        let block = if self.query_is_q8_1() { 36 } else { 34 };
        Ok(self.row_bytes(n)? / self.block_bytes() * block)
    }

    /// Quantizes a query for dot products with keys of this type, as ggml does before
    /// attention (`quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`).
    pub fn quantize_query(self, x: &[f32], out: &mut [u8]) -> Result<()> {
        check_len(out.len(), self.query_bytes(x.len())?)?;
        if !self.query_is_q8_1() {
            return BlockType::Q8_0.quantize_row(x, out);
        }
        for (xb, q) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(36)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (c, &v) in q[4..].iter_mut().zip(xb) {
                let code = round_away(v * id);
                sum += code;
                *c = code as i8 as u8;
            }
            write_f16(q, 0, d);
            write_f16(q, 2, sum as f32 * d);
        }
        Ok(())
    }

    /// Weighted sums of rows of this type, as attention sums values: `out[qi·d + j] +=
    /// Σ_t weights[qi·n + t] · x_t[j]`, for the `n` rows of `d` coordinates in `rows` and
    /// the `g = out.len() / d` weight rows. Each row is dequantized once (as
    /// [`BlockType::dequantize_row`] does) and fused-multiply-added into every output row
    /// whose weight is not zero, rows in order: every kernel adds the same floats in the same
    /// order as the portable one (`mul_add`), so their sums are equal bit for bit.
    pub fn accumulate_rows(
        self,
        rows: &[u8],
        d: usize,
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.accumulate_rows_with(self.value_kernel(), rows, d, weights, out)
    }

    /// The fastest value-sum kernel this CPU runs for this type.
    pub(super) fn value_kernel(self) -> ValueKernel {
        #[cfg(target_arch = "x86_64")]
        {
            if self.has_simd() && crate::features::avx512() {
                return ValueKernel::Avx512;
            }
            if crate::features::avx2() {
                return ValueKernel::Avx2;
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if self.has_simd() {
            return ValueKernel::Neon;
        }
        ValueKernel::Portable
    }

    /// [`BlockType::accumulate_rows`] with the kernel chosen (`kernel` must run here).
    pub(super) fn accumulate_rows_with(
        self,
        kernel: ValueKernel,
        rows: &[u8],
        d: usize,
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let row = self.row_bytes(d)?;
        let n = rows.len().checked_div(row).unwrap_or(0);
        check_len(rows.len(), n * row)?;
        let g = out.len().checked_div(d).unwrap_or(0);
        check_len(out.len(), g * d)?;
        check_len(weights.len(), g * n)?;
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if kernel == ValueKernel::Neon {
            // SAFETY: value_kernel chose NEON for q8_0/q4_0 only; rows, weights and out were
            // checked against n, d and g above.
            unsafe { neon::accumulate(self, rows, row, d, weights, out) };
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if kernel == ValueKernel::Avx2 && self.has_simd() {
            // SAFETY: value_kernel chose AVX2 on a CPU with AVX2 and FMA; rows, weights and
            // out were checked against n, d and g above.
            unsafe { avx2::accumulate(self, rows, row, d, weights, out) };
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if kernel == ValueKernel::Avx512 {
            // SAFETY: value_kernel chose AVX-512 for q8_0/q4_0 only, on a CPU that has it;
            // rows, weights and out were checked against n, d and g above.
            unsafe { avx512::accumulate(self, rows, row, d, weights, out) };
            return Ok(());
        }
        // Rows go in tiles: each output row is loaded and stored once per tile, not once
        // per row, while the tile's dequantized rows stay in L1.
        let mut xs = vec![0f32; VALUE_TILE * d];
        let mut t0 = 0;
        while t0 < n {
            let t1 = (t0 + VALUE_TILE).min(n);
            #[cfg(target_arch = "x86_64")]
            if kernel == ValueKernel::Avx2 {
                // The next tile's rows, while this one is summed (see `avx2::PREFETCH_ROWS`).
                for k in 0..VALUE_TILE {
                    avx2::prefetch_ahead(rows, row, t0 + k);
                }
            }
            for t in t0..t1 {
                if (0..g).any(|qi| weights[qi * n + t] != 0.0) {
                    let x = &mut xs[(t - t0) * d..(t - t0 + 1) * d];
                    self.dequantize_row(&rows[t * row..(t + 1) * row], x)?;
                }
            }
            for (qi, o) in out.chunks_exact_mut(d).enumerate() {
                let ws = &weights[qi * n + t0..qi * n + t1];
                if ws.iter().all(|&w| w == 0.0) {
                    continue;
                }
                #[cfg(target_arch = "x86_64")]
                if kernel == ValueKernel::Avx2 {
                    // SAFETY: value_kernel found AVX2 and FMA; `xs` holds `ws.len()` rows of
                    // `d`, `o` is `d` long.
                    unsafe { avx2::axpy_tile(ws, &xs, o) };
                    continue;
                }
                for (k, &w) in ws.iter().enumerate() {
                    if w != 0.0 {
                        axpy_portable(w, &xs[k * d..(k + 1) * d], o);
                    }
                }
            }
            t0 = t1;
        }
        Ok(())
    }

    /// [`BlockType::dot`] of every key row in `keys` with every query in `queries` (each
    /// row as many blocks as a query): `out[qi·stride + t]` is key row `t` with query `qi`,
    /// the same float as [`BlockType::dot`]. q8_0 and q4_0 keys take a SIMD kernel where
    /// there is one (AVX-512 VNNI, else AVX2), eight queries per pass over a key block: the
    /// block is loaded and unpacked once, the eight integer sums formed together, the scales
    /// applied as the portable code applies them.
    pub fn dots(
        self,
        keys: &[u8],
        queries: &[u8],
        d: usize,
        out: &mut [f32],
        stride: usize,
    ) -> Result<()> {
        let row = self.row_bytes(d)?;
        let qrow = self.query_bytes(d)?;
        let n = keys.len().checked_div(row).unwrap_or(0);
        check_len(keys.len(), n * row)?;
        let g = queries.len().checked_div(qrow).unwrap_or(0);
        check_len(queries.len(), g * qrow)?;
        if g > 0 && (stride < n || out.len() < (g - 1) * stride + n) {
            return Err(Error::DimensionMismatch {
                expected: (g - 1) * stride.max(n) + n,
                got: out.len(),
            });
        }
        if n == 0 || g == 0 {
            return Ok(());
        }
        self.dots_with(self.dot_kernel(), keys, queries, d, out, stride)
    }

    /// The fastest many-query dot kernel this CPU runs for this type.
    pub(super) fn dot_kernel(self) -> DotKernel {
        #[cfg(target_arch = "x86_64")]
        if self.has_simd() {
            if crate::features::avx512_vnni() {
                return DotKernel::Vnni;
            }
            if crate::features::avx2() {
                return DotKernel::Avx2;
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if self.has_simd() {
            return DotKernel::Neon;
        }
        DotKernel::Portable
    }

    /// [`BlockType::dots`] with the kernel chosen (`kernel` must run here), on arguments
    /// `dots` checked.
    pub(super) fn dots_with(
        self,
        kernel: DotKernel,
        keys: &[u8],
        queries: &[u8],
        d: usize,
        out: &mut [f32],
        stride: usize,
    ) -> Result<()> {
        let row = self.row_bytes(d)?;
        let qrow = self.query_bytes(d)?;
        let n = keys.len().checked_div(row).unwrap_or(0);
        match kernel {
            #[cfg(target_arch = "x86_64")]
            DotKernel::Avx2 | DotKernel::Vnni => {
                for (c, qs) in queries.chunks(8 * qrow).enumerate() {
                    let out = &mut out[c * 8 * stride..];
                    // SAFETY: dot_kernel found the instructions, for q8_0/q4_0 only; every key
                    // row and query is `d / 32` blocks, and `out` holds `stride` floats per
                    // query of this chunk (checked by `dots`).
                    unsafe {
                        if kernel == DotKernel::Vnni {
                            avx512::dots8(self, keys, row, qs, qrow, out, stride);
                        } else {
                            avx2::dots8(self, keys, row, qs, qrow, out, stride);
                        }
                    }
                }
            }
            #[cfg(all(
                target_arch = "aarch64",
                target_feature = "neon",
                target_endian = "little"
            ))]
            DotKernel::Neon => {
                for (c, qs) in queries.chunks(8 * qrow).enumerate() {
                    // SAFETY: dot_kernel chose NEON for q8_0/q4_0 only; every key row and
                    // query is `d / 32` blocks, and `out` holds `stride` floats per query of
                    // this chunk (checked by `dots`).
                    unsafe {
                        neon::dots8(
                            self,
                            keys,
                            row,
                            qs,
                            qrow,
                            &mut out[c * 8 * stride..],
                            stride,
                        )
                    };
                }
            }
            _ => {
                for (qi, q) in queries.chunks_exact(qrow).enumerate() {
                    self.dot_rows(keys, q, &mut out[qi * stride..qi * stride + n])?;
                }
            }
        }
        Ok(())
    }

    /// The floats a query quantized by [`BlockType::quantize_query`] stands for (each code
    /// times its block's scale): what [`BlockType::dot`] multiplies the keys by.
    pub fn dequantize_query(self, q: &[u8], out: &mut [f32]) -> Result<()> {
        check_len(q.len(), self.query_bytes(out.len())?)?;
        let qb = if self.query_is_q8_1() { 36 } else { 34 };
        for (q, y) in q.chunks_exact(qb).zip(out.chunks_exact_mut(BLOCK)) {
            let d = read_f16(q, 0);
            for (y, &c) in y.iter_mut().zip(&q[qb - BLOCK..]) {
                *y = f32::from(c as i8) * d;
            }
        }
        Ok(())
    }

    /// The dot product of a row of keys of this type with a query quantized by
    /// [`BlockType::quantize_query`], as ggml's portable `ggml_vec_dot_*_generic` computes it:
    /// integer sums per block, then each block's scales, blocks added in order. The
    /// reference every SIMD kernel for these types is held to.
    ///
    /// q8_0 and q4_0 keys run AVX2 where the CPU has it, and NEON on ARM: the integer sums
    /// in SIMD (exact), the floats as here, so the result is the same float.
    pub fn dot(self, keys: &[u8], query: &[u8]) -> Result<f32> {
        let mut out = [0f32];
        self.dot_rows(keys, query, &mut out)?;
        Ok(out[0])
    }

    /// [`BlockType::dot`] of each of `out.len()` consecutive key rows (each as long as the
    /// query) with one query: `out[t]` is row `t`'s, the same float. Lengths are checked and
    /// the kernel chosen once for all rows.
    pub fn dot_rows(self, keys: &[u8], query: &[u8], out: &mut [f32]) -> Result<()> {
        let qb = if self.query_is_q8_1() { 36 } else { 34 };
        let blocks = query.len() / qb;
        check_len(query.len(), blocks * qb)?;
        let row = blocks * self.block_bytes();
        check_len(keys.len(), out.len() * row)?;
        if row == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let rows = keys.chunks_exact(row).zip(out.iter_mut());
        #[cfg(target_arch = "x86_64")]
        if self.has_simd() && crate::features::avx2() {
            for (k, o) in rows {
                // SAFETY: AVX2 is present, and every row is as many blocks as the query.
                *o = unsafe { avx2::dot(self, k, query) };
            }
            return Ok(());
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if self.has_simd() {
            // SAFETY: q8_0/q4_0 only; `keys` is `out.len()` rows of `row` bytes, each as many
            // blocks as the one query (checked above), and `out` holds one float per row.
            unsafe { neon::dots8(self, keys, row, query, query.len(), out, out.len()) };
            return Ok(());
        }
        for (k, o) in rows {
            *o = self.dot_portable(k, query);
        }
        Ok(())
    }

    /// [`BlockType::dot`] in portable code; the lengths are checked by the caller.
    pub(crate) fn dot_portable(self, keys: &[u8], query: &[u8]) -> f32 {
        let qb = if self.query_is_q8_1() { 36 } else { 34 };
        let levels = self.row().levels;
        let mut sumf = 0.0f32;
        for (k, q) in keys
            .chunks_exact(self.block_bytes())
            .zip(query.chunks_exact(qb))
        {
            let sumi = levels(k)
                .iter()
                .zip(&q[qb - BLOCK..])
                .map(|(&l, &c)| l * i32::from(c as i8))
                .sum();
            sumf += self.block_term(k, q, sumi);
        }
        sumf
    }

    /// One block's share of a dot product, from its integer sum: the scales as ggml's
    /// `vec_dot` for the type associates them, float for float. Every backend adds these.
    #[inline(always)]
    pub(crate) fn block_term(self, k: &[u8], q: &[u8], sumi: i32) -> f32 {
        let (dk, dq) = (read_f16(k, 0), read_f16(q, 0));
        match self {
            BlockType::Q8_0 => sumi as f32 * (dk * dq),
            BlockType::Q4_0 => sumi as f32 * dk * dq,
            BlockType::Q5_0 => (dk * dq) * sumi as f32,
            BlockType::Q4_1 | BlockType::Q5_1 => {
                (dk * dq) * sumi as f32 + read_f16(k, 2) * read_f16(q, 2)
            }
            BlockType::Iq4Nl => (dq * dk) * sumi as f32,
        }
    }
}

/// Which code dots many keys with many queries ([`BlockType::dots`]); all give the same
/// floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DotKernel {
    Portable,
    /// Eight queries per key block, |x| times y with x's sign, the eight sums reduced
    /// together.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// Eight queries per key block in the lanes of one register (AVX-512 VNNI).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Vnni,
    /// Each key block unpacked once for up to eight queries (NEON widening multiplies).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Neon,
}

/// Rows summed per tile by the value kernels: each output row is loaded and stored once per
/// tile.
pub(crate) const VALUE_TILE: usize = 8;

/// How the x86 value kernels sum one tile of rows `t0..t0 + m`: whether every output row
/// weighs every row of a whole tile (`full`, their fast case), and otherwise which rows some
/// output row weighs (`need`) and, per output row, the rows it weighs in order with their
/// weights (`live[qi][..count[qi]]`): zero weights are left out, as the portable code skips
/// them.
#[cfg(target_arch = "x86_64")]
pub(crate) struct TilePlan {
    pub(crate) full: bool,
    pub(crate) need: [bool; VALUE_TILE],
    live: Vec<[(f32, usize); VALUE_TILE]>,
    count: Vec<usize>,
}

#[cfg(target_arch = "x86_64")]
impl TilePlan {
    pub(crate) fn new(g: usize) -> TilePlan {
        TilePlan {
            full: false,
            need: [false; VALUE_TILE],
            live: vec![[(0.0, 0); VALUE_TILE]; g],
            count: vec![0; g],
        }
    }

    /// Plans the tile `t0..t0 + m` of the `n` rows weighed by `weights` (`g × n`).
    pub(crate) fn plan(&mut self, weights: &[f32], n: usize, t0: usize, m: usize) {
        let g = self.count.len();
        self.full = m == VALUE_TILE
            && (0..g).all(|qi| weights[qi * n + t0..][..m].iter().all(|&w| w != 0.0));
        if self.full {
            return;
        }
        self.need = [false; VALUE_TILE];
        for qi in 0..g {
            self.count[qi] = 0;
            for k in 0..m {
                let w = weights[qi * n + t0 + k];
                if w != 0.0 {
                    self.live[qi][self.count[qi]] = (w, k);
                    self.count[qi] += 1;
                    self.need[k] = true;
                }
            }
        }
    }

    /// Output row `qi`'s weighed rows: (weight, row in tile), in order.
    pub(crate) fn live(&self, qi: usize) -> &[(f32, usize)] {
        &self.live[qi][..self.count[qi]]
    }
}

/// Which code sums value rows ([`BlockType::accumulate_rows`]); all give the same floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueKernel {
    Portable,
    /// q8_0 and q4_0: each 8 coordinates of a row widened to floats and scaled in
    /// registers, then fused-added into every output row; the other types' rows dequantized
    /// into a tile, then fused-added. Eight lanes at a time.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// q8_0 and q4_0: each 16 coordinates of a row widened to floats and scaled in
    /// registers, then fused-added into every output row, sixteen lanes at a time.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    /// q8_0 and q4_0: each 8 coordinates of a row widened to floats and scaled in
    /// registers, then fused-added into every output row, four lanes at a time.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Neon,
}

/// `o[j] = w · x[j] + o[j]`, fused (one rounding), as the FMA kernels compute it.
pub(crate) fn axpy_portable(w: f32, x: &[f32], o: &mut [f32]) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = w.mul_add(x, *o);
    }
}
