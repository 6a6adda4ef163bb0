//! Quantized K/V storage: tokens are encoded as they are appended (no dense copy outlives
//! the chunk that brought them; a side that calibrates holds its first rows as f16 until it
//! has seen [`StorageShape::calibration_rows`], then codes them all, `Side::append_heads`),
//! keys and values each in their own side format (TurboQuant
//! codes under a codec spec, one of llama.cpp's block types, or dense f16, bf16 or f32;
//! `kv::format`), one stream of segments per kv head; attention reads the stored form
//! directly, on every device, and the held tokens are never decoded on the decode path.
//!
//! llama.cpp's block types are held as ggml holds them, rotated as upstream rotates them
//! (docs/cache-options.md): the queries are rotated once per call, quantized to the keys' dot type and
//! dotted per block in integers (`BlockType::dots`, ggml's products float for float); the
//! value rows are dequantized and summed with fused adds (`BlockType::accumulate_rows`), the
//! sum rotated back once. Prefill (many query rows) reads every segment as decoded rows
//! instead, once per call, through the f16 cache's tiles (`turboquant_rows.rs`): the same
//! products, added in another order.
//!
//! Layout: every kv head holds its tokens in segments of [`SEGMENT_TOKENS`] (each a
//! `CodeBlock`, ggml blocks, or a row buffer in a dense side's dtype); all segments but the
//! last are full.
//! Segments let a sliding window forget its oldest tokens by dropping whole segments (the
//! `front` tokens of the first segment are kept but masked), and let one decode step spread
//! a long context over all cores even when the model has a single kv head.
//!
//! Attention, per kv head and block of query rows: the group's query heads are scaled
//! and scored together against each segment's codes (`scores_prepared_range`: the queries
//! rotated once per call, codes unpacked once for the whole group), masked per [`AttendSpec`] (causal,
//! sliding window, dropped front), soft-maxed across segments, and the values are summed by
//! `accumulate_raw` in the rotated domain, added over the segments and rotated back once per
//! call (`finish_sums`). Keys are never
//! repeated for GQA and no dequantized K/V exists.
//!
//! Devices. The codes live in host memory and attention over them runs on the CPU (the
//! codec's AVX-512/AVX2/NEON kernels): that CPU is the storage's *home*. When the model runs
//! elsewhere (Metal, CUDA), or when [`StorageShape::home`] sets the home apart explicitly,
//! each attention call *crosses*: the query rows `[n_heads, t, head_dim]` are copied to the
//! home, attended there over the codes, and the output `[n_heads, t, head_dim]` is copied back
//! to the query's device in the query's dtype. A decode step (t = 1) thus moves
//! 2 × n_heads × head_dim floats per layer, plus the new token's K and V on append, and reads
//! each code once. [`KvStorage::to_dense`] is only for conversions between precisions and
//! for tests; the counters of [`KvStorage::traffic`] record every conversion and crossing so
//! tests can hold the decode path to that.
//!
//! Why this design on Metal, and not a Metal kernel (candle `CustomOp` with `metal_fwd`: a
//! runtime-compiled shader scoring and accumulating from codes, as turboquant-mlx and
//! llama.cpp's Metal flash attention do for their formats):
//! - Apple Silicon memory is unified: the CPU reads the codes at full memory bandwidth where
//!   they already are, and the per-step transfer is a few KiB per layer (16 KiB for 8 heads
//!   × 256 dims × f32 both ways), so the GPU never needs its own copy of the cache.
//! - It is one implementation for every device: masking, sliding windows, the dropped front,
//!   centering offsets, 2.5/3.5-bit two-segment layouts, `prod`'s QJL term, Haar rotations
//!   and dense f16 sides would each need a shader variant, and none of it could be compiled
//!   or run where KV Lab is built and tested (Linux, no GPU). This path is tested here, its
//!   NEON kernels under emulation.
//! - The price is a GPU→CPU synchronization per layer and step (the query must exist before
//!   the CPU can read it) and CPU attention instead of GPU attention. Against the dequantize-
//!   everything fallback this replaced (every held token decoded on the CPU and uploaded
//!   dense, every step), it is a strict gain; whether a Metal kernel beats it on long
//!   contexts is a measurement to make on Apple hardware, and a `metal_fwd` over the same
//!   codes is the follow-up if it does.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use kvlab_turboquant::ggml::{self, BlockType};
use kvlab_turboquant::{CodeBlock, Codec, Scratch};
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::kv::format::{
    KvPrecision, LayerPrecision, SideSpec, MIN_CALIBRATION_ROWS, TQ_ROW_GRAIN,
};
use crate::kv::split_softmax::{merge, Partial};
use crate::kv::storage::{AttendSpec, KvStorage, StorageShape, StorageTraffic};
use crate::kv::wire::{corrupt, WireReader, WireWriter};
use kvlab_cpu::attention;
use kvlab_cpu::vmath::exp_shifted_sum;

use side::{DenseRows, Seg, Side};

/// Tokens per code segment (per kv head and side).
pub const SEGMENT_TOKENS: usize = 512;

/// Upper bound on the floats of one query block's score buffer (4 MiB): long prefills are
/// cut into blocks of query rows so the scores never grow with `t × context`.
const SCORE_BUDGET: usize = 1 << 20;

/// Below this many (query, key) pairs a block is processed on the calling thread. Low enough
/// that a decode step over a sliding window (4 query heads × 512 keys on the 270M, 8 on
/// E2B) runs on two cores, as the f16 path's 256-key blocks do: a call there takes
/// 45–65 µs on one core, far above the pool's dispatch cost.
const PARALLEL_MIN_PAIRS: usize = 1 << 11;

/// Keys per unit of work where a segment is cut into key ranges (dense, ggml-block and
/// TurboQuant sides without QJL, the last below [`RANGED_CODE_SEGMENTS`] segments):
/// a sliding layer's 512-key window splits four ways, as the f16 path's 256-key blocks split
/// it two, with the merge still negligible.
const RANGE_KEYS: usize = 128;

/// Below this many segments in a decode call, TurboQuant codes are cut into key ranges too
/// (a sliding window's one or two segments); from it on, whole segments already keep
/// every core busy.
const RANGED_CODE_SEGMENTS: usize = 4;

/// From this many query rows on (prefill), sides score and sum over their decoded rows
/// instead of per record: by the row tiles of `turboquant_rows.rs` where both sides can, else
/// (a codec with QJL, q4_1/q5_1 keys on the other side) by matrix products per segment. The
/// same products as the kernels', added in another order (the difference is float rounding).
/// Decode steps (a group's few heads) keep ggml's dots and the codec's kernels float for
/// float.
const BLOCK_GEMM_MIN_ROWS: usize = 16;

/// A layer's keys and values as TurboQuant codes (see the module doc).
#[derive(Debug)]
pub struct SplitStorage {
    precision: LayerPrecision,
    shape: StorageShape,
    key: Side,
    value: Side,
    /// Stored tokens of the first segment that were dropped (masked, not yet freed).
    front: usize,
    /// Stored tokens per head, `front` included.
    total: usize,
    /// Set when [`StorageShape::home`] sets the home apart: every attention call crosses.
    apart: bool,
    /// What [`KvStorage::traffic`] reports.
    counters: Counters,
}

/// Atomic counters behind [`StorageTraffic`] (attention takes `&self`).
#[derive(Debug, Default)]
struct Counters {
    dense_conversions: AtomicU64,
    dense_rows: AtomicU64,
    crossings: AtomicU64,
    crossed_floats: AtomicU64,
    appended_floats: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> StorageTraffic {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StorageTraffic {
            dense_conversions: get(&self.dense_conversions),
            dense_rows: get(&self.dense_rows),
            crossings: get(&self.crossings),
            crossed_floats: get(&self.crossed_floats),
            appended_floats: get(&self.appended_floats),
        }
    }
}

impl SplitStorage {
    /// An empty storage; builds the codecs (and validates the specs for `shape.head_dim`).
    /// A home set apart must be the CPU: attention over codes exists only there.
    pub fn new(precision: LayerPrecision, shape: StorageShape) -> Result<Self> {
        let apart = match &shape.home {
            Some(h) if !h.is_cpu() => {
                return Err(EngineError::invalid(format!(
                    "TurboQuant attends over its codes on the CPU; home {h:?} is not supported"
                )));
            }
            Some(_) => true,
            None => false,
        };
        Ok(Self {
            key: Side::new(precision.key, &precision, true, &shape)?,
            value: Side::new(precision.value, &precision, false, &shape)?,
            precision,
            shape,
            front: 0,
            total: 0,
            apart,
            counters: Counters::default(),
        })
    }

    /// Bytes one token takes in this layer (all kv heads, keys and values).
    pub fn bytes_per_token(&self) -> usize {
        self.shape.n_kv_heads * (self.key.bytes_per_vector() + self.value.bytes_per_vector())
    }

    fn clear(&mut self) {
        self.key.truncate(0);
        self.value.truncate(0);
        self.front = 0;
        self.total = 0;
    }

    /// Host (home) f32 copy of a tensor, from whatever device it is on.
    fn host_rows(&self, x: &Tensor) -> Result<Vec<f32>> {
        Ok(x.to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }

    /// The visible stored-token range `[lo, hi)` of the query at absolute position `qp`.
    fn visible(&self, qp: usize, spec: &AttendSpec) -> Result<(usize, usize)> {
        let live = self.total - self.front;
        let (lo, hi) = spec.visible(qp, live);
        if hi <= lo {
            return Err(EngineError::invalid(format!(
                "attend: query {qp} sees no stored key (keys {}..{})",
                spec.key_start,
                spec.key_start + live
            )));
        }
        let at = |p: usize| p - spec.key_start + self.front;
        Ok((at(lo), at(hi)))
    }
}

impl KvStorage for SplitStorage {
    fn precision(&self) -> KvPrecision {
        KvPrecision::Split(self.precision)
    }

    fn len(&self) -> usize {
        self.total - self.front
    }

    fn write_state(&self, w: &mut WireWriter) -> Result<()> {
        self.write_held(w)
    }

    fn read_state(&mut self, r: &mut WireReader) -> Result<()> {
        self.read_held(r)
    }

    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (h, t, d) = k.dims3()?;
        if (h, d) != (self.shape.n_kv_heads, self.shape.head_dim) || v.dims3()? != (h, t, d) {
            return Err(EngineError::invalid(format!(
                "append: k {:?} / v {:?} do not match a cache of {} kv heads × {}",
                k.dims(),
                v.dims(),
                self.shape.n_kv_heads,
                self.shape.head_dim
            )));
        }
        if t == 0 {
            return Ok(());
        }
        let kf = self.host_rows(k)?;
        let vf = self.host_rows(v)?;
        Counters::add(&self.counters.appended_floats, kf.len() + vf.len());
        let before = self.total;
        let res = self
            .key
            .append_heads(&kf, t)
            .and_then(|_| self.value.append_heads(&vf, t));
        if res.is_err() {
            // All or nothing: a vector that cannot be encoded leaves the storage as it was.
            self.key.truncate(before);
            self.value.truncate(before);
        } else {
            self.total += t;
        }
        res
    }

    fn attend(&self, q: &Tensor, spec: &AttendSpec) -> Result<Tensor> {
        self.attend_codes(q, spec)
    }

    fn wants_query_energy(&self) -> bool {
        self.key.wants_query_energy()
    }

    fn set_query_energy(&mut self, energy: &[f64]) {
        self.key.set_query_energy(energy);
    }

    fn calibrating(&self) -> bool {
        self.key.store.waiting().is_some() || self.value.store.waiting().is_some()
    }

    fn calibrate_now(&mut self) -> Result<()> {
        if self.total < MIN_CALIBRATION_ROWS {
            return Ok(());
        }
        // Each side calibrates all or nothing; a side calibrated beside one still waiting is
        // a storage like any other (each side reads its own segments).
        self.key.calibrate(&[], 0)?;
        self.value.calibrate(&[], 0)
    }

    fn drop_front(&mut self, n: usize) -> Result<()> {
        if n > self.len() {
            return Err(EngineError::invalid(format!(
                "drop_front({n}) on a cache of {} tokens",
                self.len()
            )));
        }
        if n == self.len() {
            self.clear();
            return Ok(());
        }
        self.front += n;
        let whole = self.front / SEGMENT_TOKENS;
        if whole > 0 {
            self.key.drop_segments(whole);
            self.value.drop_segments(whole);
            self.front -= whole * SEGMENT_TOKENS;
            self.total -= whole * SEGMENT_TOKENS;
        }
        Ok(())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len() {
            return Err(EngineError::invalid(format!(
                "truncate({len}) on a cache of {} tokens",
                self.len()
            )));
        }
        if len == 0 {
            self.clear();
            return Ok(());
        }
        self.total = self.front + len;
        self.key.truncate(self.total);
        self.value.truncate(self.total);
        Ok(())
    }

    fn bytes_used(&self) -> usize {
        self.len() * self.bytes_per_token() + self.key.offset_bytes() + self.value.offset_bytes()
    }

    fn bytes_allocated(&self) -> usize {
        self.key.bytes_allocated() + self.value.bytes_allocated()
    }

    fn to_dense(&self) -> Result<(Tensor, Tensor)> {
        self.to_dense_range(0, self.len())
    }

    fn to_dense_range(&self, from: usize, len: usize) -> Result<(Tensor, Tensor)> {
        if from + len > self.len() {
            return Err(EngineError::invalid(format!(
                "to_dense_range({from}, {len}) on a cache of {} tokens",
                self.len()
            )));
        }
        Counters::add(&self.counters.dense_conversions, 1);
        Counters::add(&self.counters.dense_rows, len * self.shape.n_kv_heads);
        let shape = (self.shape.n_kv_heads, len, self.shape.head_dim);
        let dev = &self.shape.device;
        let k = Tensor::from_vec(self.decode_range(&self.key, from, len)?, shape, dev)?;
        let v = Tensor::from_vec(self.decode_range(&self.value, from, len)?, shape, dev)?;
        Ok((k, v))
    }

    fn traffic(&self) -> StorageTraffic {
        self.counters.snapshot()
    }
}

mod attend;
mod persist;
mod rows;
mod side;
#[cfg(test)]
mod tests;
