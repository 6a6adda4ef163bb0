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

use crate::config::{self, ModelConfig, RopeSpec};
use crate::error::{EngineError, Result};
use crate::kv::{KvCache, PrecisionPolicy};
use crate::profile;
use crate::weights::{checkpoint_dir, Table, WeightStore, WeightsChoice};
use layer::DecoderLayer;
use ple::{scale_in, PleInputs};
use rope::RopeTables;

/// llama.cpp stores Gemma 4's proportional RoPE as per-pair frequency divisors
/// (`rope_freqs.weight`: 1 for rotated pairs, ~1e30 for the identity ones). Reads the rotated
/// fraction from it instead of assuming 0.25; leaves the assumption (and its warning) if
/// the factors are of another form.
/// The resolved configuration of an open checkpoint, from its headers alone: GGUF metadata
/// (plus the `rope_freqs` fix-up for Gemma 4), or the `config.json` beside safetensors.
/// Loading and inspecting both read it here, so the two can never disagree.
pub fn read_config(ws: &WeightStore) -> Result<ModelConfig> {
    let cfg = match ws.gguf_content() {
        Some(content) => {
            let mut cfg = config::gguf::config_from_gguf(content)?;
            if cfg.family.facts().rope_freq_factors() && ws.contains("rope_freqs.weight") {
                proportional_from_freq_factors(&mut cfg, ws)?;
            }
            cfg
        }
        None => config::hf::load_config(&checkpoint_dir(ws.path()).join("config.json"))?,
    };
    check_layers_present(&cfg, ws)?;
    Ok(cfg)
}

/// The config's layer count against the checkpoint's: each of its layers must have tensors,
/// and no tensors may belong to a layer past them. Checked from the headers, before any
/// weight is read or any per-layer state is built.
fn check_layers_present(cfg: &ModelConfig, ws: &WeightStore) -> Result<()> {
    let n = cfg.num_layers();
    let present = ws.layer_indices();
    let expected: std::collections::BTreeSet<usize> = (0..n).collect();
    if present == expected {
        return Ok(());
    }
    let span = match (present.first(), present.last()) {
        (Some(a), Some(b)) => format!("layers {a} to {b}"),
        _ => "no layer".into(),
    };
    Err(EngineError::ConfigContradiction(format!(
        "the config declares {n} layers, but the checkpoint holds tensors for {} ({span})",
        present.len()
    )))
}

fn proportional_from_freq_factors(cfg: &mut ModelConfig, ws: &WeightStore) -> Result<()> {
    let Some(full) = cfg
        .layers
        .iter()
        .find(|l| l.kind == config::AttentionKind::Full)
    else {
        return Ok(());
    };
    let half = full.head_dim / 2;
    let f: Vec<f32> = ws
        .tensor_as("rope_freqs.weight", &[half], DType::F32)?
        .to_vec1()?;
    let rotated = f.iter().take_while(|x| **x == 1.0).count();
    if rotated == 0 || f[rotated..].iter().any(|x| *x < 1e20) {
        cfg.warnings.push(
            "rope_freqs.weight is not of the proportional form; kept partial_rotary_factor 0.25"
                .into(),
        );
        return Ok(());
    }
    let partial = (2 * rotated) as f64 / full.head_dim as f64;
    for l in cfg
        .layers
        .iter_mut()
        .filter(|l| l.kind == config::AttentionKind::Full)
    {
        if let config::RopeKind::Proportional {
            partial_rotary_factor,
        } = &mut l.rope.kind
        {
            *partial_rotary_factor = partial;
        }
    }
    cfg.warnings
        .retain(|w| !w.contains("partial_rotary_factor 0.25"));
    Ok(())
}

/// Where, in which dtype and with which held weights to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Device for weights and activations.
    pub device: Device,
    /// Activation / dense-weight dtype (f32 on CPU; quantized GGUF matrices stay quantized).
    pub dtype: DType,
    /// How a safetensors checkpoint's matrices are held (quantized while loading, or dense);
    /// GGUF files keep their own types.
    pub weights: WeightsChoice,
}

impl Default for LoadOptions {
    /// CPU, f32, dense f32 weights: the reference setting the parity tests use. The apps take
    /// [`LoadOptions::on`], whose weights suit the device.
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
            weights: WeightsChoice::F32,
        }
    }
}

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
    /// The chat template the checkpoint ships, with where it came from; `None` for a base
    /// checkpoint; an error when it is there but unreadable.
    chat_template: ChatTemplateText,
}

/// A checkpoint's chat template as found in its files (see [`crate::chat::find_template`]).
pub type ChatTemplateText =
    std::result::Result<Option<(String, crate::chat::TemplateSource)>, String>;

impl Model {
    /// Loads a model from a `.gguf` file, a `.safetensors` file (with `config.json` beside
    /// it), a `model.safetensors.index.json`, or a Hugging Face model directory.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let ws = WeightStore::open(path, opts)?;
        let cfg = read_config(&ws)?;
        let mut model = Self::from_parts(cfg, &ws)?;
        model.chat_template =
            crate::chat::find_template(path, ws.gguf_content()).map_err(|e| e.to_string());
        Ok(model)
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
            chat_template: Ok(None),
        })
    }

    /// The chat template the checkpoint ships, as text with its source (`Ok(None)`: none).
    pub fn chat_template(&self) -> &ChatTemplateText {
        &self.chat_template
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
