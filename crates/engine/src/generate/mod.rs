//! Text generation on a loaded model: render the conversation to ids, reuse the cached
//! prefix, prefill the rest in chunks, then sample token by token through the detokenizer
//! and the thinking/answer splitter, emitting events. Stops on the family's stop ids,
//! `max_tokens`, a full context, or a cancel flag checked before every token.

pub mod compare;
pub mod detok;
mod error;
pub mod fidelity;
mod logit_rows;
pub mod sampling;
pub mod score;
mod sequence;
pub(crate) mod session;
pub mod stream;
pub mod sweep;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

pub use error::GenerateError;
pub use sequence::{Outcome, Sequence};

use crate::chat::{ChatOptions, Message};
use crate::events::Event;
use crate::model::{Logits, Model};
use crate::sampling::SamplingParams;
use crate::stream::Delta;
use crate::tokenizer::{GemmaTokenizer, TokenizerError};
use session::Session;

/// Default prefill chunk: bounds activation memory on long prompts.
pub const PREFILL_CHUNK: usize = 512;

/// Tokens an answer may run to unless the request says: the app's, the CLI's and the
/// server's default alike.
pub const DEFAULT_MAX_TOKENS: usize = 512;

fn default_max_tokens() -> usize {
    DEFAULT_MAX_TOKENS
}

fn default_chunk() -> usize {
    PREFILL_CHUNK
}

/// What to continue from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Prompt {
    /// A conversation rendered with the model family's chat template.
    Chat {
        /// System prompt (Gemma 3 prefixes it to the first user message).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        system: Option<String>,
        /// The turns so far; the last is normally the user's.
        messages: Vec<Message>,
        /// Let the model think first (Gemma 4 only).
        #[serde(default)]
        thinking: bool,
    },
    /// A conversation for whatever checkpoint is loaded: rendered like [`Prompt::Chat`]
    /// when it ships a chat template, else as [`plain_transcript`] text to continue (base
    /// models babble when wrapped in turn markers they were never trained on). The engine
    /// thread decides per model ([`Prompt::for_model`]).
    Conversation {
        /// The turns so far (a system turn may lead).
        messages: Vec<Message>,
        /// Let the model think first (Gemma 4 only; ignored for plain text).
        #[serde(default)]
        thinking: bool,
    },
    /// Plain text to continue (`<bos>` + text, no template).
    Text {
        /// The text.
        text: String,
    },
    /// Token ids as they are.
    Ids {
        /// The ids.
        ids: Vec<u32>,
    },
}

impl Prompt {
    /// The prompt as it applies to a model that does (`Some(true)`, or unknown: `None`) or
    /// does not (`Some(false)`) ship a chat template: a [`Prompt::Conversation`] becomes a
    /// chat or plain text; every other prompt is returned as it is.
    pub fn for_model(self, has_chat_template: Option<bool>) -> Prompt {
        match self {
            Prompt::Conversation { messages, .. } if has_chat_template == Some(false) => {
                Prompt::Text {
                    text: plain_transcript(&messages),
                }
            }
            Prompt::Conversation { messages, thinking } => Prompt::Chat {
                system: None,
                messages,
                thinking,
            },
            other => other,
        }
    }
}

/// A conversation as plain text: each non-empty message trimmed, joined as paragraphs, with
/// no role markers.
pub fn plain_transcript(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| m.content.trim())
        .filter(|c| !c.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// What to continue from.
    pub prompt: Prompt,
    /// Sampling settings (temperature 0 = greedy).
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Most tokens to generate (the stop token included).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Prefill chunk size.
    #[serde(default = "default_chunk")]
    #[ts(as = "Option<usize>", optional)]
    pub prefill_chunk: usize,
    /// The cache this request runs with: the conversation's cache is re-encoded to it first
    /// (a switch, checked against memory) when it holds another. `None`: as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub cache: Option<crate::kv::CacheSelection>,
}

impl GenerateRequest {
    /// A request with default sampling and limits.
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens: default_max_tokens(),
            prefill_chunk: PREFILL_CHUNK,
            cache: None,
        }
    }
}

/// Receives a generation's events and gets a say between steps.
pub trait Hooks {
    /// An event for the caller.
    fn emit(&mut self, event: Event);
    /// Called before every token and between prefill chunks, with the cache at a token
    /// boundary: the place to apply control jobs (cache switches) or set the cancel flag.
    fn between_steps(&mut self, _session: &mut Session) {}
    /// Called once before anything runs, with the context the request may grow the session
    /// to (`tokens`): an error refuses the request, leaving the session untouched (the
    /// engine thread refuses what would not fit in memory).
    fn admit(
        &mut self,
        _model: &Model,
        _session: &Session,
        _tokens: usize,
    ) -> Result<(), GenerateError> {
        Ok(())
    }
}

impl<F: FnMut(Event)> Hooks for F {
    fn emit(&mut self, event: Event) {
        self(event)
    }
}

/// The prompt's token ids, refused when empty or longer than the model's context (a prompt
/// far too long is refused by its bytes, before it is encoded).
pub fn render_checked_prompt(
    model: &Model,
    tokenizer: &GemmaTokenizer,
    prompt: &Prompt,
) -> Result<Vec<u32>, GenerateError> {
    render_within_context(tokenizer, prompt, model.config().max_position_embeddings)
}

/// [`render_checked_prompt`] against a context of `max` tokens.
pub fn render_within_context(
    tokenizer: &GemmaTokenizer,
    prompt: &Prompt,
    max: usize,
) -> Result<Vec<u32>, GenerateError> {
    let ids = match render_prompt_within(tokenizer, prompt, max) {
        Err(GenerateError::Tokenizer(TokenizerError::TooLong { at_least, .. })) => {
            return Err(GenerateError::PromptTooLong { at_least, max })
        }
        other => other?,
    };
    if ids.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if ids.len() > max {
        return Err(GenerateError::ContextOverflow {
            prompt: ids.len(),
            max,
        });
    }
    Ok(ids)
}

/// The prompt's token ids.
pub fn render_prompt(
    tokenizer: &GemmaTokenizer,
    prompt: &Prompt,
) -> Result<Vec<u32>, GenerateError> {
    render_prompt_within(tokenizer, prompt, usize::MAX)
}

/// The prompt's token ids, or [`TokenizerError::TooLong`] past `limit`.
fn render_prompt_within(
    tokenizer: &GemmaTokenizer,
    prompt: &Prompt,
    limit: usize,
) -> Result<Vec<u32>, GenerateError> {
    if let Some((messages, thinking)) = prompt_messages(prompt) {
        let opts = ChatOptions {
            thinking,
            add_generation_prompt: true,
        };
        return Ok(tokenizer.render_within(&messages, opts, limit)?);
    }
    Ok(match prompt {
        Prompt::Text { text } => tokenizer.encode_within(text, true, limit)?,
        Prompt::Ids { ids } => ids.clone(),
        Prompt::Chat { .. } | Prompt::Conversation { .. } => unreachable!("rendered above"),
    })
}

/// A prompt as the model sees it: the exact text (the rendered template, or the plain text
/// with its `<bos>`), its token ids, what ends the answer, and the template that wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct PromptPreview {
    /// The text the ids encode, control tokens spelled out.
    pub text: String,
    /// The ids the model reads.
    pub ids: Vec<u32>,
    /// Ids that end the answer, with their pieces.
    pub stops: Vec<StopToken>,
    /// The chat template that rendered it (`None`: plain text, no template).
    pub template: Option<crate::chat::TemplateSource>,
}

/// A token that ends the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct StopToken {
    /// Its id.
    pub id: u32,
    /// Its piece (`<turn|>`).
    pub piece: String,
}

/// `prompt` as the model would read it (see [`PromptPreview`]).
pub fn preview_prompt(
    tokenizer: &GemmaTokenizer,
    prompt: &Prompt,
) -> Result<PromptPreview, GenerateError> {
    let ids = render_prompt(tokenizer, prompt)?;
    let (text, template) = match prompt_messages(prompt) {
        Some((messages, thinking)) => {
            let opts = ChatOptions {
                thinking,
                add_generation_prompt: true,
            };
            let text = crate::chat::unescape(&tokenizer.render_text(&messages, opts)?);
            let source = tokenizer.template().map(|t| t.source().clone()).unwrap_or(
                crate::chat::TemplateSource::Builtin {
                    family: tokenizer.family(),
                },
            );
            (text, Some(source))
        }
        None => (tokenizer.decode(&ids, false)?, None),
    };
    let stops = tokenizer
        .stop_ids()
        .iter()
        .map(|&id| StopToken {
            id,
            piece: tokenizer.piece(id).unwrap_or_default(),
        })
        .collect();
    Ok(PromptPreview {
        text,
        ids,
        stops,
        template,
    })
}

/// The conversation a chat prompt renders (system turn first), with its thinking switch.
fn prompt_messages(prompt: &Prompt) -> Option<(Vec<Message>, bool)> {
    match prompt {
        Prompt::Chat {
            system,
            messages,
            thinking,
        } => {
            let mut all = Vec::with_capacity(messages.len() + 1);
            if let Some(s) = system.as_deref().filter(|s| !s.trim().is_empty()) {
                all.push(Message::system(s));
            }
            all.extend(messages.iter().cloned());
            Some((all, *thinking))
        }
        Prompt::Conversation { messages, thinking } => Some((messages.clone(), *thinking)),
        Prompt::Text { .. } | Prompt::Ids { .. } => None,
    }
}

/// The context a request may reach: the prompt and every token it may generate, within the
/// model's context (`0`: no limit).
pub fn grown_context(prompt: &[u32], max_tokens: usize, max_context: usize) -> usize {
    let tokens = prompt.len().saturating_add(max_tokens);
    if max_context > 0 {
        tokens.min(max_context)
    } else {
        tokens
    }
}

/// Tokens per second (0 when nothing ran or no time passed).
pub(crate) fn per_second(tokens: usize, secs: f64) -> f64 {
    if tokens == 0 || secs <= 0.0 {
        0.0
    } else {
        tokens as f64 / secs
    }
}

/// Runs one request on `session`. The cache keeps the prompt and the generated tokens for
/// the next turn. Errors leave the session consistent (its history always matches its
/// cache); a prompt that does not fit leaves it untouched.
pub fn generate(
    model: &Model,
    tokenizer: &GemmaTokenizer,
    session: &mut Session,
    req: &GenerateRequest,
    cancel: &AtomicBool,
    hooks: &mut dyn Hooks,
) -> Result<Outcome, GenerateError> {
    let started = Instant::now();
    if req.max_tokens == 0 {
        return Err(GenerateError::NoTokens);
    }
    let prompt = render_checked_prompt(model, tokenizer, &req.prompt)?;
    let max_context = model.config().max_position_embeddings;
    hooks.admit(
        model,
        session,
        grown_context(&prompt, req.max_tokens, max_context),
    )?;
    let prepared = session.prepare(&prompt)?;
    let mut seq = Sequence::new(
        tokenizer,
        prompt,
        prepared.reused,
        req.sampling,
        req.max_tokens,
        max_context,
        started,
    )?;
    // Prefill everything after the reused prefix; the last chunk's logits start decoding.
    while let Some(chunk) = seq.next_prefill(req.prefill_chunk) {
        hooks.between_steps(session);
        if cancel.load(Ordering::Relaxed) {
            seq.cancel();
            break;
        }
        let (t, n) = (Instant::now(), chunk.len());
        let logits = session.forward(model, chunk, Logits::Last)?;
        seq.prefilled(n, logits, t.elapsed().as_secs_f64());
    }
    loop {
        hooks.between_steps(session);
        let cancelled = cancel.load(Ordering::Relaxed);
        let sampled = seq.sample(tokenizer, cancelled, session.len(), &mut |e| hooks.emit(e));
        if let Err(GenerateError::NonFiniteLogits { .. }) = &sampled {
            // The cached keys and values came from the same broken computation: keep none of
            // them (the conversation itself lives with the caller).
            session.reset()?;
        }
        let Some(id) = sampled? else {
            break;
        };
        seq.fed(session.forward(model, &[id], Logits::Last)?);
    }
    // The last sampled token was not run: a saved cache keeps it for a continuation.
    let all = seq.all_ids();
    session.set_pending(all.get(session.len()..).unwrap_or(&[]));
    let memory = session.memory();
    seq.finish(
        tokenizer,
        session.len(),
        &memory,
        &session.policy().clone(),
        &mut |e| hooks.emit(e),
    )
}

/// A splitter delta as its event.
pub(crate) fn delta_event(d: Delta) -> Event {
    match d {
        Delta::Answer(text) => Event::Token { text },
        Delta::Thinking(text) => Event::Thinking { text },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_json_is_pinned_and_defaults_fill_in() {
        let req: GenerateRequest = serde_json::from_value(json!({
            "prompt": {"type": "chat", "messages": [{"role": "user", "content": "hi"}]}
        }))
        .unwrap();
        assert_eq!(
            req,
            GenerateRequest::new(Prompt::Chat {
                system: None,
                messages: vec![Message::user("hi")],
                thinking: false,
            })
        );
        assert_eq!((req.max_tokens, req.prefill_chunk), (512, 512));
        assert_eq!(
            serde_json::to_value(GenerateRequest {
                max_tokens: 8,
                sampling: SamplingParams::greedy(),
                ..GenerateRequest::new(Prompt::Ids { ids: vec![2, 5] })
            })
            .unwrap(),
            json!({
                "prompt": {"type": "ids", "ids": [2, 5]},
                "sampling": {"temperature": 0.0, "top_k": null, "top_p": null, "seed": 0},
                "max_tokens": 8,
                "prefill_chunk": 512
            })
        );
        assert_eq!(
            serde_json::to_value(Prompt::Text { text: "x".into() }).unwrap(),
            json!({"type": "text", "text": "x"})
        );
        assert!(serde_json::from_value::<GenerateRequest>(json!({
            "prompt": {"type": "text", "text": "x"}, "max_token": 3
        }))
        .is_err());
    }

    #[test]
    fn conversations_follow_the_model_template_or_become_plain_text() {
        let messages = vec![
            Message::system("  Be brief. "),
            Message::user("What is the capital of France?"),
            Message::user("   "),
        ];
        let conv = Prompt::Conversation {
            messages: messages.clone(),
            thinking: true,
        };
        assert_eq!(
            conv.clone().for_model(Some(false)),
            Prompt::Text {
                text: "Be brief.\n\nWhat is the capital of France?".into()
            }
        );
        let chat = Prompt::Chat {
            system: None,
            messages,
            thinking: true,
        };
        assert_eq!(conv.clone().for_model(Some(true)), chat);
        assert_eq!(conv.for_model(None), chat);
        let ids = Prompt::Ids { ids: vec![2, 7] };
        assert_eq!(ids.clone().for_model(Some(false)), ids);
        assert_eq!(
            serde_json::to_value(Prompt::Conversation {
                messages: vec![Message::user("hi")],
                thinking: false
            })
            .unwrap(),
            json!({"type": "conversation", "messages": [{"role": "user", "content": "hi"}], "thinking": false})
        );
    }
}
