//! Gemma 4 in GGUF files: llama.cpp's `gemma4` keys (checked against its own converter
//! output, tests/it/gguf_converted.rs).

use crate::checkpoint::config::gguf::{end_ids, num, token_id, GgufHeader};
use crate::checkpoint::config::resolve::RawConfig;
use crate::checkpoint::config::{MoeSpec, PleSpec, RopeKind, RopeSpec};
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};
use candle_core::quantized::gguf_file::Value;

/// The configuration a Gemma 4 GGUF file describes, from what every family's metadata says
/// alike (`h`) and Gemma 4's own keys and rules.
pub(crate) fn raw_config(h: GgufHeader<'_>) -> Result<RawConfig> {
    let GgufHeader {
        m,
        content,
        family,
        n,
        hidden,
        heads,
        kv,
        ff,
        vocab,
        window,
        eps,
        theta_full,
        theta_swa,
        overrides,
        mut warnings,
    } = h;
    Ok({
        let swa: Vec<bool> = match content
            .metadata
            .get(&m.key("attention.sliding_window_pattern"))
        {
            Some(Value::Array(a)) if a.len() == n => a
                .iter()
                .map(|v| {
                    num(v).map(|f| f != 0.0).ok_or_else(|| {
                        m.err("attention.sliding_window_pattern", "expected booleans")
                    })
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
        let k_eq_v = layer_types.iter().enumerate().any(|(i, t)| {
            *t == AttentionKind::Full
                && content
                    .tensor_infos
                    .contains_key(&format!("blk.{i}.attn_k.weight"))
                && !content
                    .tensor_infos
                    .contains_key(&format!("blk.{i}.attn_v.weight"))
        });
        let ple = match m.usize_opt("embedding_length_per_layer_input")? {
            Some(p) if p > 0 => Some(PleSpec {
                dim: p,
                vocab_size: content
                    .tensor_infos
                    .get("per_layer_token_embd.weight")
                    .map(|t| t.shape.dims()[0])
                    .unwrap_or(vocab),
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
        warnings.push(
            "Gemma 4 GGUF: full-layer RoPE assumed proportional with partial_rotary_factor 0.25"
                .into(),
        );
        RawConfig {
            family,
            vocab_size: vocab,
            hidden_size: hidden,
            num_heads: heads,
            num_kv_heads: kv[0],
            head_dim: swa_dim,
            global_head_dim: Some(full_dim),
            num_global_kv_heads: None,
            overrides,
            layer_types,
            num_layers: n,
            sliding_window: window,
            intermediate_size: ff,
            double_wide_mlp: false, // the per-layer feed_forward_length already carries it
            k_eq_v,
            num_kv_shared_layers: m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0),
            ple,
            moe,
            rope_sliding: RopeSpec {
                theta: theta_swa,
                kind: RopeKind::Default,
            },
            rope_full: RopeSpec {
                theta: theta_full,
                kind: RopeKind::Proportional {
                    partial_rotary_factor: 0.25,
                },
            },
            rms_norm_eps: eps,
            final_logit_softcap: m.f64_opt("final_logit_softcapping")?.filter(|c| *c > 0.0),
            query_pre_attn_scalar: None,
            max_position_embeddings: m.usize_opt("context_length")?.unwrap_or(0),
            tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
            norm_weight_offset: 0.0,
            bos_token_id: token_id(&content.metadata, "tokenizer.ggml.bos_token_id"),
            eos_token_ids: end_ids(&content.metadata),
            warnings,
        }
    })
}
