//! Starting requests: a turn's conversation named or found, its prompt rendered for the
//! loaded model, the pool opening the turn; a comparison admitted for its two caches.

use std::sync::Arc;
use std::time::Instant;

use super::error::JobError;
use super::lock;
use super::submit::{CompareJob, GenerateJob, Queued};
use crate::constrain::Guide;
use crate::contract::{CacheOrigin, ConversationChoice, ConversationId, Event};
use crate::conversations::{Need, Purpose, TurnAsk};
use crate::generate::compare::CompareRun;
use crate::generate::Turn;
use crate::kv::PrecisionPolicy;
use crate::tokenizer::GemmaTokenizer;

use super::run::{Task, Worker};

impl Worker {
    /// The conversation a request runs in (`policy`: the cache it runs with, which an
    /// unnamed request's match must hold).
    pub(super) fn conversation(
        &mut self,
        choice: &Option<ConversationChoice>,
        prompt: &[u32],
        policy: &PrecisionPolicy,
    ) -> Result<ConversationId, JobError> {
        Ok(match choice {
            None => ConversationId::default_id(),
            Some(ConversationChoice::Id { id }) => id.clone(),
            Some(ConversationChoice::Continuing { prefix }) => {
                match self.pool.continuing(prefix, prompt, policy) {
                    Some(id) => id,
                    None => self.pool.unnamed(prefix)?,
                }
            }
        })
    }

    pub(super) fn start_turn(&mut self, q: Queued<GenerateJob>) {
        let Queued {
            job,
            cancel,
            arrived,
            ..
        } = q;
        let GenerateJob {
            request,
            prompt,
            tokenizer,
            guide,
            mut sink,
        } = job;
        match self.prepare_turn(&request, prompt, (&tokenizer, guide), arrived) {
            Ok((id, turn)) => {
                self.tasks.push(Task::Turn {
                    id,
                    turn: Box::new(turn),
                    sink,
                    cancel,
                });
            }
            Err(e) => sink(e.to_event()),
        }
    }

    /// Everything before a turn's first step: its conversation (the pool opens the turn:
    /// in memory with room to grow, in the cache the request names), lined up with the
    /// prompt. A refused turn leaves no conversation behind that it registered.
    pub(super) fn prepare_turn(
        &mut self,
        request: &crate::generate::GenerateRequest,
        prompt: super::submit::Rendered,
        (tokenizer, guide): (&Arc<GemmaTokenizer>, Option<Guide>),
        arrived: Instant,
    ) -> Result<(ConversationId, Turn), JobError> {
        let ((prompt, images, held), guide) = self.rendered(
            &request.prompt,
            request.context,
            (prompt, tokenizer),
            (request.constraint.as_ref(), guide),
        )?;
        let wanted = match &request.cache {
            Some(cache) => Some(cache.policy()?),
            None => None,
        };
        let effective = wanted.clone().unwrap_or_else(|| self.policy.clone());
        let id = self.conversation(&request.conversation, &prompt, &effective)?;
        let default = self.policy.clone();
        let turn = self.with_pool(|pool, host, loaded| {
            let max_context = request.context_limit(loaded.config.max_position_embeddings);
            let ask = TurnAsk {
                wanted: wanted.as_ref(),
                default: &default,
                grown: Turn::grown_context(&prompt, request, max_context),
                unnamed: matches!(
                    request.conversation,
                    Some(ConversationChoice::Continuing { .. })
                ),
            };
            let mut encode = |image: &crate::images::PromptImage| {
                encode_image(loaded.vision.as_ref(), &held, image)
            };
            pool.open_turn(host, &id, ask, |session, origin| {
                Turn::start(
                    &loaded.model,
                    &loaded.tokenizer,
                    session,
                    (request, guide),
                    (prompt, images, &mut encode),
                    arrived,
                    (id.clone(), origin),
                )
                .map_err(JobError::from)
            })
        })?;
        self.count(turn.origin());
        Ok((id, turn))
    }

    /// The prompt's ids (with its images) and compiled constraint for the loaded model: as
    /// the caller made them over `tokenizer`, unless the model changed since (then both
    /// made again here).
    pub(super) fn rendered(
        &self,
        prompt: &crate::generate::Prompt,
        context: Option<usize>,
        (rendered, tokenizer): (super::submit::Rendered, &Arc<GemmaTokenizer>),
        (constraint, guide): (Option<&crate::constrain::Constraint>, Option<Guide>),
    ) -> Result<(super::submit::Rendered, Option<Guide>), JobError> {
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        if Arc::ptr_eq(tokenizer, &loaded.tokenizer) {
            return Ok((rendered, guide));
        }
        let model = loaded.config.max_position_embeddings;
        let facts = loaded.vision.as_ref().map(|v| v.facts);
        let rendered = crate::generate::render_with_images(
            &loaded.tokenizer,
            prompt,
            context.map_or(model, |c| c.min(model)),
            facts.as_ref().map(|f| (f, &self.shared.images)),
        )?;
        let guide = super::submit::guide_for(constraint, prompt, &loaded.tokenizer)?;
        Ok((rendered, guide))
    }

    /// Counts a turn by where its cache came from.
    pub(super) fn count(&self, origin: CacheOrigin) {
        let mut c = lock(&self.shared.counters);
        match origin {
            CacheOrigin::New => c.new += 1,
            CacheOrigin::Held => c.held += 1,
            CacheOrigin::Demoted => c.demoted_hits += 1,
            CacheOrigin::Restored => c.restored += 1,
            CacheOrigin::Dropped | CacheOrigin::Reread => c.prefilled += 1,
        }
    }

    pub(super) fn start_compare(&mut self, q: Queued<CompareJob>) {
        let Queued {
            job,
            cancel,
            arrived,
            ..
        } = q;
        let CompareJob {
            request,
            prompt,
            tokenizer,
            guide,
            mut sink,
        } = job;
        match self.prepare_compare(request, prompt, (&tokenizer, guide), arrived) {
            Ok((run, reserved)) => self.tasks.push(Task::Compare {
                run: Box::new(run),
                sink,
                cancel,
                reserved,
            }),
            Err(e) => sink(Event::Error {
                code: e.code,
                message: e.message,
            }),
        }
    }

    pub(super) fn prepare_compare(
        &mut self,
        request: crate::generate::compare::CompareRequest,
        prompt: Vec<u32>,
        (tokenizer, guide): (&Arc<GemmaTokenizer>, Option<Guide>),
        arrived: Instant,
    ) -> Result<(CompareRun, u64), JobError> {
        let ((prompt, images, _), guide) = self.rendered(
            &request.prompt,
            None,
            ((prompt, Vec::new(), Vec::new()), tokenizer),
            (request.constraint.as_ref(), guide),
        )?;
        if !images.is_empty() {
            return Err(JobError::new(
                crate::contract::ErrorCode::BadImage,
                "the comparison does not take images yet: compare a turn without them",
            ));
        }
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let needed = CompareRun::needed_bytes(&loaded.model, &prompt, &request)?;
        let tokens = prompt.len() + request.max_tokens;
        self.admit(
            Need {
                owner: None,
                extra: needed,
                what: format!("compare two caches of {tokens} tokens"),
            },
            Purpose::Other,
        )?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let run = CompareRun::start(
            &loaded.model,
            &loaded.tokenizer,
            (request, guide),
            prompt,
            arrived,
        )?;
        Ok((run, needed))
    }
}

/// The soft tokens of a prompt's image, by the loaded tower, from the images `held` since
/// the prompt was rendered (another client's images filling the store meanwhile cannot
/// take it away).
fn encode_image(
    vision: Option<&super::run::Vision>,
    held: &[Arc<crate::images::PreparedImage>],
    image: &crate::images::PromptImage,
) -> Result<candle_core::Tensor, crate::generate::GenerateError> {
    use crate::images::ImageError;
    let vision = vision.ok_or_else(|| ImageError::Unsupported(String::new()))?;
    let held = held
        .iter()
        .find(|h| h.id == image.id)
        .ok_or_else(|| ImageError::Unknown(image.id.clone()))?;
    let encoded = vision.tower.encode(&held.patches)?;
    if encoded.soft_tokens.dim(0)? != image.len {
        return Err(ImageError::Mismatch(format!(
            "image {} makes {} soft tokens for {} places",
            image.id,
            encoded.soft_tokens.dim(0)?,
            image.len
        ))
        .into());
    }
    Ok(encoded.soft_tokens)
}
