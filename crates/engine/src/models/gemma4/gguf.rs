//! Gemma 4 in GGUF files: llama.cpp's `gemma4` keys (checked against its own converter
//! output, tests/it/gguf_converted.rs).

use crate::checkpoint::config::gguf::{num, GgufHeader};
use crate::checkpoint::config::resolve::RawConfig;
use crate::checkpoint::config::{MoeSpec, PleSpec, RopeKind};
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};
use candle_core::quantized::gguf_file::Value;

/// The configuration a Gemma 4 GGUF file describes, from what every family's metadata says
/// alike (`h`) and Gemma 4's own keys and rules.
pub(crate) fn raw_config(mut h: GgufHeader<'_>) -> Result<RawConfig> {
    let m = h.meta().clone();
    let content = h.content();
    let n = h.layers();
    let swa: Vec<bool> = match content
        .metadata
        .get(&m.key("attention.sliding_window_pattern"))
    {
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|v| {
                num(v)
                    .map(|f| f != 0.0)
                    .ok_or_else(|| m.err("attention.sliding_window_pattern", "expected booleans"))
            })
            .collect::<Result<_>>()?,
        Some(Value::Array(a)) => {
            return Err(EngineError::ConfigContradiction(format!(
                "`gemma4.attention.sliding_window_pattern` has {} entries but block_count is {n}",
                a.len()
            )))
        }
        _ => return Err(m.err("attention.sliding_window_pattern", "missing or not a list")),
    };
    let layer_types = swa
        .iter()
        .map(|&s| {
            if s {
                AttentionKind::Sliding
            } else {
                AttentionKind::Full
            }
        })
        .collect::<Vec<_>>();
    let full_dim = m.usize_req("attention.key_length")?;
    let swa_dim = m.usize_opt("attention.key_length_swa")?.unwrap_or(full_dim);
    // k_eq_v: the full layers come without attn_v in llama.cpp's conversion.
    let has = |name: String| content.tensor_infos.contains_key(&name);
    let k_eq_v = layer_types.iter().enumerate().any(|(i, t)| {
        *t == AttentionKind::Full
            && has(format!("blk.{i}.attn_k.weight"))
            && !has(format!("blk.{i}.attn_v.weight"))
    });
    let ple = match m.usize_opt("embedding_length_per_layer_input")? {
        Some(p) if p > 0 => Some(PleSpec {
            dim: p,
            vocab_size: content
                .tensor_infos
                .get("per_layer_token_embd.weight")
                .map(|t| t.shape.dims()[0])
                .unwrap_or(h.vocab()),
        }),
        _ => None,
    };
    let moe = match m.usize_opt("expert_count")? {
        Some(e) if e > 0 => Some(MoeSpec {
            num_experts: e,
            top_k: m.usize_req("expert_used_count")?,
            expert_width: m.usize_req("expert_feed_forward_length")?,
        }),
        _ => None,
    };
    let shared = m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0);
    h.warn(
        "Gemma 4 GGUF: full-layer RoPE assumed proportional with partial_rotary_factor 0.25".into(),
    );
    let mut c = h.into_config()?;
    c.layer_types = layer_types;
    c.head_dim = swa_dim;
    c.global_head_dim = Some(full_dim);
    // The per-layer feed_forward_length already carries the double-wide MLP.
    c.k_eq_v = k_eq_v;
    c.num_kv_shared_layers = shared;
    // GGUF files do not say how images attend; llama.cpp (mtmd) lets them attend both ways
    // but on E2B and E4B, the models with per-layer inputs, as transformers' configs do.
    c.image_bidirectional = ple.is_none();
    c.ple = ple;
    c.moe = moe;
    c.rope_full.kind = RopeKind::Proportional {
        partial_rotary_factor: 0.25,
    };
    Ok(c)
}
