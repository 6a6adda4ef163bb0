//! What the UI shows about a model before and after loading: its configuration read from the
//! file header alone (no weights), the model card, and the memory a context would cost.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use kvlab_engine::config::{self, AttentionKind, Family, KvSource, ModelConfig};
use serde::Serialize;

use crate::cachespec::{context_bytes, token_costs, TokenCost};
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

pub fn estimate(card: ModelCard, context: u64, spec: &str) -> Result<MemoryEstimate, CommandError> {
    let unknown = || CommandError::new("bad_cache_spec", format!("unknown cache policy `{spec}`"));
    let parsed = crate::cachespec::CacheSpec::parse(spec)?;
    // The card lists every offered precision applied to all layers; a scoped SPEC
    // (`tq3.5@full`) keeps the other kind of layer at f16.
    let body = spec.trim().split_once('@').map_or(spec.trim(), |(b, _)| b);
    let find = |name: &str| card.token_costs.iter().find(|c| c.spec == name);
    let chosen = find(body).ok_or_else(unknown)?;
    let f16 = find("f16").ok_or_else(unknown)?;
    let mut scoped = chosen.clone();
    match parsed.scope {
        crate::cachespec::Scope::All => {}
        crate::cachespec::Scope::Full => {
            scoped.sliding_bytes_per_token = f16.sliding_bytes_per_token
        }
        crate::cachespec::Scope::Sliding => scoped.full_bytes_per_token = f16.full_bytes_per_token,
    }
    let cost = &scoped;
    let kv = context_bytes(cost, context, card.sliding_window as u64);
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
    use crate::cachespec::TokenCost;

    fn card() -> ModelCard {
        let cost = |spec: &str, full, sliding| TokenCost {
            spec: spec.into(),
            label: spec.into(),
            full_bytes_per_token: full,
            sliding_bytes_per_token: sliding,
        };
        ModelCard {
            name: "m".into(),
            path: "m.gguf".into(),
            family: "gemma3".into(),
            format: "gguf",
            parameters: 1,
            layers: 2,
            full_layers: 1,
            sliding_layers: 1,
            shared_layers: 0,
            hidden_size: 8,
            vocab_size: 8,
            max_context: 4096,
            sliding_window: 512,
            kv_heads: 1,
            head_dim: 256,
            weights_bytes: 1000,
            supports_thinking: false,
            token_costs: vec![cost("f16", 1024, 1024), cost("tq3.5", 228, 228)],
            warnings: vec![],
        }
    }

    #[test]
    fn scoped_specs_keep_the_other_layer_kind_at_f16() {
        // 2048 tokens: full layers hold all of them, sliding layers their 512-token window.
        let all = estimate(card(), 2048, "tq3.5@all").unwrap();
        assert_eq!(all.kv_bytes, 2048 * 228 + 512 * 228);
        let full = estimate(card(), 2048, "tq3.5@full").unwrap();
        assert_eq!(full.kv_bytes, 2048 * 228 + 512 * 1024);
        assert_eq!(
            estimate(card(), 2048, "tq3.5").unwrap().kv_bytes,
            full.kv_bytes
        );
        let sliding = estimate(card(), 2048, "tq3.5@sliding").unwrap();
        assert_eq!(sliding.kv_bytes, 2048 * 1024 + 512 * 228);
        assert_eq!(sliding.total_bytes, sliding.kv_bytes + 1000);
        assert_eq!(
            estimate(card(), 2048, "q8").unwrap_err().code,
            "bad_cache_spec"
        );
    }
}
