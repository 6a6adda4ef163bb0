//! Engine-level decode benchmark (`kvlab bench decode`, cargo feature `bench`): prefill N
//! tokens, then decode M more through the engine's sampler (greedy unless told otherwise),
//! timing both phases separately, and optionally a per-operation profile of each phase
//! ([`crate::profile`]). Reports figures; asserts nothing.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::kv::{KvMemoryReport, PrecisionPolicy};
use crate::model::{Logits, Model};
use crate::profile;
use crate::sampling::{Sampler, SamplingParams};

/// The context a benchmark prefills.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BenchContext {
    /// This many deterministic filler ids (BOS first).
    Filler(usize),
    /// These token ids (a real text).
    Tokens(Vec<u32>),
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeBenchSpec {
    /// The context to prefill.
    pub context: BenchContext,
    /// Tokens to decode after the prefill.
    pub decode: usize,
    /// Prefill chunk size (bounds activation memory).
    pub prefill_chunk: usize,
    /// KV storage precision per layer.
    pub policy: PrecisionPolicy,
    /// How each decoded token is picked.
    pub sampling: SamplingParams,
    /// Record a per-operation profile of each phase (slightly slower).
    pub profile: bool,
}

/// One kind of operation's share of a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileRow {
    /// What ran (`matmul q4_k`, `attention`, `vocab projection`, `sampling`, …).
    pub op: String,
    /// Exclusive milliseconds per token of the phase.
    pub ms_per_token: f64,
    /// Calls per token.
    pub calls_per_token: f64,
    /// Fraction of the phase's wall time.
    pub share: f64,
}

/// Measured figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeBenchReport {
    /// Tokens prefilled.
    pub prefill_tokens: usize,
    /// Wall time of the prefill.
    pub prefill_secs: f64,
    /// Tokens decoded.
    pub decode_tokens: usize,
    /// Wall time of the decode.
    pub decode_secs: f64,
    /// KV cache bytes at the end.
    pub memory: KvMemoryReport,
    /// Where the prefill's time went, largest first, when profiled; the last row, `other`,
    /// is the time outside every span.
    pub prefill_profile: Option<Vec<ProfileRow>>,
    /// Where the decode's time went (the same form).
    pub decode_profile: Option<Vec<ProfileRow>>,
}

impl DecodeBenchReport {
    /// Prefill throughput.
    pub fn prefill_tok_per_s(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill_secs.max(1e-9)
    }
    /// Decode throughput.
    pub fn decode_tok_per_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_secs.max(1e-9)
    }
}

/// Deterministic ordinary-token ids (no model-specific text needed), uniform over
/// `[1000, vocab)` so no control token is hit.
fn filler_ids(n: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(1000).max(1) as u64;
    let mut rng = kvlab_turboquant::Rng::new(0, 0xBE4C);
    (0..n)
        .map(|_| (1000 + rng.below(span)).min(vocab.saturating_sub(1) as u64) as u32)
        .collect()
}

/// Prefills `spec.context` in chunks, then decodes `spec.decode` tokens with the engine's
/// sampler.
pub fn bench_decode(model: &Model, spec: &DecodeBenchSpec) -> Result<DecodeBenchReport> {
    let ids = match &spec.context {
        BenchContext::Tokens(p) if !p.is_empty() => p.clone(),
        BenchContext::Tokens(_) => return Err(EngineError::invalid("an empty benchmark prompt")),
        BenchContext::Filler(n) => {
            let mut ids = filler_ids((*n).max(1), model.config().vocab_size);
            if let Some(b) = model.config().bos_token_id {
                ids[0] = b;
            }
            ids
        }
    };
    let mut sampler =
        Sampler::new(spec.sampling).map_err(|e| EngineError::invalid(e.to_string()))?;
    let mut cache = model.new_cache(&spec.policy)?;
    if spec.profile {
        profile::enable(model.device());
    }
    let t0 = Instant::now();
    let mut last = None;
    for chunk in ids.chunks(spec.prefill_chunk.max(1)) {
        last = Some(model.forward(chunk, &mut cache, Logits::Last)?);
    }
    let mut next = match last {
        Some(l) => sample(&mut sampler, &l)?,
        None => 0,
    };
    let prefill_secs = t0.elapsed().as_secs_f64();
    let prefill_profile = spec
        .profile
        .then(|| rows(profile::finish(), prefill_secs, ids.len()));
    if spec.profile {
        profile::enable(model.device());
    }
    let t1 = Instant::now();
    for _ in 0..spec.decode {
        let l = model.forward(&[next], &mut cache, Logits::Last)?;
        next = sample(&mut sampler, &l)?;
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    let decode_profile = spec
        .profile
        .then(|| rows(profile::finish(), decode_secs, spec.decode));
    Ok(DecodeBenchReport {
        prefill_tokens: ids.len(),
        prefill_secs,
        decode_tokens: spec.decode,
        decode_secs,
        memory: cache.memory(),
        prefill_profile,
        decode_profile,
    })
}

/// The next token as generation picks it: logits to the host, then the sampler.
fn sample(sampler: &mut Sampler, logits: &candle_core::Tensor) -> Result<u32> {
    let _span = profile::span("sampling");
    let host = logits.to_vec1::<f32>()?;
    sampler
        .sample(&host)
        .map_err(|e| EngineError::invalid(e.to_string()))
}

/// A phase's profile per token, with the unattributed rest as a final `other` row.
fn rows(totals: Vec<(&'static str, profile::Row)>, secs: f64, tokens: usize) -> Vec<ProfileRow> {
    let per = tokens.max(1) as f64;
    let wall = secs.max(1e-9);
    let attributed: f64 = totals.iter().map(|(_, r)| r.time.as_secs_f64()).sum();
    let mut out: Vec<ProfileRow> = totals
        .into_iter()
        .map(|(op, r)| ProfileRow {
            op: op.to_string(),
            ms_per_token: 1e3 * r.time.as_secs_f64() / per,
            calls_per_token: r.calls as f64 / per,
            share: r.time.as_secs_f64() / wall,
        })
        .collect();
    let other = (secs - attributed).max(0.0);
    out.push(ProfileRow {
        op: "other".into(),
        ms_per_token: 1e3 * other / per,
        calls_per_token: 0.0,
        share: other / wall,
    });
    out
}
