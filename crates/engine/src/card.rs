//! The model card and the pre-load memory estimate: what a model is and what it will cost,
//! read from its files' headers alone ([`inspect`], before loading) and completed with the
//! measured weight bytes once loaded. One builder serves both, so the card shown before a
//! load and the one after it agree by construction.

use std::path::Path;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::budget::{MemoryBudget, MemoryFit, Plan};
use crate::checkpoint::config::KvSource;
use crate::checkpoint::weights::{checkpoint_dir, WeightStore};
use crate::checkpoint::{Checkpoint, LoadOptions};
use crate::contract::AttentionKind;
use crate::contract::WeightFormat;
use crate::contract::{HeadShape, LayerCounts, ModelCard};
use crate::error::Result;
use crate::kv::CacheSelection;
use crate::memory::{estimate_kv_bytes, token_costs};

/// A model read from its headers: the card and the open checkpoint it came from (whose
/// weights the decoder can then load without opening the files again).
#[derive(Debug)]
pub struct Inspection {
    /// The card (weights estimated).
    pub card: ModelCard,
    /// The checkpoint: its configuration, weight store and chat template.
    pub checkpoint: Checkpoint,
}

/// Reads the model at `path` (a `.gguf` file or a safetensors folder) without loading its
/// weights: configuration, parameter count, chat template, and the bytes the weights will
/// take when loaded with `opts`.
pub fn inspect(path: &Path, opts: &LoadOptions) -> Result<Inspection> {
    let checkpoint = Checkpoint::open(path, opts)?;
    let card = build(&checkpoint);
    Ok(Inspection { card, checkpoint })
}

/// The card of an open checkpoint.
fn build(ckpt: &Checkpoint) -> ModelCard {
    let (ws, path, config) = (ckpt.store(), ckpt.path(), ckpt.config());
    let mut counts = LayerCounts {
        sliding: 0,
        full: 0,
        shared: 0,
    };
    let mut heads: Vec<HeadShape> = Vec::new();
    for l in &config.layers {
        match (l.kv_source, l.kind) {
            (KvSource::Shared { .. }, _) => counts.shared += 1,
            (KvSource::Own, AttentionKind::Sliding) => counts.sliding += 1,
            (KvSource::Own, AttentionKind::Full) => counts.full += 1,
        }
        let shape = HeadShape {
            kind: l.kind,
            n_heads: l.n_heads,
            n_kv_heads: l.n_kv_heads,
            head_dim: l.head_dim,
        };
        if !heads.contains(&shape) {
            heads.push(shape);
        }
    }
    heads.sort_by_key(|h| h.kind == AttentionKind::Full);
    let name = path
        .file_stem()
        .or_else(|| path.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    ModelCard {
        name,
        path: path.display().to_string(),
        architecture: config.family,
        family_name: config.family.facts().display_name().to_string(),
        format: ws.format(),
        params: ws.param_count(),
        layers: config.num_layers(),
        layer_counts: counts,
        hidden_size: config.hidden_size,
        vocab_size: config.vocab_size,
        max_context: config.max_position_embeddings,
        calibration_rows: crate::kv::calibration_rows(config.max_position_embeddings),
        sliding_window: config.sliding_window,
        heads,
        weights_bytes: ws.held_bytes_estimate(),
        weights_dtype: match ws.format() {
            WeightFormat::Safetensors => ws.weights_choice().to_string(),
            WeightFormat::Gguf => ws
                .gguf_content()
                .map_or_else(|| "gguf".to_string(), gguf_file_type),
        },
        weights_measured: false,
        supports_thinking: config.family.supports_thinking(),
        has_chat_template: has_chat_template(ws),
        token_costs: token_costs(config),
        warnings: config.warnings.clone(),
        vision: None,
    }
}

/// A GGUF file's type as llama.cpp names it (`general.file_type`, llama.h's `llama_ftype`)
/// and the block types of its matrices (tensors of two or more dimensions), most tensors
/// first: `Q4_K_M: q5_0, q8_0, q4_k, q6_k`. A file without the key is named by its matrices
/// alone.
fn gguf_file_type(content: &candle_core::quantized::gguf_file::Content) -> String {
    const NAMES: [(u32, &str); 33] = [
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (7, "Q8_0"),
        (8, "Q5_0"),
        (9, "Q5_1"),
        (10, "Q2_K"),
        (11, "Q3_K_S"),
        (12, "Q3_K_M"),
        (13, "Q3_K_L"),
        (14, "Q4_K_S"),
        (15, "Q4_K_M"),
        (16, "Q5_K_S"),
        (17, "Q5_K_M"),
        (18, "Q6_K"),
        (19, "IQ2_XXS"),
        (20, "IQ2_XS"),
        (21, "Q2_K_S"),
        (22, "IQ3_XS"),
        (23, "IQ3_XXS"),
        (24, "IQ1_S"),
        (25, "IQ4_NL"),
        (26, "IQ3_S"),
        (27, "IQ3_M"),
        (28, "IQ2_S"),
        (29, "IQ2_M"),
        (30, "IQ4_XS"),
        (31, "IQ1_M"),
        (32, "BF16"),
        (36, "TQ1_0"),
        (37, "TQ2_0"),
        (38, "MXFP4_MOE"),
    ];
    let mut counts: Vec<(String, usize)> = Vec::new();
    for info in content.tensor_infos.values() {
        if info.shape.rank() < 2 {
            continue;
        }
        let name = block_type_name(info.ggml_dtype);
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mix = counts
        .into_iter()
        .map(|(n, _)| n)
        .collect::<Vec<_>>()
        .join(", ");
    let file_type = content
        .metadata
        .get("general.file_type")
        .and_then(|v| v.to_u32().ok())
        .map(|t| {
            NAMES
                .iter()
                .find(|(id, _)| *id == t)
                .map_or_else(|| format!("type {t}"), |(_, n)| n.to_string())
        });
    match file_type {
        Some(t) if mix.is_empty() || mix == t.to_lowercase() => t,
        Some(t) => format!("{t}: {mix}"),
        None => mix,
    }
}

/// ggml's lowercase name of a block type (`q4_k`, `q8_0`, `f32`).
fn block_type_name(dtype: candle_core::quantized::GgmlDType) -> String {
    let debug = format!("{dtype:?}").to_lowercase();
    // candle writes `Q4K` for ggml's `q4_k`.
    match debug.strip_suffix('k') {
        Some(stem) if !stem.ends_with('_') => format!("{stem}_k"),
        _ => debug,
    }
}

/// Whether the checkpoint carries a chat template: GGUF metadata `tokenizer.chat_template`,
/// or `chat_template` in a Hugging Face folder (`tokenizer_config.json`,
/// `chat_template.jinja` or `chat_template.json`). `None` when it cannot be told.
fn has_chat_template(ws: &WeightStore) -> Option<bool> {
    if let Some(c) = ws.gguf_content() {
        return Some(c.metadata.contains_key("tokenizer.chat_template"));
    }
    let dir = checkpoint_dir(ws.path());
    if dir.join("chat_template.jinja").exists() || dir.join("chat_template.json").exists() {
        return Some(true);
    }
    let cfg = std::fs::read(dir.join("tokenizer_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&cfg).ok()?;
    Some(v.get("chat_template").is_some())
}

/// The memory a model needs before it is loaded: its weights as they will be held plus the
/// KV cache of a context under a cache choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct MemoryEstimate {
    /// The model's card.
    pub card: ModelCard,
    /// Tokens in the context.
    pub context: usize,
    /// The cache, as its canonical SPEC.
    pub spec: String,
    /// Weight bytes (the card's).
    pub weights_bytes: u64,
    /// KV bytes of that context, the rewind margin included.
    pub kv_bytes: u64,
    /// Their sum.
    pub total_bytes: u64,
    /// Whether that fits the memory available now, and what would if it does not.
    pub fit: MemoryFit,
}

/// The estimate for the model at `path` loaded with `opts`, holding `context` tokens in the
/// cache `selection` picks, with sliding layers keeping `rewind_margin` extra tokens, and
/// whether it fits `budget`.
pub fn estimate(
    path: &Path,
    opts: &LoadOptions,
    context: usize,
    selection: &CacheSelection,
    rewind_margin: usize,
    budget: &MemoryBudget,
) -> Result<MemoryEstimate> {
    let spec = selection.spec()?;
    let policy = spec.to_policy();
    let Inspection { card, checkpoint } = inspect(path, opts)?;
    let config = checkpoint.config();
    let kv_bytes = estimate_kv_bytes(config, &policy, context, rewind_margin)?;
    let fit = Plan {
        allocated: false,
        config,
        weights_bytes: card.weights_bytes,
        held_kv_bytes: 0,
        context,
        policy: &policy,
        rewind_margin,
    }
    .fit(budget)?;
    Ok(MemoryEstimate {
        weights_bytes: card.weights_bytes,
        kv_bytes,
        total_bytes: card.weights_bytes.saturating_add(kv_bytes),
        context,
        spec: spec.to_string(),
        card,
        fit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvCache;
    use crate::models::common::Model;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    #[test]
    fn the_card_reads_the_configuration_without_weights() {
        let card = inspect(&fixture("tiny_gemma3"), &LoadOptions::default())
            .expect("inspect")
            .card;
        assert_eq!(card.format, WeightFormat::Safetensors);
        assert_eq!(card.architecture, crate::contract::Family::Gemma3);
        assert_eq!((card.layers, card.sliding_window), (6, 8));
        assert_eq!(
            card.layer_counts,
            LayerCounts {
                sliding: 4,
                full: 2,
                shared: 0
            }
        );
        assert_eq!(card.max_context, 256);
        assert_eq!(card.heads.len(), 2);
        assert_eq!((card.heads[0].n_kv_heads, card.heads[0].head_dim), (2, 16));
        assert_eq!(card.heads[0].kind, AttentionKind::Sliding);
        assert!(!card.weights_measured);
        // The fixture folder has no tokenizer_config.json: unknown, not "base".
        assert_eq!(card.has_chat_template, None);
        // Every preset these 16-wide heads can hold: not llama.cpp's 32-wide blocks.
        let fitting = crate::kv::presets().iter().filter(|p| !p.llama_cpp).count();
        assert_eq!(card.token_costs.len(), fitting);
        assert_eq!(card.family_name, "Gemma 3");
        // The card as the `loaded` event carries it, and back.
        let loaded = crate::contract::Event::Loaded { card: card.clone() };
        let v = serde_json::to_value(&loaded).unwrap();
        assert_eq!(v["type"], "loaded");
        assert_eq!(v["card"]["token_costs"][1]["spec"], "f16");
        assert_eq!(v["card"]["architecture"], "gemma3");
        assert_eq!(v["card"]["family_name"], "Gemma 3");
        assert_eq!(
            serde_json::from_value::<crate::contract::Event>(v).unwrap(),
            loaded
        );
    }

    #[test]
    fn held_weight_bytes_are_known_before_loading() {
        // f32 on CPU: the estimate from the headers equals what the loader then holds.
        for name in ["tiny_gemma3", "tiny_e", "tiny_dense", "tiny_moe"] {
            let path = fixture(name);
            let card = inspect(&path, &LoadOptions::default())
                .expect("inspect")
                .card;
            let model = Model::load(&path, &LoadOptions::default()).expect("load");
            assert_eq!(
                card.weights_bytes,
                model.weights_bytes() as u64,
                "{name}: estimate vs held"
            );
            assert_eq!(card.params * 4, card.weights_bytes, "{name}: all f32");
        }
    }

    #[test]
    fn the_estimate_equals_a_filled_cache_with_the_rewind_margin() {
        let path = fixture("tiny_e");
        let opts = LoadOptions::default();
        let model = Model::load(&path, &opts).expect("load");
        for spec in ["f16", "tq3.5@all", "k4v3@sliding"] {
            for (tokens, margin) in [(5, 0), (40, 0), (40, 16), (200, 256)] {
                let sel = CacheSelection::Spec(spec.into());
                let e = estimate(&path, &opts, tokens, &sel, margin, &MemoryBudget::default())
                    .expect("estimate");
                let mut cache: KvCache = model.new_cache(&sel.policy().unwrap()).expect("cache");
                cache.set_rewind_margin(margin);
                cache.fill_synthetic(tokens, 3).expect("fill");
                assert_eq!(
                    e.kv_bytes,
                    cache.memory().total.0 as u64,
                    "{spec}, {tokens} tokens, margin {margin}"
                );
                assert_eq!(e.total_bytes, e.kv_bytes + e.weights_bytes);
            }
        }
        let budget = MemoryBudget::default();
        let bad = estimate(
            &path,
            &opts,
            5,
            &CacheSelection::Spec("q8".into()),
            0,
            &budget,
        );
        assert!(bad.is_err());
    }
}
