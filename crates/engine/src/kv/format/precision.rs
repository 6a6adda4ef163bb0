//! The precision a layer's keys and values are stored in, and what it costs: the one byte
//! formula of each precision ([`KvPrecision::token_bytes`], [`KvPrecision::fixed_bytes`],
//! [`KvPrecision::held_bytes`], and [`KvPrecision::bytes_after`] for a layer still holding
//! its first rows as f16 before it calibrates), which the storages, the pre-load estimate,
//! the model card and a switch's plan all use.

use serde::{Deserialize, Serialize};

use super::layer::{DenseType, LayerPrecision, SideSpec};
use crate::error::{EngineError, Result};

/// Storage precision of a layer's keys and values: both dense in one dtype, or split, each
/// side in its own format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvPrecision {
    /// Keys and values dense in this dtype (`kv::dense`).
    Dense(DenseType),
    /// Keys and values each in their own format (`kv::split`).
    Split(LayerPrecision),
}

/// Rows a TurboQuant or block side reserves at a time: its codes' chunks, and its f16 and
/// block rows (kv/split/ reserves by it).
pub const TQ_ROW_GRAIN: usize = kvlab_turboquant::DEFAULT_CHUNK_VECTORS;

impl KvPrecision {
    /// Dense 32-bit floats.
    pub const F32: KvPrecision = KvPrecision::Dense(DenseType::F32);
    /// Dense IEEE half precision.
    pub const F16: KvPrecision = KvPrecision::Dense(DenseType::F16);
    /// Dense bfloat16.
    pub const BF16: KvPrecision = KvPrecision::Dense(DenseType::Bf16);

    /// Short lowercase name (`f32`, `f16`, `bf16`, `split`); `Display` gives the full
    /// form (`tq4`, `k4v3+nc`, `q8_0/q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::Dense(d) => d.name(),
            KvPrecision::Split(_) => "split",
        }
    }

    /// True for dense float precisions.
    pub fn is_dense(self) -> bool {
        matches!(self, KvPrecision::Dense(_))
    }
}

impl std::fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvPrecision::Split(p) => write!(f, "{p}"),
            KvPrecision::Dense(d) => f.write_str(d.name()),
        }
    }
}

/// Rows a calibrating TurboQuant side (a centered coded side, `+qw` keys; docs/cache-options.md) holds
/// as f16 before it measures its offset and weights on all of them and codes them: what a
/// long first prefill gives it at once. Calibrated on a conversation's first few tokens
/// instead (a short first message), tq4+qw@all lost 2–3.4× as much for the rest of the
/// conversation (270M, Alice: 0.046 mean KLD calibrated on 512 rows, 0.060 on 256, 0.080
/// on 128, 0.158 on 1). At most a segment ([`crate::kv::SEGMENT_TOKENS`]), so a sliding window
/// never drops rows that wait. A layer given all its rows at once calibrates on them
/// without waiting, from [`MIN_CALIBRATION_ROWS`]: a switch (`KvCache::apply`: the user
/// asked for the smaller cache now, and no more rows are coming with it) and a comparison
/// over a shorter text.
pub const CALIBRATION_ROWS: usize = 512;

/// Fewest rows a layer calibrates on: below, their mean is no offset worth having.
pub const MIN_CALIBRATION_ROWS: usize = 16;

/// The rows a calibrating layer waits for in a model trained for `context` tokens:
/// [`CALIBRATION_ROWS`], or a sixteenth of a shorter context (16 at least, the fewest
/// centering takes), so that f16 never holds more than that share of a full context. Every
/// Gemma has 32k tokens or more; the tests' tiny models have 256, and wait for 16.
pub fn calibration_rows(context: usize) -> usize {
    (context / 16).clamp(MIN_CALIBRATION_ROWS, CALIBRATION_ROWS)
}

impl KvPrecision {
    /// Bytes one token's key and value take in one layer of `n_kv_heads × head_dim`: dense
    /// floats, or TurboQuant codes as the codec lays them out
    /// ([`kvlab_turboquant::bytes_per_vector`]).
    pub fn token_bytes(self, n_kv_heads: usize, head_dim: usize) -> Result<usize> {
        let side = |s: &SideSpec| -> Result<usize> {
            super::side_bytes(s, head_dim).map_err(|e| EngineError::invalid(format!("{self}: {e}")))
        };
        let pair = match self {
            KvPrecision::Dense(d) => 2 * head_dim * d.bytes(),
            KvPrecision::Split(p) => side(&p.key)? + side(&p.value)?,
        };
        Ok(n_kv_heads * pair)
    }

    /// Bytes a layer holds besides its tokens once it holds any: the per-head offsets of its
    /// centered TurboQuant sides and the channel weights of `+qw` keys (`head_dim` f32 each),
    /// and the first token of `+sink` block sides (`head_dim` f16 each; see docs/cache-options.md).
    pub fn fixed_bytes(self, n_kv_heads: usize, head_dim: usize) -> usize {
        let KvPrecision::Split(p) = self else {
            return 0;
        };
        let vectors = self.calibrating_vectors() * n_kv_heads * head_dim;
        vectors * std::mem::size_of::<f32>() + p.sink_bytes(n_kv_heads, head_dim)
    }

    /// Per head, the f32 vectors a layer measures when it calibrates: an offset per centered
    /// coded side, channel weights for `+qw` keys.
    fn calibrating_vectors(self) -> usize {
        let KvPrecision::Split(p) = self else {
            return 0;
        };
        let coded = [p.key, p.value]
            .iter()
            .filter(|s| s.spec().is_some())
            .count();
        let offsets = if p.center { coded } else { 0 };
        offsets + usize::from(p.weigh_keys && p.key.spec().is_some())
    }

    /// Whether some side of this precision calibrates on its first rows (and holds them as
    /// f16 until then, [`CALIBRATION_ROWS`]): a centered coded side or `+qw` keys.
    pub fn calibrates(self) -> bool {
        self.calibrating_vectors() > 0
    }

    /// Bytes one token takes while the layer waits to calibrate: each calibrating side as
    /// f16 rows, the others as [`KvPrecision::token_bytes`] has them.
    pub fn staged_token_bytes(self, n_kv_heads: usize, head_dim: usize) -> Result<usize> {
        let KvPrecision::Split(p) = self else {
            return self.token_bytes(n_kv_heads, head_dim);
        };
        let side = |s: &SideSpec, is_key: bool| -> Result<usize> {
            if p.calibrates(is_key) {
                return Ok(2 * head_dim);
            }
            super::side_bytes(s, head_dim).map_err(|e| EngineError::invalid(format!("{self}: {e}")))
        };
        Ok(n_kv_heads * (side(&p.key, true)? + side(&p.value, false)?))
    }

    /// The most tokens a layer of this precision holding `held` tokens has room for: a dense
    /// layer's spare ([`crate::kv::allocated_tokens`]), or, for TurboQuant and llama.cpp's
    /// sides, rows reserved [`TQ_ROW_GRAIN`] at a time. What a budget of allocated bytes
    /// counts ([`crate::memory::estimate_kv_allocated`]).
    pub fn room_tokens(self, held: usize) -> usize {
        match self {
            KvPrecision::Split(_) => held.div_ceil(TQ_ROW_GRAIN).max(1) * TQ_ROW_GRAIN,
            _ => crate::kv::allocated_tokens(held),
        }
    }

    /// Bytes a layer holding `tokens` tokens takes, filled from empty and waiting for
    /// [`CALIBRATION_ROWS`] ([`KvPrecision::bytes_after`]).
    pub fn held_bytes(self, n_kv_heads: usize, head_dim: usize, tokens: usize) -> Result<u64> {
        self.bytes_after(n_kv_heads, head_dim, tokens, tokens, CALIBRATION_ROWS)
    }

    /// Bytes a layer takes holding `held` tokens once `seen` were appended since it was
    /// empty (a sliding window holds fewer than it saw), calibrating on its first
    /// `calibration_rows` (saturating: the counts may come from a user, and a huge context
    /// must read as too much, never wrap to a small number). A layer cut back below
    /// `calibration_rows` after calibrating keeps its codes, and fewer bytes than this says.
    pub fn bytes_after(
        self,
        n_kv_heads: usize,
        head_dim: usize,
        held: usize,
        seen: usize,
        calibration_rows: usize,
    ) -> Result<u64> {
        if held == 0 {
            return Ok(0);
        }
        if self.calibrates() && seen < calibration_rows {
            // Nothing measured yet; a `+sink` block side beside the waiting one has its row.
            let per = self.staged_token_bytes(n_kv_heads, head_dim)? as u64;
            let sinks = match self {
                KvPrecision::Split(p) => p.sink_bytes(n_kv_heads, head_dim),
                _ => 0,
            };
            return Ok(per.saturating_mul(held as u64).saturating_add(sinks as u64));
        }
        let per = self.token_bytes(n_kv_heads, head_dim)? as u64;
        let fixed = self.fixed_bytes(n_kv_heads, head_dim) as u64;
        Ok(per.saturating_mul(held as u64).saturating_add(fixed))
    }
}

#[cfg(test)]
mod room_tests {
    use super::*;

    #[test]
    fn tq_rows_grow_by_the_codecs_chunk() {
        let tq = KvPrecision::Split(LayerPrecision::new(SideSpec::F16, SideSpec::F16));
        assert_eq!(tq.room_tokens(1), TQ_ROW_GRAIN);
        assert_eq!(tq.room_tokens(129), 2 * TQ_ROW_GRAIN);
        // A dense layer's room: what it holds and a bounded spare.
        assert_eq!(KvPrecision::F16.room_tokens(25), 48);
        assert_eq!(KvPrecision::F16.room_tokens(4096), 4096 + 512);
    }
}
