//! Text generation on a loaded model: render the conversation to ids, reuse the cached
//! prefix, prefill the rest in chunks, then sample token by token through the detokenizer
//! and the thinking/answer splitter, emitting events. A turn ([`Turn`]) advances one step at
//! a time (a prefill chunk or a token) under whoever schedules it, the engine thread; it
//! stops on the family's stop ids, the request's stop strings, `max_tokens`, a full context,
//! or a cancel.

pub mod compare;
pub mod detok;
mod error;
pub mod fidelity;
pub mod fit;
mod logit_rows;
pub mod sampling;
pub mod score;
mod sequence;
pub(crate) mod session;
pub mod stop;
pub mod stream;
pub mod sweep;
mod turn;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

pub use error::GenerateError;
pub use sequence::Sequence;
pub use turn::{Next, Turn};

use crate::chat::{ChatOptions, Message, Role, Tool};
use crate::contract::ConversationChoice;
use crate::generate::sampling::SamplingParams;
use crate::tokenizer::{GemmaTokenizer, TokenizerError};

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
        /// Functions the model may call, rendered by the template (a model whose template
        /// has no tools refuses them).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[ts(optional, as = "Option<Vec<Tool>>")]
        tools: Vec<Tool>,
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
        /// Functions the model may call (see [`Prompt::Chat`]; refused for plain text).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[ts(optional, as = "Option<Vec<Tool>>")]
        tools: Vec<Tool>,
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
            Prompt::Conversation {
                messages, tools, ..
            } if has_chat_template == Some(false) && tools.is_empty() => Prompt::Text {
                text: plain_transcript(&messages),
            },
            Prompt::Conversation {
                messages,
                thinking,
                tools,
            } => Prompt::Chat {
                system: None,
                messages,
                thinking,
                tools,
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
    /// (a switch, checked against memory) when it holds another. `None`: as it is (a new
    /// conversation gets the engine's default for new ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub cache: Option<crate::kv::CacheSelection>,
    /// Strings that end the answer where its text shows one (it is never sent): at most
    /// [`stop::MAX_STOPS`] of at most [`stop::MAX_STOP_BYTES`] bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[ts(as = "Option<Vec<String>>", optional)]
    pub stop: Vec<String>,
    /// The conversation it runs in (`None`: the default one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub conversation: Option<ConversationChoice>,
    /// Tokens of context the turn may reach, prompt and answer together, when less than the
    /// model's (a server's `--ctx`): a longer prompt is refused before any work, and the
    /// answer ends (`length`) where the context does. `None`: the model's whole context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub context: Option<usize>,
    /// What the answer is held to (JSON, a schema, a tool call), by constrained decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub constraint: Option<crate::constrain::Constraint>,
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
            stop: Vec::new(),
            conversation: None,
            context: None,
            constraint: None,
        }
    }

    /// Tokens of context this request may reach on a model of `model_context`.
    pub fn context_limit(&self, model_context: usize) -> usize {
        self.context.map_or(model_context, |c| c.min(model_context))
    }

    /// Refuses what no model could run: no tokens asked for, too many or too long stop
    /// strings.
    pub fn check(&self) -> Result<(), GenerateError> {
        if self.max_tokens == 0 {
            return Err(GenerateError::NoTokens);
        }
        if self.stop.len() > stop::MAX_STOPS {
            return Err(GenerateError::BadStop(format!(
                "at most {} stop strings, got {}",
                stop::MAX_STOPS,
                self.stop.len()
            )));
        }
        if let Some(s) = self.stop.iter().find(|s| s.len() > stop::MAX_STOP_BYTES) {
            return Err(GenerateError::BadStop(format!(
                "a stop string is at most {} bytes, got one of {}",
                stop::MAX_STOP_BYTES,
                s.len()
            )));
        }
        self.sampling.validate()?;
        Ok(())
    }
}

/// The prompt's token ids against a context of `max` tokens, refused when empty or longer
/// (a prompt far too long is refused by its bytes, before it is encoded).
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
    check_prompt(ids.len(), max)?;
    Ok(ids)
}

/// A prompt's ids, the images in them, and those images as held when it was rendered (in
/// the same order), so a turn that waits in the queue never looks them up again.
pub(crate) type Rendered = (
    Vec<u32>,
    Vec<crate::images::PromptImage>,
    Vec<std::sync::Arc<crate::images::PreparedImage>>,
);

/// The prompt's token ids, rendered for the loaded model ([`Prompt::for_model`]), with its
/// images in their places ([`crate::images::place`]), against a context of `max` tokens.
/// `images`: the loaded model's image facts and the images the engine holds, locked only to
/// look them up (`None`: a model that reads none, which refuses a prompt with images).
pub(crate) fn render_with_images(
    tokenizer: &GemmaTokenizer,
    prompt: &Prompt,
    max: usize,
    images: Option<(
        &crate::images::ImageFacts,
        &std::sync::Mutex<crate::images::ImageStore>,
    )>,
) -> Result<Rendered, GenerateError> {
    use crate::images::{ImageError, MAX_IMAGES_PER_PROMPT};
    let named: Vec<(Role, &str)> = match prompt {
        Prompt::Chat { messages, .. } | Prompt::Conversation { messages, .. } => messages
            .iter()
            .flat_map(|m| m.images.iter().map(move |i| (m.role, i.as_str())))
            .collect(),
        Prompt::Text { .. } | Prompt::Ids { .. } => Vec::new(),
    };
    let prompt = prompt
        .clone()
        .for_model(Some(tokenizer.template().is_some()));
    let ids = render_within_context(tokenizer, &prompt, max)?;
    if named.is_empty() {
        return Ok((ids, Vec::new(), Vec::new()));
    }
    if named.len() > MAX_IMAGES_PER_PROMPT {
        return Err(ImageError::Mismatch(format!(
            "{} images in one prompt (at most {MAX_IMAGES_PER_PROMPT})",
            named.len()
        ))
        .into());
    }
    if let Some((role, _)) = named.iter().find(|(r, _)| *r != Role::User) {
        return Err(ImageError::Mismatch(format!(
            "only user turns show images (a {role:?} turn names one)"
        ))
        .into());
    }
    let Some((facts, store)) = images else {
        return Err(ImageError::Unsupported(
            " (it has no vision tower: load its mmproj GGUF beside it, or a multimodal checkpoint)"
                .into(),
        )
        .into());
    };
    if matches!(prompt, Prompt::Text { .. }) || tokenizer.template().is_none() {
        return Err(
            ImageError::Unsupported(" without a chat template to place them".into()).into(),
        );
    }
    let held = {
        let store = store.lock().unwrap_or_else(|p| p.into_inner());
        named
            .iter()
            .map(|(_, id)| {
                store
                    .get(id)
                    .ok_or_else(|| ImageError::Unknown((*id).to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    let (ids, placed) = crate::images::place(&ids, facts.tokens, &held)?;
    check_prompt(ids.len(), max)?;
    Ok((ids, placed, held))
}

/// A prompt of `len` tokens is something to run and fits `max` tokens of context: the one
/// check, at submit and again where a turn or a comparison starts.
pub(crate) fn check_prompt(len: usize, max: usize) -> Result<(), GenerateError> {
    if len == 0 {
        return Err(GenerateError::EmptyPrompt);
    }
    if len > max {
        return Err(GenerateError::ContextOverflow { prompt: len, max });
    }
    Ok(())
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
    if let Some((messages, thinking, tools)) = prompt_messages(prompt) {
        let opts = ChatOptions {
            thinking,
            add_generation_prompt: true,
        };
        return Ok(tokenizer.render_within(&messages, opts, tools, limit)?);
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
        Some((messages, thinking, tools)) => {
            let opts = ChatOptions {
                thinking,
                add_generation_prompt: true,
            };
            let text = crate::chat::unescape(&tokenizer.render_text(&messages, opts, tools)?);
            let source = tokenizer
                .template()
                .map(|t| t.source().clone())
                .unwrap_or(crate::chat::TemplateSource::builtin(tokenizer.family()));
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

/// The conversation a chat prompt renders (system turn first), with its thinking switch and
/// its tools.
fn prompt_messages(prompt: &Prompt) -> Option<(Vec<Message>, bool, &[Tool])> {
    match prompt {
        Prompt::Chat {
            system,
            messages,
            thinking,
            tools,
        } => {
            let mut all = Vec::with_capacity(messages.len() + 1);
            if let Some(s) = system.as_deref().filter(|s| !s.trim().is_empty()) {
                all.push(Message::system(s));
            }
            all.extend(messages.iter().cloned());
            Some((all, *thinking, tools))
        }
        Prompt::Conversation {
            messages,
            thinking,
            tools,
        } => Some((messages.clone(), *thinking, tools)),
        Prompt::Text { .. } | Prompt::Ids { .. } => None,
    }
}

impl Prompt {
    /// The tools the prompt offers.
    pub fn tools(&self) -> &[Tool] {
        match self {
            Prompt::Chat { tools, .. } | Prompt::Conversation { tools, .. } => tools,
            Prompt::Text { .. } | Prompt::Ids { .. } => &[],
        }
    }

    /// Whether it asks the model to think first.
    pub fn thinking(&self) -> bool {
        match self {
            Prompt::Chat { thinking, .. } | Prompt::Conversation { thinking, .. } => *thinking,
            Prompt::Text { .. } | Prompt::Ids { .. } => false,
        }
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
                tools: Vec::new(),
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
            tools: Vec::new(),
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
            tools: Vec::new(),
        };
        assert_eq!(conv.clone().for_model(Some(true)), chat);
        assert_eq!(conv.for_model(None), chat);
        let ids = Prompt::Ids { ids: vec![2, 7] };
        assert_eq!(ids.clone().for_model(Some(false)), ids);
        assert_eq!(
            serde_json::to_value(Prompt::Conversation {
                messages: vec![Message::user("hi")],
                thinking: false,
                tools: Vec::new(),
            })
            .unwrap(),
            json!({"type": "conversation", "messages": [{"role": "user", "content": "hi"}], "thinking": false})
        );
    }
}
