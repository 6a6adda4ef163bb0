//! What the UI shows about a model before and after loading: its configuration read from the
//! file header alone (no weights), the model card, and the memory a context would cost.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use kvlab_engine::config::{self, AttentionKind, Family, KvSource, ModelConfig};
use serde::Serialize;

use crate::cachespec::{policy_for, token_costs, TokenCost};
use crate::error::CommandError;

/// The model card.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelCard {
    pub name: String,
    pub path: String,
    pub family: String,
    pub format: &'static str,
    /// Parameters counted from the configuration's matrix shapes.
    pub parameters: u64,
    pub layers: usize,
    pub full_layers: usize,
    pub sliding_layers: usize,
    pub shared_layers: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub max_context: usize,
    pub sliding_window: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub weights_bytes: u64,
    pub supports_thinking: bool,
    /// Whether the checkpoint ships a chat template (`Some(false)`: a base model, which the
    /// UI introduces as one). The engine reads it when it loads the model, so a card made
    /// before loading has `None`.
    pub has_chat_template: Option<bool>,
    pub token_costs: Vec<TokenCost>,
    pub warnings: Vec<String>,
}

/// Reads a model's configuration without loading its weights.
pub fn read_config(path: &Path) -> Result<(ModelConfig, &'static str), CommandError> {
    let not_found = || {
        CommandError::new(
            "model_not_found",
            format!("{} does not exist", path.display()),
        )
    };
    if !path.exists() {
        return Err(not_found());
    }
    if path.extension().and_then(|e| e.to_str()) == Some("gguf") {
        let mut f = std::fs::File::open(path)
            .map_err(|e| CommandError::new("io", format!("{}: {e}", path.display())))?;
        let content = gguf_file::Content::read(&mut f).map_err(|e| {
            CommandError::new(
                "bad_model",
                format!("{} is not a readable GGUF file: {e}", path.display()),
            )
        })?;
        let cfg = config::gguf::config_from_gguf(&content).map_err(CommandError::from)?;
        return Ok((cfg, "gguf"));
    }
    let dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let cfg_path = dir.join("config.json");
    if !cfg_path.exists() {
        return Err(CommandError::new(
            "bad_model",
            format!(
                "{} is neither a .gguf file nor a folder with config.json",
                path.display()
            ),
        ));
    }
    let cfg = config::hf::load_config(&cfg_path).map_err(CommandError::from)?;
    Ok((cfg, "safetensors"))
}

/// Bytes of the weight files: the GGUF file, or every safetensors file in the folder.
pub fn weights_bytes(path: &Path) -> u64 {
    if path.is_file() && path.extension().and_then(|e| e.to_str()) == Some("gguf") {
        return std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    }
    let dir: PathBuf = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().and_then(|x| x.to_str()) == Some("safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Parameters implied by the configuration (embeddings, attention, MLP, experts).
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    let h = cfg.hidden_size as u64;
    let mut n = cfg.vocab_size as u64 * h;
    if !cfg.tie_word_embeddings {
        n += cfg.vocab_size as u64 * h;
    }
    if let Some(p) = cfg.ple {
        n += p.vocab_size as u64 * p.dim as u64 * cfg.layers.len() as u64;
    }
    for l in &cfg.layers {
        let (hd, q, kv) = (l.head_dim as u64, l.n_heads as u64, l.n_kv_heads as u64);
        let v = if l.k_eq_v { 0 } else { kv * hd * h };
        let kvp = if l.kv_source == KvSource::Own {
            kv * hd * h + v
        } else {
            0
        };
        n += 2 * q * hd * h + kvp + 3 * h * l.mlp_width as u64;
        if let Some(m) = cfg.moe {
            n += m.num_experts as u64 * 3 * h * m.expert_width as u64;
        }
    }
    n
}

/// The card for a model at `path` with configuration `cfg`.
pub fn model_card(path: &Path, cfg: &ModelConfig, format: &'static str) -> ModelCard {
    let count = |k: AttentionKind| cfg.layers.iter().filter(|l| l.kind == k).count();
    let first = cfg.layers.first();
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    ModelCard {
        name,
        path: path.display().to_string(),
        family: match cfg.family {
            Family::Gemma3 => "Gemma 3".into(),
            Family::Gemma4 => "Gemma 4".into(),
        },
        format,
        parameters: parameter_count(cfg),
        layers: cfg.layers.len(),
        full_layers: count(AttentionKind::Full),
        sliding_layers: count(AttentionKind::Sliding),
        shared_layers: cfg
            .layers
            .iter()
            .filter(|l| l.kv_source != KvSource::Own)
            .count(),
        hidden_size: cfg.hidden_size,
        vocab_size: cfg.vocab_size,
        max_context: cfg.max_position_embeddings,
        sliding_window: cfg.sliding_window,
        kv_heads: first.map(|l| l.n_kv_heads).unwrap_or(0),
        head_dim: first.map(|l| l.head_dim).unwrap_or(0),
        weights_bytes: weights_bytes(path),
        supports_thinking: cfg.family == Family::Gemma4,
        has_chat_template: None,
        token_costs: token_costs(cfg),
        warnings: cfg.warnings.clone(),
    }
}

/// Memory a context of `context` tokens would need under the precision `spec`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MemoryEstimate {
    pub card: ModelCard,
    pub context: u64,
    pub spec: String,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    pub total_bytes: u64,
}

/// The estimate for `card` (of a model configured as `cfg`): a scoped SPEC (`tq3.5@full`)
/// keeps the other kind of layer at f16, exactly as the engine would store it.
pub fn estimate(
    card: ModelCard,
    cfg: &ModelConfig,
    context: u64,
    spec: &str,
) -> Result<MemoryEstimate, CommandError> {
    let policy = policy_for(spec)?;
    let tokens = usize::try_from(context)
        .map_err(|_| CommandError::new("bad_context", format!("{context} tokens")))?;
    let kv = kvlab_engine::memory::estimate_kv_bytes(cfg, &policy, tokens)
        .map_err(|e| CommandError::new("bad_cache_spec", e.to_string()))?;
    Ok(MemoryEstimate {
        weights_bytes: card.weights_bytes,
        kv_bytes: kv,
        total_bytes: card.weights_bytes + kv,
        context,
        spec: spec.to_owned(),
        card,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (ModelCard, ModelConfig) {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/engine/tests/fixtures/tiny_gemma3");
        let (cfg, format) = read_config(&dir).expect("fixture");
        (model_card(&dir, &cfg, format), cfg)
    }

    #[test]
    fn the_card_reads_the_configuration_without_weights() {
        let (card, _) = tiny();
        assert_eq!(card.format, "safetensors");
        assert_eq!(
            (
                card.layers,
                card.sliding_layers,
                card.full_layers,
                card.sliding_window
            ),
            (6, 4, 2, 8)
        );
        assert_eq!(
            (card.kv_heads, card.head_dim, card.max_context),
            (2, 16, 256)
        );
        assert!(card.weights_bytes > 0);
    }

    #[test]
    fn scoped_specs_keep_the_other_layer_kind_at_f16() {
        // 100 tokens: full layers hold all of them, sliding layers their last 7 (window 8).
        // f16 costs 128 B per layer-token; TQ 3.5 on 16 dims 2 × 2 × 9 = 36 B, plus per TQ
        // layer the centering offsets: 2 sides × 2 heads × 16 f32 = 256 B.
        let (card, cfg) = tiny();
        let f16 = estimate(card.clone(), &cfg, 100, "f16").unwrap();
        assert_eq!(f16.kv_bytes, 2 * 128 * 100 + 4 * 128 * 7);
        let full = estimate(card.clone(), &cfg, 100, "tq3.5@full").unwrap();
        assert_eq!(full.kv_bytes, 2 * 36 * 100 + 2 * 256 + 4 * 128 * 7);
        assert_eq!(
            estimate(card.clone(), &cfg, 100, "tq3.5").unwrap().kv_bytes,
            full.kv_bytes
        );
        let sliding = estimate(card.clone(), &cfg, 100, "tq3.5@sliding").unwrap();
        assert_eq!(sliding.kv_bytes, 2 * 128 * 100 + 4 * 36 * 7 + 4 * 256);
        assert_eq!(sliding.total_bytes, sliding.kv_bytes + card.weights_bytes);
        assert_eq!(
            estimate(card, &cfg, 100, "q8").unwrap_err().code,
            "bad_cache_spec"
        );
    }
}
