//! A checkpoint as found on disk, read once: where it comes from ([`source`]: a local path or
//! the Hub), its weight store and the options it is held with (`weights`, [`LoadOptions`]:
//! GGUF, safetensors, quantization while loading, their checks), its resolved configuration
//! ([`config`]: GGUF metadata or `config.json`, checked against the tensors present) and the
//! chat template it ships. [`Checkpoint::open`] yields them side by side: the decoder takes
//! the configuration and the weights, the tokenizer the template, the card all three.

pub mod config;
pub mod source;
mod template;
pub(crate) mod weights;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use crate::error::{EngineError, Result};
use config::{ModelConfig, RopeKind};
use weights::{checkpoint_dir, WeightStore, WeightsChoice};

pub(crate) use template::find_template;

/// A checkpoint's chat template as found in its files (see [`Checkpoint::template`]):
/// `Ok(None)` for a checkpoint without one, an error when it is there but unreadable.
pub type ChatTemplateText =
    std::result::Result<Option<(String, crate::chat::TemplateSource)>, String>;

/// An open checkpoint: its weight store (headers read, no weight loaded yet), its resolved
/// configuration and the chat template its files hold.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    store: WeightStore,
    config: ModelConfig,
    template: ChatTemplateText,
}

impl Checkpoint {
    /// Opens any checkpoint (a `.gguf` file, or safetensors: a folder, a `.safetensors` file
    /// or a `model.safetensors.index.json`) to be held with `opts`, reading headers only.
    pub fn open(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let store = WeightStore::open(path, opts)?;
        let config = read_config(&store)?;
        let template = find_template(path, store.gguf_content()).map_err(|e| e.to_string());
        Ok(Self {
            path: path.to_path_buf(),
            store,
            config,
            template,
        })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The resolved configuration (incl. warnings).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The chat template the checkpoint ships, as text with its source.
    pub fn template(&self) -> &ChatTemplateText {
        &self.template
    }

    /// The weight store the decoder loads from.
    pub(crate) fn store(&self) -> &WeightStore {
        &self.store
    }
}

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

/// llama.cpp stores Gemma 4's proportional RoPE as per-pair frequency divisors
/// (`rope_freqs.weight`: 1 for rotated pairs, ~1e30 for the identity ones). Reads the rotated
/// fraction from it instead of assuming 0.25; leaves the assumption (and its warning) if
/// the factors are of another form.
fn proportional_from_freq_factors(cfg: &mut ModelConfig, ws: &WeightStore) -> Result<()> {
    let Some(full) = cfg
        .layers
        .iter()
        .find(|l| l.kind == crate::contract::AttentionKind::Full)
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
        .filter(|l| l.kind == crate::contract::AttentionKind::Full)
    {
        if let RopeKind::Proportional {
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
