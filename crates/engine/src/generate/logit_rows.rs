//! Next-token distributions compared position by position: the reference's rows are prepared
//! once (log-normalizer, probabilities, argmax) and any number of test rows are scored against
//! them — KL(ref ‖ test), top-1 agreement, largest logit error and both negative
//! log-likelihoods — in two passes over the vocabulary per test row, with f64 sums and no
//! vocabulary-sized temporaries per test (a sweep scores many caches against one reference).

use rayon::prelude::*;

use crate::generate::fidelity::PositionFidelity;
use kvlab_cpu::vmath;
use kvlab_cpu::widest;

/// Lanes of the vectorized sums (two AVX2 registers of f32, one of AVX-512).
const LANES: usize = 16;

/// The reference's side of a block of positions: `rows × vocab` logits, row-major.
pub(crate) struct ReferenceRows<'a> {
    logits: &'a [f32],
    vocab: usize,
    /// `p_ref`, row-major like `logits`.
    probs: Vec<f32>,
    /// Per row: log Σ exp(logit), Σ p as held (1 up to rounding), the argmax.
    rows: Vec<RowSummary>,
    /// The token each row predicts.
    targets: &'a [u32],
    /// Position of the first row.
    first_pos: usize,
}

#[derive(Debug, Clone, Copy)]
struct RowSummary {
    lse: f64,
    prob_sum: f64,
    top: usize,
}

impl<'a> ReferenceRows<'a> {
    /// Prepares `targets.len()` rows of `logits` (`vocab` wide), the first at `first_pos`.
    pub(crate) fn new(
        logits: &'a [f32],
        vocab: usize,
        targets: &'a [u32],
        first_pos: usize,
    ) -> Self {
        debug_assert_eq!(logits.len(), targets.len() * vocab);
        let mut probs = vec![0f32; logits.len()];
        let rows = logits
            .par_chunks(vocab)
            .zip(probs.par_chunks_mut(vocab))
            .map(|(row, p)| {
                let (top, max) = argmax(row);
                let lse = max as f64 + widest!(exp_sum_body(row, max)).ln();
                let shift = lse as f32;
                let prob_sum = widest!(probs_body(row, shift, p));
                RowSummary { lse, prob_sum, top }
            })
            .collect();
        Self {
            logits,
            vocab,
            probs,
            rows,
            targets,
            first_pos,
        }
    }

    /// Scores `test` (the same shape as the reference's logits) row by row.
    pub(crate) fn score(&self, test: &[f32]) -> Vec<PositionFidelity> {
        debug_assert_eq!(test.len(), self.logits.len());
        let v = self.vocab;
        (0..self.rows.len())
            .into_par_iter()
            .map(|i| {
                let span = i * v..(i + 1) * v;
                let (r, t, p) = (
                    &self.logits[span.clone()],
                    &test[span.clone()],
                    &self.probs[span],
                );
                let reference = self.rows[i];
                let (top, max) = argmax(t);
                let sums = widest!(cross_body(r, t, p, max));
                let lse = max as f64 + sums.exp_sum.ln();
                // KL = Σ p (lp_ref − lp_test) = Σ p (l_ref − l_test) − (lse_ref − lse_test): the
                // logit differences are exact for close rows, so a tiny KL stays accurate, and
                // dividing by the held Σ p cancels the f32 probabilities' common scale error.
                let kld = sums.cross / reference.prob_sum - (reference.lse - lse);
                let target = self.targets[i] as usize;
                PositionFidelity {
                    pos: self.first_pos + i,
                    // Rounding can make a near-zero KL slightly negative.
                    kld: kld.max(0.0),
                    top1_agree: top == reference.top,
                    max_logit_error: sums.max_error,
                    nll_reference: reference.lse - r[target] as f64,
                    nll: lse - t[target] as f64,
                }
            })
            .collect()
    }
}

/// The first index of the largest value, and the value.
fn argmax(row: &[f32]) -> (usize, f32) {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
}

/// Σ exp(x − max), summed in f64.
#[inline(always)]
fn exp_sum_body(row: &[f32], max: f32) -> f64 {
    let mut acc = [0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let mut tail = 0f64;
    for &x in chunks.remainder() {
        tail += vmath::exp(x - max) as f64;
    }
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += vmath::exp(x - max) as f64;
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// `p = exp(x − lse)`; returns Σ p in f64.
#[inline(always)]
fn probs_body(row: &[f32], lse: f32, p: &mut [f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let (rc, pc) = (row.chunks_exact(LANES), p.chunks_exact_mut(LANES));
    let (rt, start) = (rc.remainder(), row.len() - row.len() % LANES);
    for (c, o) in rc.zip(pc) {
        for ((a, &x), y) in acc.iter_mut().zip(c).zip(o.iter_mut()) {
            *y = vmath::exp(x - lse);
            *a += *y as f64;
        }
    }
    let mut tail = 0f64;
    for (&x, y) in rt.iter().zip(&mut p[start..]) {
        *y = vmath::exp(x - lse);
        tail += *y as f64;
    }
    acc.iter().sum::<f64>() + tail
}

/// One pass over a test row: its exp-sum (for its normalizer), Σ p_ref (l_ref − l_test) and
/// max |l_ref − l_test|.
struct CrossSums {
    exp_sum: f64,
    cross: f64,
    max_error: f32,
}

#[inline(always)]
fn cross_body(r: &[f32], t: &[f32], p: &[f32], max: f32) -> CrossSums {
    let (mut e, mut c, mut m) = ([0f64; LANES], [0f64; LANES], [0f32; LANES]);
    let n = r.len() - r.len() % LANES;
    for ((rc, tc), pc) in r[..n]
        .chunks_exact(LANES)
        .zip(t[..n].chunks_exact(LANES))
        .zip(p[..n].chunks_exact(LANES))
    {
        for j in 0..LANES {
            let d = rc[j] - tc[j];
            e[j] += vmath::exp(tc[j] - max) as f64;
            c[j] += pc[j] as f64 * d as f64;
            m[j] = m[j].max(d.abs());
        }
    }
    // The tail sums apart and is added last, as in `exp_sum_body`: a row scored against itself
    // gets the reference's normalizer bit for bit, so its KL is exactly 0.
    let (mut exp_tail, mut cross_tail, mut max_error) =
        (0f64, 0f64, m.iter().fold(0f32, |a, &b| a.max(b)));
    for j in n..r.len() {
        let d = r[j] - t[j];
        exp_tail += vmath::exp(t[j] - max) as f64;
        cross_tail += p[j] as f64 * d as f64;
        max_error = max_error.max(d.abs());
    }
    CrossSums {
        exp_sum: e.iter().sum::<f64>() + exp_tail,
        cross: c.iter().sum::<f64>() + cross_tail,
        max_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook definitions in f64, one row at a time.
    fn textbook(r: &[f32], t: &[f32], target: usize) -> (f64, bool, f32, f64, f64) {
        let log_softmax = |x: &[f32]| {
            let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            x.iter().map(|&v| v as f64 - lse).collect::<Vec<f64>>()
        };
        let (lr, lt) = (log_softmax(r), log_softmax(t));
        let kld = lr.iter().zip(&lt).map(|(a, b)| a.exp() * (a - b)).sum();
        let top = |x: &[f32]| argmax(x).0;
        let err = r
            .iter()
            .zip(t)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        (kld, top(r) == top(t), err, -lr[target], -lt[target])
    }

    #[test]
    fn scores_equal_the_textbook_definitions() {
        let mut rng = kvlab_turboquant::Rng::new(7, 1);
        // An odd width, so the lanes' tail runs too; logits of a softcapped model's range.
        let (rows, vocab) = (5, 1003);
        let mut logits = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|_| scale * rng.symmetric()).collect()
        };
        let reference = logits(rows * vocab, 30.0);
        let near: Vec<f32> = reference
            .iter()
            .zip(logits(rows * vocab, 0.01))
            .map(|(a, b)| a + b)
            .collect();
        let far = logits(rows * vocab, 30.0);
        let targets: Vec<u32> = (0..rows).map(|i| (i * 211 % vocab) as u32).collect();
        let rows_ref = ReferenceRows::new(&reference, vocab, &targets, 40);
        for test in [&reference, &near, &far] {
            for (i, got) in rows_ref.score(test).iter().enumerate() {
                let span = i * vocab..(i + 1) * vocab;
                let (kld, agree, err, nll_ref, nll) =
                    textbook(&reference[span.clone()], &test[span], targets[i] as usize);
                assert_eq!(got.pos, 40 + i);
                // f32 exponentials (2 ulp) bound the normalizers' difference to ~1e-8 nats: far
                // below the ~1e-5 an f16 cache loses against f32 per position.
                assert!(
                    (got.kld - kld.max(0.0)).abs() <= 2e-8 + 1e-6 * kld,
                    "{} vs {kld}",
                    got.kld
                );
                assert_eq!(got.top1_agree, agree);
                assert_eq!(got.max_logit_error, err);
                assert!(
                    (got.nll_reference - nll_ref).abs() < 1e-5,
                    "{} vs {nll_ref}",
                    got.nll_reference
                );
                assert!((got.nll - nll).abs() < 1e-5, "{} vs {nll}", got.nll);
            }
        }
        // Against itself: nothing lost, exactly.
        assert!(rows_ref
            .score(&reference)
            .iter()
            .all(|p| p.kld == 0.0 && p.max_logit_error == 0.0));
    }
}
