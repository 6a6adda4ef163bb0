//! Cache fidelity: one token stream runs through two caches of the same model at once
//! (teacher forcing on the same tokens), and every position's next-token distribution under
//! the test cache is compared with the reference cache's: KL(ref ‖ test), top-1 agreement,
//! largest logit error, and both perplexities.

use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::kv::PrecisionPolicy;
use crate::model::{Logits, Model};

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
    if ids.len() < 2 {
        return Err(EngineError::invalid(
            "fidelity needs at least 2 tokens (one to condition on, one to score)",
        ));
    }
    let mut c_ref = model.new_cache(reference)?;
    let mut c_test = model.new_cache(test)?;
    let chunk = chunk.max(1);
    let mut positions = Vec::with_capacity(ids.len() - 1);
    let mut at = 0;
    while at < ids.len() {
        let n = chunk.min(ids.len() - at);
        let part = &ids[at..at + n];
        if at + n <= score_from {
            model.forward(part, &mut c_ref, Logits::Last)?;
            model.forward(part, &mut c_test, Logits::Last)?;
            at += n;
            on_chunk(at, ids.len());
            continue;
        }
        let l_ref = model.forward(part, &mut c_ref, Logits::All)?;
        let l_test = model.forward(part, &mut c_test, Logits::All)?;
        let scored = n.min(ids.len() - 1 - at);
        if scored > 0 {
            let targets = &ids[at + 1..at + 1 + scored];
            positions.extend(compare_rows(
                &l_ref.narrow(0, 0, scored)?,
                &l_test.narrow(0, 0, scored)?,
                targets,
                at,
            )?);
        }
        at += n;
        on_chunk(at, ids.len());
    }
    Ok(FidelityReport::from_positions(positions))
}

/// Per-row comparison of two `[n, vocab]` logit blocks whose rows predict `targets`.
fn compare_rows(
    l_ref: &Tensor,
    l_test: &Tensor,
    targets: &[u32],
    first_pos: usize,
) -> Result<Vec<PositionFidelity>> {
    let l_ref = l_ref.to_dtype(DType::F32)?;
    let l_test = l_test.to_dtype(DType::F32)?;
    let lp_ref = candle_nn::ops::log_softmax(&l_ref, D::Minus1)?;
    let lp_test = candle_nn::ops::log_softmax(&l_test, D::Minus1)?;
    let kld = (lp_ref.exp()? * (&lp_ref - &lp_test)?)?
        .sum(D::Minus1)?
        .to_vec1::<f32>()?;
    let top_ref = l_ref.argmax(D::Minus1)?.to_vec1::<u32>()?;
    let top_test = l_test.argmax(D::Minus1)?.to_vec1::<u32>()?;
    let max_err = (&l_ref - &l_test)?
        .abs()?
        .max(D::Minus1)?
        .to_vec1::<f32>()?;
    let idx = Tensor::from_vec(targets.to_vec(), (targets.len(), 1), l_ref.device())?;
    let nll_ref = lp_ref.gather(&idx, 1)?.flatten_all()?.to_vec1::<f32>()?;
    let nll_test = lp_test.gather(&idx, 1)?.flatten_all()?.to_vec1::<f32>()?;
    Ok((0..targets.len())
        .map(|i| PositionFidelity {
            pos: first_pos + i,
            // Rounding can make a near-zero KL slightly negative.
            kld: (kld[i] as f64).max(0.0),
            top1_agree: top_ref[i] == top_test[i],
            max_logit_error: max_err[i],
            nll_reference: -(nll_ref[i] as f64),
            nll: -(nll_test[i] as f64),
        })
        .collect())
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
