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
use crate::images::PromptImage;
use crate::models::common::Model;
use crate::models::common::SoftSpan;
use crate::tokenizer::GemmaTokenizer;

/// What a turn runs next ([`Turn::next`]).
#[derive(Debug)]
pub enum Next {
    /// These ids in the session's cache: a prefill chunk (with the soft tokens of the
    /// images in it) or the token just sampled.
    Run(Vec<u32>, Vec<SoftSpan>),
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
    /// The prompt's images the cache did not hold, with their soft tokens.
    images: Vec<(PromptImage, Tensor)>,
}

/// Encodes a prompt's image into its soft tokens (the loaded vision tower's work).
pub type EncodeImage<'a> = &'a mut dyn FnMut(&PromptImage) -> Result<Tensor, GenerateError>;

impl Turn {
    /// Starts `request`'s turn (held to `guide`, its compiled constraint) over `session`
    /// with the prompt `prompt` (ids, and the images in it, which `encode` makes soft
    /// tokens of where the cache does not hold them), arrived at
    /// `started`, in `conversation` whose cache came from `origin`: the cache keeps the
    /// longest prefix it shares with the prompt (rows that were held as codes are never kept
    /// for a dense policy: then the history is read again and the stats say `reread`).
    pub fn start(
        model: &Model,
        tokenizer: &GemmaTokenizer,
        session: &mut Session,
        (request, guide): (&GenerateRequest, Option<Guide>),
        (prompt, images, encode): (Vec<u32>, Vec<PromptImage>, EncodeImage<'_>),
        started: Instant,
        (conversation, origin): (ConversationId, CacheOrigin),
    ) -> Result<Self, GenerateError> {
        request.check()?;
        let max_context = request.context_limit(model.config().max_position_embeddings);
        super::check_prompt(prompt.len(), max_context)?;
        let prepared = session.prepare(&prompt, &images)?;
        let images = images
            .into_iter()
            .filter(|i| i.at + i.len > prepared.reused)
            .map(|i| {
                let soft = encode(&i)?;
                Ok((i, soft))
            })
            .collect::<Result<Vec<_>, GenerateError>>()?;
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
            images,
        })
    }

    /// The soft tokens of the images in the chunk of `len` tokens from `pos`.
    fn soft_at(&self, pos: usize, len: usize) -> Result<Vec<SoftSpan>, GenerateError> {
        let mut out = Vec::new();
        for (image, rows) in &self.images {
            let (a, b) = (image.at.max(pos), (image.at + image.len).min(pos + len));
            if a < b {
                out.push(SoftSpan {
                    at: a - pos,
                    rows: rows.narrow(0, a - image.at, b - a)?,
                });
            }
        }
        Ok(out)
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
        let chunk = limit.map_or(self.chunk, |l| l.clamp(1, self.chunk));
        let pos = session.len();
        let chunk = chunk_at(self.images.iter().map(|(i, _)| i), pos, chunk);
        let seq = self.seq.as_mut().ok_or_else(ended)?;
        if let Some(ids) = seq.next_prefill(chunk) {
            if cancelled {
                seq.cancel();
            } else {
                let ids = ids.to_vec();
                let soft = self.soft_at(pos, ids.len())?;
                return Ok(Next::Run(ids, soft));
            }
        }
        let sampled = seq.sample(tokenizer, cancelled, session.len(), emit);
        if let Err(GenerateError::NonFiniteLogits { .. }) = &sampled {
            // The cached keys and values came from the same broken computation: keep none of
            // them (the conversation itself lives with the caller).
            session.reset()?;
        }
        if let Some(id) = sampled? {
            return Ok(Next::Run(vec![id], Vec::new()));
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

/// The length of the chunk from position `pos` of at most `want` tokens, but never cutting
/// one of `images` (in order; one that starts here runs whole, however long) nor holding
/// two of them.
fn chunk_at<'a>(
    images: impl Iterator<Item = &'a PromptImage>,
    pos: usize,
    mut want: usize,
) -> usize {
    for image in images {
        let (a, b) = (image.at, image.at + image.len);
        if b <= pos {
            continue;
        }
        if a <= pos {
            want = want.max(b - pos);
        } else {
            if a < pos + want {
                want = a - pos;
            }
            break;
        }
    }
    want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stop_before_an_image_take_it_whole_and_never_hold_two() {
        let image = |at, len| PromptImage {
            at,
            len,
            id: String::new(),
        };
        let images = [image(10, 70), image(81, 5)];
        let chunk = |pos, want| chunk_at(images.iter(), pos, want);
        // Text before the first image: up to its start.
        assert_eq!(chunk(0, 512), 10);
        assert_eq!(chunk(0, 4), 4);
        // At an image: all of it, past a small limit, and not into the next.
        assert_eq!(chunk(10, 7), 70);
        assert_eq!(chunk(10, 512), 71);
        // Between them and after them, as asked.
        assert_eq!(chunk(80, 512), 1);
        assert_eq!(chunk(81, 2), 5);
        assert_eq!(chunk(86, 32), 32);
    }
}
