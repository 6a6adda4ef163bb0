//! Engine-level decode benchmark (`kvlab bench decode`, cargo feature `bench`): prefill N
//! tokens, then greedy decode M more, timing both phases separately. Reports figures;
//! asserts nothing.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Logits, Model};
use crate::error::Result;
use crate::kv::{KvMemoryReport, PrecisionPolicy};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeBenchSpec {
    /// Context tokens to prefill.
    pub ctx: usize,
    /// Tokens to decode after the prefill.
    pub decode: usize,
    /// Prefill chunk size (bounds activation memory).
    pub prefill_chunk: usize,
    /// KV storage precision per layer.
    pub policy: PrecisionPolicy,
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

/// Prefills `spec.ctx` tokens (BOS first) in chunks, then greedily decodes `spec.decode`.
pub fn bench_decode(model: &Model, spec: &DecodeBenchSpec) -> Result<DecodeBenchReport> {
    let vocab = model.config().vocab_size;
    let mut ids = filler_ids(spec.ctx.max(1), vocab);
    if let Some(b) = model.config().bos_token_id {
        ids[0] = b;
    }
    let mut cache = model.new_cache(&spec.policy)?;
    let t0 = Instant::now();
    let mut last = None;
    for chunk in ids.chunks(spec.prefill_chunk.max(1)) {
        last = Some(model.forward(chunk, &mut cache, Logits::Last)?);
    }
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut next = match last {
        Some(l) => l.argmax(0)?.to_scalar::<u32>()?,
        None => 0,
    };
    let t1 = Instant::now();
    for _ in 0..spec.decode {
        let l = model.forward(&[next], &mut cache, Logits::Last)?;
        next = l.argmax(0)?.to_scalar::<u32>()?;
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    Ok(DecodeBenchReport {
        prefill_tokens: ids.len(),
        prefill_secs,
        decode_tokens: spec.decode,
        decode_secs,
        memory: cache.memory(),
    })
}
