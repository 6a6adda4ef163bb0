//! The Gemma 3 / Gemma 4 text decoder over a [`KvCache`]: load from safetensors or GGUF on
//! any device/dtype, then run chunks of any length at any offset, returning the last or all
//! positions' logits.
//!
//! ```no_run
//! use kvlab_engine::{KvPrecision, LoadOptions, Logits, Model, PrecisionPolicy};
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

pub use linear::{Linear, RmsNorm};

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
        Ok(Self {
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
        if ids.is_empty() {
            return Err(EngineError::invalid("forward on an empty chunk"));
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
        match self.run(ids, cache, which) {
            Ok(l) => {
                cache.commit(ids.len())?;
                Ok(l)
            }
            Err(e) => {
                cache.rollback()?;
                Err(e)
            }
        }
    }

    fn run(&self, ids: &[u32], cache: &mut KvCache, which: Logits) -> Result<Tensor> {
        let t = ids.len();
        let start = cache.seq_len();
        let ids_t = Tensor::from_vec(ids.to_vec(), t, &self.device)?;
        let mut x = {
            let _span = profile::span("embedding");
            (self.embed.lookup(&ids_t, self.dtype)? * self.embed_scale)?
        };
        let ple = {
            let _span = profile::span("per-layer embeddings");
            self.ple
                .as_ref()
                .map(|p| p.compute(&ids_t, &x))
                .transpose()?
        };
        let mut tables: Vec<(RopeSpec, usize, RopeTables)> = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let spec = layer.spec();
            let pos = match tables
                .iter()
                .position(|(r, d, _)| *r == spec.rope && *d == spec.head_dim)
            {
                Some(p) => p,
                None => {
                    let _span = profile::span("rope");
                    let tb = RopeTables::new(
                        &spec.rope,
                        spec.head_dim,
                        start,
                        t,
                        self.dtype,
                        &self.device,
                    )?;
                    tables.push((spec.rope, spec.head_dim, tb));
                    tables.len() - 1
                }
            };
            let inp = ple
                .as_ref()
                .map(|p| p.narrow(1, i, 1)?.squeeze(1))
                .transpose()?;
            x = layer.forward(&x, &tables[pos].2, cache, start, inp.as_ref())?;
        }
        if which == Logits::Last {
            x = x.narrow(0, t - 1, 1)?;
        }
        let mut logits = self
            .lm_head
            .forward_as("vocab projection", &self.final_norm.forward(&x)?)?;
        let _span = profile::span("logit softcap");
        logits = logits.to_dtype(DType::F32)?;
        if let Some(c) = self.config.final_logit_softcap {
            logits = fused::softcap(&logits, c)?;
        }
        Ok(match which {
            Logits::Last => logits.squeeze(0)?,
            Logits::All => logits,
        })
    }
}
