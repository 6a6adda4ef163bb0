//! What a model is, as the front ends see it: the card ([`ModelCard`]) and the names it is
//! written in (family, attention kind, checkpoint format, a preset's cost per token). Data
//! only: the engine fills it (`card::inspect`), the app, CLI and server show it.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// A model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Gemma 3 text decoder.
    Gemma3,
    /// Gemma 4 text decoder (E2B, E4B, 31B, 26B-A4B).
    Gemma4,
}

/// Attention pattern of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    /// Local attention over the last `sliding_window` tokens (query included).
    Sliding,
    /// Causal attention over the whole sequence.
    Full,
}

/// The two checkpoint formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// One `.gguf` file (config, tokenizer and tensors in one).
    Gguf,
    /// A Hugging Face folder: `config.json` beside `.safetensors` shards.
    Safetensors,
}

/// What one token costs under one preset (applied to all layers), per attention kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct TokenCost {
    /// The preset's label (`TQ 3.5`).
    pub label: String,
    /// Its canonical SPEC on all layers.
    pub spec: String,
    /// Bytes per token over the full-attention layers (these grow with every token).
    pub full_bytes_per_token: u64,
    /// Bytes per token over the sliding layers (these stop growing at their window).
    pub sliding_bytes_per_token: u64,
}

/// How many layers of each attention kind a model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct LayerCounts {
    /// Sliding-window layers that own a cache.
    pub sliding: usize,
    /// Full-attention layers that own a cache.
    pub full: usize,
    /// Layers that read another layer's cache (Gemma 4 KV sharing).
    pub shared: usize,
}

/// The attention heads of the layers of one kind (Gemma 4's full layers have wider heads
/// than its sliding ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct HeadShape {
    /// Which layers.
    pub kind: AttentionKind,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
}

/// What a model is: shown by the app and printed by the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct ModelCard {
    /// Display name (file or repository name).
    pub name: String,
    /// The weights' path (file or folder).
    pub path: String,
    /// Gemma 3 or Gemma 4.
    pub architecture: Family,
    /// The family as people write it (`Gemma 4`).
    pub family_name: String,
    /// GGUF or safetensors.
    pub format: WeightFormat,
    /// Parameters of the language model, counted from the weight headers.
    pub params: u64,
    /// Decoder layers.
    pub layers: usize,
    /// Layers by attention kind.
    pub layer_counts: LayerCounts,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Maximum context in tokens.
    pub max_context: usize,
    /// Tokens a TurboQuant cache that centers or weighs its keys (every menu preset) holds
    /// as f16 before it calibrates on all of them and codes them (`kv::calibration_rows`).
    pub calibration_rows: usize,
    /// Sliding window (0 without sliding layers).
    pub sliding_window: usize,
    /// Head shapes, one entry per distinct shape, sliding layers first.
    pub heads: Vec<HeadShape>,
    /// Bytes the weights take in memory as loaded: quantized matrices at their block size,
    /// the rest in `weights_dtype`. Estimated from the headers before loading, measured
    /// after (see `weights_measured`).
    pub weights_bytes: u64,
    /// How the weights are held: for a safetensors checkpoint the weights choice (`q4_k`,
    /// `q8_0`, `f16`, `bf16`, `f32`); for a GGUF file its own type as llama.cpp names it and
    /// the block types of its matrices, most used first (`Q4_K_M: q5_0, q8_0, q4_k, q6_k`),
    /// which it is held in as stored.
    pub weights_dtype: String,
    /// True once `weights_bytes` is what the loaded model holds.
    pub weights_measured: bool,
    /// Whether the model has a thinking mode.
    pub supports_thinking: bool,
    /// Whether the checkpoint ships a chat template (false: a base model, best prompted
    /// with plain text; `None`: unknown).
    pub has_chat_template: Option<bool>,
    /// What one token of KV cache costs under each preset.
    pub token_costs: Vec<TokenCost>,
    /// Config fields that were ignored, defaulted or assumed.
    pub warnings: Vec<String>,
    /// How the model reads images (`None`: it reads none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub vision: Option<VisionCard>,
}

/// How a loaded model reads images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct VisionCard {
    /// Where the tower came from (the checkpoint, or the mmproj file's path).
    pub source: String,
    /// Bytes of the tower's weights as held.
    pub weights_bytes: u64,
    /// Soft tokens an image takes at most (the processor's budget).
    pub max_soft_tokens: usize,
}
