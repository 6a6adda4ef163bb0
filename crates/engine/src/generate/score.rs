//! Scoring a fixed token stream: per-position next-token log-probabilities (perplexity) and
//! all-position logits under a chunk schedule (parity checks), both run through a caller's
//! cache so any KV precision can be measured the same way.

use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

use super::GenerateError;
use crate::error::EngineError;
use crate::kv::KvCache;
use crate::models::common::{Logits, Model};

/// Chunk sizes: `first` once, then `cycle` repeated, the last chunk cut at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSchedule {
    /// Size of the first chunk.
    pub first: usize,
    /// Sizes that repeat after it (empty: `first` repeats).
    pub cycle: Vec<usize>,
}

impl ChunkSchedule {
    /// One size throughout.
    pub fn uniform(size: usize) -> Self {
        Self {
            first: size,
            cycle: Vec::new(),
        }
    }

    /// Parses `"10,1,3,1,5"`: 10 once, then 1,3,1,5 cycling. Sizes must be ≥ 1.
    pub fn parse(s: &str) -> Result<Self, EngineError> {
        let sizes = s
            .split(',')
            .map(|p| match p.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(EngineError::InvalidRequest(format!(
                    "bad chunk size `{p}` in schedule `{s}` (want positive integers, comma-separated)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (&first, cycle) = sizes
            .split_first()
            .ok_or_else(|| EngineError::InvalidRequest("empty chunk schedule".into()))?;
        Ok(Self {
            first,
            cycle: cycle.to_vec(),
        })
    }

    /// The chunk lengths that cover `total` tokens.
    pub fn chunks(&self, total: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < total {
            let size = if out.is_empty() || self.cycle.is_empty() {
                self.first
            } else {
                let s = self.cycle[i % self.cycle.len()];
                i += 1;
                s
            }
            .max(1);
            let n = size.min(total - at);
            out.push(n);
            at += n;
        }
        out
    }
}

/// Logits of every position of `ids` `[T, vocab]` (f32), run through `cache` in the chunks
/// of `schedule`.
pub fn chunked_logits(
    model: &Model,
    cache: &mut KvCache,
    ids: &[u32],
    schedule: &ChunkSchedule,
) -> Result<Tensor, GenerateError> {
    if ids.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let mut outs = Vec::new();
    let mut at = 0;
    for n in schedule.chunks(ids.len()) {
        outs.push(model.forward(&ids[at..at + n], cache, Logits::All)?);
        at += n;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// `lp[i] = log p(ids[i + 1] | ids[..= i])` for `i in 0..ids.len() − 1`, running `ids`
/// through `cache` in chunks of `chunk` tokens. `on_chunk(done)` reports progress.
pub fn next_token_logprobs(
    model: &Model,
    cache: &mut KvCache,
    ids: &[u32],
    chunk: usize,
    on_chunk: &mut dyn FnMut(usize),
) -> Result<Vec<f32>, GenerateError> {
    if ids.len() < 2 {
        return Err(GenerateError::EmptyPrompt);
    }
    let device = model.device().clone();
    let mut out = Vec::with_capacity(ids.len() - 1);
    for (n, start) in ChunkSchedule::uniform(chunk.max(1))
        .chunks(ids.len())
        .into_iter()
        .scan(0, |at, n| {
            let s = *at;
            *at += n;
            Some((n, s))
        })
    {
        let logits = model.forward(&ids[start..start + n], cache, Logits::All)?;
        // Positions whose next token exists.
        let scored = n.min(ids.len() - 1 - start);
        if scored > 0 {
            let lsm = candle_nn::ops::log_softmax(&logits.narrow(0, 0, scored)?, D::Minus1)?;
            let targets =
                Tensor::from_slice(&ids[start + 1..start + 1 + scored], (scored, 1), &device)?;
            let picked = lsm.gather(&targets, 1)?.squeeze(1)?.to_dtype(DType::F32)?;
            out.extend(picked.to_vec1::<f32>()?);
        }
        on_chunk(start + n);
    }
    Ok(out)
}

/// The text a perplexity run scores: line endings normalized to `\n` and leading
/// whitespace removed (alice29.txt has CRLF endings and a blank-line title block). Scoring
/// `\r` tokens would flatter the model.
pub fn normalize_text(text: &str) -> String {
    text.replace("\r\n", "\n").trim_start().to_owned()
}

/// A perplexity measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Perplexity {
    /// exp(mean negative log-likelihood).
    pub ppl: f64,
    /// Mean negative log-likelihood in nats.
    pub nll: f64,
    /// Tokens scored.
    pub tokens_scored: usize,
}

impl Perplexity {
    /// From per-token log-probabilities (natural log).
    pub fn from_logprobs(lp: &[f32]) -> Self {
        let n = lp.len();
        let nll = if n == 0 {
            0.0
        } else {
            -lp.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64
        };
        Self {
            ppl: nll.exp(),
            nll,
            tokens_scored: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_cycles_after_the_first_chunk_and_cuts_the_last() {
        let s = ChunkSchedule::parse("10,1,3,1,5").unwrap();
        assert_eq!(s.chunks(40), [10, 1, 3, 1, 5, 1, 3, 1, 5, 1, 3, 1, 5]);
        assert_eq!(s.chunks(12), [10, 1, 1]);
        assert_eq!(ChunkSchedule::parse("7").unwrap().chunks(16), [7, 7, 2]);
        assert_eq!(ChunkSchedule::uniform(4).chunks(0), Vec::<usize>::new());
        for bad in ["", "0", "3,x", "1,,2", "-1"] {
            assert!(ChunkSchedule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_is_normalized_before_scoring() {
        assert_eq!(normalize_text("\r\n\r\n  Alice\r\nwas\n"), "Alice\nwas\n");
    }

    #[test]
    fn perplexity_of_uniform_guesses_is_the_vocabulary() {
        let lp = vec![-(512f32).ln(); 9];
        let p = Perplexity::from_logprobs(&lp);
        assert_eq!(p.tokens_scored, 9);
        assert!((p.ppl - 512.0).abs() < 1e-3, "{}", p.ppl);
        assert!((p.nll - 512f64.ln()).abs() < 1e-5);
    }
}
