//! Cache policy strings as the UI sends them (`f16`, `f32@full`, `tq3.5@all`, `k4v3`),
//! parsed by the engine's SPEC grammar ([`kvlab_engine::kv::CacheSpec`]), their short labels,
//! and the per-token KV bytes of each precision the UI offers (the engine's byte formula).

use kvlab_engine::config::ModelConfig;
use kvlab_engine::kv::CacheSpec;
use kvlab_engine::memory::policy_token_bytes;
use kvlab_engine::PrecisionPolicy;
use serde::Serialize;

use crate::error::CommandError;

/// The policy a SPEC string stands for; a bad SPEC is a `bad_cache_spec` error.
pub fn policy_for(spec: &str) -> Result<PrecisionPolicy, CommandError> {
    CacheSpec::parse(spec)
        .map(|s| s.to_policy())
        .map_err(|e| CommandError::new("bad_cache_spec", e.to_string()))
}

/// A policy as a short label (`f16`, or `full f32 · sliding f16`).
pub fn policy_label(p: &PrecisionPolicy) -> String {
    if p.full == p.sliding {
        p.full.to_string()
    } else {
        format!("full {} · sliding {}", p.full, p.sliding)
    }
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

/// Bytes per token of every offered precision applied to all layers of `config`.
pub fn token_costs(config: &ModelConfig) -> Vec<TokenCost> {
    OFFERED
        .iter()
        .filter_map(|(spec, label)| {
            let policy = policy_for(&format!("{spec}@all")).ok()?;
            let bytes = policy_token_bytes(config, &policy).ok()?;
            Some(TokenCost {
                spec: (*spec).to_owned(),
                label: (*label).to_owned(),
                full_bytes_per_token: bytes.full,
                sliding_bytes_per_token: bytes.sliding,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_engine::KvPrecision;

    pub(crate) fn tiny_config() -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/engine/tests/fixtures/tiny_gemma3/config.json");
        kvlab_engine::config::hf::load_config(&path).expect("fixture config")
    }

    #[test]
    fn specs_become_engine_policies_with_labels() {
        let all = policy_for("tq3.5@all").unwrap();
        assert_eq!(policy_label(&all), "tq3.5");
        // TurboQuant defaults to the full layers; sliding ones stay f16.
        let full = policy_for("tq3.5").unwrap();
        assert_eq!(policy_label(&full), "full tq3.5 · sliding f16");
        // A scoped dense SPEC (the side panel's scope menu) keeps the other kind at f16.
        let f32_full = policy_for("f32@full").unwrap();
        assert_eq!(
            (f32_full.full, f32_full.sliding),
            (KvPrecision::F32, KvPrecision::F16)
        );
        assert_eq!(policy_label(&policy_for("f32@all").unwrap()), "f32");
        for bad in ["", "q8", "tq5", "tq3.7", "k4", "f16@half"] {
            assert_eq!(policy_for(bad).unwrap_err().code, "bad_cache_spec", "{bad}");
        }
    }

    #[test]
    fn offered_costs_follow_the_codec_layout() {
        // 4 sliding and 2 full layers of 2 KV heads × 16 dims.
        let costs = token_costs(&tiny_config());
        assert_eq!(costs.len(), OFFERED.len());
        let by = |spec: &str| costs.iter().find(|c| c.spec == spec).unwrap();
        // f16: 2 heads × (16 + 16 values) × 2 B = 128 B per layer.
        assert_eq!(
            (
                by("f16").sliding_bytes_per_token,
                by("f16").full_bytes_per_token
            ),
            (4 * 128, 2 * 128)
        );
        assert_eq!(by("f32").full_bytes_per_token, 2 * 256);
        // 3.5 bits × 16 dims = 7 B of codes + a 2 B norm per vector.
        assert_eq!(by("tq3.5").full_bytes_per_token, 2 * 2 * 2 * 9);
        // k4v3: 8 + 2 and 6 + 2 bytes.
        assert_eq!(by("k4v3").sliding_bytes_per_token, 4 * 2 * (10 + 8));
    }
}
