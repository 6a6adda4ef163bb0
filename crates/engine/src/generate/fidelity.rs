//! Cache fidelity: one token stream runs through two caches of the same model at once
//! (teacher forcing on the same tokens), and every position's next-token distribution under
//! the test cache is compared with the reference cache's: KL(ref ‖ test), top-1 agreement,
//! largest logit error, and both perplexities.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::generate::logit_rows::ReferenceRows;
use crate::kv::{KvCache, PrecisionPolicy};
use crate::models::common::{Logits, Model};

/// One scored position `i` (predicting token `i + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PositionFidelity {
    /// Position of the predicting token.
    pub pos: usize,
    /// KL(p_ref ‖ p_test) in nats.
    pub kld: f64,
    /// Both caches put the same token first.
    pub top1_agree: bool,
    /// max_v |logit_ref − logit_test|.
    pub max_logit_error: f32,
    /// −log p_ref(next token).
    pub nll_reference: f64,
    /// −log p_test(next token).
    pub nll: f64,
}

/// Summary over all scored positions (`positions` holds the detail).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FidelityReport {
    /// Perplexity under the test cache.
    pub ppl: f64,
    /// Perplexity under the reference cache.
    pub ppl_reference: f64,
    /// Mean KL(ref ‖ test) per position, nats.
    pub mean_kld: f64,
    /// Largest per-position KL.
    pub max_kld: f64,
    /// Fraction of positions whose argmax agrees.
    pub top1_agreement: f64,
    /// Largest logit error over all positions.
    pub max_logit_error: f32,
    /// Positions scored (`tokens − 1`).
    pub tokens_scored: usize,
    /// Per-position figures.
    pub positions: Vec<PositionFidelity>,
}

/// Runs `ids` through a `reference` and a `test` cache in lockstep, `chunk` tokens per
/// step (bounds the `[chunk, vocab]` logits held at once), and compares every position.
/// `on_chunk(done, total)` reports progress.
pub fn compare_caches(
    model: &Model,
    ids: &[u32],
    reference: &PrecisionPolicy,
    test: &PrecisionPolicy,
    chunk: usize,
    on_chunk: &mut dyn FnMut(usize, usize),
) -> Result<FidelityReport> {
    compare_caches_from(model, ids, reference, test, chunk, 0, on_chunk)
}

/// [`compare_caches`] scoring only positions `score_from..`: chunks wholly before it run
/// for their K/V alone, without the vocabulary projection (most of a small model's cost).
pub fn compare_caches_from(
    model: &Model,
    ids: &[u32],
    reference: &PrecisionPolicy,
    test: &PrecisionPolicy,
    chunk: usize,
    score_from: usize,
    on_chunk: &mut dyn FnMut(usize, usize),
) -> Result<FidelityReport> {
    let mut reports = compare_many_from(
        model,
        ids,
        reference,
        std::slice::from_ref(test),
        chunk,
        score_from,
        &mut |done, total| {
            on_chunk(done, total);
            true
        },
    )?;
    Ok(reports.remove(0))
}

/// Every cache of `tests` against one `reference`, in lockstep on the same tokens: each chunk
/// runs through the reference once and through every test cache, and each test's rows are
/// scored against the reference's, so N caches cost N + 1 forward passes instead of 2N. A
/// test equal to the reference reuses its logits. All `tests.len() + 1` caches are held at
/// once: bound the count by memory ([`crate::generate::sweep::lockstep_batches`]). Reports come back in
/// `tests`' order. `on_chunk(done, total)` reports tokens run after each chunk and returns
/// whether to go on: on `false` the reports hold the positions scored so far.
pub fn compare_many_from(
    model: &Model,
    ids: &[u32],
    reference: &PrecisionPolicy,
    tests: &[PrecisionPolicy],
    chunk: usize,
    score_from: usize,
    on_chunk: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<Vec<FidelityReport>> {
    let mut run = Lockstep::new(model, ids.to_vec(), reference, tests, chunk, score_from)?;
    while !run.done() {
        run.step(model)?;
        if !on_chunk(run.tokens_run(), ids.len()) {
            break;
        }
    }
    Ok(run.reports())
}

/// [`compare_many_from`] a chunk at a time, for a caller that has other work between chunks
/// (the engine thread answers other requests between them).
pub struct Lockstep {
    ids: Vec<u32>,
    c_ref: KvCache,
    c_tests: Vec<Option<KvCache>>,
    chunk: usize,
    score_from: usize,
    positions: Vec<Vec<PositionFidelity>>,
    at: usize,
}

impl Lockstep {
    /// The caches of a run over `ids`: the reference, and one per test unlike it.
    pub fn new(
        model: &Model,
        ids: Vec<u32>,
        reference: &PrecisionPolicy,
        tests: &[PrecisionPolicy],
        chunk: usize,
        score_from: usize,
    ) -> Result<Self> {
        if ids.len() < 2 {
            return Err(EngineError::invalid(
                "fidelity needs at least 2 tokens (one to condition on, one to score)",
            ));
        }
        let c_ref = model.new_cache(reference)?;
        let c_tests = tests
            .iter()
            .map(|t| (t != reference).then(|| model.new_cache(t)).transpose())
            .collect::<Result<Vec<Option<KvCache>>>>()?;
        Ok(Self {
            positions: vec![Vec::with_capacity(ids.len() - 1); tests.len()],
            ids,
            c_ref,
            c_tests,
            chunk: chunk.max(1),
            score_from,
            at: 0,
        })
    }

    /// The same run with TurboQuant caches calibrating on their first chunk (the whole text
    /// when it is one; up to the model's calibration rows) instead of holding a text's first
    /// tokens as f16 as a conversation does: what the app's comparison shows, whose
    /// conversations are mostly shorter than the model's calibration rows. With its 64-token
    /// chunks it overstates a longer conversation's loss (tq4+qw@all on the 270M: 0.09
    /// against 0.046 mean KLD calibrated on 512 rows). Call before the first step.
    pub fn calibrating_on_first_chunk(mut self) -> Result<Self> {
        let first = self.chunk.min(self.ids.len());
        self.c_ref.set_calibration_rows(first)?;
        for c in self.c_tests.iter_mut().flatten() {
            c.set_calibration_rows(first)?;
        }
        Ok(self)
    }

    /// Whether every token has run.
    pub fn done(&self) -> bool {
        self.at >= self.ids.len()
    }

    /// Tokens run so far.
    pub fn tokens_run(&self) -> usize {
        self.at
    }

    /// Runs the next chunk through every cache and scores its rows.
    pub fn step(&mut self, model: &Model) -> Result<()> {
        if self.done() {
            return Ok(());
        }
        let (ids, at) = (&self.ids, self.at);
        let n = self.chunk.min(ids.len() - at);
        let part = &ids[at..at + n];
        // Rows scored in this chunk: every one but a last token's, which predicts nothing.
        let scored = n.min(ids.len() - 1 - at);
        if at + n <= self.score_from || scored == 0 {
            model.forward(part, &mut self.c_ref, Logits::Last)?;
            for cache in self.c_tests.iter_mut().flatten() {
                model.forward(part, cache, Logits::Last)?;
            }
        } else {
            let targets = &ids[at + 1..at + 1 + scored];
            let l_ref = scored_rows(model.forward(part, &mut self.c_ref, Logits::All)?, scored)?;
            let rows = ReferenceRows::new(&l_ref, l_ref.len() / scored, targets, at);
            for (cache, out) in self.c_tests.iter_mut().zip(&mut self.positions) {
                out.extend(match cache {
                    Some(cache) => {
                        let logits = model.forward(part, cache, Logits::All)?;
                        rows.score(&scored_rows(logits, scored)?)
                    }
                    None => rows.score(&l_ref),
                });
            }
        }
        self.at += n;
        Ok(())
    }

    /// The reports of the positions scored so far, in the tests' order.
    pub fn reports(self) -> Vec<FidelityReport> {
        let score_from = self.score_from;
        self.positions
            .into_iter()
            .map(|p| {
                let p = p.into_iter().filter(|p| p.pos >= score_from).collect();
                FidelityReport::from_positions(p)
            })
            .collect()
    }
}

/// The first `rows` rows of a `[t, vocab]` logits block, as row-major f32.
fn scored_rows(logits: Tensor, rows: usize) -> Result<Vec<f32>> {
    Ok(logits
        .narrow(0, 0, rows)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

impl FidelityReport {
    /// The summary of any set of scored positions (e.g. several windows pooled, or only
    /// the second half of each, as llama.cpp's perplexity tool scores).
    pub fn from_positions(positions: Vec<PositionFidelity>) -> FidelityReport {
        summarize(positions)
    }
}

fn summarize(positions: Vec<PositionFidelity>) -> FidelityReport {
    let n = positions.len().max(1) as f64;
    let mean = |f: &dyn Fn(&PositionFidelity) -> f64| positions.iter().map(f).sum::<f64>() / n;
    FidelityReport {
        ppl: mean(&|p| p.nll).exp(),
        ppl_reference: mean(&|p| p.nll_reference).exp(),
        mean_kld: mean(&|p| p.kld),
        max_kld: positions.iter().map(|p| p.kld).fold(0.0, f64::max),
        top1_agreement: mean(&|p| f64::from(u8::from(p.top1_agree))),
        max_logit_error: positions
            .iter()
            .map(|p| p.max_logit_error)
            .fold(0.0, f32::max),
        tokens_scored: positions.len(),
        positions,
    }
}
