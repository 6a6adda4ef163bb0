//! Engine-level decode benchmark (`kvlab bench decode`, cargo feature `bench`): prefill N
//! tokens, then decode M more through the engine's sampler (greedy unless told otherwise),
//! timing both phases separately, and optionally a per-operation profile of each phase
//! ([`crate::profile`]); or ([`bench_decode_compare`]) one prefill, then the same M tokens
//! decoded through several cache precisions in alternating rounds, each from the same depth.
//! Reports figures; asserts nothing.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::generate::sampling::{Sampler, SamplingParams};
use crate::kv::{KvMemoryReport, PrecisionPolicy};
use crate::models::common::{Logits, Model};
use crate::profile;

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
    /// The decoded token ids.
    pub decoded: Vec<u32>,
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
    let ids = context_ids(model, &spec.context, spec.decode)?;
    let mut sampler = new_sampler(spec)?;
    let mut cache = model.new_cache(&spec.policy)?;
    if spec.profile {
        profile::enable(model.device());
    }
    let t0 = Instant::now();
    let next = prefill(model, &ids, spec.prefill_chunk, &mut cache, &mut sampler)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let prefill_profile = spec
        .profile
        .then(|| rows(profile::finish(), prefill_secs, ids.len()));
    if spec.profile {
        profile::enable(model.device());
    }
    let t1 = Instant::now();
    let decoded = decode(model, next, spec.decode, &mut cache, &mut sampler)?;
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
        decoded,
    })
}

/// One cache precision's share of a [`bench_decode_compare`] run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    /// The precision decoded through.
    pub policy: PrecisionPolicy,
    /// Wall time of each round's decode, in round order.
    pub decode_secs: Vec<f64>,
    /// KV cache bytes after its last round.
    pub memory: KvMemoryReport,
    /// The tokens its last round decoded.
    pub decoded: Vec<u32>,
}

impl CompareRow {
    /// Throughput of its fastest round (on a shared machine, the least disturbed one).
    pub fn best_tok_per_s(&self, tokens: usize) -> f64 {
        let best = self
            .decode_secs
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        tokens as f64 / best.max(1e-9)
    }
}

/// What [`bench_decode_compare`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    /// Tokens prefilled (once, in the first policy's precision).
    pub prefill_tokens: usize,
    /// Wall time of that prefill.
    pub prefill_secs: f64,
    /// Tokens decoded per round and policy.
    pub decode_tokens: usize,
    /// One row per policy, in the order asked.
    pub rows: Vec<CompareRow>,
}

/// Decode speed of several cache precisions side by side from one prefill (in the first
/// policy's precision; `spec.policy` and `spec.profile` are not used): each of `rounds`
/// rounds switches the cache to each policy in turn ([`crate::kv::KvCache::convert`], as the
/// app does), rewinds it to the prompt and decodes `spec.decode` tokens from the same first
/// token, so every run starts at the same depth and the policies alternate in time (a
/// shared machine's noise falls on all of them). A precision reached by converting another
/// holds that one's rounding (f16 after TurboQuant holds the decoded codes): the same bytes
/// and speed as a direct prefill, not necessarily the same tokens.
pub fn bench_decode_compare(
    model: &Model,
    spec: &DecodeBenchSpec,
    policies: &[PrecisionPolicy],
    rounds: usize,
) -> Result<CompareReport> {
    let first = policies
        .first()
        .ok_or_else(|| EngineError::invalid("no cache precision to compare"))?;
    let ids = context_ids(model, &spec.context, spec.decode)?;
    let mut cache = model.new_cache(first)?;
    // Sliding layers keep the tokens each round decodes past their window, so every round
    // can rewind to the end of the prompt.
    cache.set_rewind_margin(spec.decode);
    let t0 = Instant::now();
    let next = prefill(
        model,
        &ids,
        spec.prefill_chunk,
        &mut cache,
        &mut new_sampler(spec)?,
    )?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut rows: Vec<CompareRow> = policies
        .iter()
        .map(|p| CompareRow {
            policy: p.clone(),
            decode_secs: Vec::with_capacity(rounds),
            memory: cache.memory(),
            decoded: Vec::new(),
        })
        .collect();
    for _ in 0..rounds.max(1) {
        for row in &mut rows {
            cache.convert(&row.policy)?;
            cache.rewind(ids.len())?;
            // A fresh sampler per run: a seeded sampler then draws the same sequence.
            let mut sampler = new_sampler(spec)?;
            let t = Instant::now();
            row.decoded = decode(model, next, spec.decode, &mut cache, &mut sampler)?;
            row.decode_secs.push(t.elapsed().as_secs_f64());
            row.memory = cache.memory();
        }
    }
    Ok(CompareReport {
        prefill_tokens: ids.len(),
        prefill_secs,
        decode_tokens: spec.decode,
        rows,
    })
}

/// Prefill speed of several cache precisions: in each of `rounds` rounds every policy in turn
/// prefills the whole context into a fresh cache of its own (so its encoding and its
/// attention over what it holds are timed, as a new conversation pays them), alternating in
/// time as [`bench_decode_compare`]'s decodes do. `secs[policy][round]`; `spec.decode`,
/// `spec.policy` and `spec.profile` are not used.
pub fn bench_prefill_each(
    model: &Model,
    spec: &DecodeBenchSpec,
    policies: &[PrecisionPolicy],
    rounds: usize,
) -> Result<Vec<Vec<f64>>> {
    let ids = context_ids(model, &spec.context, 0)?;
    let mut secs = vec![Vec::with_capacity(rounds); policies.len()];
    for _ in 0..rounds.max(1) {
        for (policy, row) in policies.iter().zip(&mut secs) {
            let mut cache = model.new_cache(policy)?;
            let mut sampler = new_sampler(spec)?;
            let t = Instant::now();
            prefill(model, &ids, spec.prefill_chunk, &mut cache, &mut sampler)?;
            row.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(secs)
}

/// The token ids a benchmark context stands for, refused before any work when they and the
/// `decode` tokens after them exceed the model's positions (the forward pass would refuse
/// the first token past them, after a prefill that can take minutes).
fn context_ids(model: &Model, context: &BenchContext, decode: usize) -> Result<Vec<u32>> {
    let ids = context_tokens(model, context)?;
    let max = model.config().max_position_embeddings;
    if max > 0 && ids.len() + decode > max {
        return Err(EngineError::invalid(format!(
            "context full: {} context + {decode} decoded tokens exceed the model's {max} \
             positions",
            ids.len()
        )));
    }
    Ok(ids)
}

fn context_tokens(model: &Model, context: &BenchContext) -> Result<Vec<u32>> {
    Ok(match context {
        BenchContext::Tokens(p) if !p.is_empty() => p.clone(),
        BenchContext::Tokens(_) => return Err(EngineError::invalid("an empty benchmark prompt")),
        BenchContext::Filler(n) => {
            let mut ids = filler_ids((*n).max(1), model.config().vocab_size);
            if let Some(b) = model.config().bos_token_id {
                ids[0] = b;
            }
            ids
        }
    })
}

fn new_sampler(spec: &DecodeBenchSpec) -> Result<Sampler> {
    Sampler::new(spec.sampling).map_err(|e| EngineError::invalid(e.to_string()))
}

/// Runs `ids` through the model in chunks; returns the token sampled after them.
fn prefill(
    model: &Model,
    ids: &[u32],
    chunk: usize,
    cache: &mut crate::kv::KvCache,
    sampler: &mut Sampler,
) -> Result<u32> {
    let mut last = None;
    for c in ids.chunks(chunk.max(1)) {
        last = Some(model.forward(c, cache, Logits::Last)?);
    }
    match last {
        Some(l) => sample(sampler, &l),
        None => Ok(0),
    }
}

/// Decodes `n` tokens from `next`; returns them.
fn decode(
    model: &Model,
    mut next: u32,
    n: usize,
    cache: &mut crate::kv::KvCache,
    sampler: &mut Sampler,
) -> Result<Vec<u32>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let l = model.forward(&[next], cache, Logits::Last)?;
        next = sample(sampler, &l)?;
        out.push(next);
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::kv::CacheSpec;
    use crate::LoadOptions;

    fn spec(policy: &str) -> Result<DecodeBenchSpec> {
        Ok(DecodeBenchSpec {
            // Past the fixture's sliding window (8) in the prompt and again while decoding.
            context: BenchContext::Filler(24),
            decode: 12,
            prefill_chunk: 7,
            policy: CacheSpec::parse(policy)?.to_policy(),
            sampling: SamplingParams::greedy(),
            profile: false,
        })
    }

    fn policies(r: &CompareReport) -> Vec<PrecisionPolicy> {
        r.rows.iter().map(|row| row.policy.clone()).collect()
    }

    #[test]
    fn compared_runs_each_start_from_the_prompt_in_their_own_precision() -> Result<()> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_e");
        let model = Model::load(&dir, &LoadOptions::default())?;
        let plain = bench_decode(&model, &spec("f32")?)?;
        let f32p = CacheSpec::parse("f32")?.to_policy();
        let tq = CacheSpec::parse("tq4@all")?.to_policy();
        let r = bench_decode_compare(&model, &spec("f32")?, &[f32p.clone(), f32p, tq], 1)?;
        assert_eq!(r.prefill_tokens, 24);
        assert_eq!(plain.decoded.len(), 12);
        // The first run is a plain run; the second decodes the same tokens only if the
        // rewind restored every layer (sliding ones included) to the end of the prompt.
        assert_eq!(r.rows[0].decoded, plain.decoded);
        assert_eq!(r.rows[1].decoded, plain.decoded);
        // The third ran on 4-bit codes: its cache holds a fraction of the f32 bytes.
        let (f32_bytes, tq_bytes) = (r.rows[0].memory.total.0, r.rows[2].memory.total.0);
        assert!(tq_bytes * 4 < f32_bytes, "{tq_bytes} vs {f32_bytes}");
        assert_eq!(r.rows[2].decoded.len(), 12);
        // Rounds alternate the precisions, each timed once per round.
        let r = bench_decode_compare(&model, &spec("f32")?, &policies(&r), 3)?;
        assert!(r.rows.iter().all(|row| row.decode_secs.len() == 3));
        assert!(bench_decode_compare(&model, &spec("f32")?, &[], 1).is_err());
        Ok(())
    }

    #[test]
    fn a_context_past_the_positions_is_refused_before_the_prefill() -> Result<()> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_e");
        let model = Model::load(&dir, &LoadOptions::default())?;
        let max = model.config().max_position_embeddings;
        let mut s = spec("f32")?;
        s.context = BenchContext::Filler(max);
        s.decode = 1;
        for e in [
            bench_decode(&model, &s).err(),
            bench_decode_compare(&model, &s, std::slice::from_ref(&s.policy), 1).err(),
        ] {
            let e = e.expect("refused").to_string();
            assert!(e.contains(&format!("{max} context + 1 decoded")), "{e}");
        }
        // Exactly the positions: prefill alone fits, and so do context and decode together.
        assert!(bench_prefill_each(&model, &s, std::slice::from_ref(&s.policy), 1).is_ok());
        s.context = BenchContext::Filler(max - 2);
        s.decode = 2;
        assert_eq!(bench_decode(&model, &s)?.decoded.len(), 2);
        Ok(())
    }
}
