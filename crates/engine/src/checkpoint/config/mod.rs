//! Model configuration: parses Hugging Face `config.json` ([`hf`]) and GGUF metadata
//! ([`gguf`]) into one resolved, per-layer [`ModelConfig`]. Contradictions are errors;
//! unknown or ignored fields are kept as human-readable `warnings`.

pub mod gguf;
pub mod hf;
pub(crate) mod resolve;
pub mod rope;

use serde::{Deserialize, Serialize};

pub use rope::{RopeKind, RopeSpec};

use crate::contract::{AttentionKind, Family};

/// Where a layer's keys and values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvSource {
    /// The layer computes K/V and owns a cache.
    Own,
    /// The layer reads the cache of `producer` (Gemma 4 KV sharing), current step included.
    Shared {
        /// Index of the producing layer (same attention kind, earlier layer).
        producer: usize,
    },
}

/// Everything the decoder needs to know about one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerSpec {
    /// Layer index.
    pub index: usize,
    /// Sliding or full attention.
    pub kind: AttentionKind,
    /// `Some(W)` on sliding layers: key k visible to query q iff `0 ≤ q − k < W`.
    pub sliding_window: Option<usize>,
    /// Per-head dimension of q, k and v.
    pub head_dim: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (GQA groups).
    pub n_kv_heads: usize,
    /// RoPE of this layer.
    pub rope: RopeSpec,
    /// Own cache or shared from a producer layer.
    pub kv_source: KvSource,
    /// Dense MLP intermediate width.
    pub mlp_width: usize,
    /// V is the (v-normed) raw K projection; the layer has no `v_proj`.
    pub k_eq_v: bool,
    /// Weightless RMS norm on V (Gemma 4).
    pub v_norm: bool,
    /// Multiplier on q·kᵀ (1.0 for Gemma 4, `query_pre_attn_scalar^-½` for Gemma 3).
    pub attn_scale: f64,
}

/// Per-layer embeddings (Gemma 4 E-series).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PleSpec {
    /// Width `p` of each layer's input.
    pub dim: usize,
    /// Rows of `embed_tokens_per_layer`.
    pub vocab_size: usize,
}

/// Mixture-of-experts block (Gemma 4 26B-A4B), running beside the dense MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Number of experts.
    pub num_experts: usize,
    /// Experts used per token.
    pub top_k: usize,
    /// Intermediate width of one expert.
    pub expert_width: usize,
}

/// A fully resolved text-decoder configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Gemma 3 or Gemma 4.
    pub family: Family,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// RMS norm epsilon.
    pub rms_norm_eps: f64,
    /// `Some(c)`: logits = c·tanh(logits / c).
    pub final_logit_softcap: Option<f64>,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// Sliding window (0 if the model has no sliding layers).
    pub sliding_window: usize,
    /// Per-layer embeddings, if any.
    pub ple: Option<PleSpec>,
    /// Mixture of experts, if any.
    pub moe: Option<MoeSpec>,
    /// Each layer ends with `h *= layer_scalar` (Gemma 4).
    pub layer_scalar: bool,
    /// Added to every stored RMS-norm weight at load time (1.0 for Hugging Face Gemma 3
    /// checkpoints, whose norms compute `x·(1+w)`; 0.0 for Gemma 4 and GGUF files).
    pub norm_weight_offset: f64,
    /// The output projection is the token embedding.
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence id.
    pub bos_token_id: Option<u32>,
    /// The padding id: what the places of an image's soft tokens are looked up as.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// Ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// An image's soft tokens attend to each other both ways on sliding layers (transformers'
    /// `use_bidirectional_attention: "vision"`, the 26B and 31B); else causally (E2B, E4B).
    #[serde(default)]
    pub image_bidirectional: bool,
    /// One entry per layer, in order.
    pub layers: Vec<LayerSpec>,
    /// Unknown, ignored or defaulted fields, for the user to see.
    pub warnings: Vec<String>,
}

impl ModelConfig {
    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layers that own a KV cache (not consumers of a shared cache).
    pub fn cache_owning_layers(&self) -> impl Iterator<Item = &LayerSpec> {
        self.layers
            .iter()
            .filter(|l| matches!(l.kv_source, KvSource::Own))
    }
}
