//! Turns the format-neutral [`RawConfig`] that both parsers produce into the per-layer
//! [`ModelConfig`], checking every cross-field invariant on the way.

use std::collections::BTreeMap;

use super::{
    AttentionKind, Family, KvSource, LayerSpec, ModelConfig, MoeSpec, PleSpec, RopeKind, RopeSpec,
};
use crate::error::{EngineError, Result};

/// Explicit per-layer overrides (`per_layer_config` in transformers' spelling).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LayerOverride {
    pub head_dim: Option<usize>,
    pub n_kv_heads: Option<usize>,
}

/// What a parser extracted, before any per-layer resolution.
#[derive(Debug, Clone)]
pub(crate) struct RawConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub global_head_dim: Option<usize>,
    pub num_global_kv_heads: Option<usize>,
    pub overrides: BTreeMap<usize, LayerOverride>,
    pub layer_types: Vec<AttentionKind>,
    pub num_layers: usize,
    pub sliding_window: usize,
    /// One width per layer, or a single width for all.
    pub intermediate_size: Vec<usize>,
    pub double_wide_mlp: bool,
    pub k_eq_v: bool,
    pub num_kv_shared_layers: usize,
    pub ple: Option<PleSpec>,
    pub moe: Option<MoeSpec>,
    pub rope_sliding: RopeSpec,
    pub rope_full: RopeSpec,
    pub rms_norm_eps: f64,
    pub final_logit_softcap: Option<f64>,
    /// Gemma 3's `query_pre_attn_scalar`; ignored for Gemma 4 (scale 1.0).
    pub query_pre_attn_scalar: Option<f64>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub norm_weight_offset: f64,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// An image's soft tokens attend to each other both ways on sliding layers.
    pub image_bidirectional: bool,
    pub warnings: Vec<String>,
}

fn contradiction(msg: String) -> EngineError {
    EngineError::ConfigContradiction(msg)
}

/// Most decoder layers a config may declare (the deepest open models have ~130): per-layer
/// tables are built from this count before any tensor is looked at.
pub(crate) const MAX_LAYERS: usize = 1024;

/// Caps on the other sizes, far above any real model, so that byte counts derived from them
/// (a token's KV bytes, a layer's weights) cannot overflow.
const MAX_WIDTH: usize = 1 << 20;
const MAX_HEADS: usize = 1 << 12;
const MAX_HEAD_DIM: usize = 1 << 14;
const MAX_VOCAB: usize = 1 << 24;
const MAX_CONTEXT: usize = 1 << 28;

/// Refuses a layer count no model has, before anything is built per layer.
pub(crate) fn check_layer_count(n: usize) -> Result<()> {
    if n > MAX_LAYERS {
        return Err(contradiction(format!(
            "the config declares {n} layers (at most {MAX_LAYERS})"
        )));
    }
    Ok(())
}

/// Refuses a configuration value no model can run with: a NaN or an infinity (they reach the
/// logits as noise through some kernels, not as non-finite logits), or a RoPE base, scaling
/// factor, epsilon or soft cap that is negative or zero where the formula divides by it.
fn check_numbers(
    eps: f64,
    softcap: Option<f64>,
    norm_offset: f64,
    layers: &[LayerSpec],
) -> Result<()> {
    let mut values = vec![
        ("rms_norm_eps", eps, eps >= 0.0),
        ("norm weight offset", norm_offset, true),
    ];
    if let Some(c) = softcap {
        values.push(("final_logit_softcap", c, c > 0.0));
    }
    for (i, l) in layers.iter().enumerate() {
        let (theta, name) = (l.rope.theta, "rope_theta (rope_freq_base)");
        if !(theta.is_finite() && theta > 1.0) {
            return Err(contradiction(format!(
                "layer {i}: {name} is {theta}: it must be a finite number above 1"
            )));
        }
        match l.rope.kind {
            RopeKind::Default => {}
            RopeKind::Linear { factor } => {
                values.push(("rope scaling factor", factor, factor > 0.0))
            }
            RopeKind::Proportional {
                partial_rotary_factor: f,
            } => values.push(("partial_rotary_factor", f, (0.0..=1.0).contains(&f))),
        }
        values.push(("attention scale", l.attn_scale, l.attn_scale > 0.0));
    }
    for (name, v, in_range) in values {
        if !v.is_finite() || !in_range {
            return Err(contradiction(format!(
                "{name} is {v}: a model cannot run with it"
            )));
        }
    }
    Ok(())
}

impl RawConfig {
    /// Resolves every layer and checks the invariants the decoder relies on.
    pub fn resolve(mut self) -> Result<ModelConfig> {
        let l = self.num_layers;
        if l == 0 {
            return Err(contradiction("num_hidden_layers is 0".into()));
        }
        check_layer_count(l)?;
        let widths = self.intermediate_size.iter().copied().max().unwrap_or(0);
        for (name, v, cap) in [
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", widths, MAX_WIDTH),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("num_attention_heads", self.num_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_kv_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            (
                "global_head_dim",
                self.global_head_dim.unwrap_or(0),
                MAX_HEAD_DIM,
            ),
            (
                "num_global_key_value_heads",
                self.num_global_kv_heads.unwrap_or(0),
                MAX_HEADS,
            ),
            ("sliding_window", self.sliding_window, MAX_CONTEXT),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_CONTEXT,
            ),
            (
                "per-layer input width",
                self.ple.map_or(0, |p| p.dim),
                MAX_WIDTH,
            ),
            (
                "per-layer vocabulary",
                self.ple.map_or(0, |p| p.vocab_size),
                MAX_VOCAB,
            ),
            ("experts", self.moe.map_or(0, |m| m.num_experts), MAX_HEADS),
            (
                "expert width",
                self.moe.map_or(0, |m| m.expert_width),
                MAX_WIDTH,
            ),
        ] {
            if v > cap {
                return Err(contradiction(format!("{name} is {v} (at most {cap})")));
            }
        }
        for o in self.overrides.values() {
            if o.head_dim.unwrap_or(0) > MAX_HEAD_DIM || o.n_kv_heads.unwrap_or(0) > MAX_HEADS {
                return Err(contradiction(format!(
                    "a per-layer override is out of range: {o:?}"
                )));
            }
        }
        if self.layer_types.len() != l {
            return Err(contradiction(format!(
                "layer_types has {} entries but num_hidden_layers is {l}",
                self.layer_types.len()
            )));
        }
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("vocab_size", self.vocab_size),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(contradiction(format!("{name} is 0")));
            }
        }
        if self.intermediate_size.len() != 1 && self.intermediate_size.len() != l {
            return Err(contradiction(format!(
                "intermediate_size lists {} widths for {l} layers",
                self.intermediate_size.len()
            )));
        }
        if let Some(&bad) = self.overrides.keys().find(|&&i| i >= l) {
            return Err(contradiction(format!(
                "per_layer_config names layer {bad} but the model has {l} layers"
            )));
        }
        if self.family.facts().decoder().last_layer_full
            && self.layer_types[l - 1] != AttentionKind::Full
        {
            // transformers forces the last Gemma 4 layer to full attention; follow it, visibly.
            self.warnings.push(format!(
                "layer_types[{}] is sliding_attention; Gemma 4 forces the last layer to full_attention",
                l - 1
            ));
            self.layer_types[l - 1] = AttentionKind::Full;
        }
        let has_sliding = self.layer_types.contains(&AttentionKind::Sliding);
        if has_sliding && self.sliding_window == 0 {
            return Err(contradiction(
                "sliding layers present but sliding_window is 0 or missing".into(),
            ));
        }
        if self.num_kv_shared_layers >= l {
            return Err(contradiction(format!(
                "num_kv_shared_layers {} leaves no layer to produce K/V ({l} layers)",
                self.num_kv_shared_layers
            )));
        }
        if let Some(moe) = &self.moe {
            if moe.top_k == 0 || moe.top_k > moe.num_experts || moe.expert_width == 0 {
                return Err(contradiction(format!(
                    "MoE block with {} experts, top_k {}, expert width {}",
                    moe.num_experts, moe.top_k, moe.expert_width
                )));
            }
        }
        if !self.k_eq_v {
            if let Some(g) = self.num_global_kv_heads {
                if g != self.num_kv_heads {
                    self.warnings.push(format!(
                        "num_global_key_value_heads {g} ignored: it applies only with attention_k_eq_v"
                    ));
                }
            }
        }

        let first_shared = l - self.num_kv_shared_layers;
        let producer_of = |kind: AttentionKind| {
            (0..first_shared)
                .rev()
                .find(|&i| self.layer_types[i] == kind)
        };
        let traits = self.family.facts().decoder();
        let mut layers = Vec::with_capacity(l);
        for i in 0..l {
            let kind = self.layer_types[i];
            let full = kind == AttentionKind::Full;
            let ov = self.overrides.get(&i).cloned().unwrap_or_default();
            let head_dim = match (ov.head_dim, full.then_some(self.global_head_dim).flatten()) {
                (Some(a), Some(b)) if a != b => {
                    return Err(contradiction(format!(
                        "layer {i}: per_layer_config head_dim {a} ≠ global_head_dim {b}"
                    )))
                }
                (Some(a), _) => a,
                (None, Some(b)) => b,
                (None, None) => self.head_dim,
            };
            let k_eq_v = traits.extensions && full && self.k_eq_v;
            let n_kv_heads = if k_eq_v {
                match (ov.n_kv_heads, self.num_global_kv_heads) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(contradiction(format!(
                            "layer {i}: per_layer_config num_key_value_heads {a} ≠ num_global_key_value_heads {b}"
                        )))
                    }
                    (Some(a), _) | (None, Some(a)) => a,
                    (None, None) => self.num_kv_heads,
                }
            } else {
                ov.n_kv_heads.unwrap_or(self.num_kv_heads)
            };
            if head_dim == 0 || head_dim % 2 != 0 {
                return Err(contradiction(format!(
                    "layer {i}: head_dim {head_dim} must be even and non-zero"
                )));
            }
            if n_kv_heads == 0 || !self.num_heads.is_multiple_of(n_kv_heads) {
                return Err(contradiction(format!(
                    "layer {i}: {} query heads are not a multiple of {n_kv_heads} kv heads",
                    self.num_heads
                )));
            }
            let kv_source = if i < first_shared {
                KvSource::Own
            } else {
                match producer_of(kind) {
                    Some(p) => KvSource::Shared { producer: p },
                    None => {
                        return Err(contradiction(format!(
                            "layer {i} shares K/V but no earlier non-shared {kind:?} layer exists"
                        )))
                    }
                }
            };
            let base_width = if self.intermediate_size.len() == 1 {
                self.intermediate_size[0]
            } else {
                self.intermediate_size[i]
            };
            let shared = matches!(kv_source, KvSource::Shared { .. });
            let mlp_width = if self.double_wide_mlp && shared {
                base_width * 2
            } else {
                base_width
            };
            let attn_scale = if traits.unit_attention_scale {
                1.0
            } else {
                match self.query_pre_attn_scalar {
                    Some(s) if s > 0.0 => s.powf(-0.5),
                    _ => (head_dim as f64).powf(-0.5),
                }
            };
            layers.push(LayerSpec {
                index: i,
                kind,
                sliding_window: (!full).then_some(self.sliding_window),
                head_dim,
                n_heads: self.num_heads,
                n_kv_heads,
                rope: if full {
                    self.rope_full
                } else {
                    self.rope_sliding
                },
                kv_source,
                mlp_width,
                k_eq_v,
                v_norm: traits.v_norm,
                attn_scale,
            });
        }
        // A shared consumer reads its producer's cache, so their cache geometry must agree.
        for i in 0..l {
            if let KvSource::Shared { producer } = layers[i].kv_source {
                let (c, p) = (&layers[i], &layers[producer]);
                if c.head_dim != p.head_dim || c.n_kv_heads != p.n_kv_heads {
                    return Err(contradiction(format!(
                        "layer {i} (head_dim {}, {} kv heads) shares the cache of layer {producer} (head_dim {}, {} kv heads)",
                        c.head_dim, c.n_kv_heads, p.head_dim, p.n_kv_heads
                    )));
                }
            }
        }
        check_numbers(
            self.rms_norm_eps,
            self.final_logit_softcap,
            self.norm_weight_offset,
            &layers,
        )?;
        Ok(ModelConfig {
            family: self.family,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            rms_norm_eps: self.rms_norm_eps,
            final_logit_softcap: self.final_logit_softcap,
            max_position_embeddings: self.max_position_embeddings,
            sliding_window: if has_sliding { self.sliding_window } else { 0 },
            ple: self.ple,
            moe: self.moe,
            layer_scalar: traits.layer_scalar,
            norm_weight_offset: self.norm_weight_offset,
            tie_word_embeddings: self.tie_word_embeddings,
            bos_token_id: self.bos_token_id,
            pad_token_id: self.pad_token_id,
            eos_token_ids: self.eos_token_ids,
            image_bidirectional: self.image_bidirectional,
            layers,
            warnings: self.warnings,
        })
    }
}
