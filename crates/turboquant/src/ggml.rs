//! llama.cpp's KV cache block types (ggml's `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`,
//! `iq4_nl`): blocks of 32 coordinates with f16 scales, quantized and dequantized exactly as
//! ggml's reference code does (`quantize_row_*_ref`, `dequantize_row_*`: the same bytes and
//! the same floats, tests/ggml_blocks.rs), dotted with a quantized query as ggml's portable
//! `vec_dot` does (the same float), and upstream's Hadamard rotation of keys and
//! values (llama.cpp's `attn_rot_k`/`attn_rot_v`). The arithmetic is the reference's, in f32,
//! one rounding per operation, in its order: that is what makes the bytes equal.

use half::f16;

use crate::error::{Error, Result};

/// Coordinates per block, for every type here.
pub const BLOCK: usize = 32;

/// iq4_nl's 16 non-linear levels (ggml-common.h's `kvalues_iq4nl`).
const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One of llama.cpp's KV block types (serialized by its llama.cpp name, `q8_0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockType {
    /// 8-bit codes, one f16 scale: 34 bytes a block, 8.5 bits a coordinate.
    Q8_0,
    /// 4-bit codes around 8, one f16 scale: 18 bytes, 4.5 bits.
    Q4_0,
    /// 4-bit codes, f16 scale and minimum: 20 bytes, 5 bits.
    Q4_1,
    /// 5-bit codes around 16 (high bits apart), one f16 scale: 22 bytes, 5.5 bits.
    Q5_0,
    /// 5-bit codes, f16 scale and minimum: 24 bytes, 6 bits.
    Q5_1,
    /// 4-bit indices into 16 non-linear levels, one f16 scale: 18 bytes, 4.5 bits.
    Iq4Nl,
}

impl BlockType {
    /// Every type, in llama.cpp's `-ctk` menu order.
    pub const ALL: [BlockType; 6] = [
        BlockType::Q8_0,
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::Iq4Nl,
    ];

    /// The name llama.cpp gives it (`-ctk q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            BlockType::Q8_0 => "q8_0",
            BlockType::Q4_0 => "q4_0",
            BlockType::Q4_1 => "q4_1",
            BlockType::Q5_0 => "q5_0",
            BlockType::Q5_1 => "q5_1",
            BlockType::Iq4Nl => "iq4_nl",
        }
    }

    /// The type named `name` (as [`BlockType::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Bytes of one block of [`BLOCK`] coordinates.
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockType::Q8_0 => 2 + BLOCK,
            BlockType::Q4_0 | BlockType::Iq4Nl => 2 + BLOCK / 2,
            BlockType::Q4_1 => 4 + BLOCK / 2,
            BlockType::Q5_0 => 2 + 4 + BLOCK / 2,
            BlockType::Q5_1 => 4 + 4 + BLOCK / 2,
        }
    }

    /// Bits a coordinate takes, scales included (8.5 for q8_0, 4.5 for q4_0).
    pub fn bits_per_coordinate(self) -> f64 {
        (self.block_bytes() * 8) as f64 / BLOCK as f64
    }

    /// Bytes of a row of `n` coordinates; `n` must be a multiple of [`BLOCK`].
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        if !n.is_multiple_of(BLOCK) {
            return Err(Error::InvalidDimension {
                dim: n,
                reason: "a row of ggml blocks is a multiple of 32 coordinates",
            });
        }
        Ok(n / BLOCK * self.block_bytes())
    }

    /// Quantizes `x` into `out` (exactly [`BlockType::row_bytes`] of it) as ggml's
    /// `quantize_row_*_ref` does.
    pub fn quantize_row(self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let bytes = self.row_bytes(x.len())?;
        check_len(out.len(), bytes)?;
        for (xb, q) in x
            .chunks_exact(BLOCK)
            .zip(out.chunks_exact_mut(self.block_bytes()))
        {
            let xb: &[f32; BLOCK] = xb.try_into().expect("chunks of BLOCK");
            match self {
                BlockType::Q8_0 => quantize_q8_0(xb, q),
                BlockType::Q4_0 => quantize_symmetric(xb, q, 4),
                BlockType::Q5_0 => quantize_symmetric(xb, q, 5),
                BlockType::Q4_1 => quantize_affine(xb, q, 4),
                BlockType::Q5_1 => quantize_affine(xb, q, 5),
                BlockType::Iq4Nl => quantize_iq4_nl(xb, q),
            }
        }
        Ok(())
    }

    /// Dequantizes `q` into `out` as ggml's `dequantize_row_*` does.
    pub fn dequantize_row(self, q: &[u8], out: &mut [f32]) -> Result<()> {
        check_len(q.len(), self.row_bytes(out.len())?)?;
        for (q, y) in q
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let d = read_f16(q, 0);
            // The two types caches use most, written so the compiler vectorizes them: the
            // same float per coordinate (its level times the scale) as the general path.
            match self {
                BlockType::Q8_0 => {
                    for (y, &c) in y.iter_mut().zip(&q[2..2 + BLOCK]) {
                        *y = f32::from(c as i8) * d;
                    }
                    continue;
                }
                BlockType::Q4_0 => {
                    let (lo, hi) = y.split_at_mut(BLOCK / 2);
                    for ((l, h), &c) in lo.iter_mut().zip(hi.iter_mut()).zip(&q[2..2 + BLOCK / 2]) {
                        *l = (i32::from(c & 0x0F) - 8) as f32 * d;
                        *h = (i32::from(c >> 4) - 8) as f32 * d;
                    }
                    continue;
                }
                _ => {}
            }
            let levels = self.levels(q);
            if matches!(self, BlockType::Q4_1 | BlockType::Q5_1) {
                let m = read_f16(q, 2);
                for (y, &l) in y.iter_mut().zip(&levels) {
                    *y = l as f32 * d + m;
                }
            } else {
                for (y, &l) in y.iter_mut().zip(&levels) {
                    *y = l as f32 * d;
                }
            }
        }
        Ok(())
    }
}

impl BlockType {
    /// Whether a query dotted with keys of this type is quantized to q8_1 (q4_1 and q5_1,
    /// whose minimum needs the query's sum) rather than q8_0: ggml's `vec_dot_type`. Their dot
    /// uses that sum as stored (an f16), so it is not the plain product of the floats that
    /// [`BlockType::dequantize_row`] and [`BlockType::dequantize_query`] give.
    pub fn query_is_q8_1(self) -> bool {
        matches!(self, BlockType::Q4_1 | BlockType::Q5_1)
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
    fn value_kernel(self) -> ValueKernel {
        #[cfg(target_arch = "x86_64")]
        {
            if matches!(self, BlockType::Q8_0 | BlockType::Q4_0)
                && crate::kernels::avx512_available()
            {
                return ValueKernel::Avx512;
            }
            if crate::kernels::avx2_available() {
                return ValueKernel::Avx2;
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if matches!(self, BlockType::Q8_0 | BlockType::Q4_0) {
            return ValueKernel::Neon;
        }
        ValueKernel::Portable
    }

    /// [`BlockType::accumulate_rows`] with the kernel chosen (`kernel` must run here).
    fn accumulate_rows_with(
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
        if kernel == ValueKernel::Avx2 && matches!(self, BlockType::Q8_0 | BlockType::Q4_0) {
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
    fn dot_kernel(self) -> DotKernel {
        #[cfg(target_arch = "x86_64")]
        if matches!(self, BlockType::Q8_0 | BlockType::Q4_0) {
            if vnni_available() {
                return DotKernel::Vnni;
            }
            if crate::kernels::avx2_available() {
                return DotKernel::Avx2;
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if matches!(self, BlockType::Q8_0 | BlockType::Q4_0) {
            return DotKernel::Neon;
        }
        DotKernel::Portable
    }

    /// [`BlockType::dots`] with the kernel chosen (`kernel` must run here), on arguments
    /// `dots` checked.
    fn dots_with(
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
        if matches!(self, BlockType::Q8_0 | BlockType::Q4_0) && crate::kernels::avx2_available() {
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
        if matches!(self, BlockType::Q8_0 | BlockType::Q4_0) {
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
        let mut sumf = 0.0f32;
        for (k, q) in keys
            .chunks_exact(self.block_bytes())
            .zip(query.chunks_exact(qb))
        {
            let sumi = self
                .levels(k)
                .iter()
                .zip(&q[qb - BLOCK..])
                .map(|(&l, &c)| l * i32::from(c as i8))
                .sum();
            sumf += self.block_term(k, q, sumi);
        }
        sumf
    }

    /// Each coordinate's integer level in a key block: what its scale multiplies (and its
    /// minimum is added to, for q4_1 and q5_1). The one reading of the block layouts.
    #[inline(always)]
    fn levels(self, k: &[u8]) -> [i32; BLOCK] {
        let nib = |at: usize, high: [u8; 4], offset: i32| {
            nibbles(&k[at..at + BLOCK / 2], high).map(|c| i32::from(c) - offset)
        };
        match self {
            BlockType::Q8_0 => std::array::from_fn(|j| i32::from(k[2 + j] as i8)),
            BlockType::Q4_0 => nib(2, [0; 4], 8),
            BlockType::Q4_1 => nib(4, [0; 4], 0),
            BlockType::Q5_0 => nib(6, [k[2], k[3], k[4], k[5]], 16),
            BlockType::Q5_1 => nib(8, [k[4], k[5], k[6], k[7]], 0),
            BlockType::Iq4Nl => nib(2, [0; 4], 0).map(|c| i32::from(IQ4_NL_LEVELS[c as usize])),
        }
    }

    /// One block's share of a dot product, from its integer sum: the scales as ggml's
    /// `vec_dot` for the type associates them, float for float. Every backend adds these.
    #[inline(always)]
    fn block_term(self, k: &[u8], q: &[u8], sumi: i32) -> f32 {
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

/// NEON kernels for q8_0 and q4_0: key dots against q8_0 queries (armv8.0: widening
/// multiplies, no `sdot`) and value sums.
#[cfg(all(
    target_arch = "aarch64",
    target_feature = "neon",
    target_endian = "little"
))]
mod neon {
    use std::arch::aarch64::*;

    use super::{BlockType, BLOCK, VALUE_TILE};

    /// Σ x_j·y_j over 32 signed bytes, exactly: products of at most 128·127 in i16, summed
    /// pairwise into i32.
    #[target_feature(enable = "neon")]
    fn sum_i8(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
        let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(x0), vget_low_s8(y0)));
        acc = vpadalq_s16(acc, vmull_high_s8(x0, y0));
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(x1), vget_low_s8(y1)));
        acc = vpadalq_s16(acc, vmull_high_s8(x1, y1));
        vaddvq_s32(acc)
    }

    /// The 32 signed levels of a q8_0 or q4_0 key block, coordinates 0..16 and 16..32.
    #[inline(always)]
    unsafe fn key_levels(t: BlockType, k: &[u8]) -> (int8x16_t, int8x16_t) {
        // SAFETY (caller): k holds a whole block, 34 bytes (q8_0) or 18 (q4_0).
        unsafe {
            if t == BlockType::Q8_0 {
                (
                    vld1q_s8(k[2..].as_ptr().cast()),
                    vld1q_s8(k[18..].as_ptr().cast()),
                )
            } else {
                let packed = vld1q_u8(k[2..].as_ptr());
                let eight = vdupq_n_s8(8);
                (
                    vsubq_s8(
                        vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0F))),
                        eight,
                    ),
                    vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(packed)), eight),
                )
            }
        }
    }

    /// Dots of every key row with up to eight q8_0 queries (see `BlockType::dots`): each key
    /// block loaded and unpacked once, each query's integer sum formed exactly (`sum_i8`), and
    /// its `block_term` added in block order: the portable dot's float.
    ///
    /// # Safety
    /// `t` is q8_0 or q4_0; `keys` is whole rows of `row` bytes, `queries` at most eight rows
    /// of `qrow` bytes covering as many blocks, and `out` holds `stride` floats for each
    /// query but the last and the key rows' count for the last.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn dots8(
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
        for (tk, k) in keys.chunks_exact(row).enumerate() {
            let mut acc = [0f32; 8];
            for b in 0..blocks {
                let kb = &k[b * bb..(b + 1) * bb];
                // SAFETY: kb is one whole block.
                let (x0, x1) = unsafe { key_levels(t, kb) };
                for (qi, a) in acc.iter_mut().enumerate().take(g) {
                    let q = &queries[qi * qrow + b * (2 + BLOCK)..][..2 + BLOCK];
                    // SAFETY: q holds the block's 2-byte scale and 32 codes.
                    let (y0, y1) = unsafe {
                        (
                            vld1q_s8(q[2..].as_ptr().cast()),
                            vld1q_s8(q[18..].as_ptr().cast()),
                        )
                    };
                    *a += t.block_term(kb, q, sum_i8(x0, x1, y0, y1));
                }
            }
            for (qi, a) in acc.iter().enumerate().take(g) {
                out[qi * stride + tk] = *a;
            }
        }
    }

    /// Eight coordinates (`unit` 0..4 of a block) of a q8_0 or q4_0 block, as
    /// [`BlockType::dequantize_row`] makes them: the level (an exact float) times the scale.
    #[inline(always)]
    unsafe fn levels8(t: BlockType, block: &[u8], unit: usize) -> (float32x4_t, float32x4_t) {
        let scale = super::read_f16(block, 0);
        // SAFETY (caller): block is whole; the 8-byte loads stay inside its codes.
        let wide = unsafe {
            if t == BlockType::Q8_0 {
                vmovl_s8(vld1_s8(block[2 + 8 * unit..].as_ptr().cast()))
            } else {
                // Coordinates 0..16 are the low nibbles of the 16 code bytes, 16..32 the high.
                let packed = vld1_u8(block[2 + 8 * (unit % 2)..].as_ptr());
                let nib = if unit < 2 {
                    vand_u8(packed, vdup_n_u8(0x0F))
                } else {
                    vshr_n_u8::<4>(packed)
                };
                vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(nib)), vdupq_n_s16(8))
            }
        };
        let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
        let hi = vcvtq_f32_s32(vmovl_high_s16(wide));
        (vmulq_n_f32(lo, scale), vmulq_n_f32(hi, scale))
    }

    /// `BlockType::accumulate_rows` for q8_0 and q4_0 rows: per tile of rows, per eight
    /// coordinates, each weighed row's values made once in registers and fused-added into
    /// the output rows that weigh it, rows in order (zero weights skipped, as the portable
    /// code skips them).
    ///
    /// # Safety
    /// `t` is q8_0 or q4_0, `rows` whole rows of `row` bytes for `d` coordinates, `weights`
    /// `g · n` and `out` `g · d` floats (`g = out.len() / d`).
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn accumulate(
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
        let zero = vdupq_n_f32(0.0);
        let mut t0 = 0;
        while t0 < n {
            let m = (n - t0).min(VALUE_TILE);
            let need: [bool; VALUE_TILE] =
                std::array::from_fn(|k| k < m && (0..g).any(|qi| weights[qi * n + t0 + k] != 0.0));
            for b in 0..d / BLOCK {
                for unit in 0..4 {
                    let mut xs = [(zero, zero); VALUE_TILE];
                    for (k, x) in xs.iter_mut().enumerate() {
                        if need[k] {
                            let at = (t0 + k) * row + b * bb;
                            // SAFETY: row t0 + k < n holds the whole block b.
                            *x = unsafe { levels8(t, &rows[at..at + bb], unit) };
                        }
                    }
                    let col = b * BLOCK + 8 * unit;
                    for qi in 0..g {
                        let w = &weights[qi * n + t0..][..m];
                        if w.iter().all(|&w| w == 0.0) {
                            continue;
                        }
                        // SAFETY: qi < g and col + 8 ≤ d: eight floats of output row qi.
                        unsafe {
                            let p = out.as_mut_ptr().add(qi * d + col);
                            let (mut a0, mut a1) = (vld1q_f32(p), vld1q_f32(p.add(4)));
                            for (&(x0, x1), &w) in xs.iter().zip(w) {
                                if w != 0.0 {
                                    a0 = vfmaq_n_f32(a0, x0, w);
                                    a1 = vfmaq_n_f32(a1, x1, w);
                                }
                            }
                            vst1q_f32(p, a0);
                            vst1q_f32(p.add(4), a1);
                        }
                    }
                }
            }
            t0 += m;
        }
    }
}

/// AVX2 dot products for q8_0 and q4_0 keys against a q8_0 query.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BlockType, BLOCK, VALUE_TILE};

    /// The 32 signed levels of a q8_0 or q4_0 key block.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn key_levels(t: BlockType, k: &[u8]) -> __m256i {
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
    pub(super) unsafe fn dots8(
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
                    let y =
                        unsafe { _mm256_loadu_si256(ys[(b * 4 + qi) * BLOCK..].as_ptr().cast()) };
                    let pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
                    *quad = _mm256_madd_epi16(pairs, ones);
                }
                // Four vectors of eight partial sums → the four totals.
                let h01 = _mm256_hadd_epi32(quads[0], quads[1]);
                let h23 = _mm256_hadd_epi32(quads[2], quads[3]);
                let h = _mm256_hadd_epi32(h01, h23);
                let sumi =
                    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                // `add_block_term`'s operations, in four lanes.
                let fi = _mm_cvtepi32_ps(sumi);
                let dk = _mm_set1_ps(super::read_f16(kb, 0));
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
    pub(super) const PREFETCH_ROWS: usize = 8;

    /// Asks for every cache line of `bytes` in all cache levels (a hint: never faults).
    #[inline(always)]
    pub(super) fn prefetch(bytes: &[u8]) {
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
    pub(super) fn prefetch_ahead(rows: &[u8], row: usize, t: usize) {
        let at = (t + PREFETCH_ROWS) * row;
        if let Some(next) = rows.get(at..at + row) {
            prefetch(next);
        }
    }

    pub(super) fn query_scales(queries: &[u8], qrow: usize, blocks: usize) -> Vec<f32> {
        let mut dq = vec![0f32; blocks * 8];
        for (qi, q) in queries.chunks_exact(qrow).enumerate() {
            for b in 0..blocks {
                dq[b * 8 + qi] = super::read_f16(q, b * (2 + BLOCK));
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
    pub(super) unsafe fn add_block_term(
        t: BlockType,
        acc: __m256,
        sumi: __m256i,
        kb: &[u8],
        dq: &[f32],
    ) -> __m256 {
        let fi = _mm256_cvtepi32_ps(sumi);
        let dk = _mm256_set1_ps(super::read_f16(kb, 0));
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
    pub(super) unsafe fn store_sums(
        acc: __m256,
        g: usize,
        out: &mut [f32],
        stride: usize,
        tk: usize,
    ) {
        let mut sums = [0f32; 8];
        // SAFETY: sums has eight floats.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), acc) };
        for (qi, &v) in sums.iter().enumerate().take(g) {
            out[qi * stride + tk] = v;
        }
    }

    /// [`super::axpy_portable`] of each row `k` of `xs` (rows of `o.len()`) with weight
    /// `ws[k]` in turn, zero weights skipped, eight lanes at a time with the output held in
    /// a register across the rows: every element sees the same fused adds in the same order.
    ///
    /// # Safety
    /// AVX2 and FMA must be present; `xs` holds at least `ws.len()` rows of `o.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy_tile(ws: &[f32], xs: &[f32], o: &mut [f32]) {
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
    pub(super) unsafe fn accumulate(
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
        let mut plan = super::TilePlan::new(g);
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
                        let sc = _mm256_set1_ps(super::read_f16(block, 0));
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
                    scales[k * blocks + b] =
                        _mm256_set1_ps(super::read_f16(rows, (t0 + k) * row + b * bb));
                }
            }
            for b in 0..blocks {
                for quarter in 0..4 {
                    let mut xs = [_mm256_setzero_ps(); VALUE_TILE];
                    for k in (0..m).filter(|&k| plan.need[k]) {
                        let at = (t0 + k) * row + b * bb;
                        // SAFETY: row t0 + k < n holds the whole block b.
                        xs[k] = unsafe {
                            levels8(t, &rows[at..at + bb], quarter, scales[k * blocks + b])
                        };
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
    pub(super) unsafe fn dot(t: BlockType, keys: &[u8], query: &[u8]) -> f32 {
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
}

/// Which code dots many keys with many queries ([`BlockType::dots`]); all give the same
/// floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DotKernel {
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

/// Whether the VNNI dot kernel runs here (AVX-512 VNNI and VL, AVX-512 allowed).
#[cfg(target_arch = "x86_64")]
fn vnni_available() -> bool {
    crate::kernels::avx512_available()
        && crate::kernels::avx2_available()
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Rows summed per tile by the value kernels: each output row is loaded and stored once per
/// tile.
const VALUE_TILE: usize = 8;

/// How the x86 value kernels sum one tile of rows `t0..t0 + m`: whether every output row
/// weighs every row of a whole tile (`full`, their fast case), and otherwise which rows some
/// output row weighs (`need`) and, per output row, the rows it weighs in order with their
/// weights (`live[qi][..count[qi]]`): zero weights are left out, as the portable code skips
/// them.
#[cfg(target_arch = "x86_64")]
struct TilePlan {
    full: bool,
    need: [bool; VALUE_TILE],
    live: Vec<[(f32, usize); VALUE_TILE]>,
    count: Vec<usize>,
}

#[cfg(target_arch = "x86_64")]
impl TilePlan {
    fn new(g: usize) -> TilePlan {
        TilePlan {
            full: false,
            need: [false; VALUE_TILE],
            live: vec![[(0.0, 0); VALUE_TILE]; g],
            count: vec![0; g],
        }
    }

    /// Plans the tile `t0..t0 + m` of the `n` rows weighed by `weights` (`g × n`).
    fn plan(&mut self, weights: &[f32], n: usize, t0: usize, m: usize) {
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
    fn live(&self, qi: usize) -> &[(f32, usize)] {
        &self.live[qi][..self.count[qi]]
    }
}

/// Which code sums value rows ([`BlockType::accumulate_rows`]); all give the same floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValueKernel {
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{BlockType, BLOCK, VALUE_TILE};

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
    pub(super) unsafe fn dots8(
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
        let dq = super::avx2::query_scales(queries, qrow, blocks);
        let c128 = _mm256_set1_epi8(-128);
        for (tk, k) in keys.chunks_exact(row).enumerate() {
            super::avx2::prefetch_ahead(keys, row, tk);
            let mut acc = _mm256_setzero_ps();
            for b in 0..blocks {
                let kb = &k[b * bb..(b + 1) * bb];
                // SAFETY: kb is one whole block.
                let x = unsafe { super::avx2::key_levels(t, kb) };
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
                acc =
                    unsafe { super::avx2::add_block_term(t, acc, sumi, kb, &dq[b * 8..b * 8 + 8]) };
            }
            // SAFETY: AVX2 is present; out is as the caller's contract says.
            unsafe { super::avx2::store_sums(acc, g, out, stride, tk) };
        }
    }

    /// Sixteen coordinates of a q8_0 or q4_0 block, `half` 0 or 1, as
    /// [`BlockType::dequantize_row`] makes them: the level (an exact float) times the scale.
    #[target_feature(enable = "avx512f")]
    unsafe fn levels16(t: BlockType, block: &[u8], half: usize) -> __m512 {
        let scale = _mm512_set1_ps(super::read_f16(block, 0));
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
    pub(super) unsafe fn accumulate(
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
        let mut plan = super::TilePlan::new(g);
        let mut t0 = 0;
        while t0 < n {
            let m = (n - t0).min(VALUE_TILE);
            // The next tile's rows, while this one is summed (see `avx2::PREFETCH_ROWS`).
            for k in 0..VALUE_TILE {
                super::avx2::prefetch_ahead(rows, row, t0 + k);
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
}

fn check_len(got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::DimensionMismatch { expected, got })
    }
}

/// `o[j] = w · x[j] + o[j]`, fused (one rounding), as the FMA kernels compute it.
fn axpy_portable(w: f32, x: &[f32], o: &mut [f32]) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = w.mul_add(x, *o);
    }
}

#[inline(always)]
fn read_f16(q: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([q[at], q[at + 1]]))
}

/// An f16's value as an f32, exactly (every f16 is an f32), in a few integer operations the
/// compiler inlines: `half`'s conversion is a call per scale, a fifth of a block dot's time.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let em = u32::from(h & 0x7FFF);
    let magnitude = if em >= 0x7C00 {
        // Infinity or NaN: all-ones exponent, the mantissa moved up.
        0x7F80_0000 | ((em & 0x03FF) << 13)
    } else if em >= 0x0400 {
        // Normal: rebias the exponent from 15 to 127.
        (em << 13) + ((127 - 15) << 23)
    } else {
        // Zero or subnormal: em × 2⁻²⁴, exact in f32.
        (em as f32 * f32::from_bits(0x3380_0000)).to_bits()
    };
    f32::from_bits(sign | magnitude)
}

fn write_f16(q: &mut [u8], at: usize, v: f32) {
    q[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The 32 codes of a block: low nibbles hold coordinates 0..16, high nibbles 16..32, and
/// bit `j` of the little-endian `high` word is code `j`'s fifth bit.
fn nibbles(packed: &[u8], high: [u8; 4]) -> [u8; BLOCK] {
    let high = u32::from_le_bytes(high);
    let mut codes = [0u8; BLOCK];
    for (j, &b) in packed.iter().enumerate() {
        codes[j] = (b & 0x0F) | (((high >> j) & 1) as u8) << 4;
        codes[j + BLOCK / 2] = (b >> 4) | (((high >> (j + BLOCK / 2)) & 1) as u8) << 4;
    }
    codes
}

/// Packs 32 codes as [`nibbles`] reads them; returns the fifth bits' word.
fn pack_nibbles(codes: &[u8; BLOCK], packed: &mut [u8]) -> [u8; 4] {
    let mut high = 0u32;
    for j in 0..BLOCK / 2 {
        let (a, b) = (codes[j], codes[j + BLOCK / 2]);
        packed[j] = (a & 0x0F) | ((b & 0x0F) << 4);
        high |= u32::from((a >> 4) & 1) << j;
        high |= u32::from((b >> 4) & 1) << (j + BLOCK / 2);
    }
    high.to_le_bytes()
}

/// The coordinate of largest magnitude, with its sign (the first of equals, as the
/// reference's strict `>` keeps it).
fn signed_max(xb: &[f32; BLOCK]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// `roundf`: halves away from zero (Rust's `round` is the same).
fn round_away(v: f32) -> i32 {
    v.round() as i32
}

fn quantize_q8_0(xb: &[f32; BLOCK], q: &mut [u8]) {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    write_f16(q, 0, d);
    for (c, &v) in q[2..].iter_mut().zip(xb) {
        *c = round_away(v * id) as i8 as u8;
    }
}

/// q4_0 and q5_0: a scale from the signed maximum (so it maps to the lowest code), codes
/// offset by half their range.
fn quantize_symmetric(xb: &[f32; BLOCK], q: &mut [u8], bits: u32) {
    let half = (1u32 << (bits - 1)) as f32;
    let top = (1u8 << bits) - 1;
    let (_, max) = signed_max(xb);
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut codes = [0u8; BLOCK];
    for (c, &v) in codes.iter_mut().zip(xb) {
        // (int8_t)(x*id + half + 0.5): truncation toward zero, then capped at the top code.
        *c = ((v * id + (half + 0.5)) as i8 as u8).min(top);
    }
    write_f16(q, 0, d);
    if bits == 4 {
        pack_nibbles(&codes, &mut q[2..]);
    } else {
        let high = pack_nibbles(&codes, &mut q[6..]);
        q[2..6].copy_from_slice(&high);
    }
}

/// q4_1 and q5_1: a scale and a minimum, codes from the minimum up.
fn quantize_affine(xb: &[f32; BLOCK], q: &mut [u8], bits: u32) {
    let top = (1u8 << bits) - 1;
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut codes = [0u8; BLOCK];
    for (c, &v) in codes.iter_mut().zip(xb) {
        *c = (((v - min) * id + 0.5) as i8 as u8).min(top);
    }
    write_f16(q, 0, d);
    write_f16(q, 2, min);
    if bits == 4 {
        pack_nibbles(&codes, &mut q[4..]);
    } else {
        let high = pack_nibbles(&codes, &mut q[8..]);
        q[4..8].copy_from_slice(&high);
    }
}

/// The level nearest `x` (the lower one of a tie goes up, as the reference's `<` says).
fn nearest_level(x: f32) -> u8 {
    let levels = IQ4_NL_LEVELS.map(f32::from);
    if x <= levels[0] {
        return 0;
    }
    if x >= levels[15] {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < levels[mid] {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - levels[hi - 1] < levels[hi] - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// iq4_nl as the reference quantizer runs it (no importance weights, no scale search): each
/// coordinate to its nearest level at the scale that maps the signed maximum to -127, then
/// the least-squares scale for those levels (weighted by the squared coordinates). A block
/// of (near) zeros gets scale 0; its codes are then meaningless (the reference leaves them
/// unwritten), and zero here.
fn quantize_iq4_nl(xb: &[f32; BLOCK], q: &mut [u8]) {
    let (amax, max) = signed_max(xb);
    let mut codes = [0u8; BLOCK];
    let mut d = 0.0f32;
    if amax >= 1e-15 {
        let id = 1.0 / (max / f32::from(IQ4_NL_LEVELS[0]));
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for (c, &v) in codes.iter_mut().zip(xb) {
            *c = nearest_level(id * v);
            let level = f32::from(IQ4_NL_LEVELS[*c as usize]);
            let w = v * v;
            sumqx += w * level * v;
            sumq2 += w * level * level;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    }
    write_f16(q, 0, d);
    pack_nibbles(&codes, &mut q[2..]);
}

/// Width of the Hadamard blocks llama.cpp rotates keys (and queries) in, for heads of
/// `head_dim` (one width per cache: every layer it holds has that head size): the largest
/// power of two dividing it, when it is a multiple of 64; none otherwise.
pub fn key_rotation_width(head_dim: usize) -> Option<usize> {
    (head_dim > 0 && head_dim.is_multiple_of(64)).then(|| 1 << head_dim.trailing_zeros())
}

/// Width of the Hadamard blocks llama.cpp rotates values in (and the attention output back):
/// 64, when `head_dim` is a multiple of 64; none otherwise.
pub fn value_rotation_width(head_dim: usize) -> Option<usize> {
    (head_dim > 0 && head_dim.is_multiple_of(64)).then_some(64)
}

/// Rotates each `width`-wide slice of `x` by the orthonormal Walsh–Hadamard matrix of that
/// width (Sylvester's order, scaled by 1/√width: symmetric, its own inverse), as a fast
/// transform. `width` is a power of two dividing `x.len()`.
pub fn hadamard_rotate(x: &mut [f32], width: usize) -> Result<()> {
    if !width.is_power_of_two() || !x.len().is_multiple_of(width) {
        return Err(Error::InvalidDimension {
            dim: width,
            reason: "a Hadamard block is a power of two that divides the row",
        });
    }
    let scale = 1.0 / (width as f32).sqrt();
    for block in x.chunks_exact_mut(width) {
        let mut h = 1;
        while h < width {
            // Each butterfly pair as two slices of h, so the wide stages vectorize (the
            // same sum and difference per element, in any lane order).
            for pair in block.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (x, y) = (*a, *b);
                    *a = x + y;
                    *b = x - y;
                }
            }
            h *= 2;
        }
        for v in block.iter_mut() {
            *v *= scale;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inline_f16_conversion_is_halfs_for_every_value() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn bits_per_coordinate_are_llama_cpps() {
        let bits: Vec<f64> = BlockType::ALL
            .iter()
            .map(|t| t.bits_per_coordinate())
            .collect();
        assert_eq!(bits, [8.5, 4.5, 5.0, 5.5, 6.0, 4.5]);
        for t in BlockType::ALL {
            assert_eq!(BlockType::from_name(t.name()), Some(t));
        }
        assert_eq!(BlockType::from_name("q4_k"), None);
    }

    #[test]
    fn rotation_widths_follow_upstream() {
        assert_eq!(key_rotation_width(256), Some(256));
        assert_eq!(key_rotation_width(512), Some(512));
        assert_eq!(key_rotation_width(192), Some(64));
        assert_eq!(key_rotation_width(80), None);
        assert_eq!(value_rotation_width(512), Some(64));
        assert_eq!(value_rotation_width(100), None);
    }

    /// The SIMD dot products are the portable ones, float for float, on rows at every scale
    /// and on codes at their extremes.
    #[test]
    fn simd_dots_equal_the_portable_reference_bit_for_bit() {
        let mut rng = crate::Rng::new(35, 0);
        let n = 256;
        for row in 0..300 {
            let scale = [1e-3f32, 1.0, 40.0, 6e4][row % 4];
            let mut x: Vec<f32> = (0..n).map(|_| rng.gaussian() as f32 * scale).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.gaussian() as f32 * 2.0).collect();
            if row % 7 == 0 {
                // Codes at ±127 and the lowest q4_0 level in every block.
                for (j, v) in x.iter_mut().enumerate() {
                    *v = if j % 2 == 0 { scale } else { -scale };
                }
            }
            for t in BlockType::ALL {
                let mut k = vec![0u8; t.row_bytes(n).unwrap()];
                let mut q = vec![0u8; t.query_bytes(n).unwrap()];
                t.quantize_row(&x, &mut k).unwrap();
                t.quantize_query(&y, &mut q).unwrap();
                let simd = t.dot(&k, &q).unwrap();
                let portable = t.dot_portable(&k, &q);
                assert_eq!(simd.to_bits(), portable.to_bits(), "{} row {row}", t.name());
            }
        }
    }

    /// Every value-sum kernel is the portable fused adds, bit for bit: with zero weights
    /// (masked rows) and without (whole tiles, the AVX-512 kernel's fast case), a last tile
    /// cut short, and more output rows than a tile has.
    #[test]
    fn tiled_value_sums_equal_row_by_row_fused_adds() {
        let mut rng = crate::Rng::new(37, 0);
        let (n, d, g) = (21, 96, 13);
        for (t, masked) in BlockType::ALL
            .into_iter()
            .flat_map(|t| [(t, true), (t, false)])
        {
            let mut rows = vec![0u8; n * t.row_bytes(d).unwrap()];
            for r in rows.chunks_exact_mut(t.row_bytes(d).unwrap()) {
                let x: Vec<f32> = (0..d).map(|_| rng.gaussian() as f32 * 7.0).collect();
                t.quantize_row(&x, r).unwrap();
            }
            let weights: Vec<f32> = (0..g * n)
                .map(|i| {
                    if masked && i % 4 == 1 {
                        0.0
                    } else {
                        rng.uniform() as f32 + 1e-3
                    }
                })
                .collect();
            let mut want = vec![0.5f32; g * d];
            let mut x = vec![0f32; d];
            for (k, r) in rows.chunks_exact(t.row_bytes(d).unwrap()).enumerate() {
                t.dequantize_row(r, &mut x).unwrap();
                for (qi, o) in want.chunks_exact_mut(d).enumerate() {
                    let w = weights[qi * n + k];
                    if w != 0.0 {
                        axpy_portable(w, &x, o);
                    }
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for kernel in runnable_value_kernels(t) {
                let mut got = vec![0.5f32; g * d];
                t.accumulate_rows_with(kernel, &rows, d, &weights, &mut got)
                    .unwrap();
                assert_eq!(bits(&got), bits(&want), "{} {kernel:?} {masked}", t.name());
            }
            let mut got = vec![0.5f32; g * d];
            t.accumulate_rows(&rows, d, &weights, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want), "{}", t.name());
        }
    }

    /// The dot kernels this CPU runs for `t`.
    fn runnable_dot_kernels(t: BlockType) -> Vec<DotKernel> {
        let mut v = vec![DotKernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if matches!(t, BlockType::Q8_0 | BlockType::Q4_0) {
            if crate::kernels::avx2_available() {
                v.push(DotKernel::Avx2);
            }
            if vnni_available() {
                v.push(DotKernel::Vnni);
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if matches!(t, BlockType::Q8_0 | BlockType::Q4_0) {
            v.push(DotKernel::Neon);
        }
        let _ = t;
        v
    }

    /// The value kernels this CPU runs for `t`.
    fn runnable_value_kernels(t: BlockType) -> Vec<ValueKernel> {
        let mut v = vec![ValueKernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::kernels::avx2_available() {
                v.push(ValueKernel::Avx2);
            }
            if matches!(t, BlockType::Q8_0 | BlockType::Q4_0) && crate::kernels::avx512_available()
            {
                v.push(ValueKernel::Avx512);
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_feature = "neon",
            target_endian = "little"
        ))]
        if matches!(t, BlockType::Q8_0 | BlockType::Q4_0) {
            v.push(ValueKernel::Neon);
        }
        let _ = t;
        v
    }

    /// Many keys against many queries, eight at a time in SIMD, are each the one-pair dot.
    #[test]
    fn query_batched_dots_equal_the_portable_reference_bit_for_bit() {
        let mut rng = crate::Rng::new(36, 0);
        let (n, d) = (37, 128);
        for t in BlockType::ALL {
            for g in [1usize, 3, 8, 11, 17] {
                let mut keys = vec![0u8; n * t.row_bytes(d).unwrap()];
                let mut queries = vec![0u8; g * t.query_bytes(d).unwrap()];
                for (i, k) in keys.chunks_exact_mut(t.row_bytes(d).unwrap()).enumerate() {
                    let scale = [1e-3f32, 1.0, 40.0][i % 3];
                    let mut x: Vec<f32> = (0..d).map(|_| rng.gaussian() as f32 * scale).collect();
                    if i % 5 == 0 {
                        // Codes at ±127 and q4_0's lowest level in every block.
                        for (j, v) in x.iter_mut().enumerate() {
                            *v = if j % 2 == 0 { scale } else { -scale };
                        }
                    }
                    t.quantize_row(&x, k).unwrap();
                }
                for q in queries.chunks_exact_mut(t.query_bytes(d).unwrap()) {
                    let y: Vec<f32> = (0..d).map(|_| rng.gaussian() as f32 * 3.0).collect();
                    t.quantize_query(&y, q).unwrap();
                }
                let stride = n + 5;
                for kernel in runnable_dot_kernels(t).into_iter().map(Some).chain([None]) {
                    let mut out = vec![f32::NAN; (g - 1) * stride + n];
                    match kernel {
                        Some(k) => t.dots_with(k, &keys, &queries, d, &mut out, stride),
                        None => t.dots(&keys, &queries, d, &mut out, stride),
                    }
                    .unwrap();
                    for (qi, q) in queries.chunks_exact(t.query_bytes(d).unwrap()).enumerate() {
                        for (j, k) in keys.chunks_exact(t.row_bytes(d).unwrap()).enumerate() {
                            let want = t.dot_portable(k, q);
                            let got = out[qi * stride + j];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} {kernel:?} g {g} q {qi} k {j}",
                                t.name()
                            );
                        }
                    }
                }
                let mut out = vec![f32::NAN; (g - 1) * stride + n];
                assert!(t
                    .dots(
                        &keys,
                        &queries,
                        d,
                        &mut out[..n - 1 + (g - 1) * stride],
                        stride
                    )
                    .is_err());
            }
        }
    }

    #[test]
    fn rows_of_the_wrong_length_are_refused() {
        let mut out = [0u8; 34];
        assert!(BlockType::Q8_0.quantize_row(&[0.0; 31], &mut out).is_err());
        assert!(BlockType::Q8_0
            .quantize_row(&[0.0; 32], &mut out[..33])
            .is_err());
        let mut y = [0.0f32; 32];
        assert!(BlockType::Q4_0.dequantize_row(&out, &mut y).is_err());
        assert!(hadamard_rotate(&mut [0.0; 96], 64).is_err());
        assert!(hadamard_rotate(&mut [0.0; 96], 48).is_err());
    }
}
