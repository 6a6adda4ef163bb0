//! The precision a layer's keys and values are stored in, and what it costs: the one byte
//! formula of each precision ([`KvPrecision::token_bytes`], [`KvPrecision::fixed_bytes`],
//! [`KvPrecision::held_bytes`]), which the storages, the pre-load estimate, the model card
//! and a switch's plan all use.

use serde::{Deserialize, Serialize};

use super::spec::{TqPrecision, TqSide};
use crate::error::{EngineError, Result};

/// Storage precision of a layer's keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KvPrecision {
    /// 32-bit floats (reference precision).
    F32,
    /// IEEE half precision (what llama.cpp stores by default).
    F16,
    /// bfloat16.
    BF16,
    /// TurboQuant codes (keys and values each quantized or dense f16), see
    /// [`super::spec::TqPrecision`].
    #[serde(rename = "turboquant")]
    TurboQuant(TqPrecision),
}

impl KvPrecision {
    /// Short lowercase name (`f32`, `f16`, `bf16`, `turboquant`); `Display` gives the full
    /// form (`tq4`, `k4v3+nc`).
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::BF16 => "bf16",
            KvPrecision::TurboQuant(_) => "turboquant",
        }
    }

    /// True for dense float precisions.
    pub fn is_dense(self) -> bool {
        !matches!(self, KvPrecision::TurboQuant(_))
    }
}

impl std::fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvPrecision::TurboQuant(p) => write!(f, "{p}"),
            other => f.write_str(other.name()),
        }
    }
}

impl KvPrecision {
    /// Bytes one token's key and value take in one layer of `n_kv_heads × head_dim`: dense
    /// floats, or TurboQuant codes as the codec lays them out
    /// ([`kvlab_turboquant::bytes_per_vector`]).
    pub fn token_bytes(self, n_kv_heads: usize, head_dim: usize) -> Result<usize> {
        let side = |s: &TqSide| -> Result<usize> {
            super::format::side_bytes(s, head_dim)
                .map_err(|e| EngineError::invalid(format!("{self}: {e}")))
        };
        let pair = match self {
            KvPrecision::F32 => head_dim * 8,
            KvPrecision::F16 | KvPrecision::BF16 => head_dim * 4,
            KvPrecision::TurboQuant(p) => side(&p.key)? + side(&p.value)?,
        };
        Ok(n_kv_heads * pair)
    }

    /// Bytes a layer holds besides its tokens once it holds any: the per-head offsets of its
    /// centered TurboQuant sides and the channel weights of `+qw` keys (`head_dim` f32 each;
    /// see `kv::spec`).
    pub fn fixed_bytes(self, n_kv_heads: usize, head_dim: usize) -> usize {
        let KvPrecision::TurboQuant(p) = self else {
            return 0;
        };
        let coded = [p.key, p.value]
            .iter()
            .filter(|s| s.spec().is_some())
            .count();
        let offsets = if p.center { coded } else { 0 };
        let weights = usize::from(p.weigh_keys && p.key.spec().is_some());
        (offsets + weights) * n_kv_heads * head_dim * std::mem::size_of::<f32>()
    }

    /// Bytes a layer holding `tokens` tokens takes (saturating: `tokens` may come from a
    /// user, and a huge context must read as too much, never wrap to a small number).
    pub fn held_bytes(self, n_kv_heads: usize, head_dim: usize, tokens: usize) -> Result<u64> {
        let per = self.token_bytes(n_kv_heads, head_dim)? as u64;
        let fixed = if tokens > 0 {
            self.fixed_bytes(n_kv_heads, head_dim) as u64
        } else {
            0
        };
        Ok(per.saturating_mul(tokens as u64).saturating_add(fixed))
    }
}
