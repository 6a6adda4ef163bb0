//! Side-by-side generation: one prompt through two cache policies of the same model as two
//! [`Sequence`]s in lockstep (each round advances both streams by one token, so both stream
//! at once), then the test policy's fidelity against the reference, and any swept caches',
//! teacher-forced on the reference's tokens in lockstep ([`crate::generate::fidelity::Lockstep`]). All
//! caches are fresh: no conversation is touched. A [`CompareRun`] advances one step at a time
//! under the engine thread: [`CompareRun::next`] names a pane's prefill chunk or both panes'
//! next tokens, which run as rows of the engine's one forward pass beside other requests',
//! and [`CompareRun::ran`] takes their logits; a scoring chunk runs by itself.

use crate::constrain::Guide;
use std::ops::Range;
use std::time::Instant;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::contract::{CompareFidelity, Event, FitTarget, FittedCache};
use crate::generate::fidelity::{FidelityReport, Lockstep};
use crate::generate::fit::{self, FitBudget, Sensitivity};
use crate::generate::sampling::SamplingParams;
use crate::generate::sweep;
use crate::generate::{grown_context, GenerateError, Prompt, Sequence};
use crate::kv::{CacheSelection, CacheSpec, KvCache, PrecisionPolicy};
use crate::memory::estimate_kv_bytes;
use crate::models::common::Model;
use crate::tokenizer::GemmaTokenizer;

/// Tokens per teacher-forced fidelity step (bounds the `[chunk, vocab]` logits held).
pub const FIDELITY_CHUNK: usize = 64;

fn default_max_tokens() -> usize {
    256
}

fn default_chunk() -> usize {
    crate::generate::PREFILL_CHUNK
}

/// One comparison: a prompt, and the reference and test caches it runs under, as every front
/// end sends them (a SPEC or a menu choice each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
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
    /// The reference cache (pane 0) and the tested one (pane 1).
    pub caches: [CacheSelection; 2],
    /// Prefill chunk size (the engine's unless a caller measures another).
    #[serde(default = "default_chunk")]
    #[ts(skip)]
    pub prefill_chunk: usize,
    /// Caches to sweep after the comparison: each scored against the reference on the
    /// reference's tokens, as `sweep_point` events (the compare view's KLD-against-bits chart).
    #[serde(default)]
    pub sweep: Vec<CacheSelection>,
    /// What both answers are held to (a JSON schema: does this cache break my JSON?).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub constraint: Option<crate::constrain::Constraint>,
    /// A cache to fit to a budget after the sweep, probed and then scored on the
    /// reference's tokens (a `fitted` event, then its `sweep_point`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub fit: Option<FitTarget>,
}

impl CompareRequest {
    /// The two panes' policies (a SPEC that does not parse is an invalid request).
    fn policies(&self) -> Result<[PrecisionPolicy; 2], GenerateError> {
        Ok([self.caches[0].policy()?, self.caches[1].policy()?])
    }
}

/// What a comparison runs next ([`CompareRun::next`]).
#[derive(Debug)]
pub enum CompareNext {
    /// These ids, each in its pane's cache (pane index, ids).
    Run(Vec<(usize, Vec<u32>)>),
    /// The step did its own work (or none); more to come.
    Working,
    /// It ended (not yet reported: the caller sends `finished` once its state is current);
    /// fidelity is absent when cancelled or nothing was generated.
    Finished(Option<CompareFidelity>),
}

/// One pane: its index, its sequence and its cache (dropped once the pane is done).
struct Pane {
    index: usize,
    seq: Option<Sequence>,
    cache: Option<KvCache>,
}

/// A comparison in progress (see the module doc).
pub struct CompareRun {
    req: CompareRequest,
    /// The panes' policies, as `req.caches` select them.
    policies: [PrecisionPolicy; 2],
    /// The swept caches, as `req.sweep` selects them.
    sweep: Vec<CacheSpec>,
    panes: Vec<Pane>,
    kv_bytes: [u64; 2],
    /// The reference's tokens, once both panes are done.
    reference: Vec<u32>,
    /// The tested cache, then every swept one.
    tests: Vec<PrecisionPolicy>,
    /// Groups of `tests` scored together, and the one being scored.
    batches: Vec<Range<usize>>,
    batch: usize,
    scoring: Option<Lockstep>,
    tested: Option<FidelityReport>,
    /// The fit's probes (scored after the sweep, `tests` from `probe_start` on), their mean
    /// KLDs as scored, and what was fitted (then scored last).
    probes: Vec<fit::Probe>,
    probe_start: usize,
    probe_klds: Vec<f64>,
    fitted: Option<FittedCache>,
}

impl CompareRun {
    /// KV bytes the two panes' caches hold at most, for `prompt` growing by `req.max_tokens`.
    pub fn needed_bytes(
        model: &Model,
        prompt: &[u32],
        req: &CompareRequest,
    ) -> Result<u64, GenerateError> {
        let max_context = model.config().max_position_embeddings;
        let tokens = grown_context(prompt, req.max_tokens, max_context);
        let mut needed = 0u64;
        for policy in &req.policies()? {
            needed = needed.saturating_add(estimate_kv_bytes(model.config(), policy, tokens, 0)?);
        }
        Ok(needed)
    }

    /// Starts `req` over the prompt `prompt` (ids), arrived at `started`: both panes' fresh
    /// caches and sequences, each held to its own copy of `guide` (the request's compiled
    /// constraint).
    pub fn start(
        model: &Model,
        tokenizer: &GemmaTokenizer,
        (req, guide): (CompareRequest, Option<Guide>),
        prompt: Vec<u32>,
        started: Instant,
    ) -> Result<Self, GenerateError> {
        let max_context = model.config().max_position_embeddings;
        super::check_prompt(prompt.len(), max_context)?;
        if req.max_tokens == 0 {
            return Err(GenerateError::NoTokens);
        }
        let policies = req.policies()?;
        // A budget no cache meets is refused now, not after every probe has run.
        if let Some(t) = req.fit {
            if t.ctx == 0 || t.ctx > max_context {
                return Err(GenerateError::Engine(crate::error::EngineError::invalid(
                    format!("a fit's budget is counted at 1 to {max_context} tokens"),
                )));
            }
            fit::check_budget(model.config(), FitBudget::Bytes(t.bytes), t.ctx)?;
        }
        let sweep = req
            .sweep
            .iter()
            .map(CacheSelection::spec)
            .collect::<Result<Vec<_>, _>>()?;
        let mut panes = Vec::with_capacity(2);
        let mut guides = [guide.as_ref().map(Guide::duplicate), guide];
        for (index, policy) in policies.iter().enumerate() {
            let seq = Sequence::new(
                tokenizer,
                prompt.clone(),
                0,
                req.sampling,
                req.max_tokens,
                max_context,
                started,
            )?
            .with_guide(guides[index].take())
            .reading_calls(!req.prompt.tools().is_empty());
            // Calibrated on the prompt, given at once, as the scoring's caches are
            // (`Lockstep::calibrating_on_first_chunk`): each pane shows what its cache holds.
            let mut cache = model.new_cache(policy)?;
            cache.set_calibration_rows(prompt.len())?;
            panes.push(Pane {
                index,
                seq: Some(seq),
                cache: Some(cache),
            });
        }
        Ok(Self {
            req,
            policies,
            sweep,
            panes,
            kv_bytes: [0; 2],
            reference: Vec::new(),
            tests: Vec::new(),
            batches: Vec::new(),
            batch: 0,
            scoring: None,
            tested: None,
            probes: Vec::new(),
            probe_start: 0,
            probe_klds: Vec::new(),
            fitted: None,
        })
    }

    /// The first half of a step: the ids each pane runs next (one pane's prefill chunk of
    /// at most `limit` tokens when set, or both panes' sampled tokens, their text already
    /// emitted), in pane order; or a step that did its work itself (the panes' ending, a
    /// chunk of the scoring), or the end. The caller runs the ids in
    /// [`CompareRun::caches_mut`] (in one pass with other sequences' rows), then hands
    /// each pane's logits to [`CompareRun::ran`].
    pub fn next(
        &mut self,
        model: &Model,
        tokenizer: &GemmaTokenizer,
        cancelled: bool,
        limit: Option<usize>,
        kv_room: &mut dyn FnMut() -> u64,
        emit: &mut dyn FnMut(Event),
    ) -> Result<CompareNext, GenerateError> {
        if !self.panes.iter().any(|p| p.seq.is_some()) {
            return self.step_scoring(model, cancelled, emit);
        }
        let chunk = limit.map_or(self.req.prefill_chunk.max(1), |l| {
            l.clamp(1, self.req.prefill_chunk.max(1))
        });
        // Prefill: one chunk of the first pane that has some left.
        for pane in &mut self.panes {
            let Some(seq) = pane.seq.as_mut() else {
                continue;
            };
            if let Some(part) = seq.next_prefill(chunk) {
                if cancelled {
                    seq.cancel();
                    continue;
                }
                return Ok(CompareNext::Run(vec![(pane.index, part.to_vec())]));
            }
        }
        // Lockstep: each round advances both streams by one token, so both stream at once.
        let mut runs = Vec::new();
        for pane in &mut self.panes {
            let (Some(seq), Some(cache)) = (pane.seq.as_mut(), pane.cache.as_ref()) else {
                continue;
            };
            let index = pane.index;
            let mut pane_emit = |event: Event| {
                emit(Event::Pane {
                    pane: index,
                    event: Box::new(event),
                })
            };
            if let Some(id) = seq.sample(tokenizer, cancelled, cache.seq_len(), &mut pane_emit)? {
                runs.push((index, vec![id]));
            }
        }
        if !runs.is_empty() {
            return Ok(CompareNext::Run(runs));
        }
        self.end_panes(model, tokenizer, cancelled, kv_room, emit)
    }

    /// Whether its next step is a pane's prefill chunk (a batched step takes one at most).
    pub fn prefilling(&self) -> bool {
        self.panes
            .iter()
            .filter_map(|p| p.seq.as_ref())
            .any(|s| s.next_prefill(1).is_some())
    }

    /// Each running pane's cache, with its index.
    pub fn caches_mut(&mut self) -> impl Iterator<Item = (usize, &mut KvCache)> {
        self.panes
            .iter_mut()
            .filter(|p| p.seq.is_some())
            .filter_map(|p| Some((p.index, p.cache.as_mut()?)))
    }

    /// The second half of a step: pane `pane` ran `ids` from [`CompareRun::next`] in `secs`,
    /// giving `logits` for their last position.
    pub fn ran(
        &mut self,
        pane: usize,
        ids: &[u32],
        logits: Result<Tensor, GenerateError>,
        secs: f64,
    ) -> Result<(), GenerateError> {
        let seq = self
            .panes
            .iter_mut()
            .find(|p| p.index == pane)
            .and_then(|p| p.seq.as_mut())
            .ok_or_else(|| {
                GenerateError::Engine(crate::error::EngineError::invalid("no such pane"))
            })?;
        let logits = logits?;
        if seq.next_prefill(1).is_some() {
            seq.prefilled(ids.len(), logits, secs);
        } else {
            seq.fed(logits);
        }
        Ok(())
    }

    /// Both panes are done: their figures go out, then their caches go before the scoring
    /// builds more.
    fn end_panes(
        &mut self,
        model: &Model,
        tokenizer: &GemmaTokenizer,
        cancelled: bool,
        kv_room: &mut dyn FnMut() -> u64,
        emit: &mut dyn FnMut(Event),
    ) -> Result<CompareNext, GenerateError> {
        for pane in &mut self.panes {
            let (Some(seq), Some(cache)) = (pane.seq.take(), pane.cache.take()) else {
                continue;
            };
            if pane.index == 0 {
                self.reference = seq.all_ids();
            }
            let memory = cache.memory();
            self.kv_bytes[pane.index] = memory.total.0 as u64;
            let index = pane.index;
            let mut pane_emit = |event: Event| {
                emit(Event::Pane {
                    pane: index,
                    event: Box::new(event),
                })
            };
            seq.finish(
                tokenizer,
                cache.seq_len(),
                &memory,
                &self.policies[index],
                &mut pane_emit,
            )?;
        }
        if cancelled || self.reference.len() < 2 {
            return Ok(CompareNext::Finished(None));
        }
        // The tested pane's cache and every swept one are scored in lockstep against one
        // run of the reference per group of caches that fits in memory.
        self.tests = vec![self.policies[1].clone()];
        self.tests.extend(self.sweep.iter().map(|s| s.to_policy()));
        if self.req.fit.is_some() {
            self.probes = fit::probes(model.config(), 0)?;
            self.probe_start = self.tests.len();
            self.tests
                .extend(self.probes.iter().map(|p| p.policy.clone()));
        }
        self.batches = sweep::lockstep_batches(
            model,
            &self.policies[0],
            &self.tests,
            self.reference.len(),
            kv_room(),
        )?;
        Ok(CompareNext::Working)
    }

    fn step_scoring(
        &mut self,
        model: &Model,
        cancelled: bool,
        emit: &mut dyn FnMut(Event),
    ) -> Result<CompareNext, GenerateError> {
        if cancelled {
            return Ok(CompareNext::Finished(None));
        }
        let Some(range) = self.batches.get(self.batch).cloned() else {
            return Ok(CompareNext::Finished(self.fidelity()));
        };
        let run = match self.scoring.as_mut() {
            Some(run) => run,
            None => self.scoring.insert(
                Lockstep::new(
                    model,
                    self.reference.clone(),
                    &self.policies[0],
                    &self.tests[range.clone()],
                    FIDELITY_CHUNK,
                    0,
                )?
                .calibrating_on_first_chunk()?,
            ),
        };
        run.step(model)?;
        let len = self.reference.len();
        emit(Event::Scoring {
            done: self.batch * len + run.tokens_run(),
            total: self.batches.len() * len,
        });
        if !run.done() {
            return Ok(CompareNext::Working);
        }
        let reports = self
            .scoring
            .take()
            .map(Lockstep::reports)
            .unwrap_or_default();
        let fit_at = self.probe_start + self.probes.len();
        for (i, report) in range.zip(reports) {
            let label = match i {
                0 => {
                    self.tested = Some(report);
                    continue;
                }
                i if i <= self.sweep.len() => self.sweep[i - 1].to_string(),
                i if i < fit_at => {
                    self.probe_klds.push(report.mean_kld);
                    continue;
                }
                _ => match &self.fitted {
                    Some(f) => f.spec.clone(),
                    None => continue,
                },
            };
            let bits = sweep::bits_per_coordinate(model, &self.tests[i], len)?;
            let point = sweep::point(label, bits, &report);
            emit(Event::SweepPoint { point });
        }
        self.batch += 1;
        if self.batch < self.batches.len() {
            return Ok(CompareNext::Working);
        }
        // Every probe scored: the fit, then its cache scored as one more group.
        if let (Some(target), None) = (self.req.fit, &self.fitted) {
            let fitted = self.fit(model, target)?;
            self.tests.push(fitted.policy.clone());
            let len = self.tests.len();
            self.batches.push(len - 1..len);
            let fitted = FittedCache {
                spec: fitted.spec,
                bits_per_coordinate: fitted.bits_per_coordinate,
                bytes: fitted.bytes,
                ctx: target.ctx,
                predicted_kld: fitted.predicted_kld,
            };
            emit(Event::Fitted {
                fitted: fitted.clone(),
            });
            self.fitted = Some(fitted);
            return Ok(CompareNext::Working);
        }
        Ok(CompareNext::Finished(self.fidelity()))
    }

    /// The widths fitted to `target` from the probes' scores.
    fn fit(&self, model: &Model, target: FitTarget) -> Result<fit::Fitted, GenerateError> {
        let sensitivity = Sensitivity::from_probes(model.config(), &self.probes, &self.probe_klds)?;
        Ok(fit::allocate(
            model.config(),
            &sensitivity,
            FitBudget::Bytes(target.bytes),
            target.ctx,
            0,
        )?)
    }

    fn fidelity(&self) -> Option<CompareFidelity> {
        let report = self.tested.as_ref()?;
        Some(CompareFidelity {
            mean_kld: report.mean_kld,
            max_kld: report.max_kld,
            top1_agreement: report.top1_agreement,
            tokens_scored: report.tokens_scored,
            ppl: report.ppl,
            ppl_reference: report.ppl_reference,
            kv_bytes: self.kv_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ErrorCode;
    use crate::kv::KvPrecision;
    use serde_json::json;

    #[test]
    fn compare_json_is_pinned() {
        let req: CompareRequest = serde_json::from_value(json!({
            "prompt": {"type": "ids", "ids": [2, 5]},
            "caches": ["f16", {"keys": "4", "values": "3", "scope": "all"}],
            "sweep": ["q8_0"],
        }))
        .unwrap();
        assert_eq!((req.max_tokens, req.prefill_chunk), (256, 512));
        let policies = req.policies().unwrap();
        assert_eq!(policies[0], PrecisionPolicy::uniform(KvPrecision::F16));
        assert_eq!(req.sweep[0].spec().unwrap().to_string(), "q8_0");
        // A SPEC that does not parse is the request's fault.
        let bad = CompareRequest {
            caches: [
                CacheSelection::Spec("f16".into()),
                CacheSelection::Spec("tq9".into()),
            ],
            ..req
        };
        assert!(matches!(bad.policies(), Err(GenerateError::Engine(_))));
        assert_eq!(
            serde_json::to_value(Event::Pane {
                pane: 1,
                event: Box::new(Event::Token { text: "hi".into() })
            })
            .unwrap(),
            json!({"type": "pane", "pane": 1, "event": {"type": "token", "text": "hi"}})
        );
        assert_eq!(
            serde_json::to_value(Event::Finished { fidelity: None }).unwrap(),
            json!({"type": "finished", "fidelity": null})
        );
        assert_eq!(
            serde_json::to_value(Event::Error {
                code: ErrorCode::Busy,
                message: "m".into()
            })
            .unwrap(),
            json!({"type": "error", "code": "busy", "message": "m"})
        );
    }
}
