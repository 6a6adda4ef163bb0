//! What a context will cost before it exists: KV bytes per token and per context under a
//! policy ([`estimate_kv_bytes`], from each precision's one byte formula), the cost table a
//! card shows ([`context_costs`]), and whether attached documents fit ([`document_fits`]).

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::checkpoint::config::ModelConfig;
use crate::contract::AttentionKind;
use crate::contract::TokenCost;
use crate::error::Result;
use crate::kv::SEGMENT_TOKENS;
use crate::kv::{calibration_rows, presets, PrecisionPolicy, MIN_CALIBRATION_ROWS};

/// KV bytes one token costs under `policy` over `config`'s cache-owning layers, per
/// attention kind (sliding layers stop growing once their window is full).
pub fn policy_token_bytes(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
) -> Result<KindTokenBytes> {
    let mut out = KindTokenBytes::default();
    for l in config.cache_owning_layers() {
        let b = policy
            .for_layer(l.index, l.kind)
            .token_bytes(l.n_kv_heads, l.head_dim)? as u64;
        match l.kind {
            AttentionKind::Sliding => out.sliding += b,
            AttentionKind::Full => out.full += b,
        }
    }
    Ok(out)
}

/// Per-token KV bytes split by attention kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KindTokenBytes {
    /// Over sliding-window layers.
    pub sliding: u64,
    /// Over full-attention layers.
    pub full: u64,
}

/// The KV bytes a context of `tokens` holds under `policy`, before anything is loaded:
/// full layers keep every token; sliding layers the last `window − 1` plus `rewind_margin`
/// (what [`KvCache`] keeps between steps once [`KvCache::set_rewind_margin`] is set); a
/// TurboQuant layer holds f16 rows until it has seen the model's
/// [`calibration_rows`](crate::kv::calibration_rows), then codes and its per-head offsets and
/// weights. Equal to a filled cache's bytes (tested).
pub fn estimate_kv_bytes(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
    tokens: usize,
    rewind_margin: usize,
) -> Result<u64> {
    let waits = calibration_rows(config.max_position_embeddings);
    kv_bytes(config, policy, tokens, rewind_margin, waits, false)
}

/// The KV bytes a cache of `tokens` tokens allocates, at most: [`estimate_kv_bytes`] with
/// each layer's held tokens widened to the room it may have ([`crate::kv::KvPrecision::room_tokens`]),
/// what a budget of allocated bytes must admit.
pub fn estimate_kv_allocated(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
    tokens: usize,
    rewind_margin: usize,
) -> Result<u64> {
    let waits = calibration_rows(config.max_position_embeddings);
    kv_bytes(config, policy, tokens, rewind_margin, waits, true)
}

/// [`estimate_kv_bytes`] of a cache given its tokens at once, which calibrates on them
/// without waiting ([`MIN_CALIBRATION_ROWS`] on): a switch, a comparison.
pub fn estimate_kv_bytes_at_once(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
    tokens: usize,
    rewind_margin: usize,
) -> Result<u64> {
    kv_bytes(
        config,
        policy,
        tokens,
        rewind_margin,
        MIN_CALIBRATION_ROWS,
        false,
    )
}

/// The bytes of [`estimate_kv_bytes`] for layers that calibrate on their first
/// `calibration_rows` tokens; with `room`, of the room each layer may allocate for its
/// tokens ([`estimate_kv_allocated`]).
fn kv_bytes(
    config: &ModelConfig,
    policy: &PrecisionPolicy,
    tokens: usize,
    rewind_margin: usize,
    calibration_rows: usize,
    room: bool,
) -> Result<u64> {
    let mut total = 0u64;
    for l in config.cache_owning_layers() {
        let precision = policy.for_layer(l.index, l.kind);
        // A coded sliding layer lets its old rows go a whole segment at a time: it may
        // allocate rows for a segment beyond its window.
        let coded = matches!(precision, crate::kv::KvPrecision::Split(_));
        let beyond = if room && coded { SEGMENT_TOKENS } else { 0 };
        let held = match l.sliding_window {
            Some(w) => tokens.min(
                w.saturating_sub(1)
                    .saturating_add(rewind_margin)
                    .saturating_add(beyond),
            ),
            None => tokens,
        };
        // Room for its rows, in the form they take after `tokens` (f16 while a TurboQuant
        // layer waits to calibrate).
        let held = if room {
            precision.room_tokens(held)
        } else {
            held
        };
        let bytes =
            precision.bytes_after(l.n_kv_heads, l.head_dim, held, tokens, calibration_rows)?;
        total = total.saturating_add(bytes);
    }
    Ok(total)
}

/// The per-token cost of every preset over `config`'s layers.
pub fn token_costs(config: &ModelConfig) -> Vec<TokenCost> {
    presets()
        .into_iter()
        .filter_map(|p| {
            let policy = crate::kv::CacheSpec::parse(&p.specs.all).ok()?.to_policy();
            let b = policy_token_bytes(config, &policy).ok()?;
            Some(TokenCost {
                label: p.label,
                spec: p.specs.all,
                full_bytes_per_token: b.full,
                sliding_bytes_per_token: b.sliding,
            })
        })
        .collect()
}

/// KV bytes under one preset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct ContextCost {
    /// The preset's label.
    pub label: String,
    /// Its canonical SPEC on all layers.
    pub spec: String,
    /// The bytes.
    pub bytes: u64,
}

/// The KV bytes of a context of `tokens` under every preset (all layers).
pub fn context_costs(
    config: &ModelConfig,
    tokens: usize,
    rewind_margin: usize,
) -> Vec<ContextCost> {
    costs_between(config, 0, tokens, rewind_margin)
}

/// Per preset: the bytes a context of `to` tokens holds minus those of `from` tokens. Where
/// `to` reaches the model's calibration rows both are counted calibrated: tokens that make a
/// TurboQuant cache code what it held as f16 cost what they weigh as codes, not the
/// (negative) difference the calibration makes.
fn costs_between(config: &ModelConfig, from: usize, to: usize, margin: usize) -> Vec<ContextCost> {
    let calibrated = to >= calibration_rows(config.max_position_embeddings);
    presets()
        .into_iter()
        .filter_map(|p| {
            let policy = crate::kv::CacheSpec::parse(&p.specs.all).ok()?.to_policy();
            let at = |t| {
                if calibrated {
                    kv_bytes(config, &policy, t, margin, 0, false).ok()
                } else {
                    estimate_kv_bytes(config, &policy, t, margin).ok()
                }
            };
            Some(ContextCost {
                label: p.label,
                spec: p.specs.all,
                bytes: at(to)?.saturating_sub(at(from)?),
            })
        })
        .collect()
}

/// What attaching a document costs before it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct DocumentFit {
    /// The document's tokens.
    pub tokens: usize,
    /// Extra KV bytes it adds to the context, under each preset.
    pub costs: Vec<ContextCost>,
    /// Context tokens after the documents up to this one and room for the answer.
    pub context_after: usize,
    /// Whether that still fits the model's context.
    pub fits: bool,
}

/// The cost of each of `documents` (token counts, in attachment order) added to a context of
/// `context_tokens`, each on top of the ones before it, leaving `reserve` tokens for the
/// answer.
pub fn document_fits(
    config: &ModelConfig,
    context_tokens: usize,
    documents: &[usize],
    reserve: usize,
    rewind_margin: usize,
) -> Vec<DocumentFit> {
    let mut at = context_tokens;
    documents
        .iter()
        .map(|&tokens| {
            let after = at + tokens;
            let fit = DocumentFit {
                tokens,
                costs: costs_between(config, at, after, rewind_margin),
                context_after: after + reserve,
                fits: after + reserve <= config.max_position_embeddings,
            };
            at = after;
            fit
        })
        .collect()
}
