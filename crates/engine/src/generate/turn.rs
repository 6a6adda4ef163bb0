//! One chat turn over a conversation's session, a step at a time: [`Turn::start`] lines the
//! cache up with the prompt (its cached prefix reused), then each step is two halves:
//! [`Turn::next`] says what to run (the next prefill chunk, or the token just sampled) or
//! ends the turn (its stats and `done` go out), and once the engine has run those ids in one
//! pass with other sequences' rows, [`Turn::ran`] takes their logits. Whoever schedules
//! turns (the engine thread) owns the session; a turn holds no reference to it between
//! steps.

use std::time::Instant;

use candle_core::Tensor;

use super::session::Session;
use super::{GenerateError, GenerateRequest, Sequence};
use crate::constrain::Guide;
use crate::contract::Event;
use crate::contract::{CacheOrigin, ConversationId};
use crate::models::common::Model;
use crate::tokenizer::GemmaTokenizer;

/// What a turn runs next ([`Turn::next`]).
#[derive(Debug)]
pub enum Next {
    /// These ids in the session's cache: a prefill chunk or the token just sampled.
    Run(Vec<u32>),
    /// The turn ended: its stats and `done` were emitted.
    Finished,
}

fn ended() -> GenerateError {
    GenerateError::Engine(crate::error::EngineError::invalid("the turn has ended"))
}

/// A chat turn in progress (see the module doc).
#[derive(Debug)]
pub struct Turn {
    /// `None` once finished.
    seq: Option<Sequence>,
    chunk: usize,
    origin: CacheOrigin,
}

impl Turn {
    /// Starts `request`'s turn (held to `guide`, its compiled constraint) over `session`
    /// with the prompt `prompt` (ids), arrived at
    /// `started`, in `conversation` whose cache came from `origin`: the cache keeps the
    /// longest prefix it shares with the prompt (rows that were held as codes are never kept
    /// for a dense policy: then the history is read again and the stats say `reread`).
    pub fn start(
        model: &Model,
        tokenizer: &GemmaTokenizer,
        session: &mut Session,
        (request, guide): (&GenerateRequest, Option<Guide>),
        prompt: Vec<u32>,
        started: Instant,
        (conversation, origin): (ConversationId, CacheOrigin),
    ) -> Result<Self, GenerateError> {
        request.check()?;
        let max_context = request.context_limit(model.config().max_position_embeddings);
        super::check_prompt(prompt.len(), max_context)?;
        let prepared = session.prepare(&prompt)?;
        let origin = if prepared.reread_coded {
            CacheOrigin::Reread
        } else {
            origin
        };
        let seq = Sequence::new(
            tokenizer,
            prompt,
            prepared.reused,
            request.sampling,
            request.max_tokens,
            max_context,
            started,
        )?
        .with_stop_strings(request.stop.clone())
        .with_guide(guide)
        .reading_calls(!request.prompt.tools().is_empty())
        .in_conversation(conversation, origin);
        Ok(Self {
            seq: Some(seq),
            chunk: request.prefill_chunk.max(1),
            origin,
        })
    }

    /// Where its cache came from (`reread` when its coded rows were dropped at the start).
    pub fn origin(&self) -> CacheOrigin {
        self.origin
    }

    /// Whether the turn's next step is a prefill chunk (a batched step takes one at most).
    pub fn prefilling(&self) -> bool {
        self.seq
            .as_ref()
            .is_some_and(|s| s.next_prefill(1).is_some())
    }

    /// The first half of a step: what to run next in the session's cache — the next prefill
    /// chunk (at most `limit` tokens when set) or the token just sampled (its text already
    /// emitted) — or the turn's end (then `emit` got its last text, its stats and `done`);
    /// `cancelled` ends it before the next token. The caller runs the ids, then
    /// hands their logits to [`Turn::ran`].
    pub fn next(
        &mut self,
        tokenizer: &GemmaTokenizer,
        session: &mut Session,
        cancelled: bool,
        limit: Option<usize>,
        emit: &mut dyn FnMut(Event),
    ) -> Result<Next, GenerateError> {
        let Some(seq) = self.seq.as_mut() else {
            return Err(ended());
        };
        let chunk = limit.map_or(self.chunk, |l| l.clamp(1, self.chunk));
        if let Some(chunk) = seq.next_prefill(chunk) {
            if cancelled {
                seq.cancel();
            } else {
                return Ok(Next::Run(chunk.to_vec()));
            }
        }
        let sampled = seq.sample(tokenizer, cancelled, session.len(), emit);
        if let Err(GenerateError::NonFiniteLogits { .. }) = &sampled {
            // The cached keys and values came from the same broken computation: keep none of
            // them (the conversation itself lives with the caller).
            session.reset()?;
        }
        if let Some(id) = sampled? {
            return Ok(Next::Run(vec![id]));
        }
        // The last sampled token was not run: a saved cache keeps it for a continuation.
        let all = seq.all_ids();
        session.set_pending(all.get(session.len()..).unwrap_or(&[]));
        let memory = session.memory();
        let policy = session.policy().clone();
        let Some(seq) = self.seq.take() else {
            return Err(ended());
        };
        seq.finish(tokenizer, session.len(), &memory, &policy, emit)?;
        Ok(Next::Finished)
    }

    /// The second half of a step: `ids` from [`Turn::next`] ran in `secs` (the session
    /// recorded them when `logits` is `Ok`), giving `logits` for their last position.
    pub fn ran(
        &mut self,
        ids: &[u32],
        logits: Result<Tensor, GenerateError>,
        secs: f64,
    ) -> Result<(), GenerateError> {
        let Some(seq) = self.seq.as_mut() else {
            return Err(ended());
        };
        let logits = logits?;
        if seq.next_prefill(1).is_some() {
            seq.prefilled(ids.len(), logits, secs);
        } else {
            seq.fed(logits);
        }
        Ok(())
    }

    /// Tokens of context the turn may reach: its prompt and every token it may generate,
    /// within the model's context.
    pub fn grown_context(prompt: &[u32], request: &GenerateRequest, max_context: usize) -> usize {
        super::grown_context(prompt, request.max_tokens, max_context)
    }
}
