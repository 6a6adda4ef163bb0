//! Builds a [`ModelConfig`] from GGUF metadata: llama.cpp's `gemma3` keys (checked against
//! a real Gemma 3 270M file) and its `gemma4` keys (checked against llama.cpp's own converter
//! output, tests/gguf_converted.rs). What a Gemma 3 file cannot say (layer types,
//! `query_pre_attn_scalar`) is assumed as llama.cpp assumes it, with a warning.

use std::collections::{BTreeMap, HashMap};

use candle_core::quantized::gguf_file::{Content, Value};

use super::resolve::{LayerOverride, RawConfig};
use super::{AttentionKind, Family, ModelConfig, MoeSpec, PleSpec, RopeKind, RopeSpec};
use crate::error::{EngineError, Result};

/// `{arch}.*` keys this parser reads or knowingly ignores.
const KNOWN_SUFFIXES: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_swa",
    "attention.value_length_swa",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attention.shared_kv_layers",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.dimension_count",
    "rope.dimension_count_swa",
    "rope.scaling.type",
    "rope.scaling.factor",
    "final_logit_softcapping",
    "embedding_length_per_layer_input",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
];

struct Meta<'a> {
    md: &'a HashMap<String, Value>,
    arch: String,
}

fn num(v: &Value) -> Option<f64> {
    Some(match v {
        Value::U8(x) => *x as f64,
        Value::I8(x) => *x as f64,
        Value::U16(x) => *x as f64,
        Value::I16(x) => *x as f64,
        Value::U32(x) => *x as f64,
        Value::I32(x) => *x as f64,
        Value::U64(x) => *x as f64,
        Value::I64(x) => *x as f64,
        Value::F32(x) => *x as f64,
        Value::F64(x) => *x,
        Value::Bool(b) => u8::from(*b) as f64,
        _ => return None,
    })
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn err(&self, k: &str, what: &str) -> EngineError {
        EngineError::ConfigParse {
            origin: "GGUF metadata".into(),
            reason: format!("`{}`: {what}", self.key(k)),
        }
    }
    fn f64_opt(&self, k: &str) -> Result<Option<f64>> {
        match self.md.get(&self.key(k)) {
            None => Ok(None),
            Some(v) => num(v)
                .map(Some)
                .ok_or_else(|| self.err(k, "expected a number")),
        }
    }
    fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.f64_opt(k)? {
            Some(f) if f >= 0.0 && f.fract() == 0.0 => Ok(Some(f as usize)),
            Some(_) => Err(self.err(k, "expected a non-negative integer")),
            None => Ok(None),
        }
    }
    fn usize_req(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?.ok_or_else(|| self.err(k, "missing"))
    }
    /// A key that is either one integer or one integer per layer.
    fn per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<usize>>> {
        match self.md.get(&self.key(k)) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                if a.len() != n {
                    return Err(EngineError::ConfigContradiction(format!(
                        "`{}` has {} entries but block_count is {n}",
                        self.key(k),
                        a.len()
                    )));
                }
                a.iter()
                    .map(|v| {
                        num(v)
                            .filter(|f| *f >= 0.0)
                            .map(|f| f as usize)
                            .ok_or_else(|| self.err(k, "expected integers"))
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(Some)
            }
            Some(_) => Ok(Some(vec![self.usize_req(k)?; n])),
        }
    }
}

/// Gemma 3's layer kinds as llama.cpp's loader reads them: no sliding window means every layer
/// is full; else `sliding_window_pattern` is either a per-layer bool array (true = sliding)
/// or a period `p` (layer `i` full iff `i % p == p − 1`, every layer sliding for 0), 6 when
/// absent, which the file cannot contradict and so gets a warning.
fn gemma3_layer_types(
    m: &Meta<'_>,
    n: usize,
    window: usize,
    warnings: &mut Vec<String>,
) -> Result<Vec<AttentionKind>> {
    let kind = |sliding: bool| {
        if sliding {
            AttentionKind::Sliding
        } else {
            AttentionKind::Full
        }
    };
    if window == 0 {
        return Ok(vec![AttentionKind::Full; n]);
    }
    let key = "attention.sliding_window_pattern";
    if let Some(Value::Array(a)) = m.md.get(&m.key(key)) {
        if a.len() != n {
            return Err(EngineError::ConfigContradiction(format!(
                "`{}` has {} entries but block_count is {n}",
                m.key(key),
                a.len()
            )));
        }
        return a
            .iter()
            .map(|v| {
                num(v)
                    .map(|f| kind(f != 0.0))
                    .ok_or_else(|| m.err(key, "expected booleans"))
            })
            .collect();
    }
    let period = match m.usize_opt(key)? {
        Some(p) => p,
        None => {
            warnings.push(
                "GGUF carries no layer types: every 6th layer assumed full attention, the rest \
                 sliding, as llama.cpp does"
                    .into(),
            );
            6
        }
    };
    Ok((0..n)
        .map(|i| kind(period == 0 || i % period < period - 1))
        .collect())
}

fn token_id(md: &HashMap<String, Value>, key: &str) -> Option<u32> {
    md.get(key).and_then(num).map(|f| f as u32)
}

/// The file's end-of-sequence ids: `tokenizer.ggml.eos_token_id`, and the end-of-turn and
/// end-of-message ids llama.cpp's converter writes when a tokenizer has them.
fn end_ids(md: &HashMap<String, Value>) -> Vec<u32> {
    let mut ids: Vec<u32> = ["eos", "eot", "eom"]
        .iter()
        .filter_map(|k| token_id(md, &format!("tokenizer.ggml.{k}_token_id")))
        .collect();
    ids.dedup();
    ids
}

/// Parses the metadata (and tensor directory, for shapes) of a GGUF file.
pub fn config_from_gguf(content: &Content) -> Result<ModelConfig> {
    let arch = match content.metadata.get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(EngineError::ConfigParse {
                origin: "GGUF metadata".into(),
                reason: "general.architecture missing".into(),
            })
        }
    };
    let family = Family::from_gguf_arch(&arch)
        .ok_or_else(|| EngineError::UnsupportedArchitecture(arch.clone()))?;
    let m = Meta {
        md: &content.metadata,
        arch: arch.clone(),
    };
    let mut warnings = Vec::new();
    let prefix = format!("{arch}.");
    let mut unknown: Vec<&String> = content
        .metadata
        .keys()
        .filter(|k| {
            k.strip_prefix(&prefix)
                .is_some_and(|s| !KNOWN_SUFFIXES.contains(&s))
        })
        .collect();
    unknown.sort();
    for k in unknown {
        warnings.push(format!("unknown GGUF key `{k}` ignored"));
    }
    let n = m.usize_req("block_count")?;
    super::resolve::check_layer_count(n)?;
    let hidden = m.usize_req("embedding_length")?;
    let heads = m.usize_req("attention.head_count")?;
    let kv = m
        .per_layer("attention.head_count_kv", n)?
        .unwrap_or_else(|| vec![heads; n]);
    let ff = m
        .per_layer("feed_forward_length", n)?
        .ok_or_else(|| m.err("feed_forward_length", "missing"))?;
    let embd = content
        .tensor_infos
        .get("token_embd.weight")
        .ok_or_else(|| EngineError::MissingTensor {
            name: "token_embd.weight".into(),
            origin: "GGUF file".into(),
        })?;
    let vocab = match embd.shape.dims() {
        [v, h] if *h == hidden => *v,
        d => {
            return Err(EngineError::ShapeMismatch {
                name: "token_embd.weight".into(),
                expected: vec![0, hidden],
                actual: d.to_vec(),
            })
        }
    };
    let window = m.usize_opt("attention.sliding_window")?.unwrap_or(0);
    let eps = m
        .f64_opt("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-6);
    let theta_full = m.f64_opt("rope.freq_base")?.unwrap_or(1e6);
    let theta_swa = m.f64_opt("rope.freq_base_swa")?.unwrap_or(1e4);
    let mut overrides = BTreeMap::new();

    let raw = match family {
        Family::Gemma3 => {
            let layer_types = gemma3_layer_types(&m, n, window, &mut warnings)?;
            let head_dim = m
                .usize_opt("attention.key_length")?
                .unwrap_or(hidden / heads.max(1));
            let full_kind = match content.metadata.get(&m.key("rope.scaling.type")) {
                Some(Value::String(t)) if t == "linear" => RopeKind::Linear {
                    factor: m.f64_opt("rope.scaling.factor")?.unwrap_or(1.0),
                },
                Some(Value::String(t)) if t == "none" => RopeKind::Default,
                None => RopeKind::Default,
                Some(other) => {
                    return Err(m.err("rope.scaling.type", &format!("unsupported value {other:?}")))
                }
            };
            // llama.cpp's rule: query_pre_attn_scalar is head_dim, except for the 27B model
            // (62 layers) where it is hidden/heads. GGUF carries no key for it.
            let qpas = if n == 62 {
                warnings.push(
                    "GGUF carries no query_pre_attn_scalar: attention scale 1/√(hidden/heads) \
                     assumed for the 62-layer Gemma 3 27B, as llama.cpp does"
                        .into(),
                );
                (hidden / heads.max(1)) as f64
            } else {
                warnings.push(format!(
                    "GGUF carries no query_pre_attn_scalar: attention scale 1/√head_dim \
                     (1/√{head_dim}) assumed, as llama.cpp does"
                ));
                head_dim as f64
            };
            for (i, &k) in kv.iter().enumerate() {
                overrides.insert(
                    i,
                    LayerOverride {
                        head_dim: None,
                        n_kv_heads: Some(k),
                    },
                );
            }
            RawConfig {
                family,
                vocab_size: vocab,
                hidden_size: hidden,
                num_heads: heads,
                num_kv_heads: kv[0],
                head_dim,
                global_head_dim: None,
                num_global_kv_heads: None,
                overrides,
                layer_types,
                num_layers: n,
                sliding_window: window,
                intermediate_size: ff,
                double_wide_mlp: false,
                k_eq_v: false,
                num_kv_shared_layers: 0,
                ple: None,
                moe: None,
                rope_sliding: RopeSpec {
                    theta: theta_swa,
                    kind: RopeKind::Default,
                },
                rope_full: RopeSpec {
                    theta: theta_full,
                    kind: full_kind,
                },
                rms_norm_eps: eps,
                final_logit_softcap: m.f64_opt("final_logit_softcapping")?.filter(|c| *c > 0.0),
                query_pre_attn_scalar: Some(qpas),
                max_position_embeddings: m.usize_opt("context_length")?.unwrap_or(0),
                tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
                norm_weight_offset: 0.0, // llama.cpp's converter already added Gemma 3's +1
                bos_token_id: token_id(&content.metadata, "tokenizer.ggml.bos_token_id"),
                eos_token_ids: end_ids(&content.metadata),
                warnings,
            }
        }
        Family::Gemma4 => {
            let swa: Vec<bool> = match content.metadata.get(&m.key("attention.sliding_window_pattern")) {
                Some(Value::Array(a)) if a.len() == n => a
                    .iter()
                    .map(|v| num(v).map(|f| f != 0.0).ok_or_else(|| m.err("attention.sliding_window_pattern", "expected booleans")))
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
            for (i, &k) in kv.iter().enumerate() {
                overrides.insert(
                    i,
                    LayerOverride {
                        head_dim: None,
                        n_kv_heads: Some(k),
                    },
                );
            }
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
            warnings.push("Gemma 4 GGUF: full-layer RoPE assumed proportional with partial_rotary_factor 0.25".into());
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
        }
    };
    raw.resolve()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{TensorInfo, VersionedMagic};
    use candle_core::quantized::GgmlDType;

    /// A 6-layer Gemma 3 header with `extra` metadata.
    fn gemma3(extra: &[(&str, Value)]) -> Content {
        let mut md = HashMap::new();
        md.insert(
            "general.architecture".into(),
            Value::String("gemma3".into()),
        );
        for (k, v) in [
            ("block_count", 6),
            ("embedding_length", 64),
            ("feed_forward_length", 128),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("attention.key_length", 16),
            ("attention.sliding_window", 8),
        ] {
            md.insert(format!("gemma3.{k}"), Value::U32(v));
        }
        for (k, v) in extra {
            md.insert(format!("gemma3.{k}"), v.clone());
        }
        let mut tensor_infos = HashMap::new();
        tensor_infos.insert(
            "token_embd.weight".into(),
            TensorInfo {
                ggml_dtype: GgmlDType::F32,
                shape: (512, 64).into(),
                offset: 0,
            },
        );
        Content {
            magic: VersionedMagic::GgufV3,
            metadata: md,
            tensor_infos,
            tensor_data_offset: 0,
        }
    }

    fn kinds(c: &ModelConfig) -> String {
        c.layers
            .iter()
            .map(|l| match l.kind {
                AttentionKind::Sliding => 'S',
                AttentionKind::Full => 'F',
            })
            .collect()
    }

    #[test]
    fn gemma3_layer_kinds_as_llama_cpp_reads_them() {
        // No pattern: every 6th layer full, and the assumption is stated.
        let c = config_from_gguf(&gemma3(&[])).expect("config");
        assert_eq!(kinds(&c), "SSSSSF");
        assert!(c.warnings.iter().any(|w| w.contains("no layer types")));
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("query_pre_attn_scalar") && w.contains("1/√16")));
        assert_eq!(c.layers[0].attn_scale, 0.25);
        // A period.
        let c = config_from_gguf(&gemma3(&[(
            "attention.sliding_window_pattern",
            Value::U32(3),
        )]))
        .expect("config");
        assert_eq!(kinds(&c), "SSFSSF");
        assert!(!c.warnings.iter().any(|w| w.contains("no layer types")));
        // A per-layer bool array (true = sliding), as llama.cpp's loader also accepts.
        let bools = [true, false, true, true, false, false]
            .map(Value::Bool)
            .to_vec();
        let c = config_from_gguf(&gemma3(&[(
            "attention.sliding_window_pattern",
            Value::Array(bools),
        )]))
        .expect("config");
        assert_eq!(kinds(&c), "SFSSFF");
        // The wrong length is a clear contradiction, not a panic.
        let short = Value::Array(vec![Value::Bool(true); 4]);
        let err =
            config_from_gguf(&gemma3(&[("attention.sliding_window_pattern", short)])).unwrap_err();
        assert!(err.to_string().contains("4 entries"), "{err}");
        // Period 0: every layer sliding (llama.cpp's rule).
        let c = config_from_gguf(&gemma3(&[(
            "attention.sliding_window_pattern",
            Value::U32(0),
        )]))
        .expect("config");
        assert_eq!(kinds(&c), "SSSSSS");
    }
}
