//! One generated sequence, whatever runs it: its prompt ids and how far they are prefilled,
//! its sampler, stop rules, detokenizing splitter (answer vs thinking) and timing. A chat
//! turn ([`super::generate`]) drives one over the conversation's session; a comparison
//! ([`crate::generate::compare`]) drives two over fresh caches in lockstep. The caller owns the cache and
//! runs the model; the sequence decides what to run next and when to stop, so every entry
//! point stops, streams and counts the same way.

use std::time::Instant;

use candle_core::Tensor;

use super::stop::StopMatcher;
use super::stream::Delta;
use super::{per_second, GenerateError};
use crate::constrain::Guide;
use crate::contract::{CacheOrigin, ConversationId};
use crate::contract::{DoneReason, Event, GenStats};
use crate::generate::sampling::{Sampler, SamplingParams};
use crate::generate::stream::StreamSplitter;
use crate::kv::{KvMemoryReport, PrecisionPolicy};
use crate::tokenizer::GemmaTokenizer;

/// A fresh id for a tool call (`call_` and 16 hex digits, unguessable as OpenAI's are).
fn call_id() -> String {
    let mut bytes = [0u8; 8];
    // The OS's random source; a clock-and-counter mix if it fails (ids need only differ).
    if getrandom::fill(&mut bytes).is_err() {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        bytes = (crate::memory::unix_ms() ^ (n << 40)).to_le_bytes();
    }
    format!("call_{:016x}", u64::from_le_bytes(bytes))
}

/// How a sequence ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Why it ended.
    pub reason: DoneReason,
    /// Generated ids (the stop token included).
    pub token_ids: Vec<u32>,
    /// Its figures.
    pub stats: GenStats,
}

/// A generation in progress (see the module doc).
#[derive(Debug)]
pub struct Sequence {
    prompt: Vec<u32>,
    /// Prompt tokens the cache already held when the sequence began.
    reused: usize,
    /// Prompt tokens run so far (from `reused` up to `prompt.len()`).
    prefilled: usize,
    sampler: Sampler,
    splitter: StreamSplitter,
    stops: Vec<u32>,
    /// The request's stop strings, over the answer's text.
    stop_strings: StopMatcher,
    /// The grammar its tokens are held to, if any.
    guide: Option<Guide>,
    /// Tool calls made so far.
    calls: usize,
    /// The conversation it runs in and where its cache came from (for its stats).
    conversation: Option<ConversationId>,
    origin: CacheOrigin,
    max_tokens: usize,
    max_context: usize,
    ids: Vec<u32>,
    /// Logits of the last token run, waiting to be sampled.
    logits: Option<Tensor>,
    done: Option<DoneReason>,
    started: Instant,
    prefill_secs: f64,
    first_token: Option<Instant>,
}

impl Sequence {
    /// A sequence continuing `prompt`, of which the cache already holds the first `reused`
    /// tokens, generating at most `max_tokens` in a context of `max_context`; `started` is
    /// when the request arrived (time to first token counts from it).
    pub fn new(
        tokenizer: &GemmaTokenizer,
        prompt: Vec<u32>,
        reused: usize,
        sampling: SamplingParams,
        max_tokens: usize,
        max_context: usize,
        started: Instant,
    ) -> Result<Self, GenerateError> {
        Ok(Self {
            reused,
            prefilled: reused,
            prompt,
            sampler: Sampler::new(sampling)?,
            splitter: StreamSplitter::new(),
            stops: tokenizer.stop_ids().to_vec(),
            stop_strings: StopMatcher::default(),
            guide: None,
            calls: 0,
            conversation: None,
            origin: CacheOrigin::New,
            max_tokens,
            max_context,
            ids: Vec::new(),
            logits: None,
            done: None,
            started,
            prefill_secs: 0.0,
            first_token: None,
        })
    }

    /// This sequence ending where its answer's text shows one of `stops` (the text before it
    /// is the answer's end; the stop string is never sent).
    pub fn with_stop_strings(mut self, stops: Vec<String>) -> Self {
        self.stop_strings = StopMatcher::new(stops);
        self
    }

    /// This sequence reading the model's tool calls (the prompt offered tools).
    pub fn reading_calls(mut self, calls: bool) -> Self {
        self.splitter = std::mem::take(&mut self.splitter).reading_calls(calls);
        self
    }

    /// This sequence held to `guide` (each step's sampling masked to what it allows).
    pub fn with_guide(mut self, guide: Option<Guide>) -> Self {
        self.guide = guide;
        self
    }

    /// This sequence running in `conversation`, whose cache came from `origin` (its stats
    /// say so).
    pub fn in_conversation(mut self, conversation: ConversationId, origin: CacheOrigin) -> Self {
        self.conversation = Some(conversation);
        self.origin = origin;
        self
    }

    /// The next prompt chunk (at most `chunk` tokens) to run, or `None` once the prompt is in
    /// the cache (or the sequence has ended).
    pub fn next_prefill(&self, chunk: usize) -> Option<&[u32]> {
        if self.done.is_some() || self.prefilled >= self.prompt.len() {
            return None;
        }
        let end = (self.prefilled + chunk.max(1)).min(self.prompt.len());
        Some(&self.prompt[self.prefilled..end])
    }

    /// Records that the chunk from [`Sequence::next_prefill`] ran (taking `secs`) and gave
    /// `logits` for its last position.
    pub fn prefilled(&mut self, tokens: usize, logits: Tensor, secs: f64) {
        self.prefilled += tokens;
        self.prefill_secs += secs;
        self.logits = Some(logits);
    }

    /// Ends the sequence as cancelled (a no-op once it has ended).
    pub fn cancel(&mut self) {
        self.done.get_or_insert(DoneReason::Cancelled);
    }

    /// Samples the next token from the last logits and streams its text to `emit`. Returns
    /// the token to run through the model next, or `None` when the sequence has ended: on a
    /// stop token, at `max_tokens`, when the cache (holding `context_len` tokens) is full,
    /// or when `cancelled`.
    pub fn sample(
        &mut self,
        tokenizer: &GemmaTokenizer,
        cancelled: bool,
        context_len: usize,
        emit: &mut dyn FnMut(Event),
    ) -> Result<Option<u32>, GenerateError> {
        if cancelled {
            self.cancel();
        }
        if self.done.is_some() {
            return Ok(None);
        }
        // No logits only when the prefill never ran, which happens only on a cancel.
        let Some(current) = self.logits.take() else {
            self.cancel();
            return Ok(None);
        };
        if self.ids.len() >= self.max_tokens {
            self.done = Some(DoneReason::Length);
            return Ok(None);
        }
        let mut logits = current.to_vec1::<f32>()?;
        // The model's logits are soft-capped and never masked, so a NaN or an infinity means
        // broken weights or an overflow: sampling around it would print noise.
        let bad = logits.iter().filter(|v| !v.is_finite()).count();
        if bad > 0 {
            return Err(GenerateError::NonFiniteLogits {
                bad,
                vocab: logits.len(),
                position: context_len,
            });
        }
        if let Some(guide) = &mut self.guide {
            guide.mask(&mut logits)?;
        }
        let id = self.sampler.sample(&logits)?;
        if let Some(guide) = &mut self.guide {
            guide.commit(id)?;
        }
        self.first_token.get_or_insert_with(Instant::now);
        self.ids.push(id);
        let step = self.splitter.push(tokenizer, id)?;
        for d in step.deltas {
            self.emit_delta(d, emit);
        }
        if step.stop || self.stops.contains(&id) || self.stop_strings.stopped() {
            self.done = Some(DoneReason::Stop);
        } else if self.ids.len() >= self.max_tokens || context_len >= self.max_context {
            self.done = Some(DoneReason::Length);
        }
        Ok(if self.done.is_some() { None } else { Some(id) })
    }

    /// Emits a splitter delta, answer text through the stop strings (nothing after a stop).
    fn emit_delta(&mut self, d: Delta, emit: &mut dyn FnMut(Event)) {
        match d {
            Delta::Answer(text) => {
                let out = self.stop_strings.push(&text);
                if !out.is_empty() {
                    emit(Event::Token { text: out });
                }
            }
            _ if self.stop_strings.stopped() => {}
            Delta::Thinking(text) => emit(Event::Thinking { text }),
            Delta::ToolCall { name, arguments } => {
                emit(Event::ToolCall {
                    index: self.calls,
                    id: call_id(),
                    name,
                    arguments,
                });
                self.calls += 1;
            }
        }
    }

    /// Records the logits of the token [`Sequence::sample`] returned, once it ran.
    pub fn fed(&mut self, logits: Tensor) {
        self.logits = Some(logits);
    }

    /// Flushes held-back text, then emits `stats` and `done`. `context_tokens`, `memory` and
    /// `policy` describe the cache the sequence ran in, as it is now.
    pub fn finish(
        mut self,
        tokenizer: &GemmaTokenizer,
        context_tokens: usize,
        memory: &KvMemoryReport,
        policy: &PrecisionPolicy,
        emit: &mut dyn FnMut(Event),
    ) -> Result<Outcome, GenerateError> {
        for d in self.splitter.finish(tokenizer)? {
            self.emit_delta(d, emit);
        }
        let tail = self.stop_strings.finish();
        if !tail.is_empty() {
            emit(Event::Token { text: tail });
        }
        // A stop string that showed only in the text held back to the end still ends the
        // answer as a stop.
        let reason = match self.done {
            _ if self.stop_strings.stopped() => DoneReason::Stop,
            Some(r) => r,
            None => DoneReason::Cancelled,
        };
        let prefill_tokens = self.prefilled - self.reused;
        let decode_secs = self.first_token.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let stats = GenStats {
            prompt_tokens: self.prompt.len(),
            reused_tokens: self.reused,
            prefill_tokens,
            generated_tokens: self.ids.len(),
            time_to_first_token_s: self
                .first_token
                .map_or(0.0, |t| (t - self.started).as_secs_f64()),
            prefill_tok_per_s: per_second(prefill_tokens, self.prefill_secs),
            decode_tok_per_s: per_second(self.ids.len().saturating_sub(1), decode_secs),
            context_tokens,
            max_context: self.max_context,
            kv_bytes: memory.total.0,
            kv_bytes_allocated: memory.total.1,
            kv_calibrating: memory.calibrating,
            cache_spec: policy.spec_string(),
            conversation: self.conversation.clone(),
            cache_origin: self.origin,
        };
        emit(Event::Stats(stats.clone()));
        emit(Event::Done {
            reason,
            token_ids: self.ids.clone(),
        });
        Ok(Outcome {
            reason,
            token_ids: self.ids,
            stats,
        })
    }

    /// The prompt and the tokens generated so far, in order (what a teacher-forced replay
    /// of this sequence runs).
    pub fn all_ids(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.ids).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Family;
    use crate::kv::KvPrecision;
    use crate::tokenizer::tiny;
    use candle_core::Device;

    /// Logits that make `id` the greedy choice over a `vocab`-sized vocabulary.
    fn peak(id: u32, vocab: usize) -> Tensor {
        let mut v = vec![0f32; vocab];
        v[id as usize] = 10.0;
        Tensor::from_vec(v, vocab, &Device::Cpu).unwrap()
    }

    fn report() -> KvMemoryReport {
        KvMemoryReport {
            layers: Vec::new(),
            sliding: (0, 0),
            full: (0, 0),
            total: (64, 128),
            calibrating: false,
        }
    }

    #[test]
    fn prefill_chunks_then_samples_until_the_stop_token() {
        let tok = tiny(Family::Gemma3);
        let vocab = tok.vocab_size();
        let hi = tok.encode("hi", false).unwrap();
        let mut seq = Sequence::new(
            &tok,
            vec![2, 5, 6, 7, 8],
            1,
            SamplingParams::greedy(),
            10,
            100,
            Instant::now(),
        )
        .unwrap();
        // The reused token is not run again; chunks of 3.
        assert_eq!(seq.next_prefill(3), Some(&[5, 6, 7][..]));
        seq.prefilled(3, peak(hi[0], vocab), 0.01);
        assert_eq!(seq.next_prefill(3), Some(&[8][..]));
        seq.prefilled(1, peak(hi[0], vocab), 0.01);
        assert_eq!(seq.next_prefill(3), None);
        let mut text = String::new();
        let mut emit = |e: Event| {
            if let Event::Token { text: t } = e {
                text.push_str(&t)
            }
        };
        let next = seq.sample(&tok, false, 5, &mut emit).unwrap();
        assert_eq!(next, Some(hi[0]));
        // The end of turn (106) stops it.
        seq.fed(peak(106, vocab));
        assert_eq!(seq.sample(&tok, false, 6, &mut emit).unwrap(), None);
        assert!(seq.done.is_some());
        let mut events = Vec::new();
        let out = seq
            .finish(
                &tok,
                7,
                &report(),
                &PrecisionPolicy::uniform(KvPrecision::F16),
                &mut |e| events.push(e),
            )
            .unwrap();
        assert_eq!(out.reason, DoneReason::Stop);
        assert_eq!(out.token_ids, vec![hi[0], 106]);
        assert_eq!(
            (
                out.stats.prompt_tokens,
                out.stats.reused_tokens,
                out.stats.prefill_tokens
            ),
            (5, 1, 4)
        );
        assert_eq!(
            (out.stats.kv_bytes, out.stats.cache_spec.as_str()),
            (64, "f16")
        );
        assert!(matches!(events.last(), Some(Event::Done { .. })));
        assert!(matches!(events[events.len() - 2], Event::Stats(_)));
        assert_eq!(text, tok.decode(&hi[..1], false).unwrap());
    }

    #[test]
    fn length_and_cancel_end_a_sequence() {
        let tok = tiny(Family::Gemma3);
        let vocab = tok.vocab_size();
        let new = |max_tokens, max_context| {
            let mut s = Sequence::new(
                &tok,
                vec![2, 5],
                0,
                SamplingParams::greedy(),
                max_tokens,
                max_context,
                Instant::now(),
            )
            .unwrap();
            s.prefilled(2, peak(9, vocab), 0.0);
            s
        };
        let mut ignore = |_: Event| {};
        // max_tokens 1: the first token is the last.
        let mut s = new(1, 100);
        assert_eq!(s.sample(&tok, false, 2, &mut ignore).unwrap(), None);
        assert_eq!(s.done, Some(DoneReason::Length));
        // A full context ends it too.
        let mut s = new(10, 2);
        assert_eq!(s.sample(&tok, false, 2, &mut ignore).unwrap(), None);
        assert_eq!(s.done, Some(DoneReason::Length));
        // Cancelled before sampling: nothing is generated.
        let mut s = new(10, 100);
        assert_eq!(s.sample(&tok, true, 2, &mut ignore).unwrap(), None);
        assert_eq!((s.done, s.ids.len()), (Some(DoneReason::Cancelled), 0));
    }
}
