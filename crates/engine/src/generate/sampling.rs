//! Next-token sampling over a logits slice: greedy, temperature, top-k and top-p, driven by
//! the workspace's seeded generator ([`kvlab_turboquant::Rng`], on its own stream) so a given
//! seed always yields the same tokens on every platform.

use kvlab_turboquant::Rng;
use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// The sampler's stream of the shared generator (any fixed value; it keeps the sampler's
/// draws unrelated to the codec's rotations for the same seed).
const SAMPLING_STREAM: u64 = 0x5341_4D50; // "SAMP"

/// Invalid sampling settings or logits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature must be finite and >= 0, got {0}")]
    Temperature(f32),
    #[error("top_k must be >= 1, got {0}")]
    TopK(usize),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("no finite logit to sample from ({0} values)")]
    NoFiniteLogit(usize),
}

/// Sampling settings shared by the app, the CLI and the engine.
///
/// `temperature == 0` means greedy (argmax). Defaults are Gemma's recommended settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (`None`: no limit).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`
    /// (`None`: no limit).
    pub top_p: Option<f32>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::chat()
    }
}

impl SamplingParams {
    /// The one set of chat defaults, Gemma's recommended sampling (temperature 1, top-k 64,
    /// top-p 0.95): what the app's controls start at (generated into the UI's bindings), the
    /// CLI's flags default to and a server request without settings gets.
    pub fn chat() -> Self {
        Self {
            temperature: 1.0,
            top_k: Some(64),
            top_p: Some(0.95),
            seed: 0,
        }
    }

    /// Always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if let Some(k) = self.top_k {
            if k == 0 {
                return Err(SamplingError::TopK(k));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(SamplingError::TopP(p));
            }
        }
        Ok(())
    }

    fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }
}

/// Index of the largest finite logit (the lowest index among ties).
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    match best {
        Some((i, v)) if v > f32::NEG_INFINITY => Ok(i as u32),
        _ => Err(SamplingError::NoFiniteLogit(logits.len())),
    }
}

/// A seeded sampler; one per generation so its sequence depends only on the seed and logits.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Self {
            params,
            rng: Rng::new(params.seed, SAMPLING_STREAM),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token id for `logits` (one value per vocabulary entry).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let candidates = self.candidates(logits)?;
        let total: f64 = candidates.iter().map(|(_, p)| p).sum();
        let mut target = self.rng.uniform() * total;
        for &(id, p) in &candidates {
            if target < p {
                return Ok(id);
            }
            target -= p;
        }
        // Rounding can leave `target` a hair above the last weight.
        candidates
            .last()
            .map(|(id, _)| *id)
            .ok_or(SamplingError::NoFiniteLogit(logits.len()))
    }

    /// The kept tokens with unnormalised probabilities (in a deterministic order).
    fn candidates(&self, logits: &[f32]) -> Result<Vec<(u32, f64)>, SamplingError> {
        let inv_t = 1.0 / f64::from(self.params.temperature);
        // Gemma's vocabulary has 262144 entries and the app keeps 64: pick the k best logits
        // in one pass first, so exp and the sorts below touch k values, not the vocabulary.
        let kept: Vec<(u32, f32)> = match self.params.top_k {
            Some(k) if k < logits.len() => top_k_logits(logits, k),
            _ => logits
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, &v)| (i as u32, v))
                .collect(),
        };
        let max = kept
            .iter()
            .fold(f64::NEG_INFINITY, |m, &(_, v)| m.max(f64::from(v)));
        if max == f64::NEG_INFINITY {
            return Err(SamplingError::NoFiniteLogit(logits.len()));
        }
        let mut probs: Vec<(u32, f64)> = kept
            .into_iter()
            .map(|(i, v)| (i, ((f64::from(v) - max) * inv_t).exp()))
            .collect();
        // Total order (weight desc, id asc): selections are reproducible.
        let desc = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let Some(p) = self.params.top_p else {
            return Ok(probs);
        };
        let threshold = f64::from(p) * probs.iter().map(|(_, w)| w).sum::<f64>();
        // The nucleus is usually small: sort only a growing head instead of the whole vocab.
        let mut head = probs.len().min(64);
        loop {
            if head < probs.len() {
                probs.select_nth_unstable_by(head - 1, desc);
            }
            probs[..head].sort_unstable_by(desc);
            let mut cumulative = 0.0;
            for n in 0..head {
                cumulative += probs[n].1;
                if cumulative >= threshold {
                    probs.truncate(n + 1);
                    return Ok(probs);
                }
            }
            if head == probs.len() {
                return Ok(probs);
            }
            head = (head * 4).min(probs.len());
        }
    }
}

/// A logit ranked best-first: larger logit, then smaller id.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ranked {
    logit: f32,
    id: u32,
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    /// Greater is better.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.logit
            .total_cmp(&other.logit)
            .then(other.id.cmp(&self.id))
    }
}

/// The `k` best finite logits (larger first, the smaller id among equals), best first, in
/// one pass over `logits` with a heap of `k`: most values only meet one comparison with the
/// worst kept logit.
fn top_k_logits(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut heap: BinaryHeap<Reverse<Ranked>> = BinaryHeap::with_capacity(k + 1);
    // The worst kept logit once the heap is full: ids only grow, so an equal logit later in
    // the slice ranks below it and is skipped.
    let mut floor = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_finite() || (heap.len() == k && v <= floor) {
            continue;
        }
        let item = Reverse(Ranked {
            logit: v,
            id: i as u32,
        });
        if heap.len() < k {
            heap.push(item);
        } else if let Some(mut worst) = heap.peek_mut() {
            *worst = item;
        }
        if heap.len() == k {
            floor = heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.logit);
        }
    }
    heap.into_sorted_vec()
        .into_iter()
        .map(|Reverse(r)| (r.id, r.logit))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 42 over five equal logits (computed outside this code from the published
    /// SplitMix64 and xoshiro256** algorithms on the sampler's stream).
    const PINNED_SEED_42: [u32; 12] = [1, 3, 0, 3, 0, 0, 1, 2, 1, 2, 1, 1];

    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    fn sampled(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params).unwrap();
        (0..n).map(|_| s.sample(logits).unwrap()).collect()
    }

    fn counts(ids: &[u32], vocab: usize) -> Vec<usize> {
        let mut c = vec![0; vocab];
        for &i in ids {
            c[i as usize] += 1;
        }
        c
    }

    #[test]
    fn greedy_picks_the_argmax() {
        let logits = [0.1, 2.5, -1.0, 2.4, f32::NAN];
        assert_eq!(sampled(SamplingParams::greedy(), &logits, 3), [1, 1, 1]);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -5.0]).unwrap(), 1);
        assert_eq!(
            argmax(&[f32::NAN, f32::NEG_INFINITY]),
            Err(SamplingError::NoFiniteLogit(2))
        );
        assert_eq!(argmax(&[]), Err(SamplingError::NoFiniteLogit(0)));
    }

    #[test]
    fn top_k_one_equals_greedy_at_any_temperature() {
        let mut rng = Rng::new(7, 0);
        let logits: Vec<f32> = (0..1000).map(|_| (rng.uniform() * 10.0) as f32).collect();
        let expect = argmax(&logits).unwrap();
        let params = SamplingParams {
            temperature: 1.7,
            top_k: Some(1),
            top_p: Some(0.9),
            seed: 3,
        };
        assert!(sampled(params, &logits, 50).iter().all(|&t| t == expect));
    }

    #[test]
    fn same_seed_same_sequence_other_seed_other_sequence() {
        let logits = logits_of(&[0.2; 5]);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 42,
        };
        let a = sampled(p, &logits, 64);
        assert_eq!(a, sampled(p, &logits, 64));
        assert_ne!(a, sampled(SamplingParams { seed: 43, ..p }, &logits, 64));
    }

    #[test]
    fn a_seed_means_the_same_tokens_in_every_build() {
        // Pinned: a seed the user wrote down must replay the same answer after an upgrade,
        // so a change of generator or stream shows up here, not in a user's report.
        let logits = logits_of(&[0.2; 5]);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 42,
        };
        assert_eq!(sampled(p, &logits, 12), PINNED_SEED_42);
    }

    #[test]
    fn unrestricted_sampling_follows_the_distribution() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 1,
        };
        let c = counts(&sampled(p, &logits, 20_000), 4);
        let f: Vec<f64> = c.iter().map(|&n| n as f64 / 20_000.0).collect();
        for (got, want) in f.iter().zip([0.5, 0.3, 0.15, 0.05]) {
            assert!((got - want).abs() < 0.015, "{f:?}");
        }
    }

    #[test]
    fn top_p_excludes_the_tail() {
        // Cumulative 0.5, 0.8, 0.95, 1.0: top_p 0.7 keeps {0, 1} renormalised to 0.625/0.375.
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.7),
            seed: 9,
        };
        let c = counts(&sampled(p, &logits, 20_000), 4);
        assert_eq!((c[2], c[3]), (0, 0), "{c:?}");
        let f0 = c[0] as f64 / 20_000.0;
        assert!((f0 - 0.625).abs() < 0.015, "{c:?}");
    }

    #[test]
    fn top_k_restricts_to_the_k_best_and_temperature_sharpens() {
        let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: Some(2),
            top_p: None,
            seed: 5,
        };
        let c = counts(&sampled(p, &logits, 20_000), 4);
        assert_eq!((c[0], c[2]), (0, 0), "{c:?}");
        assert!((c[1] as f64 / 20_000.0 - 4.0 / 7.0).abs() < 0.015, "{c:?}");
        // T = 0.5 squares the probabilities: 0.16 / (0.16 + 0.09) = 0.64.
        let cold = SamplingParams {
            temperature: 0.5,
            ..p
        };
        let c = counts(&sampled(cold, &logits, 20_000), 4);
        assert!((c[1] as f64 / 20_000.0 - 0.64).abs() < 0.015, "{c:?}");
    }

    #[test]
    fn nucleus_over_a_large_vocab_matches_a_full_sort() {
        let mut rng = Rng::new(11, 0);
        let logits: Vec<f32> = (0..5000).map(|_| (rng.uniform() * 4.0) as f32).collect();
        let params = SamplingParams {
            temperature: 0.8,
            top_k: None,
            top_p: Some(0.9),
            seed: 0,
        };
        let got = Sampler::new(params).unwrap().candidates(&logits).unwrap();
        // Reference: sort everything, take the smallest prefix reaching 90 %.
        let mut all: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, (f64::from(v) / 0.8).exp()))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f64 = all.iter().map(|x| x.1).sum();
        let mut cum = 0.0;
        let n = all
            .iter()
            .position(|x| {
                cum += x.1;
                cum >= 0.9 * total
            })
            .unwrap()
            + 1;
        let ids = |v: &[(u32, f64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
        assert!(n > 64, "the test must exercise head growth (n = {n})");
        assert_eq!(ids(&got), ids(&all[..n]));
    }

    /// The one-pass top-k against a full sort, on a vocabulary with many exact ties (values
    /// on a coarse grid) and non-finite entries: the same ids, best first, the smaller id
    /// first among equal logits; and sampled candidates keep that order with exp weights.
    #[test]
    fn one_pass_top_k_matches_a_full_sort_with_ties_and_non_finite_values() {
        let mut rng = Rng::new(5, 0);
        let mut logits: Vec<f32> = (0..20_000)
            .map(|_| (rng.below(200) as f32) * 0.25 - 30.0)
            .collect();
        for i in (0..logits.len()).step_by(997) {
            logits[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 3];
        }
        let mut reference: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (i as u32, v))
            .collect();
        reference.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for k in [1, 2, 64, 500, 19_000] {
            let got = top_k_logits(&logits, k);
            assert_eq!(got, reference[..k], "k = {k}");
        }
        // More than there are finite values: every finite one.
        assert_eq!(top_k_logits(&logits, 19_990), reference);

        let params = SamplingParams {
            temperature: 0.5,
            top_k: Some(64),
            top_p: None,
            seed: 0,
        };
        let got = Sampler::new(params).unwrap().candidates(&logits).unwrap();
        let max = f64::from(reference[0].1);
        let want: Vec<(u32, f64)> = reference[..64]
            .iter()
            .map(|&(i, v)| (i, ((f64::from(v) - max) / 0.5).exp()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn invalid_params_are_rejected() {
        let bad = |p: SamplingParams| Sampler::new(p).unwrap_err();
        let d = SamplingParams::default();
        assert_eq!(
            bad(SamplingParams {
                temperature: -1.0,
                ..d
            }),
            SamplingError::Temperature(-1.0)
        );
        assert!(matches!(
            bad(SamplingParams {
                temperature: f32::NAN,
                ..d
            }),
            SamplingError::Temperature(_)
        ));
        assert_eq!(
            bad(SamplingParams {
                top_k: Some(0),
                ..d
            }),
            SamplingError::TopK(0)
        );
        assert_eq!(
            bad(SamplingParams {
                top_p: Some(0.0),
                ..d
            }),
            SamplingError::TopP(0.0)
        );
        assert_eq!(
            bad(SamplingParams {
                top_p: Some(1.5),
                ..d
            }),
            SamplingError::TopP(1.5)
        );
        let mut s = Sampler::new(d).unwrap();
        assert_eq!(
            s.sample(&[f32::NAN; 3]),
            Err(SamplingError::NoFiniteLogit(3))
        );
    }

    #[test]
    fn json_shape_is_pinned() {
        let p = SamplingParams::default();
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"temperature":1.0,"top_k":64,"top_p":0.95,"seed":0}"#
        );
        let g: SamplingParams =
            serde_json::from_str(r#"{"temperature":0.0,"top_k":null,"top_p":null,"seed":7}"#)
                .unwrap();
        assert_eq!(
            g,
            SamplingParams {
                seed: 7,
                ..SamplingParams::greedy()
            }
        );
        let partial: SamplingParams = serde_json::from_str(r#"{"seed":3}"#).unwrap();
        assert_eq!(partial, SamplingParams { seed: 3, ..p });
        assert!(serde_json::from_str::<SamplingParams>(r#"{"temp":1}"#).is_err());
    }
}
