//! Activation rows quantized once per matmul: blocks of 32 values, each with one f32 scale and
//! signed bytes `round(x·127/max|x|)`, the integer sum of every 16 bytes (the kernels' offset
//! corrections) and the block's sum as a float (`d·Σq`, the K formats' min correction).
//!
//! One scale per 32 values for every weight format, where ggml uses one per 256 for its K
//! formats (Q8_K): Gemma's activations carry a few channels hundreds of times larger than the
//! rest, and a 256-wide block rounds everything beside such a channel to a handful of levels.
//! The kernels scale each 32-weight unit in floats, which costs about what ggml's integer
//! sub-block scaling does.

/// Values per activation block.
pub const BLOCK: usize = 32;

/// `rows × cols` activations quantized in blocks of [`BLOCK`] values.
#[derive(Debug, Clone, Default)]
pub struct QuantizedActs {
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// `rows × cols` signed bytes, row-major.
    pub q: Vec<i8>,
    /// `rows × cols/32` scales.
    pub d: Vec<f32>,
    /// `rows × cols/16` sums of 16 consecutive bytes.
    pub sums: Vec<i32>,
    /// `rows × cols/32` block sums as floats: `d · Σq`.
    pub fsums: Vec<f32>,
}

impl QuantizedActs {
    /// Quantizes `x` (`rows × cols`, row-major; `cols` a multiple of 32) into `self`, reusing
    /// its buffers.
    pub fn quantize_into(&mut self, x: &[f32], rows: usize, cols: usize) {
        debug_assert!(cols.is_multiple_of(BLOCK));
        debug_assert_eq!(x.len(), rows * cols);
        self.rows = rows;
        self.cols = cols;
        self.q.resize(rows * cols, 0);
        self.d.resize(rows * cols / BLOCK, 0.0);
        self.sums.resize(rows * cols / 16, 0);
        self.fsums.resize(rows * cols / BLOCK, 0.0);
        super::dispatch::quantize_blocks(x, self);
    }

    /// Row `r`'s bytes.
    #[inline]
    pub fn row_q(&self, r: usize) -> &[i8] {
        &self.q[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r`'s scales.
    #[inline]
    pub fn row_d(&self, r: usize) -> &[f32] {
        let n = self.cols / BLOCK;
        &self.d[r * n..(r + 1) * n]
    }

    /// Row `r`'s sums of 16.
    #[inline]
    pub fn row_sums(&self, r: usize) -> &[i32] {
        let n = self.cols / 16;
        &self.sums[r * n..(r + 1) * n]
    }

    /// Row `r`'s block sums.
    #[inline]
    pub fn row_fsums(&self, r: usize) -> &[f32] {
        let n = self.cols / BLOCK;
        &self.fsums[r * n..(r + 1) * n]
    }
}

/// Quantizes every block of `x` into `a`'s buffers; written as plain loops so that the
/// compiler vectorizes them for whichever instruction set the caller was compiled for. Each
/// value is computed the same way whatever the vector width, so every backend sees the same
/// bytes and scales.
#[inline(always)]
pub(crate) fn quantize_blocks_body(x: &[f32], a: &mut QuantizedActs) {
    for (((xb, qb), (db, fb)), sb) in x
        .chunks_exact(BLOCK)
        .zip(a.q.chunks_exact_mut(BLOCK))
        .zip(a.d.iter_mut().zip(a.fsums.iter_mut()))
        .zip(a.sums.chunks_exact_mut(2))
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        // f32::max drops NaN: a NaN input must still reach the outputs (the engine refuses
        // non-finite logits), so it makes the block's scale NaN.
        let nan = xb.iter().fold(false, |n, v| n | v.is_nan());
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let d = if nan { f32::NAN } else { amax / 127.0 };
        *db = d;
        for (o, v) in qb.iter_mut().zip(xb) {
            *o = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        for (s, qs) in sb.iter_mut().zip(qb.chunks_exact(16)) {
            *s = qs.iter().map(|&v| v as i32).sum();
        }
        *fb = d * (sb[0] + sb[1]) as f32;
    }
}
