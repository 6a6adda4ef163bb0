//! Quantized K/V storage: tokens are encoded as they are appended (no dense copy outlives
//! the chunk that brought them; a side that calibrates holds its first rows as f16 until it
//! has seen [`StorageShape::calibration_rows`], then codes them all, `Side::append_heads`),
//! keys and values each in their own side format (TurboQuant
//! codes under a codec spec, one of llama.cpp's block types, or dense f16, bf16 or f32;
//! `kv::format`), one stream of segments per kv head; attention reads the stored form
//! directly, on every device, and the held tokens are never decoded on the decode path.
//!
//! llama.cpp's block types are held as ggml holds them, rotated as upstream rotates them
//! (`kv::spec`): the queries are rotated once per call, quantized to the keys' dot type and
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

use super::precision::TQ_ROW_GRAIN;
use super::spec::{TqPrecision, TqSide};
use super::storage::{
    AttendSpec, KvPrecision, KvStorage, StorageShape, StorageTraffic, MIN_CALIBRATION_ROWS,
};
use super::wire::{corrupt, WireReader, WireWriter};
use crate::error::{EngineError, Result};
use kvlab_cpu::attention;
use kvlab_cpu::vmath::exp_shifted_sum;

use super::split_softmax::{merge, Partial};

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

/// `a` (`m × k`) times `b` (`k × n`), row-major, on the CPU's GEMM.
fn matmul(a: Vec<f32>, m: usize, b: Vec<f32>, k: usize, n: usize) -> Result<Vec<f32>> {
    let a = Tensor::from_vec(a, (m, k), &Device::Cpu)?;
    let b = Tensor::from_vec(b, (k, n), &Device::Cpu)?;
    Ok(a.matmul(&b)?.flatten_all()?.to_vec1::<f32>()?)
}

/// `a` (`m × k`) times the transpose of `b` (`n × k`), row-major.
fn matmul_t(a: Vec<f32>, m: usize, b: Vec<f32>, n: usize, k: usize) -> Result<Vec<f32>> {
    product_t(&Tensor::from_vec(a, (m, k), &Device::Cpu)?, b, n)
}

/// [`matmul_t`] with `a` already a tensor (`m × k`, shared by several products).
fn product_t(a: &Tensor, b: Vec<f32>, n: usize) -> Result<Vec<f32>> {
    let (m, k) = a.dims2()?;
    if n == 0 {
        return Ok(vec![0.0; m]);
    }
    let b = Tensor::from_vec(b, (n, k), &Device::Cpu)?;
    Ok(a.matmul(&b.t()?)?.flatten_all()?.to_vec1::<f32>()?)
}

/// A call's queries as a key side scores them, made once for every segment.
enum Prepared {
    /// Each row quantized to a block side's dot type, as ggml's flash attention does.
    Block(Vec<u8>),
    /// Rotated as a TurboQuant side's codes are, for prefill's matrix products (`g × d`).
    Rotated(Tensor),
    /// Made ready for a TurboQuant side's kernels (rotated, in their order) once per call,
    /// not once per segment.
    Codes(kvlab_turboquant::PreparedQueries),
}

/// The stored rows from the first to the last of `rows` (clipped to the `n` a segment holds)
/// that some of the `g` weight rows (`weights`: `g × n`) weighs, and those weight rows' columns
/// over that span (`g × span`); `None` when none is weighed. Value sums read only that span:
/// a sliding window's dropped front, a causal block's future and other units' keys never.
fn weighed_span(
    weights: &[f32],
    n: usize,
    g: usize,
    rows: std::ops::Range<usize>,
) -> Option<(std::ops::Range<usize>, Vec<f32>)> {
    let weighed = |t: usize| (0..g).any(|qi| weights[qi * n + t] != 0.0);
    let (lo, hi) = (rows.start.min(n), rows.end.min(n));
    let first = (lo..hi).find(|&t| weighed(t))?;
    let last = (first..hi).rev().find(|&t| weighed(t)).unwrap_or(first);
    let w = weights
        .chunks_exact(n)
        .take(g)
        .flat_map(|r| r[first..=last].iter().copied())
        .collect();
    Some((first..last + 1, w))
}

/// One segment of one side of one kv head.
enum Seg {
    Codes(CodeBlock),
    /// Row-major `tokens × dim` dense floats.
    Dense(DenseRows),
    /// Row-major ggml blocks, `tokens × row_bytes`.
    Blocks(Vec<u8>),
}

/// A dense side's segment in the side's dtype (f16, bf16 or f32).
enum DenseRows {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
}

/// Reserves room for `add` more floats in a segment of rows of `d`, 128 rows at a time (never
/// past a whole segment) so the reserve stays small.
fn grow<T>(v: &mut Vec<T>, add: usize, d: usize) {
    if v.capacity() < v.len() + add {
        let want = (v.len() + add).div_ceil(TQ_ROW_GRAIN * d) * TQ_ROW_GRAIN * d;
        v.reserve_exact(want.min(SEGMENT_TOKENS * d).max(v.len() + add) - v.len());
    }
}

impl DenseRows {
    fn new(dtype: DType) -> Self {
        match dtype {
            DType::BF16 => DenseRows::Bf16(Vec::new()),
            DType::F32 => DenseRows::F32(Vec::new()),
            _ => DenseRows::F16(Vec::new()),
        }
    }

    /// Floats held.
    fn len(&self) -> usize {
        match self {
            DenseRows::F16(v) => v.len(),
            DenseRows::Bf16(v) => v.len(),
            DenseRows::F32(v) => v.len(),
        }
    }

    fn capacity_bytes(&self) -> usize {
        match self {
            DenseRows::F16(v) => 2 * v.capacity(),
            DenseRows::Bf16(v) => 2 * v.capacity(),
            DenseRows::F32(v) => 4 * v.capacity(),
        }
    }

    /// Appends `xs` (rows of `d`), rounded to the dtype.
    fn extend(&mut self, xs: &[f32], d: usize) {
        match self {
            DenseRows::F16(v) => {
                grow(v, xs.len(), d);
                v.extend(xs.iter().map(|&x| f16::from_f32(x)));
            }
            DenseRows::Bf16(v) => {
                grow(v, xs.len(), d);
                v.extend(xs.iter().map(|&x| bf16::from_f32(x)));
            }
            DenseRows::F32(v) => {
                grow(v, xs.len(), d);
                v.extend_from_slice(xs);
            }
        }
    }

    /// Keeps the first `n` floats.
    fn truncate(&mut self, n: usize) {
        match self {
            DenseRows::F16(v) => v.truncate(n),
            DenseRows::Bf16(v) => v.truncate(n),
            DenseRows::F32(v) => v.truncate(n),
        }
    }

    /// Floats `range` as f32 (a bf16 side's widened, for the f32 kernels).
    fn floats(&self, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let mut out = vec![0f32; range.len()];
        self.read(range.start, &mut out)
            .ok_or_else(|| EngineError::invalid("rows past a dense segment"))?;
        Ok(out)
    }

    /// Floats `at..at + out.len()` into `out`; `None` past the end.
    fn read(&self, at: usize, out: &mut [f32]) -> Option<()> {
        let range = at..at + out.len();
        match self {
            DenseRows::F16(v) => {
                for (o, x) in out.iter_mut().zip(v.get(range)?) {
                    *o = x.to_f32();
                }
            }
            DenseRows::Bf16(v) => {
                for (o, x) in out.iter_mut().zip(v.get(range)?) {
                    *o = x.to_f32();
                }
            }
            DenseRows::F32(v) => out.copy_from_slice(v.get(range)?),
        }
        Some(())
    }

    /// The floats as saved: each one's little-endian bytes.
    fn to_bytes(&self) -> Vec<u8> {
        match self {
            DenseRows::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            DenseRows::Bf16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            DenseRows::F32(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        }
    }

    /// What [`DenseRows::to_bytes`] wrote for a side of `dtype` (whole rows: the reader
    /// checks the length against the side's row bytes).
    fn from_bytes(dtype: DType, bytes: &[u8]) -> Self {
        let u16s = || {
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        match dtype {
            DType::BF16 => DenseRows::Bf16(u16s().map(bf16::from_bits).collect()),
            DType::F32 => DenseRows::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            _ => DenseRows::F16(u16s().map(f16::from_bits).collect()),
        }
    }
}

/// A side stored in one of llama.cpp's block types, rotated as upstream rotates it.
#[derive(Debug, Clone, Copy)]
struct BlockSide {
    ty: BlockType,
    /// Bytes of one stored vector.
    row_bytes: usize,
    /// Hadamard block width the vectors (and, for keys, the queries) are rotated in.
    rot: Option<usize>,
}

impl BlockSide {
    /// Rotates (when rotating) and quantizes `rows` (`n × dim`), appending the blocks.
    fn encode(&self, rows: &[f32], dim: usize, out: &mut Vec<u8>) -> Result<()> {
        let mut row = vec![0f32; dim];
        for r in rows.chunks_exact(dim) {
            row.copy_from_slice(r);
            self.rotate(&mut row)?;
            let at = out.len();
            out.resize(at + self.row_bytes, 0);
            self.ty.quantize_row(&row, &mut out[at..])?;
        }
        Ok(())
    }

    /// The floats of stored rows (in the rotated domain), row-major.
    fn dequantize_rows(&self, bytes: &[u8], dim: usize) -> Result<Vec<f32>> {
        // Each row through a buffer that stays in L1, appended: zeroing the whole output
        // first cost as much as the dequantizing.
        let mut out = Vec::with_capacity(bytes.len() / self.row_bytes * dim);
        let mut row = vec![0f32; dim];
        for q in bytes.chunks_exact(self.row_bytes) {
            self.ty.dequantize_row(q, &mut row)?;
            out.extend_from_slice(&row);
        }
        Ok(out)
    }

    /// Applies the side's rotation to `x` (its own inverse).
    fn rotate(&self, x: &mut [f32]) -> Result<()> {
        if let Some(w) = self.rot {
            ggml::hadamard_rotate(x, w)?;
        }
        Ok(())
    }
}

/// Keys or values of every kv head.
struct Side {
    /// The codec a coded side's segments hold codes of; `None` for block and dense sides,
    /// and for a calibrating side until it calibrates (`waiting` holds it then).
    codec: Option<Arc<Codec>>,
    /// A calibrating side's codec (centered, or `+qw` keys) while it holds its first rows as
    /// f16 ([`Side::append_heads`]): until then it is a dense f16 side in every respect.
    waiting: Option<Arc<Codec>>,
    /// Rows it waits for ([`StorageShape::calibration_rows`]).
    calibration_rows: usize,
    /// Set for a side in one of llama.cpp's block types (then `codec` is `None`).
    block: Option<BlockSide>,
    /// The dtype of a dense side (neither `codec` nor `block`).
    dense: DType,
    dim: usize,
    heads: Vec<Vec<Seg>>,
    /// Whether coded vectors are stored relative to a per-head offset.
    center: bool,
    /// Per head: the offset subtracted before encoding, fixed when the side calibrates.
    offsets: Vec<Option<Vec<f32>>>,
    /// Whether coded vectors are weighted per channel by the queries' energy (`+qw`).
    weigh: bool,
    /// Per head: the channel weights w (the codes hold w ⊙ (x − μ)), fixed when the side
    /// calibrates.
    weights: Vec<Option<Vec<f32>>>,
    /// Per head: Σ q_j² over the query rows of the head's group seen so far, for the weights.
    query_energy: Vec<Vec<f64>>,
    /// Whether this is a `+sink` block side (`kv::spec`).
    sink: bool,
    /// Per head: a `+sink` side's first token as f16, rotated as its blocks are. Attention
    /// and decoding read it in place of that token's blocks ([`Side::sink_row`]).
    sinks: Vec<Option<Vec<f16>>>,
    /// Whether a sliding window dropped the first segment: the sinks then stand for no held
    /// token, and stay (their bytes are in the layer's fixed bytes) until the side empties.
    sink_dropped: bool,
}

impl fmt::Debug for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the codes themselves.
        f.debug_struct("Side")
            .field("spec", &self.codec.as_ref().map(|c| *c.spec()))
            .field("waiting", &self.waiting.is_some())
            .field("dim", &self.dim)
            .field("heads", &self.heads.len())
            .field("segments", &self.heads.first().map_or(0, Vec::len))
            .finish()
    }
}

impl Side {
    /// `rotate` and `is_key` choose a block side's rotation: keys in the widest Hadamard
    /// block upstream uses, values in 64-wide ones, neither unless `dim` is a multiple of 64.
    fn new(side: TqSide, p: &TqPrecision, is_key: bool, shape: &StorageShape) -> Result<Self> {
        let (n_heads, dim) = (shape.n_kv_heads, shape.head_dim);
        let (center, weigh) = (p.center, p.weigh_keys && is_key);
        let mut codec = match side {
            TqSide::Codes(spec) => Some(Arc::new(Codec::new(dim, spec)?)),
            _ => None,
        };
        let block = match side {
            TqSide::Block(ty) => Some(BlockSide {
                ty,
                row_bytes: ty.row_bytes(dim)?,
                rot: if !p.rotate {
                    None
                } else if is_key {
                    ggml::key_rotation_width(dim)
                } else {
                    ggml::value_rotation_width(dim)
                },
            }),
            _ => None,
        };
        let center = center && codec.is_some();
        let weigh = weigh && codec.is_some();
        let waiting = if p.calibrates(is_key) {
            codec.take()
        } else {
            None
        };
        Ok(Self {
            codec,
            waiting,
            calibration_rows: shape.calibration_rows.min(SEGMENT_TOKENS),
            block,
            dense: side.dense_dtype().unwrap_or(DType::F16),
            dim,
            heads: (0..n_heads).map(|_| Vec::new()).collect(),
            center,
            offsets: vec![None; n_heads],
            weigh,
            weights: vec![None; n_heads],
            query_energy: vec![vec![0.0; dim]; n_heads],
            sink: p.sink && block.is_some(),
            sinks: vec![None; n_heads],
            sink_dropped: false,
        })
    }

    /// Keeps head `h`'s first token (the first row of `rows`) as its sink when this is a
    /// `+sink` side that holds nothing yet.
    fn keep_sink(&mut self, h: usize, rows: &[f32]) -> Result<()> {
        let (Some(b), Some(first)) = (&self.block, rows.get(..self.dim)) else {
            return Ok(());
        };
        if !self.sink || self.sinks[h].is_some() || !self.heads[h].is_empty() {
            return Ok(());
        }
        let mut row = first.to_vec();
        b.rotate(&mut row)?;
        let row: Vec<f16> = row.into_iter().map(f16::from_f32).collect();
        if row.iter().any(|x| !x.is_finite()) {
            // Refused as a calibrating side refuses what f16 cannot hold (all or nothing:
            // the append leaves the storage as it was).
            let norm = first.iter().map(|x| x * x).sum::<f32>().sqrt();
            return Err(kvlab_turboquant::Error::NotEncodable { norm }.into());
        }
        self.sinks[h] = Some(row);
        Ok(())
    }

    /// Head `h`'s sink where segment `s` holds its token (as the first row), in the rotated
    /// domain the blocks are read in.
    fn sink_row(&self, h: usize, s: usize) -> Option<Vec<f32>> {
        if s != 0 || self.sink_dropped {
            return None;
        }
        let row = self.sinks.get(h)?.as_ref()?;
        Some(row.iter().map(|x| x.to_f32()).collect())
    }

    /// Whether a head still waits for its weights (so the queries' energy is wanted).
    fn wants_query_energy(&self) -> bool {
        self.weigh && self.weights.iter().any(Option::is_none)
    }

    /// Takes the per-head query energies (`n_heads × dim`) the cache measured so far.
    fn set_query_energy(&mut self, energy: &[f64]) {
        for (h, e) in energy.chunks_exact(self.dim).enumerate() {
            if let Some(mine) = self.query_energy.get_mut(h) {
                mine.copy_from_slice(e);
            }
        }
    }

    /// The weights of head `h`, if its codes are weighted.
    fn weights(&self, h: usize) -> Option<&[f32]> {
        self.weights.get(h).and_then(|w| w.as_deref())
    }

    fn bytes_per_vector(&self) -> usize {
        match (&self.codec, &self.block) {
            (Some(c), _) => c.bytes_per_vector(),
            (None, Some(b)) => b.row_bytes,
            (None, None) => self.dense.size_in_bytes() * self.dim,
        }
    }

    fn seg_len(&self, seg: &Seg) -> usize {
        match seg {
            Seg::Codes(b) => b.len(),
            Seg::Dense(v) => v.len() / self.dim,
            Seg::Blocks(v) => v.len() / self.bytes_per_vector(),
        }
    }

    fn new_seg(&self) -> Seg {
        match (&self.codec, &self.block) {
            (Some(c), _) => Seg::Codes(c.new_block()),
            (None, Some(_)) => Seg::Blocks(Vec::new()),
            (None, None) => Seg::Dense(DenseRows::new(self.dense)),
        }
    }

    fn scratch(&self) -> Scratch {
        self.codec.as_ref().map(|c| c.scratch()).unwrap_or_default()
    }

    /// Appends `t` rows of every head (`rows`: `heads × t × dim`). A calibrating side holds
    /// them as f16 until it has seen [`Side::calibration_rows`], then measures each head's
    /// offset and weights on all of them and codes them in place ([`Side::calibrate`]).
    fn append_heads(&mut self, rows: &[f32], t: usize) -> Result<()> {
        let per_head = t * self.dim;
        if self.waiting.is_some() {
            let held = self.heads.first().map_or(0, |segs| {
                segs.iter().map(|s| self.seg_len(s)).sum::<usize>()
            });
            if held + t >= self.calibration_rows {
                return self.calibrate(rows, t);
            }
            // Refused now as the codec would refuse them when it calibrates (and as a
            // calibrated side's append does), not later, at the append that calibrates.
            for r in rows.chunks_exact(self.dim) {
                let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt();
                if !norm.is_finite() || norm > f16::MAX.to_f32() {
                    return Err(kvlab_turboquant::Error::NotEncodable { norm }.into());
                }
            }
        }
        for (h, r) in rows.chunks_exact(per_head).enumerate() {
            self.keep_sink(h, r)?;
            let coded = self.coded(h, r);
            self.append_rows(h, &coded)?;
        }
        Ok(())
    }

    /// `rows` of head `h` as its codes hold them: less the head's offset, times its weights.
    fn coded<'a>(&self, h: usize, rows: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        let (offset, weights) = (self.offset(h), self.weights(h));
        if offset.is_none() && weights.is_none() {
            return std::borrow::Cow::Borrowed(rows);
        }
        let mut coded = rows.to_vec();
        for r in coded.chunks_exact_mut(self.dim) {
            if let Some(m) = offset {
                r.iter_mut().zip(m).for_each(|(x, m)| *x -= m);
            }
            if let Some(w) = weights {
                r.iter_mut().zip(w).for_each(|(x, w)| *x *= w);
            }
        }
        std::borrow::Cow::Owned(coded)
    }

    /// Calibrates a waiting side on the rows it holds and `rows` (`heads × t × dim`): each
    /// head's offset (their mean, [`MIN_CALIBRATION_ROWS`] at least) and weights, then every row
    /// coded in the same places. All or nothing: on an error the side is as it was.
    fn calibrate(&mut self, rows: &[f32], t: usize) -> Result<()> {
        if self.waiting.is_none() {
            return Ok(());
        }
        let d = self.dim;
        let n_heads = self.heads.len();
        self.codec = self.waiting.take();
        let built = (|| {
            let mut heads = Vec::with_capacity(n_heads);
            let mut offsets = Vec::with_capacity(n_heads);
            let mut weights = Vec::with_capacity(n_heads);
            for h in 0..n_heads {
                let new = rows.get(h * t * d..(h + 1) * t * d).unwrap_or_default();
                let held: usize = self.heads[h].iter().map(|s| self.seg_len(s)).sum();
                let mut all = vec![0f32; held * d];
                self.decode(h, 0, &mut all)?;
                all.extend_from_slice(new);
                let offset = (self.center && all.len() / d >= MIN_CALIBRATION_ROWS)
                    .then(|| mean_row(&all, d))
                    .or_else(|| self.center.then(|| vec![0.0; d]));
                if let Some(m) = &offset {
                    for r in all.chunks_exact_mut(d) {
                        r.iter_mut().zip(m).for_each(|(x, m)| *x -= m);
                    }
                }
                let w = self
                    .weigh
                    .then(|| channel_weights(&self.query_energy[h], &all, d));
                if let Some(w) = &w {
                    for r in all.chunks_exact_mut(d) {
                        r.iter_mut().zip(w).for_each(|(x, w)| *x *= w);
                    }
                }
                let mut segs = Vec::new();
                self.append_to(&mut segs, &all)?;
                heads.push(segs);
                offsets.push(offset);
                weights.push(w);
            }
            Ok::<_, EngineError>((heads, offsets, weights))
        })();
        match built {
            Ok((heads, offsets, weights)) => {
                self.heads = heads;
                self.offsets = offsets;
                self.weights = weights;
                Ok(())
            }
            Err(e) => {
                self.waiting = self.codec.take();
                Err(e)
            }
        }
    }

    /// Holds a calibrating side's rows as f16 again, waiting, once it holds none.
    fn restage(&mut self) {
        if self.waiting.is_none() && (self.center || self.weigh) {
            self.waiting = self.codec.take();
        }
    }

    /// The offset of head `h`, if its vectors are stored relative to one.
    fn offset(&self, h: usize) -> Option<&[f32]> {
        self.offsets.get(h).and_then(|o| o.as_deref())
    }

    /// Appends `rows` (`n × dim`, as coded) to head `h`, filling the last segment first.
    fn append_rows(&mut self, h: usize, rows: &[f32]) -> Result<()> {
        let mut segs = std::mem::take(&mut self.heads[h]);
        let res = self.append_to(&mut segs, rows);
        self.heads[h] = segs;
        res
    }

    /// [`Side::append_rows`] into the segments `segs`.
    fn append_to(&self, segs: &mut Vec<Seg>, mut rows: &[f32]) -> Result<()> {
        let d = self.dim;
        let row_bytes = self.bytes_per_vector();
        while !rows.is_empty() {
            let need_new = match segs.last() {
                None => true,
                Some(s) => self.seg_len(s) == SEGMENT_TOKENS,
            };
            if need_new {
                segs.push(self.new_seg());
            }
            let Some(seg) = segs.last_mut() else {
                return Err(EngineError::invalid("segment missing after push"));
            };
            let have = match seg {
                Seg::Codes(b) => b.len(),
                Seg::Dense(v) => v.len() / d,
                Seg::Blocks(v) => v.len() / row_bytes,
            };
            let take = (SEGMENT_TOKENS - have).min(rows.len() / d);
            let (now, rest) = rows.split_at(take * d);
            match (seg, &self.codec) {
                (Seg::Codes(b), Some(codec)) => codec.encode_batch(now, b)?,
                (Seg::Dense(v), _) => v.extend(now, d),
                (Seg::Blocks(v), _) => {
                    let Some(b) = &self.block else {
                        return Err(EngineError::invalid("block segment without a block type"));
                    };
                    let row = b.row_bytes;
                    if v.capacity() < v.len() + take * row {
                        let want = (v.len() + take * row).div_ceil(TQ_ROW_GRAIN * row)
                            * TQ_ROW_GRAIN
                            * row;
                        v.reserve_exact(want.min(SEGMENT_TOKENS * row) - v.len());
                    }
                    b.encode(now, d, v)?;
                }
                (Seg::Codes(_), None) => {
                    return Err(EngineError::invalid("code segment without a codec"));
                }
            }
            rows = rest;
        }
        Ok(())
    }

    /// Keeps the first `total` stored tokens of every head.
    fn truncate(&mut self, total: usize) {
        let d = self.dim;
        if total == 0 {
            self.offsets.iter_mut().for_each(|o| *o = None);
            self.weights.iter_mut().for_each(|w| *w = None);
            self.sinks.iter_mut().for_each(|s| *s = None);
            self.sink_dropped = false;
            self.restage();
        }
        let keep = total.div_ceil(SEGMENT_TOKENS);
        let in_last = total - keep.saturating_sub(1) * SEGMENT_TOKENS;
        let row = self.bytes_per_vector();
        for segs in &mut self.heads {
            segs.truncate(keep);
            match segs.last_mut() {
                Some(Seg::Codes(b)) => b.truncate(in_last),
                Some(Seg::Dense(v)) => v.truncate(in_last * d),
                Some(Seg::Blocks(v)) => v.truncate(in_last * row),
                None => {}
            }
        }
    }

    /// Forgets the first `n` segments of every head.
    fn drop_segments(&mut self, n: usize) {
        self.sink_dropped |= n > 0;
        for segs in &mut self.heads {
            let n = n.min(segs.len());
            segs.drain(..n);
        }
    }

    /// Bytes of the per-head offsets and weights (f32, `dim` each per head that has one)
    /// and sinks (f16).
    fn offset_bytes(&self) -> usize {
        let vectors = self.offsets.iter().flatten().count() + self.weights.iter().flatten().count();
        let sinks = self.sinks.iter().flatten().count();
        (vectors * std::mem::size_of::<f32>() + sinks * 2) * self.dim
    }

    fn bytes_allocated(&self) -> usize {
        self.offset_bytes()
            + self
                .heads
                .iter()
                .flatten()
                .map(|s| match s {
                    Seg::Codes(b) => b.bytes_allocated(),
                    Seg::Dense(v) => v.capacity_bytes(),
                    Seg::Blocks(v) => v.capacity(),
                })
                .sum::<usize>()
    }

    /// The block type of a block side.
    fn block_side(&self) -> Result<&BlockSide> {
        self.block
            .as_ref()
            .ok_or_else(|| EngineError::invalid("block segment without a block type"))
    }

    /// Decodes stored tokens `from..from + out.len() / dim` of head `h` into `out`.
    fn decode(&self, h: usize, from: usize, out: &mut [f32]) -> Result<()> {
        let d = self.dim;
        let mut scratch = self.scratch();
        for (r, row) in out.chunks_exact_mut(d).enumerate() {
            let j = from + r;
            let seg = self.heads[h]
                .get(j / SEGMENT_TOKENS)
                .ok_or_else(|| EngineError::invalid(format!("token {j} is not stored")))?;
            let i = j % SEGMENT_TOKENS;
            match (seg, &self.codec) {
                (Seg::Codes(b), Some(c)) => {
                    c.decode(b, i, row, &mut scratch)?;
                    if let Some(w) = self.weights(h) {
                        row.iter_mut().zip(w).for_each(|(x, w)| *x /= w);
                    }
                    if let Some(m) = self.offset(h) {
                        row.iter_mut().zip(m).for_each(|(x, m)| *x += m);
                    }
                }
                (Seg::Dense(v), _) => {
                    v.read(i * d, row)
                        .ok_or_else(|| EngineError::invalid(format!("token {j} is not stored")))?;
                }
                (Seg::Blocks(v), _) => {
                    let b = self.block_side()?;
                    let src = v
                        .get(i * b.row_bytes..(i + 1) * b.row_bytes)
                        .ok_or_else(|| EngineError::invalid(format!("token {j} is not stored")))?;
                    let sink = if i == 0 {
                        self.sink_row(h, j / SEGMENT_TOKENS)
                    } else {
                        None
                    };
                    match sink {
                        Some(sink) => row.copy_from_slice(&sink),
                        None => b.ty.dequantize_row(src, row)?,
                    }
                    b.rotate(row)?;
                }
                (Seg::Codes(_), None) => {
                    return Err(EngineError::invalid("code segment without a codec"));
                }
            }
        }
        Ok(())
    }

    /// The queries as this side scores them ([`Prepared`]), once per attention call for
    /// every segment: quantized for a block side; rotated for a TurboQuant side, for matrix
    /// products in prefill (at least [`BLOCK_GEMM_MIN_ROWS`] rows, a codec without QJL) and
    /// for its kernels otherwise; `None` for a dense side.
    fn prepare_queries(&self, queries: &[f32]) -> Result<Option<Prepared>> {
        let d = self.dim;
        let g = queries.len() / d;
        if let Some(b) = &self.block {
            let qb = b.ty.query_bytes(d)?;
            let mut qq = vec![0u8; qb * g];
            for (q, out) in queries.chunks_exact(d).zip(qq.chunks_exact_mut(qb)) {
                b.ty.quantize_query(q, out)?;
            }
            return Ok(Some(Prepared::Block(qq)));
        }
        match &self.codec {
            Some(c) if g >= BLOCK_GEMM_MIN_ROWS && c.works_by_products() => {
                let mut rq = vec![0f32; g * d];
                c.rotated_queries(queries, &mut rq)?;
                Ok(Some(Prepared::Rotated(Tensor::from_vec(
                    rq,
                    (g, d),
                    &Device::Cpu,
                )?)))
            }
            Some(c) => Ok(Some(Prepared::Codes(c.prepare_scores(queries)?))),
            None => Ok(None),
        }
    }

    /// `out[qi·n + t] = ⟨q_qi, x̂_t⟩` for the tokens `cols` of the `n` of segment `s` of head
    /// `h`; the other columns are left as they were (the caller masks them). `prepared` is
    /// what [`Side::prepare_queries`] made of `queries`.
    #[allow(clippy::too_many_arguments)]
    fn scores(
        &self,
        h: usize,
        s: usize,
        queries: &[f32],
        prepared: Option<&Prepared>,
        cols: std::ops::Range<usize>,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.dim;
        match (&self.heads[h][s], &self.codec) {
            (Seg::Codes(b), Some(c)) => {
                let n = b.len();
                let (lo, hi) = (cols.start.min(n), cols.end.min(n));
                if let (Some(Prepared::Rotated(rq)), true) = (prepared, hi > lo) {
                    // Prefill: each record decoded once (rotated domain) and scored against
                    // every query row by one matrix product, where the kernels decode a
                    // record once per 8 query rows.
                    let mut keys = vec![0f32; (hi - lo) * d];
                    c.rotated_rows(b, lo..hi, &mut keys)?;
                    let prod = product_t(rq, keys, hi - lo)?;
                    for (qi, p) in prod.chunks_exact(hi - lo).enumerate() {
                        out[qi * n + lo..qi * n + hi].copy_from_slice(p);
                    }
                } else if let Some(Prepared::Codes(p)) = prepared {
                    c.scores_prepared_range(p, b, cols, scratch, out)?;
                } else {
                    c.scores_multi_range(queries, b, cols, scratch, out)?;
                }
            }
            (Seg::Blocks(v), _) => {
                // As ggml's flash attention: the (rotated) query quantized to the keys' dot
                // type, integer dots per block.
                let b = self.block_side()?;
                let n = v.len() / b.row_bytes;
                let g = queries.len() / d;
                let qb = b.ty.query_bytes(d)?;
                // The queries arrive rotated (`attend_codes` rotates them once per call) and
                // quantized (`prepare_queries`, once per call).
                let Some(Prepared::Block(qq)) = prepared else {
                    return Err(EngineError::invalid("block keys without queries"));
                };
                let (lo, hi) = (cols.start.min(n), cols.end.min(n));
                if g >= BLOCK_GEMM_MIN_ROWS && !b.ty.query_is_q8_1() {
                    // Prefill: the same products as one matrix product of the quantized
                    // queries' floats with the keys' (summed in another order). Not for
                    // q4_1/q5_1, whose dots use the query's sum rounded to f16.
                    let mut qf = vec![0f32; g * d];
                    for (q, out) in qq.chunks_exact(qb).zip(qf.chunks_exact_mut(d)) {
                        b.ty.dequantize_query(q, out)?;
                    }
                    let keys = b.dequantize_rows(&v[lo * b.row_bytes..hi * b.row_bytes], d)?;
                    let prod = matmul_t(qf, g, keys, hi - lo, d)?;
                    for (qi, p) in prod.chunks_exact((hi - lo).max(1)).enumerate().take(g) {
                        out[qi * n + lo..qi * n + hi].copy_from_slice(&p[..hi - lo]);
                    }
                } else {
                    let keys = &v[lo * b.row_bytes..hi * b.row_bytes];
                    b.ty.dots(keys, qq, d, &mut out[lo..], n)?;
                }
                // A `+sink` side's first token: its f16 row, scored by the same query.
                if let Some(sink) = self.sink_row(h, s).filter(|_| lo == 0 && hi > 0) {
                    let mut qf = vec![0f32; d];
                    for (qi, q) in qq.chunks_exact(qb).take(g).enumerate() {
                        b.ty.dequantize_query(q, &mut qf)?;
                        out[qi * n] = qf.iter().zip(&sink).map(|(a, b)| a * b).sum();
                    }
                }
            }
            (Seg::Dense(v), _) => {
                // The f16 cache's kernels (a calibrating side's first rows, a dense side).
                let n = v.len() / d;
                let (lo, hi) = (cols.start.min(n), cols.end.min(n));
                if hi <= lo {
                    return Ok(());
                }
                let g = queries.len() / d;
                let sc = match v {
                    DenseRows::F16(x) => dense_scores(queries, &x[lo * d..hi * d], d, g),
                    DenseRows::F32(x) => dense_scores(queries, &x[lo * d..hi * d], d, g),
                    DenseRows::Bf16(_) => dense_scores(queries, &v.floats(lo * d..hi * d)?, d, g),
                };
                for (qi, row) in sc.chunks_exact(hi - lo).enumerate() {
                    out[qi * n + lo..qi * n + hi].copy_from_slice(row);
                }
            }
            (Seg::Codes(_), None) => {
                return Err(EngineError::invalid("code segment without a codec"));
            }
        }
        Ok(())
    }

    /// Whether [`Side::accumulate`] leaves `g` rows of sums in the codec's raw domain
    /// (`Codec::accumulate_raw`: rotated, in its kernels' order), to be added over the
    /// segments and taken back once by [`Side::finish_raw`]: TurboQuant codes without QJL
    /// summed by the kernels (fewer than [`BLOCK_GEMM_MIN_ROWS`] rows).
    fn sums_raw(&self, g: usize) -> bool {
        g < BLOCK_GEMM_MIN_ROWS && self.codec.as_ref().is_some_and(|c| c.works_by_products())
    }

    /// Sums of [`Side::accumulate`] left in the raw domain ([`Side::sums_raw`]), added up
    /// over the segments, as the values' rotated-back sums.
    fn finish_raw(&self, out: &mut [f32]) -> Result<()> {
        if let Some(c) = &self.codec {
            let raw = out.to_vec();
            c.finish_sums(&raw, out)?;
        }
        Ok(())
    }

    /// Whether [`Side::accumulate`] reads only the rows of the range it is given, in decode: a
    /// segment of dense rows, ggml blocks or TurboQuant codes without QJL (whose sums stay
    /// raw, [`Side::sums_raw`]) can be cut into key ranges summed apart; codes with QJL are
    /// summed whole.
    fn sums_by_range(&self) -> bool {
        self.codec.as_ref().is_none_or(|c| c.works_by_products())
    }

    /// `out[qi] = Σ_t w[qi·n + t] · x̂_t` over segment `s` of head `h` (`out` is `g × dim`),
    /// `t` in `rows` (a side that [`Side::sums_by_range`]; other sides sum the whole segment,
    /// their weights zero outside `rows`); in the codec's raw domain where
    /// [`Side::sums_raw`].
    fn accumulate(
        &self,
        h: usize,
        s: usize,
        rows: std::ops::Range<usize>,
        weights: &[f32],
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.dim;
        match (&self.heads[h][s], &self.codec) {
            (Seg::Codes(b), Some(c)) => {
                let n = b.len();
                let g = out.len() / d;
                if self.sums_raw(g) {
                    // Left rotated: the caller adds the segments' sums and rotates them
                    // back once (`finish_raw`). Only the rows of `rows` are read.
                    out.fill(0.0);
                    let lo = rows.start.min(n);
                    let records = lo..rows.end.clamp(lo, n);
                    return Ok(c.accumulate_raw(weights, b, records, scratch, out)?);
                }
                if g < BLOCK_GEMM_MIN_ROWS || !c.works_by_products() {
                    return Ok(c.accumulate_multi(weights, b, scratch, out)?);
                }
                // Prefill: the weighed records decoded once (rotated domain), summed for
                // every row by one matrix product, then rotated back, where the kernels
                // decode a record once per 8 rows.
                let Some((span, w)) = weighed_span(weights, n, g, rows) else {
                    out.fill(0.0);
                    return Ok(());
                };
                let m = span.len();
                let mut held = vec![0f32; m * d];
                c.rotated_rows(b, span, &mut held)?;
                let sums = matmul(w, g, held, m, d)?;
                c.unrotated_sums(&sums, out)?;
            }
            (Seg::Blocks(v), _) => {
                // Value rows converted to floats and summed, as ggml does; the sums stay in
                // the rotated domain (`attend_block` rotates the total back once). Only the
                // rows of `rows` some query weighs are read: a sliding window's dropped
                // front, a causal block's future and other units' keys never are.
                let b = self.block_side()?;
                let n = v.len() / b.row_bytes;
                let g = out.len() / d;
                let Some((span, w)) = weighed_span(weights, n, g, rows) else {
                    out.fill(0.0);
                    return Ok(());
                };
                let held = &v[span.start * b.row_bytes..span.end * b.row_bytes];
                let m = span.len();
                // A `+sink` side's first token: its f16 row in place of its blocks', added
                // as the difference once the blocks are summed.
                let sink = self.sink_row(h, s).filter(|_| span.start == 0);
                let w0: Vec<f32> = match sink {
                    Some(_) => w.chunks_exact(m).map(|r| r[0]).collect(),
                    None => Vec::new(),
                };
                if g < BLOCK_GEMM_MIN_ROWS {
                    // Decode: each row dequantized once and fused-added into the few
                    // outputs (the codec's SIMD kernels), never a whole dequantized copy.
                    out.fill(0.0);
                    b.ty.accumulate_rows(held, d, &w, out)?;
                } else {
                    // Prefill: one matrix product.
                    let values = b.dequantize_rows(held, d)?;
                    out.copy_from_slice(&matmul(w, g, values, m, d)?);
                }
                if let Some(sink) = sink {
                    let mut first = vec![0f32; d];
                    b.ty.dequantize_row(&held[..b.row_bytes], &mut first)?;
                    for (o, &w0) in out.chunks_exact_mut(d).zip(&w0) {
                        if w0 != 0.0 {
                            for ((o, s), f) in o.iter_mut().zip(&sink).zip(&first) {
                                *o += w0 * (s - f);
                            }
                        }
                    }
                }
            }
            (Seg::Dense(v), _) => {
                let g = out.len() / d;
                let Some((span, w)) = weighed_span(weights, v.len() / d, g, rows) else {
                    out.fill(0.0);
                    return Ok(());
                };
                let at = span.start * d..span.end * d;
                match v {
                    DenseRows::F16(x) => dense_weighted(&x[at], d, &w, g, out),
                    DenseRows::F32(x) => dense_weighted(&x[at], d, &w, g, out),
                    DenseRows::Bf16(_) => dense_weighted(&v.floats(at)?, d, &w, g, out),
                }
            }
            (Seg::Codes(_), None) => {
                return Err(EngineError::invalid("code segment without a codec"));
            }
        }
        Ok(())
    }
}

/// `g × rows` scores of the `g` queries against dense rows `x` (rows of `d`), by the f16
/// cache's kernels.
fn dense_scores<T: attention::Elem>(queries: &[f32], x: &[T], d: usize, g: usize) -> Vec<f32> {
    let keys: Vec<&[T]> = x.chunks_exact(d).collect();
    let mut sc = vec![0f32; g * keys.len()];
    let none: &[&[f32]] = &[];
    attention::scores(queries, &keys, none, g, 1.0, &mut sc);
    sc
}

/// `out[qi] = Σ_t w[qi·rows + t] · x_t` over dense rows `x` (rows of `d`), by the f16 cache's
/// kernels.
fn dense_weighted<T: attention::Elem>(x: &[T], d: usize, w: &[f32], g: usize, out: &mut [f32]) {
    let vals: Vec<&[T]> = x.chunks_exact(d).collect();
    attention::weighted(w, &vals, g, out);
}

/// Fewest rows for a head's channel weights: below, the head's codes stay unweighted.
const MIN_WEIGHT_ROWS: usize = MIN_CALIBRATION_ROWS;

/// Bounds on a channel's weight relative to the others: a channel no query has read yet, or
/// on which no key varies, must not take a weight that overflows the stored norm.
const WEIGHT_RATIO_BOUND: f64 = 1e4;

/// The weights of `+qw` (module doc of `kv::spec`): w_j = (E q_j² / E x_j²)^¼ over the rows
/// `x` about to be coded (already centered), scaled so their geometric mean is one. Ones when
/// no query has been seen or there are too few rows to measure the keys' spread.
fn channel_weights(query_energy: &[f64], rows: &[f32], d: usize) -> Vec<f32> {
    let n = rows.len() / d;
    let q_total: f64 = query_energy.iter().sum();
    if n < MIN_WEIGHT_ROWS || !q_total.is_finite() || q_total <= 0.0 {
        return vec![1.0; d];
    }
    let mut spread = vec![0f64; d];
    for r in rows.chunks_exact(d) {
        spread
            .iter_mut()
            .zip(r)
            .for_each(|(a, &x)| *a += (x as f64) * (x as f64));
    }
    let k_total: f64 = spread.iter().sum();
    if !k_total.is_finite() || k_total <= 0.0 {
        return vec![1.0; d];
    }
    let floor = 1.0 / (d as f64 * WEIGHT_RATIO_BOUND);
    let logs: Vec<f64> = query_energy
        .iter()
        .zip(&spread)
        .map(|(&q, &k)| {
            let (q, k) = ((q / q_total).max(floor), (k / k_total).max(floor));
            0.25 * (q / k).ln()
        })
        .collect();
    let mean = logs.iter().sum::<f64>() / d as f64;
    logs.iter().map(|l| (l - mean).exp() as f32).collect()
}

/// The mean of `n × d` row-major rows.
fn mean_row(rows: &[f32], d: usize) -> Vec<f32> {
    let n = rows.len() / d;
    let mut m = vec![0f64; d];
    for r in rows.chunks_exact(d) {
        m.iter_mut().zip(r).for_each(|(a, &x)| *a += x as f64);
    }
    m.iter().map(|a| (*a / n.max(1) as f64) as f32).collect()
}

/// A layer's keys and values as TurboQuant codes (see the module doc).
#[derive(Debug)]
pub struct TurboQuantStorage {
    precision: TqPrecision,
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

impl TurboQuantStorage {
    /// An empty storage; builds the codecs (and validates the specs for `shape.head_dim`).
    /// A home set apart must be the CPU: attention over codes exists only there.
    pub fn new(precision: TqPrecision, shape: StorageShape) -> Result<Self> {
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
        let key_end = spec.key_start + live;
        let lo = match spec.window {
            Some(w) => spec.key_start.max((qp + 1).saturating_sub(w)),
            None => spec.key_start,
        };
        let hi = key_end.min(qp + 1);
        if hi <= lo {
            return Err(EngineError::invalid(format!(
                "attend: query {qp} sees no stored key (keys {}..{key_end})",
                spec.key_start
            )));
        }
        let at = |p: usize| p - spec.key_start + self.front;
        Ok((at(lo), at(hi)))
    }

    /// The compressed-domain attention (see the module doc): `q` from any device, output on
    /// `q`'s device in `q`'s dtype. Computed at home (the CPU); crosses when `q` is elsewhere
    /// or the home is set apart.
    fn attend_codes(&self, q: &Tensor, spec: &AttendSpec) -> Result<Tensor> {
        let (nh, t, d) = q.dims3()?;
        let nkv = self.shape.n_kv_heads;
        if d != self.shape.head_dim || nkv == 0 || nh % nkv != 0 {
            return Err(EngineError::invalid(format!(
                "attend: q {:?} does not fit a cache of {nkv} kv heads × {}",
                q.dims(),
                self.shape.head_dim
            )));
        }
        if t == 0 {
            return Ok(q.clone());
        }
        if self.total == self.front {
            return Err(EngineError::invalid("attend on an empty cache"));
        }
        let group = nh / nkv;
        let qv = self.host_rows(q)?;
        let scale = spec.scale as f32;
        let live = self.total - self.front;
        // Prefill by rows holds no score matrix across segments: all positions at once.
        let by_rows = self.reads_as_rows(group * t);
        let rows_per_block = if by_rows {
            t
        } else {
            (SCORE_BUDGET / (group * live)).clamp(1, t)
        };
        let mut out = vec![0f32; nh * t * d];
        for hk in 0..nkv {
            // Weighted keys: score q ⊘ w against the codes of w ⊙ (k − μ).
            let q_scale: Vec<f32> = match self.key.weights(hk) {
                Some(w) => w.iter().map(|w| scale / w).collect(),
                None => vec![scale; d],
            };
            let mut a = 0;
            while a < t {
                let b = (a + rows_per_block).min(t);
                let ranges = (a..b)
                    .map(|i| self.visible(spec.query_start + i, spec))
                    .collect::<Result<Vec<_>>>()?;
                // The group's query heads, row-major (row, head), scale folded in.
                let g = (b - a) * group;
                let mut qm = vec![0f32; g * d];
                for (ri, i) in (a..b).enumerate() {
                    for gg in 0..group {
                        let src = &qv[((hk * group + gg) * t + i) * d..][..d];
                        let dst = &mut qm[(ri * group + gg) * d..][..d];
                        for ((o, &x), &s) in dst.iter_mut().zip(src).zip(&q_scale) {
                            *o = x * s;
                        }
                    }
                }
                let res = if by_rows {
                    // Rotates the queries for block keys itself, pass by pass on all cores.
                    self.attend_rows(hk, &qm, group, &ranges)?
                } else {
                    // Block keys are stored rotated: rotate the queries once, here.
                    if let Some(b) = &self.key.block {
                        for row in qm.chunks_exact_mut(d) {
                            b.rotate(row)?;
                        }
                    }
                    self.attend_block(hk, &qm, group, &ranges)?
                };
                for (ri, i) in (a..b).enumerate() {
                    for gg in 0..group {
                        let dst = &mut out[((hk * group + gg) * t + i) * d..][..d];
                        dst.copy_from_slice(&res[(ri * group + gg) * d..][..d]);
                    }
                }
                a = b;
            }
        }
        let floats = out.len();
        let o = Tensor::from_vec(out, (nh, t, d), &Device::Cpu)?;
        if self.apart || !q.device().is_cpu() {
            // The query rows came in (host_rows above) and the output goes back.
            Counters::add(&self.counters.crossings, 1);
            Counters::add(&self.counters.crossed_floats, qv.len() + floats);
            // Cast on the host first: the copy back then moves the query's dtype, not f32.
            return Ok(o.to_dtype(q.dtype())?.to_device(q.device())?);
        }
        Ok(o.to_dtype(q.dtype())?)
    }

    /// One kv head, one block of query rows (`ranges[r]` = visible stored tokens of row r,
    /// `qm` = `rows × group` scaled queries) → `rows × group × d` outputs.
    fn attend_block(
        &self,
        hk: usize,
        qm: &[f32],
        group: usize,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let d = self.shape.head_dim;
        let g = ranges.len() * group;
        let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        // Units of work: each segment's keys that some row sees, cut into key ranges of
        // RANGE_KEYS in decode where both sides read ranges alone (dense rows, ggml blocks,
        // TurboQuant codes without QJL), so a sliding window or a short context still runs
        // on every core as the f16 path does. TurboQuant codes are cut only where the call
        // has fewer than RANGED_CODE_SEGMENTS segments: their kernels' per-call set-up
        // (lookup tables, query tiles) is paid per unit. Prefill's matrix products go by
        // whole segments.
        let spans: Vec<_> = self.segment_spans(hk, lo, hi).collect();
        let codes = self.key.codec.is_some() || self.value.codec.is_some();
        let by_range = g < BLOCK_GEMM_MIN_ROWS
            && self.key.sums_by_range()
            && self.value.sums_by_range()
            && (!codes || spans.len() < RANGED_CODE_SEGMENTS);
        let mut units: Vec<(usize, usize, usize)> = Vec::new();
        for (s, a, b) in spans {
            if by_range {
                let mut at = a;
                while at < b {
                    let to = (at + RANGE_KEYS).min(b);
                    units.push((s, at, to));
                    at = to;
                }
            } else {
                units.push((s, a, b));
            }
        }
        let parallel = g * (hi - lo) >= PARALLEL_MIN_PAIRS && units.len() > 1;

        // One pass per unit, all units in parallel: masked scores, their softmax numerators
        // against the unit's own maximum, and the values weighted by them. The partial sums
        // are then rescaled to the overall maximum and added, as flash attention does: one
        // dispatch to the compute pool per call.
        let prepared = self.key.prepare_queries(qm)?;
        let seg_pass = |scratch: &mut (Scratch, Scratch),
                        &(s, ua, ub): &(usize, usize, usize)|
         -> Result<Partial> {
            let n = self.key.seg_len(&self.key.heads[hk][s]);
            // Row r sees the unit's tokens `cols(r)`; only their union is scored (a sliding
            // window's dropped front and a causal block's future are never read).
            let cols = |r: (usize, usize)| seen_rows(r, s * SEGMENT_TOKENS, ua, ub);
            let lo = ranges.iter().map(|&r| cols(r).0).min().unwrap_or(ua);
            let hi = ranges.iter().map(|&r| cols(r).1).max().unwrap_or(ua);
            let mut w = vec![0f32; g * n];
            self.key.scores(
                hk,
                s,
                qm,
                prepared.as_ref(),
                lo..hi.max(lo),
                &mut scratch.0,
                &mut w,
            )?;
            let mut max = vec![f32::NEG_INFINITY; g];
            let mut sum = vec![0f32; g];
            for (qi, row) in w.chunks_exact_mut(n.max(1)).enumerate().take(g) {
                let (from, to) = cols(ranges[qi / group]);
                if from == to {
                    // No token of this segment is visible to the row: it weighs none.
                    row.fill(0.0);
                    continue;
                }
                // Masked records weigh exactly 0 (the value sums skip records no row weighs);
                // the exponentials are taken over the visible ones only.
                row[..from].fill(0.0);
                row[to..].fill(0.0);
                let seen = &mut row[from..to];
                let m = seen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                // Unscaled numerators e^(x − m); each output row is divided by its total once.
                sum[qi] = exp_shifted_sum(seen, m);
                max[qi] = m;
            }
            let mut out = vec![0f32; g * d];
            self.value
                .accumulate(hk, s, ua..ub, &w, &mut scratch.1, &mut out)?;
            Ok(Partial { max, sum, out })
        };
        let scratch = || (self.key.scratch(), self.value.scratch());
        let partials: Vec<Partial> = if parallel {
            super::pool::map_on_compute_pool(&units, scratch, seg_pass)
                .into_iter()
                .collect::<Result<_>>()?
        } else {
            let mut sc = scratch();
            units
                .iter()
                .map(|u| seg_pass(&mut sc, u))
                .collect::<Result<_>>()?
        };
        let mut out = vec![0f32; g * d];
        merge(&partials, d, &mut out);
        // TurboQuant values were summed in their raw domain: the total rotated back once.
        if self.value.sums_raw(g) {
            self.value.finish_raw(&mut out)?;
        }
        self.finish_values(hk, &mut out)?;
        Ok(out)
    }

    /// Attention outputs of head `hk` (rows of `d`) from the values' stored domain to the
    /// model's.
    fn finish_values(&self, hk: usize, out: &mut [f32]) -> Result<()> {
        let d = self.shape.head_dim;
        // Block values were summed in their rotated domain: rotate the total back.
        if let Some(b) = &self.value.block {
            for row in out.chunks_exact_mut(d) {
                b.rotate(row)?;
            }
        }
        // Values were coded relative to an offset: every row's weights sum to one, so the
        // offset comes back whole. (A key offset needs nothing: it shifts all of a query's
        // scores by the same q·μ, which the softmax ignores.)
        if let Some(m) = self.value.offset(hk) {
            for row in out.chunks_exact_mut(d) {
                row.iter_mut().zip(m).for_each(|(x, m)| *x += m);
            }
        }
        Ok(())
    }

    /// The segments of head `hk` that stored tokens `lo..hi` reach, each as `(segment, a,
    /// b)`: its rows `a..b` among them (`a == b` where it holds none).
    fn segment_spans(
        &self,
        hk: usize,
        lo: usize,
        hi: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (lo / SEGMENT_TOKENS..hi.div_ceil(SEGMENT_TOKENS)).map(move |s| {
            let n = self.key.seg_len(&self.key.heads[hk][s]);
            let base = s * SEGMENT_TOKENS;
            let a = lo.saturating_sub(base).min(n);
            (s, a, hi.saturating_sub(base).min(n).max(a))
        })
    }

    /// Decodes held tokens `from..from + len` of every head into `[n_kv, len, d]` f32.
    fn decode_range(&self, side: &Side, from: usize, len: usize) -> Result<Vec<f32>> {
        let (h, d) = (self.shape.n_kv_heads, self.shape.head_dim);
        let mut out = vec![0f32; h * len * d];
        if len == 0 {
            return Ok(out);
        }
        // Rows are independent: decode them on all cores in runs of 256.
        out.par_chunks_mut(256 * d)
            .enumerate()
            .try_for_each(|(c, rows)| {
                let first = c * 256;
                let mut r = 0;
                while r < rows.len() / d {
                    let flat = first + r;
                    let (head, tok) = (flat / len, flat % len);
                    let n = (len - tok).min(rows.len() / d - r);
                    side.decode(head, self.front + from + tok, &mut rows[r * d..(r + n) * d])?;
                    r += n;
                }
                Ok::<(), EngineError>(())
            })?;
        Ok(out)
    }
}

/// The rows of `a..b`, in a segment whose first token is stored token `base`, that a query
/// seeing stored tokens `rlo..rhi` sees (an empty range where it sees none of them).
fn seen_rows((rlo, rhi): (usize, usize), base: usize, a: usize, b: usize) -> (usize, usize) {
    let from = rlo.saturating_sub(base).clamp(a, b);
    (from, rhi.saturating_sub(base).clamp(a, b).max(from))
}

/// Segment kinds in a saved side.
const SEG_CODES: u8 = 0;
const SEG_DENSE: u8 = 1;
const SEG_BLOCKS: u8 = 2;

impl Side {
    /// Per head: the offset (flag, then `dim` f32), for a `+qw` side the weights (the same),
    /// then its segments (kind, byte length, bytes: a `CodeBlock`'s records, or f16 rows).
    fn write_state(&self, w: &mut WireWriter) {
        w.len(self.heads.len());
        for (h, segs) in self.heads.iter().enumerate() {
            // Weights only for `+qw` sides, so other files read as before `+qw` existed.
            let weighted = if self.weigh {
                Some(&self.weights[h])
            } else {
                None
            };
            for v in std::iter::once(&self.offsets[h]).chain(weighted) {
                match v {
                    Some(o) => {
                        w.u8(1);
                        w.f32s(o);
                    }
                    None => w.u8(0),
                }
            }
            // Sinks only for `+sink` sides: 0 none, 1 held, 2 kept past a dropped segment.
            if self.sink {
                match &self.sinks[h] {
                    Some(row) => {
                        w.u8(if self.sink_dropped { 2 } else { 1 });
                        w.u16s(row.iter().map(|x| x.to_bits()));
                    }
                    None => w.u8(0),
                }
            }
            w.len(segs.len());
            for seg in segs {
                match seg {
                    Seg::Codes(b) => {
                        let bytes = b.to_bytes();
                        w.u8(SEG_CODES);
                        w.len(bytes.len());
                        w.bytes(&bytes);
                    }
                    Seg::Dense(v) => {
                        let bytes = v.to_bytes();
                        w.u8(SEG_DENSE);
                        w.len(bytes.len());
                        w.bytes(&bytes);
                    }
                    Seg::Blocks(v) => {
                        w.u8(SEG_BLOCKS);
                        w.len(v.len());
                        w.bytes(v);
                    }
                }
            }
        }
    }

    /// Reads what [`Side::write_state`] wrote into this empty side; every head must then
    /// hold `total` tokens in full segments but the last.
    fn read_state(&mut self, r: &mut WireReader, total: usize) -> Result<()> {
        let heads = r.len(self.heads.len(), "the kv head count")?;
        if heads != self.heads.len() {
            return Err(corrupt(format!(
                "{heads} kv heads saved, the layer has {}",
                self.heads.len()
            )));
        }
        let d = self.dim;
        for h in 0..heads {
            self.offsets[h] = match r.u8()? {
                0 => None,
                1 if self.center => Some(r.f32s(d)?),
                flag => return Err(corrupt(format!("offset flag {flag}"))),
            };
            let flag = if self.weigh { r.u8()? } else { 0 };
            self.weights[h] = match flag {
                0 => None,
                1 => {
                    let w = r.f32s(d)?;
                    if w.iter().any(|x| !x.is_finite() || *x <= 0.0) {
                        return Err(corrupt("a channel weight is not a positive number"));
                    }
                    Some(w)
                }
                flag => return Err(corrupt(format!("weights flag {flag}"))),
            };
            let flag = if self.sink { r.u8()? } else { 0 };
            self.sinks[h] = match flag {
                0 => None,
                1 | 2 if total > 0 => {
                    if h > 0 && self.sink_dropped != (flag == 2) {
                        return Err(corrupt("kv heads saved with their sinks both held and not"));
                    }
                    self.sink_dropped = flag == 2;
                    Some(r.u16s(d)?.into_iter().map(f16::from_bits).collect())
                }
                flag => return Err(corrupt(format!("sink flag {flag} with {total} tokens"))),
            };
            if self.sink && total > 0 && self.sinks[h].is_none() {
                return Err(corrupt("a `+sink` layer saved without its first token"));
            }
            // A calibrating side saved before it calibrated has neither, and f16 rows.
            if self.center || self.weigh {
                let calibrated = self.offsets[h].is_some() || self.weights[h].is_some();
                if h == 0 && calibrated {
                    self.codec = self.waiting.take();
                } else if calibrated != self.waiting.is_none() {
                    return Err(corrupt("kv heads saved both calibrated and not"));
                }
            }
            let n = r.len(total.div_ceil(SEGMENT_TOKENS), "a head's segment count")?;
            let mut segs = Vec::with_capacity(n);
            for _ in 0..n {
                let kind = r.u8()?;
                let len = r.len(r.remaining(), "a segment's size")?;
                let bytes = r.take(len)?;
                let row = self.bytes_per_vector();
                let seg = match (kind, &self.codec) {
                    (SEG_CODES, Some(codec)) => Seg::Codes(CodeBlock::from_bytes(codec, bytes)?),
                    (SEG_BLOCKS, None) if self.block.is_some() && len % row == 0 => {
                        Seg::Blocks(bytes.to_vec())
                    }
                    (SEG_DENSE, None) if self.block.is_none() && len % row == 0 => {
                        Seg::Dense(DenseRows::from_bytes(self.dense, bytes))
                    }
                    _ => {
                        return Err(corrupt(format!(
                            "segment kind {kind} of {len} bytes does not fit this side"
                        )))
                    }
                };
                segs.push(seg);
            }
            let lens: Vec<usize> = segs.iter().map(|s| self.seg_len(s)).collect();
            let held: usize = lens.iter().sum();
            let full_but_last = lens.iter().rev().skip(1).all(|&l| l == SEGMENT_TOKENS);
            if held != total || !full_but_last || lens.last().is_some_and(|&l| l == 0) {
                return Err(corrupt(format!(
                    "head {h} holds {held} tokens in segments {lens:?}, the layer {total}"
                )));
            }
            self.heads[h] = segs;
        }
        Ok(())
    }
}

impl TurboQuantStorage {
    /// `[total][front]`, then keys, then values.
    pub(super) fn write_held(&self, w: &mut WireWriter) -> Result<()> {
        w.len(self.total);
        w.len(self.front);
        self.key.write_state(w);
        self.value.write_state(w);
        Ok(())
    }

    /// Reads what [`TurboQuantStorage::write_state`] wrote into this empty storage.
    pub(super) fn read_held(&mut self, r: &mut WireReader) -> Result<()> {
        if self.total != 0 {
            return Err(EngineError::invalid(
                "restore into a cache that holds tokens",
            ));
        }
        // Every stored token takes at least one byte per head and side.
        let total = r.len(r.remaining(), "a layer's stored tokens")?;
        let front = r.len(total.min(SEGMENT_TOKENS - 1), "a layer's dropped front")?;
        self.key.read_state(r, total)?;
        self.value.read_state(r, total)?;
        self.total = total;
        self.front = front;
        Ok(())
    }
}

impl KvStorage for TurboQuantStorage {
    fn precision(&self) -> KvPrecision {
        KvPrecision::TurboQuant(self.precision)
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
        self.key.waiting.is_some() || self.value.waiting.is_some()
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

#[path = "turboquant_rows.rs"]
mod rows;

#[cfg(test)]
#[path = "turboquant_tests.rs"]
mod tests;
