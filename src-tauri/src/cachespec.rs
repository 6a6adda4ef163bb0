//! Cache policy strings as the UI sends them (`f16`, `f32@full`, `tq3.5`, `k4v3@sliding`)
//! parsed into the engine's [`PrecisionPolicy`], and the bytes one token costs per precision.
//! Precisions the engine cannot store yet are refused with a coded error, never guessed.

use kvlab_engine::config::{AttentionKind, KvSource, ModelConfig};
use kvlab_engine::kv::CacheSpec as EngineSpec;
use kvlab_engine::{KvPrecision, PrecisionPolicy};
use serde::Serialize;

use crate::error::CommandError;

/// Which layer kinds a spec applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    All,
    Full,
    Sliding,
}

/// A parsed policy string.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSpec {
    /// Bits per coordinate of keys and values (16/32 for dense, 2–4 for TurboQuant).
    pub key_bits: f32,
    pub value_bits: f32,
    pub scope: Scope,
}

fn parse_bits(s: &str) -> Option<f32> {
    let b: f32 = s.parse().ok()?;
    const ALLOWED: [f32; 5] = [2.0, 2.5, 3.0, 3.5, 4.0];
    ALLOWED.contains(&b).then_some(b)
}

impl CacheSpec {
    /// Parses `f32`, `f16`, `bf16`, `tq<b>` or `k<b>v<b>`, optionally `@all|@full|@sliding`.
    pub fn parse(spec: &str) -> Result<Self, CommandError> {
        let bad = || CommandError::new("bad_cache_spec", format!("unknown cache policy `{spec}`"));
        let dense = matches!(spec.trim(), "f32" | "f16" | "bf16");
        let (body, scope) = match spec.trim().split_once('@') {
            // As in the engine's grammar: TurboQuant without a suffix means the full layers.
            None if dense => (spec.trim(), Scope::All),
            None => (spec.trim(), Scope::Full),
            Some((b, "all")) => (b, Scope::All),
            Some((b, "full")) => (b, Scope::Full),
            Some((b, "sliding")) => (b, Scope::Sliding),
            Some(_) => return Err(bad()),
        };
        let (key_bits, value_bits) = match body {
            "f32" => (32.0, 32.0),
            "f16" => (16.0, 16.0),
            "bf16" => (16.5, 16.5),
            _ => {
                if let Some(b) = body.strip_prefix("tq") {
                    let b = parse_bits(b).ok_or_else(bad)?;
                    (b, b)
                } else if let Some(rest) = body.strip_prefix('k') {
                    let (k, v) = rest.split_once('v').ok_or_else(bad)?;
                    (
                        parse_bits(k).ok_or_else(bad)?,
                        parse_bits(v).ok_or_else(bad)?,
                    )
                } else {
                    return Err(bad());
                }
            }
        };
        Ok(Self {
            key_bits,
            value_bits,
            scope,
        })
    }
}

/// The policy a SPEC string asks for, starting from `current`. TurboQuant SPECs go through
/// the engine's own parser (layers outside their scope become f16); a dense SPEC may carry a
/// scope here (`f32@full`), which changes only that kind of layer.
pub fn policy_for(spec: &str, current: &PrecisionPolicy) -> Result<PrecisionPolicy, CommandError> {
    let parsed = CacheSpec::parse(spec)?;
    let (body, _) = spec.trim().split_once('@').unwrap_or((spec.trim(), ""));
    let dense = match body {
        "f32" => Some(KvPrecision::F32),
        "f16" => Some(KvPrecision::F16),
        "bf16" => Some(KvPrecision::BF16),
        _ => None,
    };
    let Some(p) = dense else {
        return EngineSpec::parse(spec)
            .map(|s| s.to_policy())
            .map_err(|e| CommandError::new("bad_cache_spec", e.to_string()));
    };
    let mut next = current.clone();
    next.overrides.clear();
    if matches!(parsed.scope, Scope::All | Scope::Full) {
        next.full = p;
    }
    if matches!(parsed.scope, Scope::All | Scope::Sliding) {
        next.sliding = p;
    }
    Ok(next)
}

/// A policy as a short label (`f16`, or `full f32 · sliding f16`).
pub fn policy_label(p: &PrecisionPolicy) -> String {
    if p.full == p.sliding {
        p.full.to_string()
    } else {
        format!("full {} · sliding {}", p.full, p.sliding)
    }
}

/// Bytes one key+value vector pair costs at `bits` per coordinate: dense floats, or
/// TurboQuant's packed indices plus one f16 norm per vector.
pub fn pair_bytes(head_dim: usize, key_bits: f32, value_bits: f32) -> u64 {
    let one = |bits: f32| -> u64 {
        if bits >= 16.0 {
            (head_dim * (bits as usize / 8)) as u64
        } else {
            ((head_dim as f32 * bits / 8.0).ceil() as u64) + 2
        }
    };
    one(key_bits) + one(value_bits)
}

/// Per-token KV bytes of one precision, split by layer kind (sliding layers stop growing
/// at their window).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenCost {
    pub spec: String,
    pub label: String,
    pub full_bytes_per_token: u64,
    pub sliding_bytes_per_token: u64,
}

/// The precisions the UI offers, in menu order.
pub const OFFERED: [(&str, &str); 8] = [
    ("f32", "FP32"),
    ("f16", "FP16"),
    ("tq4", "TQ 4"),
    ("tq3.5", "TQ 3.5"),
    ("tq3", "TQ 3"),
    ("tq2.5", "TQ 2.5"),
    ("tq2", "TQ 2"),
    ("k4v3", "TQ K4 V3"),
];

/// Bytes per token of every offered precision for `config`.
pub fn token_costs(config: &ModelConfig) -> Vec<TokenCost> {
    OFFERED
        .iter()
        .filter_map(|(spec, label)| {
            let s = CacheSpec::parse(spec).ok()?;
            let (mut full, mut sliding) = (0, 0);
            for l in config
                .layers
                .iter()
                .filter(|l| l.kv_source == KvSource::Own)
            {
                let b = l.n_kv_heads as u64 * pair_bytes(l.head_dim, s.key_bits, s.value_bits);
                match l.kind {
                    AttentionKind::Full => full += b,
                    AttentionKind::Sliding => sliding += b,
                }
            }
            Some(TokenCost {
                spec: (*spec).to_owned(),
                label: (*label).to_owned(),
                full_bytes_per_token: full,
                sliding_bytes_per_token: sliding,
            })
        })
        .collect()
}

/// KV bytes of a context of `tokens` under `cost` (sliding layers hold at most `window`).
pub fn context_bytes(cost: &TokenCost, tokens: u64, window: u64) -> u64 {
    let sliding_tokens = if window == 0 {
        tokens
    } else {
        tokens.min(window)
    };
    cost.full_bytes_per_token * tokens + cost.sliding_bytes_per_token * sliding_tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dense_turboquant_and_scopes() {
        let s = CacheSpec::parse("tq3.5").unwrap();
        assert_eq!((s.key_bits, s.value_bits, s.scope), (3.5, 3.5, Scope::Full));
        let s = CacheSpec::parse("tq3.5@all").unwrap();
        assert_eq!((s.key_bits, s.value_bits, s.scope), (3.5, 3.5, Scope::All));
        assert_eq!(CacheSpec::parse("f16").unwrap().scope, Scope::All);
        let s = CacheSpec::parse("k4v3@sliding").unwrap();
        assert_eq!(
            (s.key_bits, s.value_bits, s.scope),
            (4.0, 3.0, Scope::Sliding)
        );
        for bad in ["", "q8", "tq5", "tq3.7", "k4", "f16@half"] {
            assert_eq!(
                CacheSpec::parse(bad).unwrap_err().code,
                "bad_cache_spec",
                "{bad}"
            );
        }
    }

    #[test]
    fn turboquant_specs_become_engine_policies() {
        let base = PrecisionPolicy::uniform(KvPrecision::F16);
        let all = policy_for("tq3.5@all", &base).unwrap();
        assert_eq!(policy_label(&all), "tq3.5");
        // The engine's default scope is full-attention layers; sliding ones stay f16.
        let full = policy_for("tq3.5", &base).unwrap();
        assert_eq!(full.sliding, KvPrecision::F16);
        assert_eq!(full.full.to_string(), "tq3.5");
        assert_eq!(policy_for("tq9", &base).unwrap_err().code, "bad_cache_spec");
    }

    #[test]
    fn applying_a_scoped_spec_keeps_the_other_kind() {
        let base = PrecisionPolicy::uniform(KvPrecision::F32);
        let next = policy_for("f16@full", &base).unwrap();
        assert_eq!(
            (next.full, next.sliding),
            (KvPrecision::F16, KvPrecision::F32)
        );
        assert_eq!(policy_label(&next), "full f16 · sliding f32");
        assert_eq!(policy_label(&base), "f32");
    }

    #[test]
    fn pair_bytes_for_dense_and_packed_vectors() {
        // head_dim 256: f16 = 512 B per vector; 3.5 bits = 112 B + 2 B norm.
        assert_eq!(pair_bytes(256, 16.0, 16.0), 1024);
        assert_eq!(pair_bytes(256, 3.5, 3.5), 228);
        assert_eq!(pair_bytes(256, 4.0, 3.0), 130 + 98);
    }

    #[test]
    fn sliding_layers_stop_growing_at_the_window() {
        let c = TokenCost {
            spec: "f16".into(),
            label: "FP16".into(),
            full_bytes_per_token: 10,
            sliding_bytes_per_token: 100,
        };
        assert_eq!(context_bytes(&c, 100, 512), 100 * 10 + 100 * 100);
        assert_eq!(context_bytes(&c, 1000, 512), 1000 * 10 + 512 * 100);
        assert_eq!(context_bytes(&c, 1000, 0), 1000 * 110);
    }
}
