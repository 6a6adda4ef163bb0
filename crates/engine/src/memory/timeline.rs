//! The memory timeline: one serde [`MemorySample`] per tick (exact KV bytes, in all and per
//! conversation and tier, weights, process memory) and a [`SwitchEvent`] marker for each
//! change of a cache's precision or tier (a switch, a demotion, a spill, a restore, a drop),
//! switches made by the one function that switches a cache ([`switch_precision`]).

use std::time::Instant;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::{release_free_memory, ByteCount, KvBytes, RssProbe};
use crate::contract::{ConversationId, ConversationInfo, MarkerKind};
use crate::error::Result;
use crate::kv::{ConvertPlan, KvCache, KvMemoryReport, PrecisionPolicy};

/// A change of a cache's precision or tier, as a marker on the memory timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct SwitchEvent {
    /// What happened (a switch by its owner unless the pool acted).
    #[serde(default)]
    pub kind: MarkerKind,
    /// The conversation whose cache it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub conversation: Option<ConversationId>,
    /// When it happened, in milliseconds since the Unix epoch.
    pub t_ms: u64,
    /// The policy before, as its canonical SPEC ([`PrecisionPolicy::spec_string`]).
    pub from: String,
    /// After.
    pub to: String,
    /// Tokens converted (the context length at the switch).
    pub tokens: usize,
    /// KV bytes before the switch.
    pub kv_before: ByteCount,
    /// KV bytes after the switch.
    pub kv_after: ByteCount,
    /// Process resident bytes before (0 when unknown).
    pub rss_before: u64,
    /// Process resident bytes after (0 when unknown).
    pub rss_after: u64,
    /// Wall time of the conversion.
    pub duration_ms: f64,
}

impl SwitchEvent {
    /// This marker as `kind`, on `conversation`'s cache.
    pub fn of(mut self, kind: MarkerKind, conversation: &ConversationId) -> Self {
        self.kind = kind;
        self.conversation = Some(conversation.clone());
        self
    }

    /// The marker of a switch from policy `from` (whose cache was `before`) to `to` (now
    /// `after`), `tokens` converted in `duration_ms`, with the resident set `(before, after)`.
    pub fn between(
        (from, before): (&PrecisionPolicy, &KvMemoryReport),
        (to, after): (&PrecisionPolicy, &KvMemoryReport),
        tokens: usize,
        rss: (u64, u64),
        duration_ms: f64,
    ) -> Self {
        let bytes = |r: &KvMemoryReport| ByteCount {
            used: r.total.0 as u64,
            allocated: r.total.1 as u64,
        };
        SwitchEvent {
            kind: MarkerKind::Switch,
            conversation: None,
            t_ms: unix_ms(),
            from: from.spec_string(),
            to: to.spec_string(),
            tokens,
            kv_before: bytes(before),
            kv_after: bytes(after),
            rss_before: rss.0,
            rss_after: rss.1,
            duration_ms,
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One point of the memory timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct MemorySample {
    /// When it was taken: milliseconds since the Unix epoch (the app), or since the
    /// timeline started (benchmarks).
    pub t_ms: u64,
    /// Tokens processed so far (the next token's position).
    pub tokens_in_context: usize,
    /// Exact KV bytes.
    pub kv: KvBytes,
    /// Bytes of the model's weights as held.
    pub weights_bytes: u64,
    /// Process resident set (0 when the platform does not report it).
    pub rss_bytes: u64,
    /// The cache's policy at that moment, as its canonical SPEC (so a figure and its label
    /// always come from the same instant).
    pub cache_spec: String,
    /// Whether the cache's TurboQuant layers still hold their first tokens as f16, waiting
    /// for the model's calibration rows ([`KvCache::calibrating`]).
    #[serde(default)]
    pub calibrating: bool,
    /// Every conversation's cache: its tier and bytes, in memory and on disk (the timeline's
    /// stack by conversation and tier).
    #[serde(default)]
    pub conversations: Vec<ConversationInfo>,
}

impl MemorySample {
    /// Samples `cache`, stored as `policy`, and the process now.
    pub fn capture(
        t_ms: u64,
        cache: &KvCache,
        policy: &PrecisionPolicy,
        weights_bytes: usize,
        probe: &mut RssProbe,
    ) -> Self {
        Self {
            t_ms,
            tokens_in_context: cache.seq_len(),
            kv: KvBytes::of(cache),
            weights_bytes: weights_bytes as u64,
            rss_bytes: probe.rss_bytes(),
            cache_spec: policy.spec_string(),
            calibrating: cache.calibrating(),
            conversations: Vec::new(),
        }
    }
}

/// The one way a cache changes precision: applies `plan` ([`KvCache::apply`]: all or
/// nothing) to `cache`, stored until now as `from`, and returns the switch marker with bytes
/// and resident memory before and after.
pub fn switch_precision(
    cache: &mut KvCache,
    from: &PrecisionPolicy,
    plan: &ConvertPlan,
    probe: &mut RssProbe,
) -> Result<SwitchEvent> {
    let before = cache.memory();
    let rss_before = probe.rss_bytes();
    let t0 = Instant::now();
    cache.apply(plan)?;
    let duration_ms = t0.elapsed().as_secs_f64() * 1e3;
    // A cache that shrank hands its pages back, so resident memory drops visibly.
    release_free_memory();
    Ok(SwitchEvent::between(
        (from, &before),
        (&plan.policy, &cache.memory()),
        cache.seq_len(),
        (rss_before, probe.rss_bytes()),
        duration_ms,
    ))
}
