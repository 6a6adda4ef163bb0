//! The Gemma 3 / Gemma 4 text decoder over a [`KvCache`]: load from safetensors or GGUF on
//! any device/dtype, then run chunks of any length at any offset, returning the last or all
//! positions' logits.
//!
//! ```no_run
//! use kvlab_engine::lab::{KvPrecision, Logits, Model, PrecisionPolicy};
//! use kvlab_engine::LoadOptions;
//! # fn main() -> kvlab_engine::Result<()> {
//! let model = Model::load("gemma-3-270m-q4_k_m.gguf".as_ref(), &LoadOptions::default())?;
//! let mut cache = model.new_cache(&PrecisionPolicy::uniform(KvPrecision::F16))?;
//! let mut logits = model.forward(&[2, 818, 5279, 529, 7001, 563], &mut cache, Logits::Last)?;
//! for _ in 0..8 {
//!     let next = logits.argmax(0)?.to_scalar::<u32>()?; // logits: f32 [vocab]
//!     logits = model.forward(&[next], &mut cache, Logits::Last)?;
//! }
//! println!("KV bytes: {}", cache.memory().total.0);
//! # Ok(()) }
//! ```

mod attention;
mod fused;
mod layer;
mod linear;
mod mlp;
mod ple;
mod rope;

use std::path::Path;

use candle_core::{DType, Device, Tensor};

pub use linear::{Linear, RmsNorm, Splits};

use crate::checkpoint::config::{self, ModelConfig, RopeSpec};
use crate::checkpoint::weights::{Table, WeightStore};
use crate::checkpoint::{Checkpoint, LoadOptions};
use crate::error::{EngineError, Result};
use crate::kv::{KvCache, PrecisionPolicy};
use crate::profile;
use layer::DecoderLayer;
use ple::{scale_in, PleInputs};
use rope::RopeTables;

/// Which logits [`Model::forward`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position: `[vocab]` (generation).
    Last,
    /// Every position: `[t, vocab]` (perplexity, tests). Costs `4·vocab` bytes per row
    /// (1 MiB for Gemma's 262144 ids): keep such chunks short.
    All,
}

/// A loaded text decoder.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    embed: Table,
    embed_scale: f64,
    ple: Option<PleInputs>,
    layers: Vec<DecoderLayer>,
    final_norm: RmsNorm,
    lm_head: Linear,
    device: Device,
    dtype: DType,
    /// Bytes of the weights as held (see [`Model::weights_bytes`]).
    weights_bytes: usize,
    /// The distinct (rope, head dim) pairs of the layers, and which one each layer uses.
    rope_keys: Vec<(RopeSpec, usize)>,
    rope_of: Vec<usize>,
}

/// One sequence of a batched step ([`Model::forward_batch`]): its next ids (a prefill chunk
/// or one token), its cache, and which logits it wants.
pub struct BatchItem<'i, 'c> {
    pub ids: &'i [u32],
    pub cache: &'c mut KvCache,
    pub which: Logits,
    /// Rows of `ids` whose embeddings are given (an image's soft tokens); empty for text.
    pub soft: &'i [SoftSpan],
}

/// Rows of a chunk whose embeddings come from elsewhere (an image's soft tokens, see
/// [`crate::models::vision`]): `rows` `[n, hidden]` take the places of ids `at..at + n`,
/// which are looked up as the config's pad token for the per-layer inputs, as transformers
/// does.
#[derive(Debug, Clone)]
pub struct SoftSpan {
    /// First row of the chunk it replaces.
    pub at: usize,
    /// The embeddings, `[n, hidden]`.
    pub rows: Tensor,
}

/// A sequence inside a pass: its rows of the step's activations, its first position, its
/// cache and its rotary tables (one per [`Model`]'s rope key).
pub(crate) struct Segment<'a> {
    ids: &'a [u32],
    soft: &'a [SoftSpan],
    pub(crate) rows: std::ops::Range<usize>,
    pub(crate) start: usize,
    which: Logits,
    pub(crate) cache: &'a mut KvCache,
    pub(crate) ropes: Vec<RopeTables>,
    /// Positions that see each other both ways on sliding layers: the chunk's image, on a
    /// model that asks for it.
    pub(crate) both_ways: Option<(usize, usize)>,
}

impl Model {
    /// Loads a model from a `.gguf` file, a `.safetensors` file (with `config.json` beside
    /// it), a `model.safetensors.index.json`, or a Hugging Face model directory.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self> {
        Self::from_checkpoint(&Checkpoint::open(path, opts)?)
    }

    /// Loads the decoder of an open checkpoint (its configuration and weights; the chat
    /// template is the tokenizer's).
    pub fn from_checkpoint(ckpt: &Checkpoint) -> Result<Self> {
        Self::from_parts(ckpt.config().clone(), ckpt.store())
    }

    /// Loads Hugging Face weights with an explicit `config.json` (another spelling of the
    /// checkpoint's own, in parity tests).
    pub fn from_hf(config_path: &Path, weights: &Path, opts: &LoadOptions) -> Result<Self> {
        let cfg = config::hf::load_config(config_path)?;
        let ws = WeightStore::open_safetensors(weights, opts)?;
        Self::from_parts(cfg, &ws)
    }

    /// Builds the decoder from a resolved config and an open weight store.
    pub fn from_parts(config: ModelConfig, ws: &WeightStore) -> Result<Self> {
        let (v, h) = (config.vocab_size, config.hidden_size);
        let tied = config.tie_word_embeddings;
        let embed = ws.table("embed_tokens.weight", v, h, tied)?;
        let lm_head = if tied {
            Linear::new(embed.as_matrix())
        } else {
            Linear::load(ws, "lm_head.weight", v, h)?
        };
        let ple = config
            .ple
            .map(|s| PleInputs::load(ws, &config, s))
            .transpose()?;
        let layers = config
            .layers
            .iter()
            .map(|s| DecoderLayer::load(ws, &config, s))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = RmsNorm::load(
            ws,
            "norm.weight",
            h,
            config.rms_norm_eps,
            config.norm_weight_offset,
        )?;
        let mut rope_keys: Vec<(RopeSpec, usize)> = Vec::new();
        let rope_of = layers
            .iter()
            .map(|l: &DecoderLayer| {
                let key = (l.spec().rope, l.spec().head_dim);
                match rope_keys.iter().position(|k| *k == key) {
                    Some(p) => p,
                    None => {
                        rope_keys.push(key);
                        rope_keys.len() - 1
                    }
                }
            })
            .collect();
        Ok(Self {
            rope_keys,
            rope_of,
            embed_scale: scale_in(ws.dtype(), (h as f64).sqrt()),
            embed,
            ple,
            layers,
            final_norm,
            lm_head,
            device: ws.device().clone(),
            dtype: ws.dtype(),
            weights_bytes: ws.loaded_bytes(),
            config,
        })
    }

    /// The resolved configuration (incl. warnings).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The activation dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of all weight tensors the model holds, at their stored size (quantized GGUF
    /// matrices at their block size, dense ones at dtype size), summed when loaded.
    pub fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    /// Weight bytes one decode step reads: all of them but the per-layer embedding table,
    /// of which a token gathers one row (the main embedding is the tied output projection,
    /// read whole for the logits). What a decode rate is divided by to get its bandwidth.
    pub fn streamed_bytes_per_token(&self) -> usize {
        let gathered = self.ple.as_ref().map_or(0, PleInputs::table_bytes);
        self.weights_bytes.saturating_sub(gathered)
    }

    /// An empty cache for this model.
    pub fn new_cache(&self, policy: &PrecisionPolicy) -> Result<KvCache> {
        KvCache::new(&self.config, policy, &self.device)
    }

    /// An empty cache whose storages keep their data on `home`, apart from the model's
    /// device (see [`KvCache::with_home`]).
    pub fn new_cache_with_home(&self, policy: &PrecisionPolicy, home: Device) -> Result<KvCache> {
        KvCache::with_home(&self.config, policy, &self.device, Some(home))
    }

    /// Runs `ids` at positions `cache.seq_len()..`, extending the cache. Returns f32 logits
    /// `[vocab]` (Last) or `[t, vocab]` (All), after the final softcap. On error the cache
    /// is rolled back to its state before the call.
    pub fn forward(&self, ids: &[u32], cache: &mut KvCache, which: Logits) -> Result<Tensor> {
        self.forward_with(ids, &[], cache, which)
    }

    /// [`Model::forward`] with some rows' embeddings given (an image's soft tokens).
    pub fn forward_with(
        &self,
        ids: &[u32],
        soft: &[SoftSpan],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Tensor> {
        let mut one = [BatchItem {
            ids,
            cache,
            which,
            soft,
        }];
        self.forward_batch(&mut one)
            .pop()
            .unwrap_or_else(|| Err(EngineError::invalid("a batch of one gave no logits")))
    }

    /// Runs several sequences in one forward pass: every linear layer over all their rows
    /// at once (each weight read once for the step), attention per sequence against its own
    /// cache in its own format. Returns each item's logits as [`Model::forward`] would
    /// alone, in order: the kernels compute each row alone, so they are the same bits.
    ///
    /// An item that cannot run (empty, full context, bad id, another model's cache) gets its
    /// error and the others run. Should the pass fail, every cache is rolled back and each
    /// item runs alone, so one failing sequence leaves the batch and the others go on.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_, '_>]) -> Vec<Result<Tensor>> {
        let mut out: Vec<Option<Result<Tensor>>> = items
            .iter()
            .map(|item| self.check(item.ids, item.soft, item.cache).err().map(Err))
            .collect();
        let ready: Vec<usize> = (0..items.len()).filter(|&i| out[i].is_none()).collect();
        if ready.len() > 1 {
            let mut segments: Vec<Segment<'_>> = Vec::with_capacity(ready.len());
            let mut rows = 0;
            let mut picked = items
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| ready.contains(i))
                .map(|(_, item)| item);
            for item in picked.by_ref() {
                let start = item.cache.seq_len();
                let both_ways = self.both_ways(start, item.soft);
                segments.push(Segment {
                    ids: item.ids,
                    soft: item.soft,
                    rows: rows..rows + item.ids.len(),
                    start,
                    which: item.which,
                    cache: &mut *item.cache,
                    ropes: Vec::new(),
                    both_ways,
                });
                rows += item.ids.len();
            }
            match self.run(&mut segments) {
                Ok(logits) => {
                    let committed: Vec<Result<Tensor>> = segments
                        .iter_mut()
                        .zip(logits)
                        .map(|(s, l)| {
                            s.cache.commit(s.ids.len())?;
                            Ok(l)
                        })
                        .collect();
                    for (i, r) in ready.iter().zip(committed) {
                        out[*i] = Some(r);
                    }
                }
                Err(e) => {
                    tracing::warn!("a batched step failed ({e}); its sequences run alone");
                    let mut rolled = Ok(());
                    for s in &mut segments {
                        if let Err(e) = s.cache.rollback() {
                            rolled = Err(e);
                        }
                    }
                    drop(segments);
                    for &i in &ready {
                        out[i] = Some(match &rolled {
                            Ok(()) => self.forward_alone(&mut items[i]),
                            Err(e) => Err(EngineError::invalid(format!(
                                "a batched step failed and could not roll back: {e}"
                            ))),
                        });
                    }
                }
            }
        } else if let Some(&i) = ready.first() {
            out[i] = Some(self.forward_alone(&mut items[i]));
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(EngineError::invalid("a batch item was skipped"))))
            .collect()
    }

    /// The positions of a chunk's image that attend both ways, where the config asks for it
    /// (`check` allows such a model one image per chunk).
    fn both_ways(&self, start: usize, soft: &[SoftSpan]) -> Option<(usize, usize)> {
        let s = soft.first().filter(|_| self.config.image_bidirectional)?;
        let a = start + s.at;
        Some((a, a + s.rows.dim(0).ok()?))
    }

    /// Why `ids` cannot run on `cache`, if they cannot.
    fn check(&self, ids: &[u32], soft: &[SoftSpan], cache: &KvCache) -> Result<()> {
        if ids.is_empty() {
            return Err(EngineError::invalid("forward on an empty chunk"));
        }
        let pad_in_vocab = self
            .config
            .pad_token_id
            .is_some_and(|p| (p as usize) < self.config.vocab_size);
        if !soft.is_empty() && !pad_in_vocab {
            return Err(EngineError::invalid(
                "the model names no pad token in its vocabulary for the places of an image's soft tokens",
            ));
        }
        if self.config.image_bidirectional && soft.len() > 1 {
            return Err(EngineError::invalid(
                "this model's images attend both ways: one image per chunk",
            ));
        }
        for s in soft {
            let dims = s.rows.dims();
            let n = dims.first().copied().unwrap_or(0);
            if dims != [n, self.config.hidden_size] || s.at + n > ids.len() {
                return Err(EngineError::invalid(format!(
                    "soft tokens of shape {dims:?} at row {} do not fit a chunk of {} ids of width {}",
                    s.at,
                    ids.len(),
                    self.config.hidden_size
                )));
            }
        }
        if cache.num_layers() != self.layers.len() {
            return Err(EngineError::invalid("cache was built for another model"));
        }
        let max = self.config.max_position_embeddings;
        if max > 0 && cache.seq_len() + ids.len() > max {
            return Err(EngineError::invalid(format!(
                "context full: {} + {} tokens exceed the model's {max} positions",
                cache.seq_len(),
                ids.len()
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(EngineError::invalid(format!(
                "token id {bad} outside the vocabulary ({})",
                self.config.vocab_size
            )));
        }
        Ok(())
    }

    /// One checked item run by itself, committed or rolled back.
    fn forward_alone(&self, item: &mut BatchItem<'_, '_>) -> Result<Tensor> {
        self.check(item.ids, item.soft, item.cache)?;
        let start = item.cache.seq_len();
        let mut one = [Segment {
            ids: item.ids,
            soft: item.soft,
            rows: 0..item.ids.len(),
            start,
            which: item.which,
            cache: &mut *item.cache,
            ropes: Vec::new(),
            both_ways: self.both_ways(start, item.soft),
        }];
        match self.run(&mut one) {
            Ok(mut l) => {
                item.cache.commit(item.ids.len())?;
                l.pop()
                    .ok_or_else(|| EngineError::invalid("a run of one gave no logits"))
            }
            Err(e) => {
                item.cache.rollback()?;
                Err(e)
            }
        }
    }

    /// The pass itself over `segments` (rows laid end to end), without commit or rollback.
    fn run(&self, segments: &mut [Segment<'_>]) -> Result<Vec<Tensor>> {
        let mut ids: Vec<u32> = segments
            .iter()
            .flat_map(|s| s.ids.iter().copied())
            .collect();
        // `check` refused soft spans on a model without a pad id.
        let place = self.config.pad_token_id.unwrap_or(0);
        for s in segments.iter() {
            for span in s.soft {
                let first = s.rows.start + span.at;
                ids[first..first + span.rows.dim(0)?].fill(place);
            }
        }
        let splits = Splits(segments.iter().map(|s| s.ids.len()).collect());
        let t = ids.len();
        let ids_t = Tensor::from_vec(ids, t, &self.device)?;
        let mut x = {
            let _span = profile::span("embedding");
            let mut x = (self.embed.lookup(&ids_t, self.dtype)? * self.embed_scale)?;
            for s in segments.iter() {
                for span in s.soft {
                    x =
                        x.slice_scatter0(&span.rows.to_dtype(self.dtype)?, s.rows.start + span.at)?;
                }
            }
            x
        };
        let ple = {
            let _span = profile::span("per-layer embeddings");
            self.ple
                .as_ref()
                .map(|p| p.compute(&ids_t, &x, &splits))
                .transpose()?
        };
        // Each sequence's rotary tables, one per distinct (rope, head_dim) of the layers.
        for s in segments.iter_mut() {
            let _span = profile::span("rope");
            for (rope, head_dim) in &self.rope_keys {
                let tb = RopeTables::new(
                    rope,
                    *head_dim,
                    s.start,
                    s.ids.len(),
                    self.dtype,
                    &self.device,
                )?;
                s.ropes.push(tb);
            }
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let inp = ple
                .as_ref()
                .map(|p| p.narrow(1, i, 1)?.squeeze(1))
                .transpose()?;
            let rope = self.rope_of[i];
            x = layer.forward(&x, segments, &splits, rope, inp.as_ref())?;
        }
        // The rows whose logits are wanted: each sequence's last, or all of its rows.
        let wanted: Vec<Tensor> = segments
            .iter()
            .map(|s| match s.which {
                Logits::Last => x.narrow(0, s.rows.end - 1, 1),
                Logits::All => x.narrow(0, s.rows.start, s.rows.len()),
            })
            .collect::<candle_core::Result<_>>()?;
        let x = if wanted.len() == 1 {
            wanted[0].clone()
        } else {
            Tensor::cat(&wanted, 0)?
        };
        let wanted_splits = Splits(
            segments
                .iter()
                .map(|s| match s.which {
                    Logits::Last => 1,
                    Logits::All => s.ids.len(),
                })
                .collect(),
        );
        let mut logits = self.lm_head.forward_split_as(
            "vocab projection",
            &self.final_norm.forward(&x)?,
            &wanted_splits,
        )?;
        let _span = profile::span("logit softcap");
        logits = logits.to_dtype(DType::F32)?;
        if let Some(c) = self.config.final_logit_softcap {
            logits = fused::softcap(&logits, c)?;
        }
        let mut at = 0;
        segments
            .iter()
            .map(|s| {
                Ok(match s.which {
                    Logits::Last => {
                        at += 1;
                        logits.narrow(0, at - 1, 1)?.squeeze(0)?
                    }
                    Logits::All => {
                        at += s.ids.len();
                        logits.narrow(0, at - s.ids.len(), s.ids.len())?
                    }
                })
            })
            .collect()
    }
}
