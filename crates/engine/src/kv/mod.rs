//! The KV cache of a whole model. Two independent axes: the *layout* of each layer (full,
//! sliding window, or shared from a producer layer) and the *precision* of each cache-owning
//! layer's [`KvStorage`]. Memory is reported exactly, per layer and per attention kind.

mod attend;
mod attend_cpu;
mod dense;
mod format;
pub mod persist;
mod pool;
pub mod spec;
mod split;
mod split_softmax;
mod storage;
mod switch;
pub mod wire;

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

pub use dense::{allocated_tokens, DenseStorage};
pub use format::{
    calibration_rows, KvPrecision, LayerPrecision, SideFormat, SideSpec, MIN_CALIBRATION_ROWS,
};
pub use spec::presets::{
    cache_options, presets, suggested_policy, CacheChoice, CacheOptions, CachePreset,
    CacheSelection, FormatOption, LabeledSpec, PresetFidelity, ScopedSpecs,
};
pub use spec::{parse_policy, CacheSpec, LayerScope};
pub use split::{SplitStorage, SEGMENT_TOKENS};
pub use storage::{AttendSpec, KvStorage, StorageShape, StorageTraffic};
pub use switch::ConvertPlan;

/// Tokens converted per piece when a layer changes precision (bounds the f32 staging copy).
pub const CONVERT_CHUNK: usize = 4096;

use crate::checkpoint::config::{KvSource, ModelConfig};
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};

/// How a layer's cache relates to token positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvLayout {
    /// Every token since the start is kept.
    Full,
    /// Exactly `window` keys are visible to a query (itself included); between calls the
    /// last `window − 1` tokens are kept.
    Sliding {
        /// The window W.
        window: usize,
    },
    /// The layer stores nothing and reads layer `producer`'s cache.
    Shared {
        /// The producing layer.
        producer: usize,
    },
}

/// Which precision each cache-owning layer gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrecisionPolicy {
    /// Precision of sliding-window layers.
    pub sliding: KvPrecision,
    /// Precision of full-attention layers.
    pub full: KvPrecision,
    /// Per-layer exceptions.
    #[serde(default)]
    pub overrides: BTreeMap<usize, KvPrecision>,
}

impl Default for PrecisionPolicy {
    /// FP16 everywhere: what llama.cpp stores by default, and the engine's cache unless a
    /// caller picks another.
    fn default() -> Self {
        Self::uniform(KvPrecision::F16)
    }
}

impl PrecisionPolicy {
    /// The same precision everywhere.
    pub fn uniform(p: KvPrecision) -> Self {
        Self {
            sliding: p,
            full: p,
            overrides: BTreeMap::new(),
        }
    }

    /// Whether every layer is stored in dense floats (f32, f16, bf16): rows come back as
    /// they went in, never decoded from codes.
    pub fn is_dense(&self) -> bool {
        self.sliding.is_dense()
            && self.full.is_dense()
            && self.overrides.values().all(|p| p.is_dense())
    }

    /// The precision of `layer` of attention `kind`.
    pub fn for_layer(&self, layer: usize, kind: AttentionKind) -> KvPrecision {
        self.overrides.get(&layer).copied().unwrap_or(match kind {
            AttentionKind::Sliding => self.sliding,
            AttentionKind::Full => self.full,
        })
    }
}

/// Creates an empty storage of `precision`. New precisions (TurboQuant) add an arm here.
pub fn new_storage(precision: KvPrecision, shape: StorageShape) -> Result<Box<dyn KvStorage>> {
    match precision {
        KvPrecision::F32 | KvPrecision::F16 | KvPrecision::BF16 => {
            Ok(Box::new(DenseStorage::new(precision, shape)))
        }
        KvPrecision::Split(p) => Ok(Box::new(SplitStorage::new(p, shape)?)),
    }
}

/// A cache-owning layer: its storage and the position of its oldest held token.
#[derive(Debug)]
struct OwnedCache {
    storage: Box<dyn KvStorage>,
    /// Absolute position of the storage's first token.
    key_start: usize,
    shape: StorageShape,
    /// Σ q_j² per kv head and channel over the first [`QUERY_ENERGY_ROWS`] query rows, for
    /// storages that weigh keys by it (`+qw`), now or after a switch.
    query_energy: QueryEnergy,
}

/// Query rows measured per layer: enough for stable channel energies (on Gemma 3 270M two
/// 512-row chunks of Alice give weights within a few percent of each other), and after
/// them a decode step costs nothing.
const QUERY_ENERGY_ROWS: usize = 512;

/// Per-channel query energy of one layer.
#[derive(Debug, Clone, Default)]
struct QueryEnergy {
    /// `n_kv_heads × head_dim` sums.
    sums: Vec<f64>,
    /// Query rows (positions) summed.
    rows: usize,
}

#[derive(Debug)]
struct LayerSlot {
    kind: AttentionKind,
    layout: KvLayout,
    owned: Option<OwnedCache>,
}

/// Bytes held by one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerKvBytes {
    /// Layer index.
    pub layer: usize,
    /// Sliding or full.
    pub kind: AttentionKind,
    /// The layout.
    pub layout: KvLayout,
    /// Storage precision (`None` for shared layers, which store nothing).
    pub precision: Option<KvPrecision>,
    /// Tokens held.
    pub tokens: usize,
    /// Bytes holding live tokens.
    pub bytes_used: usize,
    /// Bytes reserved.
    pub bytes_allocated: usize,
}

/// Bytes of the whole cache, per layer and summed per attention kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvMemoryReport {
    /// One entry per layer.
    pub layers: Vec<LayerKvBytes>,
    /// (used, allocated) over sliding layers.
    pub sliding: (usize, usize),
    /// (used, allocated) over full layers.
    pub full: (usize, usize),
    /// (used, allocated) over all layers.
    pub total: (usize, usize),
    /// Some layer still holds its first tokens as f16, waiting to calibrate
    /// ([`KvCache::calibrating`]).
    #[serde(default)]
    pub calibrating: bool,
}

/// All layers' caches plus the number of tokens processed so far.
#[derive(Debug)]
pub struct KvCache {
    slots: Vec<LayerSlot>,
    seq_len: usize,
    /// Extra tokens sliding layers keep beyond `W − 1`, so [`KvCache::rewind`] can go back
    /// that far (0 by default: a sliding layer holds exactly what later queries can see).
    rewind_margin: usize,
}

impl KvCache {
    /// Empty caches for every layer of `config`, each owning layer in the precision the
    /// policy gives it, on `device`.
    pub fn new(config: &ModelConfig, policy: &PrecisionPolicy, device: &Device) -> Result<Self> {
        Self::with_home(config, policy, device, None)
    }

    /// As [`KvCache::new`], with every storage's home set to `home` (see
    /// [`StorageShape::home`]): `Some(Device::Cpu)` on a CPU model makes TurboQuant layers
    /// cross devices on every attention call exactly as they do on a Metal model, so the
    /// crossing can be tested without a GPU. `None` is what `new` does.
    pub fn with_home(
        config: &ModelConfig,
        policy: &PrecisionPolicy,
        device: &Device,
        home: Option<Device>,
    ) -> Result<Self> {
        let mut slots = Vec::with_capacity(config.layers.len());
        for l in &config.layers {
            let layout = match (l.kv_source, l.sliding_window) {
                (KvSource::Shared { producer }, _) => KvLayout::Shared { producer },
                (KvSource::Own, Some(window)) => KvLayout::Sliding { window },
                (KvSource::Own, None) => KvLayout::Full,
            };
            let owned = match layout {
                KvLayout::Shared { .. } => None,
                _ => {
                    let shape = StorageShape {
                        home: home.clone(),
                        calibration_rows: calibration_rows(config.max_position_embeddings),
                        ..StorageShape::new(l.n_kv_heads, l.head_dim, device.clone())
                    };
                    Some(OwnedCache {
                        storage: new_storage(policy.for_layer(l.index, l.kind), shape.clone())?,
                        key_start: 0,
                        shape,
                        query_energy: QueryEnergy::default(),
                    })
                }
            };
            slots.push(LayerSlot {
                kind: l.kind,
                layout,
                owned,
            });
        }
        Ok(Self {
            slots,
            seq_len: 0,
            rewind_margin: 0,
        })
    }

    /// Lets sliding layers keep `margin` tokens more than their window needs, so the cache
    /// can be rewound up to `margin` tokens (e.g. to regenerate an answer). Costs
    /// `margin` tokens of memory per sliding layer; takes effect from the next step.
    pub fn set_rewind_margin(&mut self, margin: usize) {
        self.rewind_margin = margin;
    }

    /// Lets an empty cache's TurboQuant layers calibrate on their first `rows` tokens
    /// ([`StorageShape::calibration_rows`], at most the model's): a comparison over a text
    /// shorter than the model's calibration rows codes it as a switch would, where a new
    /// conversation would hold it all as f16. Fails on a cache that holds tokens.
    pub fn set_calibration_rows(&mut self, rows: usize) -> Result<()> {
        if self.seq_len > 0 {
            return Err(EngineError::invalid(
                "calibration rows are set before the first token",
            ));
        }
        for o in self.slots.iter_mut().filter_map(|s| s.owned.as_mut()) {
            o.shape.calibration_rows = o.shape.calibration_rows.min(rows);
            o.storage = new_storage(o.storage.precision(), o.shape.clone())?;
        }
        Ok(())
    }

    /// Tokens sliding layers keep beyond their window ([`KvCache::set_rewind_margin`]).
    pub fn rewind_margin(&self) -> usize {
        self.rewind_margin
    }

    /// Tokens processed so far (the position of the next token).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.slots.len()
    }

    /// The layout of `layer`.
    pub fn layout(&self, layer: usize) -> Option<KvLayout> {
        self.slots.get(layer).map(|s| s.layout)
    }

    /// The storage of a cache-owning layer (`None` for shared layers).
    pub fn storage(&self, layer: usize) -> Option<&dyn KvStorage> {
        self.slots
            .get(layer)
            .and_then(|s| s.owned.as_ref())
            .map(|o| o.storage.as_ref())
    }

    fn owned_mut(&mut self, layer: usize) -> Result<&mut OwnedCache> {
        self.slots
            .get_mut(layer)
            .and_then(|s| s.owned.as_mut())
            .ok_or_else(|| EngineError::invalid(format!("layer {layer} owns no cache")))
    }

    /// Measures the per-channel energy of this step's queries `[t, n_heads, head_dim]` of a
    /// cache-owning layer (its first [`QUERY_ENERGY_ROWS`] rows) and hands it to a storage
    /// that weighs its keys by it. Call before the step's append.
    pub(crate) fn observe_queries(&mut self, layer: usize, q: &Tensor) -> Result<()> {
        let o = self.owned_mut(layer)?;
        let wants = o.storage.wants_query_energy();
        if o.query_energy.rows < QUERY_ENERGY_ROWS {
            let (t, nh, d) = q.dims3()?;
            let nkv = o.shape.n_kv_heads;
            if d != o.shape.head_dim || nkv == 0 || nh % nkv != 0 {
                return Err(EngineError::invalid(format!(
                    "queries {:?} do not fit a cache of {nkv} kv heads × {}",
                    q.dims(),
                    o.shape.head_dim
                )));
            }
            let rows: Vec<f32> = q
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1()?;
            let e = &mut o.query_energy;
            e.sums.resize(nkv * d, 0.0);
            let group = nh / nkv;
            for (i, head_row) in rows.chunks_exact(d).enumerate() {
                let hk = (i % nh) / group;
                let sums = &mut e.sums[hk * d..(hk + 1) * d];
                sums.iter_mut()
                    .zip(head_row)
                    .for_each(|(s, &x)| *s += (x as f64) * (x as f64));
            }
            e.rows += t;
        }
        if wants && !o.query_energy.sums.is_empty() {
            o.storage.set_query_energy(&o.query_energy.sums);
        }
        Ok(())
    }

    /// Appends this step's K/V `[n_kv_heads, t, head_dim]` to a cache-owning layer.
    pub(crate) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.owned_mut(layer)?.storage.append(k, v)
    }

    /// Attention of `q` `[n_heads, t, head_dim]` at positions `query_start..` over the cache
    /// `layer` reads (its own, or its producer's, current step included), with the
    /// positions `both_ways` seeing each other both ways (the model decides where).
    pub(crate) fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        query_start: usize,
        scale: f64,
        both_ways: Option<(usize, usize)>,
    ) -> Result<Tensor> {
        let slot = self
            .slots
            .get(layer)
            .ok_or_else(|| EngineError::invalid(format!("no layer {layer}")))?;
        let source = match slot.layout {
            KvLayout::Shared { producer } => producer,
            _ => layer,
        };
        let owned = self
            .slots
            .get(source)
            .and_then(|s| s.owned.as_ref())
            .ok_or_else(|| EngineError::invalid(format!("layer {source} owns no cache")))?;
        // The consumer keeps its own mask kind (it equals the producer's by construction).
        let window = match (slot.kind, self.slots[source].layout) {
            (AttentionKind::Sliding, KvLayout::Sliding { window }) => Some(window),
            _ => None,
        };
        let spec = AttendSpec {
            query_start,
            key_start: owned.key_start,
            window,
            scale,
            both_ways,
        };
        owned.storage.attend(q, &spec)
    }

    /// Ends a step that processed `t` tokens: advances the position and trims sliding
    /// layers to their last `W − 1` tokens (all later queries need no more), plus the
    /// rewind margin.
    pub(crate) fn commit(&mut self, t: usize) -> Result<()> {
        self.seq_len += t;
        let seq_len = self.seq_len;
        let margin = self.rewind_margin;
        for slot in &mut self.slots {
            if let (KvLayout::Sliding { window }, Some(o)) = (slot.layout, slot.owned.as_mut()) {
                let keep = window.saturating_sub(1) + margin;
                let held = o.storage.len();
                if held > keep {
                    o.storage.drop_front(held - keep)?;
                    o.key_start = seq_len - keep;
                }
            }
        }
        Ok(())
    }

    /// Undoes the appends of a step that failed part-way, so the cache is as before it.
    pub(crate) fn rollback(&mut self) -> Result<()> {
        let seq_len = self.seq_len;
        for slot in &mut self.slots {
            if let Some(o) = slot.owned.as_mut() {
                let keep = seq_len - o.key_start;
                if o.storage.len() > keep {
                    o.storage.truncate(keep)?;
                }
            }
        }
        Ok(())
    }

    /// Forgets everything (keeps the storages and their precisions).
    pub fn reset(&mut self) -> Result<()> {
        for slot in &mut self.slots {
            if let Some(o) = slot.owned.as_mut() {
                o.storage.truncate(0)?;
                o.key_start = 0;
            }
        }
        self.seq_len = 0;
        Ok(())
    }

    /// Whether [`KvCache::rewind`] to `len` tokens is possible: full layers always can;
    /// a sliding layer only if it still holds the `W − 1` tokens before `len`.
    pub fn can_rewind(&self, len: usize) -> bool {
        len <= self.seq_len
            && self
                .slots
                .iter()
                .all(|s| match (s.layout, s.owned.as_ref()) {
                    (KvLayout::Sliding { window }, Some(o)) => {
                        o.key_start <= len.saturating_sub(window.saturating_sub(1))
                    }
                    _ => true,
                })
    }

    /// Drops every token at position ≥ `len` (cheap: storages truncate in place).
    pub fn rewind(&mut self, len: usize) -> Result<()> {
        if !self.can_rewind(len) {
            return Err(EngineError::invalid(format!(
                "cannot rewind to {len} tokens: {} processed, and sliding layers hold only their window",
                self.seq_len
            )));
        }
        for slot in &mut self.slots {
            if let Some(o) = slot.owned.as_mut() {
                o.storage.truncate(len - o.key_start)?;
            }
        }
        self.seq_len = len;
        Ok(())
    }

    /// Benchmarks only: appends `tokens` positions of deterministic noise K/V (unit-scale)
    /// to every owning layer, as if a prompt of that length had been run, without running
    /// the model. Storage sizes, layouts and attention cost are exactly those of a real
    /// context of that length; the content is meaningless, so never use it for quality.
    /// Cargo feature `bench` (and this crate's own tests).
    #[cfg(any(test, feature = "lab"))]
    pub fn fill_synthetic(&mut self, tokens: usize, seed: u64) -> Result<()> {
        let mut rng = kvlab_turboquant::Rng::new(seed, 0);
        let mut at = 0;
        while at < tokens {
            let t = CONVERT_CHUNK.min(tokens - at);
            for i in 0..self.slots.len() {
                let Some(o) = &self.slots[i].owned else {
                    continue;
                };
                let (h, d) = (o.shape.n_kv_heads, o.shape.head_dim);
                let mut noise = || -> Result<Tensor> {
                    let v: Vec<f32> = (0..h * t * d).map(|_| rng.symmetric()).collect();
                    Ok(Tensor::from_vec(v, (h, t, d), &o.shape.device)?)
                };
                let (k, v) = (noise()?, noise()?);
                self.append(i, &k, &v)?;
            }
            self.commit(t)?;
            at += t;
        }
        Ok(())
    }

    /// Dense conversions and device crossings of all owning layers' current storages (see
    /// [`StorageTraffic`]; a precision switch starts new storages, counting from zero).
    pub fn traffic(&self) -> StorageTraffic {
        self.slots
            .iter()
            .filter_map(|s| s.owned.as_ref())
            .map(|o| o.storage.traffic())
            .fold(StorageTraffic::default(), |a, b| a + b)
    }

    /// Whether some layer still holds its first tokens as f16 before it calibrates
    /// ([`KvStorage::calibrating`]): until then a TurboQuant cache weighs what f16 weighs.
    pub fn calibrating(&self) -> bool {
        self.slots
            .iter()
            .filter_map(|s| s.owned.as_ref())
            .any(|o| o.storage.calibrating())
    }

    /// Exact bytes per layer and per attention kind.
    pub fn memory(&self) -> KvMemoryReport {
        let mut layers = Vec::with_capacity(self.slots.len());
        let (mut sliding, mut full) = ((0, 0), (0, 0));
        for (i, s) in self.slots.iter().enumerate() {
            let (precision, tokens, used, alloc) = match &s.owned {
                Some(o) => (
                    Some(o.storage.precision()),
                    o.storage.len(),
                    o.storage.bytes_used(),
                    o.storage.bytes_allocated(),
                ),
                None => (None, 0, 0, 0),
            };
            let acc = match s.kind {
                AttentionKind::Sliding => &mut sliding,
                AttentionKind::Full => &mut full,
            };
            acc.0 += used;
            acc.1 += alloc;
            layers.push(LayerKvBytes {
                layer: i,
                kind: s.kind,
                layout: s.layout,
                precision,
                tokens,
                bytes_used: used,
                bytes_allocated: alloc,
            });
        }
        KvMemoryReport {
            layers,
            sliding,
            full,
            total: (sliding.0 + full.0, sliding.1 + full.1),
            calibrating: self.calibrating(),
        }
    }
}
