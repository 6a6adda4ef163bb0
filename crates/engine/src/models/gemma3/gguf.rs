//! Gemma 3 in GGUF files: what llama.cpp's `gemma3` keys say (checked against a real
//! 270M file) and what they cannot (layer types, `query_pre_attn_scalar`), assumed as
//! llama.cpp assumes it, with a warning.

use crate::checkpoint::config::gguf::{num, GgufHeader, Meta};
use crate::checkpoint::config::resolve::RawConfig;
use crate::checkpoint::config::RopeKind;
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};
use candle_core::quantized::gguf_file::Value;

/// The configuration a Gemma 3 GGUF file describes, from what every family's metadata says
/// alike (`h`) and Gemma 3's own keys and rules.
pub(crate) fn raw_config(mut h: GgufHeader<'_>) -> Result<RawConfig> {
    let m = h.meta().clone();
    let (n, hidden, heads) = (h.layers(), h.hidden(), h.heads());
    let mut warnings = Vec::new();
    let layer_types = gemma3_layer_types(&m, n, h.window(), &mut warnings)?;
    let head_dim = m
        .usize_opt("attention.key_length")?
        .unwrap_or(hidden / heads.max(1));
    let full_kind = match h.content().metadata.get(&m.key("rope.scaling.type")) {
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
    for w in warnings {
        h.warn(w);
    }
    let mut c = h.into_config()?;
    c.layer_types = layer_types;
    c.head_dim = head_dim;
    c.rope_full.kind = full_kind;
    c.query_pre_attn_scalar = Some(qpas);
    Ok(c)
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
