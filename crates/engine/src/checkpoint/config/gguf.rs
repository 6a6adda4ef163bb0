//! Builds a [`ModelConfig`] from GGUF metadata: llama.cpp's `gemma3` keys (checked against
//! a real Gemma 3 270M file) and its `gemma4` keys (checked against llama.cpp's own converter
//! output, tests/it/gguf_converted.rs). What a Gemma 3 file cannot say (layer types,
//! `query_pre_attn_scalar`) is assumed as llama.cpp assumes it, with a warning.

use std::collections::{BTreeMap, HashMap};

use candle_core::quantized::gguf_file::{Content, Value};

use super::resolve::{LayerOverride, RawConfig};
use super::{Family, ModelConfig, RopeKind, RopeSpec};
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

#[derive(Clone)]
pub(crate) struct Meta<'a> {
    pub(crate) md: &'a HashMap<String, Value>,
    arch: String,
}

/// What every family's GGUF metadata says alike, read once by [`config_from_gguf`]; a
/// family's own keys and rules are read by its `gguf::raw_config` (in `models/<family>/`),
/// through these accessors, onto the config [`GgufHeader::into_config`] makes of the rest.
pub(crate) struct GgufHeader<'a> {
    m: Meta<'a>,
    content: &'a Content,
    family: Family,
    /// Layers.
    n: usize,
    hidden: usize,
    heads: usize,
    /// KV heads per layer.
    kv: Vec<usize>,
    /// Feed-forward width per layer.
    ff: Vec<usize>,
    vocab: usize,
    window: usize,
    eps: f64,
    theta_full: f64,
    theta_swa: f64,
    overrides: BTreeMap<usize, LayerOverride>,
    warnings: Vec<String>,
}

impl<'a> GgufHeader<'a> {
    /// The `{arch}.*` keys.
    pub(crate) fn meta(&self) -> &Meta<'a> {
        &self.m
    }

    /// The whole header: every key, and the tensor directory.
    pub(crate) fn content(&self) -> &'a Content {
        self.content
    }

    /// The family `general.architecture` names.
    pub(crate) fn family(&self) -> Family {
        self.family
    }

    /// Layers (`block_count`).
    pub(crate) fn layers(&self) -> usize {
        self.n
    }

    /// The residual width (`embedding_length`).
    pub(crate) fn hidden(&self) -> usize {
        self.hidden
    }

    /// Query heads (`attention.head_count`).
    pub(crate) fn heads(&self) -> usize {
        self.heads
    }

    /// The vocabulary, as the token embedding's rows.
    pub(crate) fn vocab(&self) -> usize {
        self.vocab
    }

    /// The sliding window (0: none).
    pub(crate) fn window(&self) -> usize {
        self.window
    }

    /// Notes a warning the card will show.
    pub(crate) fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    /// The configuration of what every family's file says alike: the family's own fields at
    /// their plainest (no layer kinds, `hidden / heads` per head, default RoPE on both kinds
    /// of layer, no PLE, experts or KV sharing), which its `raw_config` then sets.
    pub(crate) fn into_config(self) -> Result<RawConfig> {
        let m = &self.m;
        let md = &self.content.metadata;
        Ok(RawConfig {
            family: self.family,
            vocab_size: self.vocab,
            hidden_size: self.hidden,
            num_heads: self.heads,
            num_kv_heads: self.kv.first().copied().unwrap_or(self.heads),
            head_dim: self.hidden / self.heads.max(1),
            global_head_dim: None,
            num_global_kv_heads: None,
            overrides: self.overrides,
            layer_types: Vec::new(),
            num_layers: self.n,
            sliding_window: self.window,
            intermediate_size: self.ff,
            double_wide_mlp: false,
            k_eq_v: false,
            num_kv_shared_layers: 0,
            ple: None,
            moe: None,
            rope_sliding: RopeSpec {
                theta: self.theta_swa,
                kind: RopeKind::Default,
            },
            rope_full: RopeSpec {
                theta: self.theta_full,
                kind: RopeKind::Default,
            },
            rms_norm_eps: self.eps,
            final_logit_softcap: m.f64_opt("final_logit_softcapping")?.filter(|c| *c > 0.0),
            query_pre_attn_scalar: None,
            max_position_embeddings: m.usize_opt("context_length")?.unwrap_or(0),
            tie_word_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            // llama.cpp's converter already added Gemma 3's +1 to the norms.
            norm_weight_offset: 0.0,
            bos_token_id: token_id(md, "tokenizer.ggml.bos_token_id"),
            pad_token_id: token_id(md, "tokenizer.ggml.padding_token_id"),
            eos_token_ids: end_ids(md),
            image_bidirectional: false,
            warnings: self.warnings,
        })
    }
}

pub(crate) fn num(v: &Value) -> Option<f64> {
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
    pub(crate) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub(crate) fn err(&self, k: &str, what: &str) -> EngineError {
        EngineError::ConfigParse {
            origin: "GGUF metadata".into(),
            reason: format!("`{}`: {what}", self.key(k)),
        }
    }
    pub(crate) fn f64_opt(&self, k: &str) -> Result<Option<f64>> {
        match self.md.get(&self.key(k)) {
            None => Ok(None),
            Some(v) => num(v)
                .map(Some)
                .ok_or_else(|| self.err(k, "expected a number")),
        }
    }
    pub(crate) fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.f64_opt(k)? {
            Some(f) if f >= 0.0 && f.fract() == 0.0 => Ok(Some(f as usize)),
            Some(_) => Err(self.err(k, "expected a non-negative integer")),
            None => Ok(None),
        }
    }
    pub(crate) fn usize_req(&self, k: &str) -> Result<usize> {
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

pub(crate) fn token_id(md: &HashMap<String, Value>, key: &str) -> Option<u32> {
    md.get(key).and_then(num).map(|f| f as u32)
}

/// The file's end-of-sequence ids: `tokenizer.ggml.eos_token_id`, and the end-of-turn and
/// end-of-message ids llama.cpp's converter writes when a tokenizer has them.
pub(crate) fn end_ids(md: &HashMap<String, Value>) -> Vec<u32> {
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
    // Every family's files give each layer its own KV head count.
    let overrides = kv
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let o = LayerOverride {
                head_dim: None,
                n_kv_heads: Some(k),
            };
            (i, o)
        })
        .collect();

    let header = GgufHeader {
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
        warnings,
    };
    crate::models::gguf_config(header)?.resolve()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::AttentionKind;
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
