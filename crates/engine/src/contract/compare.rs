//! What a comparison reports besides its panes' own events: the scores of two caches
//! against each other ([`CompareFidelity`]), each swept cache's point ([`SweepPoint`]) and a
//! cache fitted to a budget ([`FitTarget`] asked, [`FittedCache`] chosen).

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// Fidelity of the tested cache against the reference, and both caches' bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct CompareFidelity {
    /// Mean KL(reference ‖ test) per position, nats.
    pub mean_kld: f64,
    /// Largest per-position KL.
    pub max_kld: f64,
    /// Fraction of positions whose top token agrees.
    pub top1_agreement: f64,
    /// Positions scored.
    pub tokens_scored: usize,
    /// Perplexity of the reference's tokens under the test cache.
    pub ppl: f64,
    /// Perplexity under the reference cache.
    pub ppl_reference: f64,
    /// KV bytes each pane's cache held at its end.
    pub kv_bytes: [u64; 2],
}

/// One cache's point of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct SweepPoint {
    /// The cache (its canonical SPEC, or a label for a per-layer policy).
    pub kv: String,
    /// Bits per coordinate as held at the scored context (32 × bytes / f32 bytes).
    pub bits_per_coordinate: f64,
    /// Mean KL(reference ‖ cache) per scored position, nats.
    pub mean_kld: f64,
    /// The 99th percentile of the per-position KL divergence.
    pub p99_kld: f64,
    /// Fraction of positions whose top token agrees with the reference's.
    pub top1_agreement: f64,
    /// Perplexity of the text under this cache.
    pub ppl: f64,
    /// Perplexity under the reference cache.
    pub ppl_reference: f64,
    /// Positions scored.
    pub tokens_scored: usize,
}

/// A cache to fit to a budget after a comparison's sweep: each cache-owning layer's keys and
/// values probed alone on the reference's tokens, then the widths with the least predicted
/// loss whose cache holds at most `bytes` at `ctx` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct FitTarget {
    /// Bytes the whole cache may hold at `ctx` tokens.
    #[ts(type = "number")]
    pub bytes: u64,
    /// Tokens the budget is counted at (sliding layers hold their window).
    pub ctx: usize,
}

/// The cache a comparison fitted (then scored as a sweep point of the same `kv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct FittedCache {
    /// Its canonical SPEC, layers of their own included (`k4v3+qw+sink@all,5=k5v4+qw+sink`).
    pub spec: String,
    /// Bits per coordinate it holds at the target's context.
    pub bits_per_coordinate: f64,
    /// Bytes it holds at the target's context.
    #[ts(type = "number")]
    pub bytes: u64,
    /// The context of the budget.
    pub ctx: usize,
    /// The mean KLD its sides' probes predict (the sweep point then measures it).
    pub predicted_kld: f64,
}
