//! Parses a Hugging Face `config.json` (top level or nested `text_config`) for
//! `gemma3`/`gemma3_text`/`gemma4`/`gemma4_text`, accepting both the transformers spelling
//! (`per_layer_config`) and the hub spelling (`global_head_dim`, `num_global_key_value_heads`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value};

use super::resolve::{LayerOverride, RawConfig};
use super::{AttentionKind, Family, ModelConfig, MoeSpec, PleSpec, RopeKind, RopeSpec};
use crate::error::{EngineError, Result};

/// Keys that are read, or deliberately irrelevant to text inference, and so never warned about.
const KNOWN: &[&str] = &[
    "architectures",
    "model_type",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "initializer_range",
    "attention_dropout",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "attention_bias",
    "hidden_activation",
    "hidden_act",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "num_global_key_value_heads",
    "per_layer_config",
    "layer_types",
    "sliding_window",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "rope_theta",
    "rope_local_base_freq",
    "rope_scaling",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "query_pre_attn_scalar",
    "tie_word_embeddings",
    "use_bidirectional_attention",
    "attention_k_eq_v",
    "enable_moe_block",
    "num_experts",
    "top_k_experts",
    "moe_intermediate_size",
    "hidden_size_per_layer_input",
    "vocab_size_per_layer_input",
    "num_kv_shared_layers",
    "use_double_wide_mlp",
    "cache_implementation",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
];

/// Reads and parses a `config.json` file.
pub fn load_config(path: &Path) -> Result<ModelConfig> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut cfg = parse_config(&text, &path.display().to_string())?;
    // generation_config.json beside it lists every id that ends a turn (Gemma 4: <eos>,
    // <turn|>, <|tool_response>); config.json often names only <eos>.
    let generation = path.with_file_name("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(&generation) {
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => {
                let ids: Vec<u32> = match v.get("eos_token_id") {
                    Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .filter_map(|x| x.as_u64().map(|n| n as u32))
                        .collect(),
                    _ => Vec::new(),
                };
                for id in ids {
                    if !cfg.eos_token_ids.contains(&id) {
                        cfg.eos_token_ids.push(id);
                    }
                }
            }
            Err(e) => cfg.warnings.push(format!(
                "{} is not JSON ({e}); its stop ids are ignored",
                generation.display()
            )),
        }
    }
    Ok(cfg)
}

/// Parses `config.json` text; `origin` names it in error messages.
pub fn parse_config(text: &str, origin: &str) -> Result<ModelConfig> {
    let root: Value = serde_json::from_str(text).map_err(|e| EngineError::ConfigParse {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    let root = root.as_object().ok_or_else(|| EngineError::ConfigParse {
        origin: origin.to_string(),
        reason: "top level is not a JSON object".into(),
    })?;
    let (obj, outer) = match root.get("text_config") {
        Some(Value::Object(tc)) => (tc, Some(root)),
        Some(Value::Null) | None => (root, None),
        Some(_) => {
            return Err(EngineError::ConfigParse {
                origin: origin.to_string(),
                reason: "text_config is not an object".into(),
            })
        }
    };
    Fields { obj, outer, origin }.raw()?.resolve()
}

/// A JSON object with typed accessors whose errors name the field.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    outer: Option<&'a Map<String, Value>>,
    origin: &'a str,
}

impl Fields<'_> {
    fn err(&self, key: &str, what: &str) -> EngineError {
        EngineError::ConfigParse {
            origin: self.origin.to_string(),
            reason: format!("field `{key}`: {what}"),
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        match self.obj.get(key) {
            Some(Value::Null) | None => None,
            Some(v) => Some(v),
        }
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| as_usize(v).ok_or_else(|| self.err(key, "expected a non-negative integer")))
            .transpose()
    }

    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.err(key, "expected a number")))
            .transpose()
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.err(key, "expected true or false"))
            })
            .transpose()
    }

    fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.err(key, "expected a string")))
            .transpose()
    }

    fn family(&self) -> Result<Family> {
        let mt = self.str_opt("model_type")?.or_else(|| {
            self.outer
                .and_then(|o| o.get("model_type"))
                .and_then(Value::as_str)
        });
        match mt {
            Some(t) => Family::from_hf_model_type(t)
                .ok_or_else(|| EngineError::UnsupportedArchitecture(t.to_string())),
            None => Err(self.err("model_type", "missing")),
        }
    }

    fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let v = match self.get(key) {
            Some(v) => Some(v),
            None => self.outer.and_then(|o| o.get(key)).filter(|v| !v.is_null()),
        };
        let Some(v) = v else { return Ok(Vec::new()) };
        let one = |x: &Value| {
            as_usize(x)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.err(key, "expected a token id or a list of token ids"))
        };
        match v {
            Value::Array(a) => a.iter().map(one).collect(),
            x => Ok(vec![one(x)?]),
        }
    }

    fn layer_types(&self, n: usize, warnings: &mut Vec<String>) -> Result<Vec<AttentionKind>> {
        if let Some(v) = self.get("layer_types") {
            let arr = v
                .as_array()
                .ok_or_else(|| self.err("layer_types", "expected a list"))?;
            return arr
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("sliding_attention") => Ok(AttentionKind::Sliding),
                    Some("full_attention") => Ok(AttentionKind::Full),
                    _ => Err(self.err(
                        "layer_types",
                        &format!("entry {i} is {t}, expected sliding_attention or full_attention"),
                    )),
                })
                .collect();
        }
        let pattern = match self.usize_opt("sliding_window_pattern")? {
            Some(p) => Some(p),
            None => self.usize_opt("_sliding_window_pattern")?,
        };
        match pattern {
            Some(p) if p > 0 => {
                warnings.push(format!(
                    "layer_types missing: derived from sliding_window_pattern {p} (every {p}th layer full)"
                ));
                Ok((0..n)
                    .map(|i| {
                        if (i + 1) % p == 0 {
                            AttentionKind::Full
                        } else {
                            AttentionKind::Sliding
                        }
                    })
                    .collect())
            }
            _ => Err(self.err("layer_types", "missing (and no sliding_window_pattern)")),
        }
    }

    fn rope_from(&self, key: &str, v: &Value, warnings: &mut Vec<String>) -> Result<RopeSpec> {
        let m = v
            .as_object()
            .ok_or_else(|| self.err(key, "expected an object"))?;
        let theta = match m.get("rope_theta") {
            Some(t) => t
                .as_f64()
                .ok_or_else(|| self.err(key, "rope_theta is not a number"))?,
            None => return Err(self.err(key, "rope_theta missing")),
        };
        let num = |k: &str| m.get(k).and_then(Value::as_f64);
        let ty = m
            .get("rope_type")
            .or_else(|| m.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        for k in m.keys() {
            if ![
                "rope_theta",
                "rope_type",
                "type",
                "factor",
                "partial_rotary_factor",
            ]
            .contains(&k.as_str())
            {
                warnings.push(format!("{key}: unknown RoPE field `{k}` ignored"));
            }
        }
        let kind = match ty {
            "default" => RopeKind::Default,
            "linear" => RopeKind::Linear {
                factor: num("factor").ok_or_else(|| self.err(key, "linear RoPE needs `factor`"))?,
            },
            "proportional" => RopeKind::Proportional {
                partial_rotary_factor: num("partial_rotary_factor").unwrap_or(1.0),
            },
            other => return Err(self.err(key, &format!("unsupported rope_type `{other}`"))),
        };
        Ok(RopeSpec { theta, kind })
    }

    /// (sliding, full) RoPE from `rope_parameters` or the legacy `rope_theta` /
    /// `rope_local_base_freq` / `rope_scaling` fields.
    fn ropes(&self, warnings: &mut Vec<String>) -> Result<(RopeSpec, RopeSpec)> {
        if let Some(rp) = self.get("rope_parameters") {
            let m = rp
                .as_object()
                .ok_or_else(|| self.err("rope_parameters", "expected an object"))?;
            if m.contains_key("sliding_attention") || m.contains_key("full_attention") {
                let s = m
                    .get("sliding_attention")
                    .map(|v| self.rope_from("rope_parameters.sliding_attention", v, warnings))
                    .transpose()?;
                let f = m
                    .get("full_attention")
                    .map(|v| self.rope_from("rope_parameters.full_attention", v, warnings))
                    .transpose()?;
                return match (s, f) {
                    (Some(s), Some(f)) => Ok((s, f)),
                    (Some(x), None) | (None, Some(x)) => Ok((x, x)),
                    (None, None) => unreachable!("one of the keys is present"),
                };
            }
            let r = self.rope_from("rope_parameters", rp, warnings)?;
            return Ok((r, r));
        }
        let global = self.f64_opt("rope_theta")?.unwrap_or(1e6);
        let local = self.f64_opt("rope_local_base_freq")?.unwrap_or(1e4);
        let mut full = RopeSpec {
            theta: global,
            kind: RopeKind::Default,
        };
        if let Some(sc) = self.get("rope_scaling") {
            let mut m = sc
                .as_object()
                .ok_or_else(|| self.err("rope_scaling", "expected an object"))?
                .clone();
            m.insert("rope_theta".into(), Value::from(global));
            full = self.rope_from("rope_scaling", &Value::Object(m), warnings)?;
        }
        Ok((
            RopeSpec {
                theta: local,
                kind: RopeKind::Default,
            },
            full,
        ))
    }

    fn overrides(&self, warnings: &mut Vec<String>) -> Result<BTreeMap<usize, LayerOverride>> {
        let mut out = BTreeMap::new();
        let Some(v) = self.get("per_layer_config") else {
            return Ok(out);
        };
        let m = v
            .as_object()
            .ok_or_else(|| self.err("per_layer_config", "expected an object"))?;
        for (k, entry) in m {
            let idx: usize = k.parse().map_err(|_| {
                self.err(
                    "per_layer_config",
                    &format!("key `{k}` is not a layer index"),
                )
            })?;
            let e = entry.as_object().ok_or_else(|| {
                self.err("per_layer_config", &format!("entry `{k}` is not an object"))
            })?;
            let mut ov = LayerOverride::default();
            for (field, val) in e {
                let n = as_usize(val).ok_or_else(|| {
                    self.err(
                        "per_layer_config",
                        &format!("layer {k} field `{field}` is not an integer"),
                    )
                })?;
                match field.as_str() {
                    "head_dim" => ov.head_dim = Some(n),
                    "num_key_value_heads" => ov.n_kv_heads = Some(n),
                    other => warnings.push(format!(
                        "per_layer_config[{k}].{other} is not supported and was ignored"
                    )),
                }
            }
            out.insert(idx, ov);
        }
        Ok(out)
    }

    fn raw(&self) -> Result<RawConfig> {
        let family = self.family()?;
        let mut warnings = Vec::new();
        let known: BTreeSet<&str> = KNOWN.iter().copied().collect();
        for k in self.obj.keys() {
            if !known.contains(k.as_str()) {
                warnings.push(format!("unknown config field `{k}` ignored"));
            }
        }
        if self.bool_opt("attention_bias")? == Some(true) {
            return Err(self.err("attention_bias", "attention biases are not supported"));
        }
        let act = match self.str_opt("hidden_activation")? {
            Some(a) => Some(a),
            None => self.str_opt("hidden_act")?,
        };
        if let Some(a) = act {
            if !matches!(a, "gelu_pytorch_tanh" | "gelu_tanh") {
                return Err(self.err(
                    "hidden_activation",
                    &format!("`{a}` not supported (gelu_pytorch_tanh only)"),
                ));
            }
        }
        if self.f64_opt("attn_logit_softcapping")?.is_some() {
            return Err(self.err(
                "attn_logit_softcapping",
                "attention logit softcapping is not supported",
            ));
        }
        // "vision" touches only an image's own span (models/vision); text stays causal.
        let image_bidirectional = match self.get("use_bidirectional_attention") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::String(s)) if s == "vision" => true,
            Some(v) => {
                return Err(self.err(
                    "use_bidirectional_attention",
                    &format!("{v} is not supported for causal generation"),
                ))
            }
        };
        let num_layers = self.usize_req("num_hidden_layers")?;
        super::resolve::check_layer_count(num_layers)?;
        let hidden_size = self.usize_req("hidden_size")?;
        let vocab_size = self.usize_req("vocab_size")?;
        let num_heads = self.usize_req("num_attention_heads")?;
        let num_kv_heads = self.usize_opt("num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim = match self.usize_opt("head_dim")? {
            Some(d) => d,
            None => {
                warnings.push("head_dim missing: using hidden_size / num_attention_heads".into());
                hidden_size / num_heads.max(1)
            }
        };
        let intermediate_size = match self.get("intermediate_size") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    as_usize(v).ok_or_else(|| self.err("intermediate_size", "expected integers"))
                })
                .collect::<Result<Vec<_>>>()?,
            Some(_) => vec![self.usize_req("intermediate_size")?],
            None => return Err(self.err("intermediate_size", "missing")),
        };
        let layer_types = self.layer_types(num_layers, &mut warnings)?;
        let (rope_sliding, rope_full) = self.ropes(&mut warnings)?;
        let traits = family.facts().decoder();
        let extensions = traits.extensions;
        let ple = match self.usize_opt("hidden_size_per_layer_input")? {
            Some(p) if p > 0 && extensions => Some(PleSpec {
                dim: p,
                vocab_size: self
                    .usize_opt("vocab_size_per_layer_input")?
                    .unwrap_or(vocab_size),
            }),
            _ => None,
        };
        let moe = if extensions && self.bool_opt("enable_moe_block")? == Some(true) {
            Some(MoeSpec {
                num_experts: self.usize_req("num_experts")?,
                top_k: self.usize_req("top_k_experts")?,
                expert_width: self.usize_req("moe_intermediate_size")?,
            })
        } else {
            None
        };
        let query_pre_attn_scalar = self.f64_opt("query_pre_attn_scalar")?;
        if !traits.unit_attention_scale && query_pre_attn_scalar.is_none() {
            warnings.push("query_pre_attn_scalar missing: attention scale 1/sqrt(head_dim)".into());
        }
        let sliding_window = self.usize_opt("sliding_window")?.unwrap_or(0);
        Ok(RawConfig {
            family,
            vocab_size,
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            global_head_dim: if extensions {
                self.usize_opt("global_head_dim")?
            } else {
                None
            },
            num_global_kv_heads: if extensions {
                self.usize_opt("num_global_key_value_heads")?
            } else {
                None
            },
            overrides: self.overrides(&mut warnings)?,
            layer_types,
            num_layers,
            sliding_window,
            intermediate_size,
            double_wide_mlp: extensions && self.bool_opt("use_double_wide_mlp")?.unwrap_or(false),
            k_eq_v: extensions && self.bool_opt("attention_k_eq_v")?.unwrap_or(false),
            num_kv_shared_layers: if extensions {
                self.usize_opt("num_kv_shared_layers")?.unwrap_or(0)
            } else {
                0
            },
            ple,
            moe,
            rope_sliding,
            rope_full,
            rms_norm_eps: self.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            final_logit_softcap: self
                .f64_opt("final_logit_softcapping")?
                .filter(|c| *c > 0.0),
            query_pre_attn_scalar,
            max_position_embeddings: self.usize_opt("max_position_embeddings")?.unwrap_or(0),
            tie_word_embeddings: self.bool_opt("tie_word_embeddings")?.unwrap_or(true),
            norm_weight_offset: traits.norm_weight_offset,
            bos_token_id: self.token_ids("bos_token_id")?.first().copied(),
            pad_token_id: self.token_ids("pad_token_id")?.first().copied(),
            eos_token_ids: self.token_ids("eos_token_id")?,
            image_bidirectional,
            warnings,
        })
    }
}

fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    // Some exporters write integers as floats (e.g. `256.0`).
    v.as_f64()
        .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15)
        .map(|f| f as usize)
}
