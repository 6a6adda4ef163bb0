//! Side-by-side generation: one prompt through two cache policies of the same model as two
//! [`Sequence`]s in lockstep (each round advances both streams by one token, so both stream
//! at once), then the test policy's fidelity against the reference, and any swept caches',
//! teacher-forced on the reference's tokens in lockstep
//! ([`crate::fidelity::compare_many_from`]). All caches are fresh: a chat session is untouched.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::events::{ErrorCode, Event};
use crate::fidelity::compare_many_from;
use crate::generate::{grown_context, render_checked_prompt, GenerateError, Prompt, Sequence};
use crate::kv::{CacheSpec, PrecisionPolicy};
use crate::model::{Logits, Model};
use crate::sampling::SamplingParams;
use crate::sweep::{self, SweepPoint};
use crate::tokenizer::GemmaTokenizer;

/// Tokens per teacher-forced fidelity step (bounds the `[chunk, vocab]` logits held).
pub const FIDELITY_CHUNK: usize = 64;

fn default_max_tokens() -> usize {
    256
}

fn default_chunk() -> usize {
    crate::generate::PREFILL_CHUNK
}

/// One comparison: a prompt, and the reference and test cache policies it runs under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    /// What both panes continue from.
    pub prompt: Prompt,
    /// Sampling settings, the same for both (greedy makes the panes comparable).
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Most tokens each pane generates (the stop token included).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// The reference policy (pane 0) and the tested one (pane 1).
    pub policies: [PrecisionPolicy; 2],
    /// Prefill chunk size.
    #[serde(default = "default_chunk")]
    pub prefill_chunk: usize,
    /// Caches to sweep after the comparison: each scored against the reference on the
    /// reference's tokens, as `sweep_point` events (the compare view's KLD-against-bits chart).
    #[serde(default)]
    pub sweep: Vec<CacheSpec>,
}

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

/// One thing a comparison reports. Every comparison ends with exactly one `finished` or
/// `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CompareEvent {
    /// An event of pane 0 (reference) or 1 (test): `token`, `thinking`, `stats`, `done`.
    Pane {
        /// Which pane.
        pane: usize,
        /// Its event.
        event: Event,
    },
    /// One cache of the request's sweep, scored on the reference's tokens (after the panes'
    /// fidelity, before `finished`).
    SweepPoint {
        /// Its figures.
        point: SweepPoint,
    },
    /// Progress of the teacher-forced scoring after the panes: `done` of `total` token steps
    /// (the reference's tokens, once per group of caches scored together).
    Scoring {
        /// Token steps run.
        done: usize,
        /// Token steps in all.
        total: usize,
    },
    /// Both panes are done; fidelity is absent when cancelled or nothing was generated.
    Finished {
        /// The scores.
        fidelity: Option<CompareFidelity>,
    },
    /// The comparison failed; the engine is still usable.
    Error {
        /// Machine-readable code.
        code: ErrorCode,
        /// Human-readable message.
        message: String,
    },
}

/// Receives a comparison's events and gets a say between rounds.
pub trait CompareHooks {
    /// An event for the caller.
    fn emit(&mut self, event: CompareEvent);
    /// Called before each round: the place to apply control jobs or set the cancel flag.
    fn between_steps(&mut self) {}
    /// Called once before anything runs: both panes' caches will hold up to `tokens` tokens
    /// under `policies`. An error refuses the comparison (the engine thread refuses what
    /// would not fit in memory).
    fn admit(
        &mut self,
        _model: &Model,
        _tokens: usize,
        _policies: &[PrecisionPolicy; 2],
    ) -> Result<(), GenerateError> {
        Ok(())
    }
    /// Bytes of KV cache the scoring may hold at once (the panes' caches are freed by then):
    /// the caches scored together in lockstep are grouped to fit.
    fn kv_room(&mut self) -> u64 {
        u64::MAX
    }
}

impl<F: FnMut(CompareEvent)> CompareHooks for F {
    fn emit(&mut self, event: CompareEvent) {
        self(event)
    }
}

/// Runs `req`: streams both panes (`pane` events ending in `stats` and `done` each), then
/// scores the test cache on the reference's tokens. Returns the fidelity it reported.
/// Does not emit `finished`: the caller does, so it can publish its state first.
pub fn run(
    model: &Model,
    tokenizer: &GemmaTokenizer,
    req: &CompareRequest,
    cancel: &AtomicBool,
    hooks: &mut dyn CompareHooks,
) -> Result<Option<CompareFidelity>, GenerateError> {
    let prompt = render_checked_prompt(model, tokenizer, &req.prompt)?;
    let max_context = model.config().max_position_embeddings;
    hooks.admit(
        model,
        grown_context(&prompt, req.max_tokens, max_context),
        &req.policies,
    )?;
    let mut panes = Vec::with_capacity(2);
    for (i, policy) in req.policies.iter().enumerate() {
        let started = Instant::now();
        let mut cache = model.new_cache(policy)?;
        let mut seq = Sequence::new(
            tokenizer,
            prompt.clone(),
            0,
            req.sampling,
            req.max_tokens,
            max_context,
            started,
        )?;
        while let Some(chunk) = seq.next_prefill(req.prefill_chunk) {
            hooks.between_steps();
            if cancel.load(Ordering::Relaxed) {
                seq.cancel();
                break;
            }
            let (t, n) = (Instant::now(), chunk.len());
            let logits = model.forward(chunk, &mut cache, Logits::Last)?;
            seq.prefilled(n, logits, t.elapsed().as_secs_f64());
        }
        panes.push((i, seq, cache));
    }

    // Lockstep: each round advances both streams by one token, so both stream at once.
    while panes.iter().any(|(_, seq, _)| !seq.is_done()) {
        hooks.between_steps();
        let cancelled = cancel.load(Ordering::Relaxed);
        for (i, seq, cache) in &mut panes {
            let pane = *i;
            let mut emit = |event| hooks.emit(CompareEvent::Pane { pane, event });
            if let Some(id) = seq.sample(tokenizer, cancelled, cache.seq_len(), &mut emit)? {
                seq.fed(model.forward(&[id], cache, Logits::Last)?);
            }
        }
    }

    let reference = panes[0].1.all_ids();
    let mut kv_bytes = [0u64; 2];
    for ((pane, seq, cache), policy) in panes.into_iter().zip(&req.policies) {
        let memory = cache.memory();
        kv_bytes[pane] = memory.total.0 as u64;
        let mut emit = |event| hooks.emit(CompareEvent::Pane { pane, event });
        seq.finish(tokenizer, cache.seq_len(), &memory, policy, &mut emit)?;
        // The pane's cache is no longer needed; free it before scoring builds two more.
        drop(cache);
    }
    if cancel.load(Ordering::Relaxed) || reference.len() < 2 {
        return Ok(None);
    }
    // The tested pane's cache and every swept one are scored in lockstep against one run of
    // the reference per group of caches that fits in memory.
    let mut tests = vec![req.policies[1].clone()];
    tests.extend(req.sweep.iter().map(CacheSpec::to_policy));
    let reference_policy = &req.policies[0];
    let room = hooks.kv_room();
    let batches = sweep::lockstep_batches(model, reference_policy, &tests, reference.len(), room)?;
    let total = batches.len() * reference.len();
    let mut tested = None;
    for (b, range) in batches.into_iter().enumerate() {
        let mut on_chunk = |done: usize, _: usize| {
            hooks.emit(CompareEvent::Scoring {
                done: b * reference.len() + done,
                total,
            });
            hooks.between_steps();
            !cancel.load(Ordering::Relaxed)
        };
        let reports = compare_many_from(
            model,
            &reference,
            reference_policy,
            &tests[range.clone()],
            FIDELITY_CHUNK,
            0,
            &mut on_chunk,
        )?;
        if cancel.load(Ordering::Relaxed) {
            return Ok(None);
        }
        for (i, report) in range.zip(reports) {
            let Some(s) = i.checked_sub(1) else {
                tested = Some(report);
                continue;
            };
            let bits = sweep::bits_per_coordinate(model, &tests[i], reference.len())?;
            let point = sweep::point(req.sweep[s].to_string(), bits, &report);
            hooks.emit(CompareEvent::SweepPoint { point });
        }
    }
    let Some(report) = tested else {
        return Ok(None);
    };
    Ok(Some(CompareFidelity {
        mean_kld: report.mean_kld,
        max_kld: report.max_kld,
        top1_agreement: report.top1_agreement,
        tokens_scored: report.tokens_scored,
        ppl: report.ppl,
        ppl_reference: report.ppl_reference,
        kv_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPrecision;
    use serde_json::json;

    #[test]
    fn compare_json_is_pinned() {
        let policies =
            ["f16", "tq3.5@all"].map(|s| crate::kv::CacheSpec::parse(s).unwrap().to_policy());
        let req: CompareRequest = serde_json::from_value(json!({
            "prompt": {"type": "ids", "ids": [2, 5]},
            "policies": policies,
        }))
        .unwrap();
        assert_eq!((req.max_tokens, req.prefill_chunk), (256, 512));
        assert!(req.sweep.is_empty());
        assert_eq!(req.policies[0], PrecisionPolicy::uniform(KvPrecision::F16));
        assert_eq!(
            serde_json::to_value(CompareEvent::Pane {
                pane: 1,
                event: Event::Token { text: "hi".into() }
            })
            .unwrap(),
            json!({"type": "pane", "pane": 1, "event": {"type": "token", "text": "hi"}})
        );
        assert_eq!(
            serde_json::to_value(CompareEvent::Finished { fidelity: None }).unwrap(),
            json!({"type": "finished", "fidelity": null})
        );
        assert_eq!(
            serde_json::to_value(CompareEvent::Error {
                code: ErrorCode::Busy,
                message: "m".into()
            })
            .unwrap(),
            json!({"type": "error", "code": "busy", "message": "m"})
        );
    }
}
