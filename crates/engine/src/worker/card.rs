//! The model card of a loaded model: architecture, parameter count (read from the weight
//! file headers), layers by kind, and the KV bytes one token costs in each precision
//! (measured on a real storage, so new precisions report their true size).

use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::config::{AttentionKind, KvSource};
use crate::events::{KvBytesPerToken, LayerCounts, ModelCard};
use crate::kv::{new_storage, KvPrecision, StorageShape};
use crate::model::Model;

/// Precisions listed on the card.
pub const CARD_PRECISIONS: [KvPrecision; 3] =
    [KvPrecision::F32, KvPrecision::F16, KvPrecision::BF16];

/// Builds the card of `model`, loaded from `weights`.
pub fn model_card(name: &str, model: &Model, weights: &Path, supports_thinking: bool) -> ModelCard {
    let cfg = model.config();
    let mut counts = LayerCounts {
        sliding: 0,
        full: 0,
        shared: 0,
    };
    for l in &cfg.layers {
        match (l.kv_source, l.kind) {
            (KvSource::Shared { .. }, _) => counts.shared += 1,
            (KvSource::Own, AttentionKind::Sliding) => counts.sliding += 1,
            (KvSource::Own, AttentionKind::Full) => counts.full += 1,
        }
    }
    let kv_bytes_per_token = CARD_PRECISIONS
        .iter()
        .filter_map(|&p| {
            let mut per = KvBytesPerToken {
                precision: p,
                sliding: 0,
                full: 0,
            };
            for l in cfg.cache_owning_layers() {
                let b = token_bytes(p, l.n_kv_heads, l.head_dim, model)?;
                match l.kind {
                    AttentionKind::Sliding => per.sliding += b,
                    AttentionKind::Full => per.full += b,
                }
            }
            Some(per)
        })
        .collect();
    let architecture = match cfg.family {
        crate::config::Family::Gemma3 => "gemma3",
        crate::config::Family::Gemma4 => "gemma4",
    };
    // One header read serves both facts for GGUF (its tokenizer arrays are large).
    let gguf = read_gguf(weights);
    let (params, template) = match &gguf {
        Some(c) => (
            c.tensor_infos
                .values()
                .map(|t| t.shape.elem_count() as u64)
                .sum(),
            Some(c.metadata.contains_key("tokenizer.chat_template")),
        ),
        None => (
            count_params(weights).unwrap_or(0),
            has_chat_template(weights),
        ),
    };
    ModelCard {
        name: name.to_owned(),
        architecture: architecture.to_owned(),
        params,
        layers: cfg.num_layers(),
        layer_counts: counts,
        sliding_window: cfg.sliding_window,
        max_context: cfg.max_position_embeddings,
        vocab_size: cfg.vocab_size,
        kv_bytes_per_token,
        supports_thinking,
        has_chat_template: template,
        warnings: cfg.warnings.clone(),
    }
}

/// Bytes one token of K and V takes in a storage of precision `p`.
fn token_bytes(p: KvPrecision, n_kv_heads: usize, head_dim: usize, model: &Model) -> Option<usize> {
    let device = model.device().clone();
    let shape = StorageShape::new(n_kv_heads, head_dim, device.clone());
    let mut s = new_storage(p, shape).ok()?;
    let zeros = Tensor::zeros((n_kv_heads, 1, head_dim), candle_core::DType::F32, &device).ok()?;
    s.append(&zeros, &zeros).ok()?;
    Some(s.bytes_used())
}

/// The header of a `.gguf` file (`None` for other files or unreadable ones).
fn read_gguf(path: &Path) -> Option<candle_core::quantized::gguf_file::Content> {
    if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    candle_core::quantized::gguf_file::Content::read(&mut f).ok()
}

/// Whether the checkpoint carries a chat template: GGUF metadata `tokenizer.chat_template`,
/// or `chat_template` in a Hugging Face `tokenizer_config.json` / `chat_template.jinja`.
pub fn has_chat_template(weights: &Path) -> Option<bool> {
    if let Some(c) = read_gguf(weights) {
        return Some(c.metadata.contains_key("tokenizer.chat_template"));
    }
    let dir = if weights.is_dir() {
        weights
    } else {
        weights.parent()?
    };
    if dir.join("chat_template.jinja").exists() || dir.join("chat_template.json").exists() {
        return Some(true);
    }
    let cfg = std::fs::read(dir.join("tokenizer_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&cfg).ok()?;
    Some(v.get("chat_template").is_some())
}

/// Parameters in a `.gguf`, `.safetensors`, sharded index, or model directory.
pub fn count_params(weights: &Path) -> Option<u64> {
    if weights.is_dir() {
        let index = weights.join("model.safetensors.index.json");
        if index.exists() {
            return count_params(&index);
        }
        let mut total = 0;
        for e in std::fs::read_dir(weights).ok()? {
            let p = e.ok()?.path();
            if p.extension().and_then(|x| x.to_str()) == Some("safetensors") {
                total += safetensors_params(&p)?;
            }
        }
        return Some(total);
    }
    let name = weights.file_name()?.to_str()?;
    if let Some(content) = read_gguf(weights) {
        return Some(
            content
                .tensor_infos
                .values()
                .map(|t| t.shape.elem_count() as u64)
                .sum(),
        );
    }
    if name.ends_with(".index.json") {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(weights).ok()?).ok()?;
        let mut shards: Vec<PathBuf> = v
            .get("weight_map")?
            .as_object()?
            .values()
            .filter_map(|s| s.as_str().map(|s| weights.with_file_name(s)))
            .collect();
        shards.sort();
        shards.dedup();
        return shards.iter().map(|s| safetensors_params(s)).sum();
    }
    safetensors_params(weights)
}

/// Sum of element counts in a safetensors header (the data is not read).
fn safetensors_params(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    // A header over 100 MB is not a safetensors file.
    if len > 100 << 20 {
        return None;
    }
    let mut header = vec![0u8; len];
    f.read_exact(&mut header).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
    Some(
        v.as_object()?
            .iter()
            .filter(|(k, _)| k.as_str() != "__metadata__")
            .filter_map(|(_, t)| {
                t.get("shape")?
                    .as_array()?
                    .iter()
                    .map(|d| d.as_u64())
                    .product::<Option<u64>>()
            })
            .sum(),
    )
}
