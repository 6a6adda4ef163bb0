//! Quantized matrices for CPU matmuls, with kernels of our own: a ggml matrix (Q4_0, Q5_0,
//! Q8_0, Q4_K, Q5_K, Q6_K) is repacked once, at load, into interleaved tiles
//! ([`layout`]) that replace it (about the file's size, never a second copy); each matmul
//! quantizes its activation rows once ([`activation`]) and runs integer dots on the
//! widest backend this CPU has ([`Backend`]), split by tiles over the caller's pool
//! ([`crate::Parallel`]). Decode (one row) reads each weight once; prefill shares each
//! unpacked weight vector among four rows and each tile among a chunk of rows.

mod activation;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dispatch;
mod format;
mod layout;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg(test)]
mod tests;

use std::ops::Range;

pub use activation::{QuantizedActs, BLOCK};
pub use dispatch::Backend;
pub use format::{decode_block, Decoded, Geometry, QFormat, ALL_FORMATS};
use layout::{Layout, Line, TILE_ROWS, VEC};

use crate::{CpuError, Parallel, Result};

/// Activation rows per pass over the tiles in a many-row matmul: a tile stays in cache
/// while these rows stream past it.
const ROW_CHUNK: usize = 64;

/// Bytes a `[rows, cols]` matrix of `format` holds once repacked (the pre-load estimate).
pub fn packed_bytes(format: QFormat, rows: usize, cols: usize) -> usize {
    rows.div_ceil(TILE_ROWS) * Layout::new(format, cols).tile_bytes
}

/// A `[rows, cols]` quantized matrix in the kernels' tile layout.
pub struct PackedMatrix {
    lay: Layout,
    rows: usize,
    cols: usize,
    data: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("format", &self.lay.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

/// Where a kernel writes: `rows × n` floats; tiles write disjoint columns.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    pub ptr: *mut f32,
    pub n: usize,
}

// SAFETY: kernels running in parallel write disjoint (row, column) cells of one buffer that
// outlives the parallel section.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// A format known at compile time, for the SIMD kernels.
pub(crate) trait Fmt {
    const FORMAT: QFormat;
    const G: format::Geometry = Self::FORMAT.geometry();
}

macro_rules! fmt_type {
    ($name:ident, $f:ident) => {
        pub(crate) struct $name;
        impl Fmt for $name {
            const FORMAT: QFormat = QFormat::$f;
        }
    };
}
fmt_type!(Q40, Q4_0);
fmt_type!(Q50, Q5_0);
fmt_type!(Q80, Q8_0);
fmt_type!(F4K, Q4K);
fmt_type!(F5K, Q5K);
fmt_type!(F6K, Q6K);

impl PackedMatrix {
    /// Repacks `rows` rows of ggml blocks of `format` (row-major, `cols` weights per row).
    pub fn from_ggml(format: QFormat, bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let g = format.geometry();
        if cols == 0 || rows == 0 || !cols.is_multiple_of(g.sb) {
            return Err(CpuError::new(format!(
                "a {} matrix needs rows of a multiple of {} weights, not [{rows}, {cols}]",
                format.name(),
                g.sb
            )));
        }
        let want = rows * (cols / g.sb) * g.ggml_block;
        if bytes.len() != want {
            return Err(CpuError::new(format!(
                "{} data of {} bytes for [{rows}, {cols}] (expected {want})",
                format.name(),
                bytes.len()
            )));
        }
        let (lay, data) = layout::repack(format, bytes, rows, cols);
        Ok(Self {
            lay,
            rows,
            cols,
            data,
        })
    }

    /// The weight type.
    pub fn format(&self) -> QFormat {
        self.lay.format
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weights per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> usize {
        self.data.len() * VEC
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.held_bytes()) }
    }

    fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }

    /// Row `r` as f32 into `out` (`cols` values), as ggml dequantizes it.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let t = r / TILE_ROWS;
        let tile = &self.bytes()[t * self.lay.tile_bytes..(t + 1) * self.lay.tile_bytes];
        layout::dequantize_row(&self.lay, tile, r % TILE_ROWS, out);
    }

    /// `x · Wᵀ` for `m` rows `x` (`m × cols`, row-major) into `out` (`m × rows`), on `backend`.
    pub fn matmul_with(
        &self,
        backend: Backend,
        pool: &dyn Parallel,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<()> {
        matmul_group_with(backend, pool, &[self], x, m, &mut [out])
    }

    /// `x · Wᵀ` on the best backend.
    pub fn matmul(&self, pool: &dyn Parallel, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        self.matmul_with(Backend::best(), pool, x, m, out)
    }

    /// Rows `ids` as f32 `[ids.len(), cols]` (embedding lookups).
    pub fn embedding(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            let id = id as usize;
            if id >= self.rows {
                return Err(CpuError::new(format!(
                    "row {id} outside a table of {} rows",
                    self.rows
                )));
            }
            self.dequantize_row(id, row);
        }
        Ok(out)
    }
}

/// `x · Wᵢᵀ` for every matrix `Wᵢ` of `mats` (all with the input's width) into `outs[i]`
/// (`m × rowsᵢ`), on the best backend: the input is quantized once and the tiles of all the
/// matrices are one work list for the compute pool, so a layer's q/k/v or gate/up
/// projections cost one pass of the pool instead of several, and the small ones balance out.
pub fn matmul_group(
    pool: &dyn Parallel,
    mats: &[&PackedMatrix],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
) -> Result<()> {
    matmul_group_with(Backend::best(), pool, mats, x, m, outs)
}

/// [`matmul_group`] on `backend`.
pub fn matmul_group_with(
    backend: Backend,
    pool: &dyn Parallel,
    mats: &[&PackedMatrix],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
) -> Result<()> {
    let Some(first) = mats.first() else {
        return Ok(());
    };
    let cols = first.cols;
    for (w, out) in mats.iter().zip(outs.iter()) {
        if w.cols != cols || x.len() != m * cols || out.len() != m * w.rows {
            return Err(CpuError::new(format!(
                "matmul of [{m}, {}] activations into [{m}, {}] outputs with a [{}, {}] matrix",
                x.len() / m.max(1),
                out.len() / m.max(1),
                w.rows,
                w.cols
            )));
        }
    }
    if outs.len() != mats.len() {
        return Err(CpuError::new("one output per matrix"));
    }
    if !backend.available() {
        return Err(CpuError::new(format!(
            "the {} kernels do not run on this CPU",
            backend.name()
        )));
    }
    let mut acts = QuantizedActs::default();
    acts.quantize_into(x, m, cols);
    let sinks: Vec<Out> = outs
        .iter_mut()
        .zip(mats)
        .map(|(o, w)| Out {
            ptr: o.as_mut_ptr(),
            n: w.rows,
        })
        .collect();
    // Work item i is tile i − starts[j] of matrix j.
    let mut starts = Vec::with_capacity(mats.len() + 1);
    starts.push(0);
    for w in mats {
        starts.push(starts.last().copied().unwrap_or(0) + w.tiles());
    }
    let total = starts.last().copied().unwrap_or(0);
    let chunk = if m <= 4 { m } else { ROW_CHUNK };
    for row0 in (0..m).step_by(chunk.max(1)) {
        let rows: Range<usize> = row0..(row0 + chunk).min(m);
        pool.for_ranges(total, &|items| {
            let mut at = items.start;
            while at < items.end {
                let j = starts.partition_point(|&s| s <= at) - 1;
                let end = items.end.min(starts[j + 1]);
                let w = mats[j];
                let tiles = at - starts[j]..end - starts[j];
                // SAFETY: availability checked above; the work items of one call are
                // disjoint tiles, and the outputs outlive the pool's execution.
                unsafe {
                    dispatch::run(
                        backend,
                        &w.lay,
                        w.bytes(),
                        &acts,
                        rows.clone(),
                        tiles,
                        sinks[j],
                    )
                }
                at = end;
            }
        });
    }
    Ok(())
}
