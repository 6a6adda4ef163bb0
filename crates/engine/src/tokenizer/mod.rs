//! Gemma tokenizer: a `tokenizers::Tokenizer` loaded from `tokenizer.json` or built from a
//! GGUF file's own vocabulary ([`gguf`]), with what the checkpoint says about chats: the
//! family's control tokens found in the vocabulary by their text (never by fixed ids), the
//! ids that end a turn, and the chat template ([`crate::chat`]). Control tokens come only
//! from the template: text, whoever wrote it, is encoded as text.

pub mod gguf;
#[cfg(test)]
mod gguf_tests;
mod memo;

use std::path::Path;
use std::sync::Arc;

use crate::contract::Family;
pub use crate::models::Control;

use crate::chat::{unescape, ChatError, ChatOptions, ChatTemplate, ControlStrings, Message, Tool};
use memo::{Encoded, Memo, Span};

/// Why tokenization or decoding failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot load tokenizer from {path}: {reason}")]
    Load { path: String, reason: String },
    /// The GGUF's vocabulary cannot be the model's: every id must have an embedding row.
    #[error(
        "{path}: the GGUF vocabulary has {tokens} tokens but its embedding matrix \
         (token_embd.weight) has {rows} rows; the file is inconsistent"
    )]
    VocabMismatch {
        path: String,
        tokens: usize,
        rows: usize,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
    /// The text holds more tokens than the caller allows: it was refused before (or while)
    /// being encoded, so its length is a lower bound.
    #[error("the text holds at least {at_least} tokens, over the limit of {limit}")]
    TooLong {
        /// Tokens the text holds at least.
        at_least: usize,
        /// The limit.
        limit: usize,
    },
}

fn tk_err(e: tokenizers::Error) -> TokenizerError {
    TokenizerError::Tokenizer(e.to_string())
}

/// A Gemma tokenizer for one model family.
pub struct GemmaTokenizer {
    /// Encodes text as text: special tokens spelled in it are not matched
    /// (`encode_special_tokens`), user-defined pieces are.
    inner: tokenizers::Tokenizer,
    family: Family,
    /// Cached: `tokenizers` recounts added tokens on every call.
    vocab_size: usize,
    /// The family's control tokens present in this vocabulary.
    controls: Vec<(Control, u32)>,
    /// Special (control) pieces of the vocabulary, longest first: what a rendered template's
    /// control strings are split at.
    specials: Vec<(String, u32)>,
    /// The same pieces as one automaton, in the same order.
    control_strings: ControlStrings,
    /// Most bytes of text one token can stand for: a text longer than `limit` times this
    /// holds more than `limit` tokens, known before it is encoded.
    max_token_bytes: usize,
    /// Recently encoded prompts, so the next turn of a conversation encodes only its new text.
    memo: Memo,
    /// Bytes of prompt text encoded so far (what the memo saves shows here).
    #[cfg(test)]
    text_bytes_encoded: std::sync::atomic::AtomicUsize,
    /// Ids that end a generated turn.
    stops: Vec<u32>,
    /// The checkpoint's chat template, if it ships one (or falls back to the family's).
    template: Option<Arc<ChatTemplate>>,
    /// The grammar engine over this vocabulary, built the first time an answer is
    /// constrained (crate::constrain::vocab).
    pub(crate) grammar: std::sync::OnceLock<
        Result<Arc<llguidance::ParserFactory>, crate::constrain::ConstrainError>,
    >,
    /// Whether chats may offer tools (see [`GemmaTokenizer::tool_support`]): found once, as
    /// it takes a render of a probe.
    tools: std::sync::OnceLock<Result<(), String>>,
}

impl std::fmt::Debug for GemmaTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemmaTokenizer")
            .field("family", &self.family)
            .field("vocab_size", &self.vocab_size)
            .field("stops", &self.stops)
            .field("template", &self.template.as_ref().map(|t| t.source()))
            .finish()
    }
}

impl GemmaTokenizer {
    /// Loads `path`: a `tokenizer.json`, or a GGUF file whose own vocabulary
    /// (`tokenizer.ggml.*`) becomes the tokenizer (see [`gguf`]). No chat template yet (see
    /// [`GemmaTokenizer::with_template`]); stops on `<eos>` and the family's end of turn.
    pub fn from_file(path: &Path, family: Family) -> Result<Self, TokenizerError> {
        let load = |reason: String| TokenizerError::Load {
            path: path.display().to_string(),
            reason,
        };
        if gguf::is_gguf(path) {
            return Self::wrap(gguf::tokenizer_from_file(path)?, family).map_err(load);
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| load(e.to_string()))?;
        Self::wrap(inner, family).map_err(load)
    }

    /// Wraps a `tokenizers` tokenizer built elsewhere (e.g. [`gguf::build`]).
    pub fn from_tokenizer(
        inner: tokenizers::Tokenizer,
        family: Family,
    ) -> Result<Self, TokenizerError> {
        Self::wrap(inner, family).map_err(|reason| TokenizerError::Load {
            path: "<memory>".into(),
            reason,
        })
    }

    fn wrap(mut inner: tokenizers::Tokenizer, family: Family) -> Result<Self, String> {
        inner.set_encode_special_tokens(true);
        let vocab_size = inner.get_vocab_size(true);
        let controls: Vec<(Control, u32)> = family
            .facts()
            .controls()
            .iter()
            .filter_map(|(c, text)| inner.token_to_id(text).map(|id| (*c, id)))
            .collect();
        let mut specials: Vec<(String, u32)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(id, t)| (t.content, id))
            .collect();
        // The family's control texts, whatever the file marks them (Gemma 4 GGUFs keep the
        // channel markers "visible", user-defined).
        for (_, id) in &controls {
            if let Some(text) = inner.id_to_token(*id) {
                if !specials.iter().any(|(_, i)| i == id) {
                    specials.push((text, *id));
                }
            }
        }
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut stops: Vec<u32> = controls
            .iter()
            .filter(|(c, _)| *c == Control::Eos)
            .map(|(_, id)| *id)
            .collect();
        for text in family.facts().end_of_turn() {
            stops.extend(inner.token_to_id(text));
        }
        stops.dedup();
        let control_strings = ControlStrings::new(specials.iter().map(|(s, _)| s.as_str()))
            .map_err(|e| e.to_string())?;
        let max_token_bytes = max_token_bytes(&inner, control_strings.longest());
        Ok(Self {
            inner,
            family,
            vocab_size,
            controls,
            specials,
            control_strings,
            max_token_bytes,
            memo: Memo::default(),
            #[cfg(test)]
            text_bytes_encoded: Default::default(),
            stops,
            template: None,
            grammar: std::sync::OnceLock::new(),
            tools: std::sync::OnceLock::new(),
        })
    }

    /// The vocabulary's control pieces and their ids (what a grammar may never write as
    /// text).
    pub(crate) fn specials(&self) -> &[(String, u32)] {
        &self.specials
    }

    /// Loads a `tokenizer.json` held in memory.
    pub fn from_bytes(bytes: &[u8], family: Family) -> Result<Self, TokenizerError> {
        let load = |reason: String| TokenizerError::Load {
            path: "<memory>".into(),
            reason,
        };
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| load(e.to_string()))?;
        Self::wrap(inner, family).map_err(load)
    }

    /// The tokenizer of a checkpoint: the vocabulary at `path`, stopping also on the
    /// file's end-of-sequence ids, with the chat template the checkpoint ships. A template
    /// that cannot be used (it fails to parse, or to render a one-line conversation) is left
    /// out with a warning naming the line: the model then continues plain text, as a base
    /// model does. A checkpoint without one gets its family's built-in template only when
    /// its `name` says it is instruction-tuned (see [`crate::chat::looks_instruct`]), with a
    /// warning. Returns the warnings with the tokenizer.
    pub fn for_checkpoint(
        path: &Path,
        checkpoint: &crate::checkpoint::Checkpoint,
        name: &str,
    ) -> Result<(Self, Vec<String>), TokenizerError> {
        let (config, found) = (checkpoint.config(), checkpoint.template());
        let tok = Self::from_file(path, config.family)?.with_stops(&config.eos_token_ids);
        let unusable = |e: &dyn std::fmt::Display| {
            format!(
                "{}: {e}; the model continues plain text",
                crate::contract::ErrorCode::BadChatTemplate
            )
        };
        let mut warnings = Vec::new();
        let template = match found {
            Ok(Some((text, source))) => {
                match ChatTemplate::parse(text, source.clone()).and_then(|t| tok.probe(t)) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        warnings.push(unusable(&e));
                        None
                    }
                }
            }
            Err(e) => {
                warnings.push(unusable(e));
                None
            }
            Ok(None) if crate::chat::looks_instruct(name) => {
                warnings.push(format!(
                    "{name} ships no chat template: using the built-in {} template",
                    config.family
                ));
                Some(ChatTemplate::builtin(config.family))
            }
            Ok(None) => None,
        };
        Ok((tok.with_template(template), warnings))
    }

    /// `template` if it renders a one-line conversation within its limits.
    fn probe(&self, template: ChatTemplate) -> Result<ChatTemplate, ChatError> {
        template.render(
            &[Message::user("Hi")],
            ChatOptions::default(),
            &[],
            &self.control_strings,
            ("<bos>", "<eos>"),
        )?;
        Ok(template)
    }

    /// This tokenizer with the checkpoint's chat template.
    pub fn with_template(mut self, template: Option<ChatTemplate>) -> Self {
        self.template = template.map(Arc::new);
        self.tools = std::sync::OnceLock::new();
        self
    }

    /// This tokenizer also stopping on `ids` (the file's end-of-sequence list: GGUF
    /// `tokenizer.ggml.eos_token_id`/`eot_token_id`/`eom_token_id`, or `eos_token_id` in
    /// `config.json` / `generation_config.json`); ids outside the vocabulary are ignored.
    pub fn with_stops(mut self, ids: &[u32]) -> Self {
        for &id in ids {
            if (id as usize) < self.vocab_size && !self.stops.contains(&id) {
                self.stops.push(id);
            }
        }
        self
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of the vocabulary piece `text`, if it has one.
    pub fn piece_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The id of `control` in this vocabulary, if it has it.
    pub fn control_id(&self, control: Control) -> Option<u32> {
        self.controls
            .iter()
            .find(|(c, _)| *c == control)
            .map(|(_, id)| *id)
    }

    /// The family control token `id` is, if any.
    pub fn control_of(&self, id: u32) -> Option<Control> {
        self.controls
            .iter()
            .find(|(_, i)| *i == id)
            .map(|(c, _)| *c)
    }

    /// Ids that end a generated turn.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stops
    }

    /// Whether the vocabulary has the family's thinking channel (its markers, found by text).
    pub fn supports_thinking(&self) -> bool {
        self.family.supports_thinking()
            && [Control::ChannelStart, Control::ChannelEnd, Control::Think]
                .iter()
                .all(|c| self.control_id(*c).is_some())
    }

    /// The chat template, if the checkpoint has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_deref()
    }

    /// [`GemmaTokenizer::encode`] for at most `limit` ids: a longer text is
    /// [`TokenizerError::TooLong`], refused by its bytes alone when it cannot fit.
    pub fn encode_within(
        &self,
        text: &str,
        bos: bool,
        limit: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.check_bytes(text, limit)?;
        let ids = self.encode(text, bos)?;
        if ids.len() > limit {
            return Err(TokenizerError::TooLong {
                at_least: ids.len(),
                limit,
            });
        }
        Ok(ids)
    }

    /// Refuses a text that holds more than `limit` tokens by its bytes alone.
    fn check_bytes(&self, text: &str, limit: usize) -> Result<(), TokenizerError> {
        let at_least = text.len() / self.max_token_bytes;
        if at_least > limit {
            return Err(TokenizerError::TooLong { at_least, limit });
        }
        Ok(())
    }

    /// Ids of `text` as plain text, preceded by `<bos>` when `bos` is set. Control strings
    /// inside `text` are text, never control ids.
    pub fn encode(&self, text: &str, bos: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(tk_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if bos {
            ids.extend(self.control_id(Control::Bos));
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Ids of a rendered template: its control strings (the vocabulary's special pieces)
    /// become their ids, the text between them is [`unescape`]d and encoded as text.
    pub fn encode_rendered(&self, rendered: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_rendered_within(rendered, usize::MAX)
    }

    /// [`GemmaTokenizer::encode_rendered`] for a prompt of at most `limit` tokens: a longer
    /// one is [`TokenizerError::TooLong`], refused by its bytes alone when it cannot fit
    /// (see `max_token_bytes`), else as soon as the tokens encoded pass the limit.
    ///
    /// Linear in the text, and incremental: the text is cut at its control strings (one
    /// Aho–Corasick pass), and each piece the last prompts encoded ([`Memo`]) already hold,
    /// at the same place in the same text, keeps its ids. A conversation's next turn renders
    /// as the last one plus its new turns, so only those are encoded; the pieces between
    /// control tokens are encoded on their own either way, so the ids are exactly what a
    /// whole encoding gives.
    pub fn encode_rendered_within(
        &self,
        rendered: &str,
        limit: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.check_bytes(rendered, limit)?;
        let earlier = self.memo.closest(rendered);
        let mut ids = Vec::new();
        let mut spans: Vec<Span> = Vec::new();
        // The earlier prompt's pieces stand while every piece so far matched one of them.
        let mut reusing = earlier.is_some();
        let mut text_start = 0;
        let controls = self.control_strings.find_from(rendered, 0).map(Some);
        for control in controls.chain([None]) {
            let text_end = control.as_ref().map_or(rendered.len(), |(r, _)| r.start);
            if text_end > text_start {
                let span = Span::text(text_start, text_end);
                let old = earlier
                    .as_ref()
                    .filter(|_| reusing)
                    .and_then(|e| e.ids_of(spans.len(), &span));
                match old {
                    Some(old) => ids.extend_from_slice(old),
                    None => {
                        reusing = false;
                        let text = unescape(&rendered[text_start..text_end]);
                        #[cfg(test)]
                        self.text_bytes_encoded
                            .fetch_add(text.len(), std::sync::atomic::Ordering::Relaxed);
                        ids.extend(self.encode(&text, false)?);
                    }
                }
                spans.push(span.ending_at(ids.len()));
            }
            let Some((range, index)) = control else {
                break;
            };
            let span = Span::control(range.start, range.end);
            reusing = reusing
                && earlier
                    .as_ref()
                    .and_then(|e| e.ids_of(spans.len(), &span))
                    .is_some();
            ids.push(self.specials[index].1);
            spans.push(span.ending_at(ids.len()));
            text_start = range.end;
            if ids.len() > limit {
                break;
            }
        }
        if ids.len() > limit {
            return Err(TokenizerError::TooLong {
                at_least: ids.len(),
                limit,
            });
        }
        self.memo.keep(Encoded::new(rendered, ids.clone(), spans));
        Ok(ids)
    }

    /// The template that renders chats: the checkpoint's, or its family's built-in one.
    fn with_chat_template<R>(&self, f: impl FnOnce(&ChatTemplate) -> R) -> R {
        match self.template() {
            Some(t) => f(t),
            None => f(&ChatTemplate::builtin(self.family)),
        }
    }

    /// The conversation rendered by the checkpoint's template (or, without one, by the
    /// family's built-in template) as the text the model reads, offering `tools`; control
    /// strings in user, system and tool messages are escaped (see [`crate::chat::escape`]).
    pub fn render_text(
        &self,
        messages: &[Message],
        opts: ChatOptions,
        tools: &[Tool],
    ) -> Result<String, ChatError> {
        if opts.thinking && !self.supports_thinking() {
            return Err(ChatError::ThinkingUnsupported(self.family));
        }
        if !tools.is_empty() {
            self.tool_support().map_err(ChatError::ToolsUnsupported)?;
        }
        let piece = |c| {
            self.control_id(c)
                .and_then(|id| self.inner.id_to_token(id))
                .unwrap_or_default()
        };
        let (bos, eos) = (piece(Control::Bos), piece(Control::Eos));
        self.with_chat_template(|t| {
            t.render(messages, opts, tools, &self.control_strings, (&bos, &eos))
        })
    }

    /// Whether a chat may offer tools: the family has a call syntax the engine reads back,
    /// the vocabulary has its markers, and the template tells the model of the tools. `Err`
    /// says why not.
    pub fn tool_support(&self) -> Result<(), String> {
        self.tools.get_or_init(|| self.find_tool_support()).clone()
    }

    fn find_tool_support(&self) -> Result<(), String> {
        let family = self.family.facts().display_name();
        if !self.family.facts().tool_calls() {
            return Err(format!("{family} models have no tool-call syntax"));
        }
        let markers = [Control::ToolCallStart, Control::ToolCallEnd, Control::Quote];
        if let Some(missing) = markers.iter().find(|c| self.control_id(**c).is_none()) {
            let text = self.family.text(*missing).unwrap_or_default();
            return Err(format!(
                "this model's vocabulary has no {text} token for tool calls"
            ));
        }
        self.with_chat_template(|t| {
            if t.renders_tools() {
                Ok(())
            } else {
                Err(format!(
                    "this model's chat template ({}) does not render tools",
                    t.source()
                ))
            }
        })
    }

    /// The conversation's token ids (see [`GemmaTokenizer::render_text`]), without tools.
    pub fn render(&self, messages: &[Message], opts: ChatOptions) -> Result<Vec<u32>, RenderError> {
        self.render_within(messages, opts, &[], usize::MAX)
    }

    /// [`GemmaTokenizer::render`] offering `tools`, for at most `limit` ids
    /// ([`TokenizerError::TooLong`] past it, see [`GemmaTokenizer::encode_rendered_within`]).
    pub fn render_within(
        &self,
        messages: &[Message],
        opts: ChatOptions,
        tools: &[Tool],
        limit: usize,
    ) -> Result<Vec<u32>, RenderError> {
        let text = self.render_text(messages, opts, tools)?;
        Ok(self.encode_rendered_within(&text, limit)?)
    }

    /// Text of `ids`: control tokens appear as their pieces (or are dropped when
    /// `skip_controls`), everything else is decoded by the tokenizer.
    pub fn decode(&self, ids: &[u32], skip_controls: bool) -> Result<String, TokenizerError> {
        let mut out = String::new();
        let mut run_start = 0;
        for (i, &id) in ids.iter().enumerate() {
            if self.control_of(id).is_some() {
                out.push_str(&self.decode_plain(&ids[run_start..i])?);
                if !skip_controls {
                    out.push_str(&self.inner.id_to_token(id).unwrap_or_default());
                }
                run_start = i + 1;
            }
        }
        out.push_str(&self.decode_plain(&ids[run_start..])?);
        Ok(out)
    }

    /// The tokenizer's own decoding of ids that are not family controls.
    fn decode_plain(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        let size = self.vocab_size as u32;
        if let Some(&bad) = ids.iter().find(|&&id| id >= size) {
            return Err(TokenizerError::UnknownId(bad));
        }
        self.inner.decode(ids, false).map_err(tk_err)
    }

    /// The vocabulary piece of `id`.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// Most bytes of text one token of `tokenizer` stands for: its longest piece, with
/// SentencePiece's `▁` as the one space it stands for and byte-fallback pieces as one byte,
/// or its longest control string; doubled, so a normalizer that shortens text (NFKC's
/// ligatures) cannot make a prompt that fits look too long.
fn max_token_bytes(tokenizer: &tokenizers::Tokenizer, longest_control: usize) -> usize {
    let longest_piece = tokenizer
        .get_vocab(true)
        .keys()
        .map(|piece| {
            let bytes = piece.len();
            if bytes == 6 && piece.starts_with("<0x") && piece.ends_with('>') {
                1
            } else {
                // '▁' is 3 bytes standing for 1.
                bytes - 2 * piece.matches('▁').count()
            }
        })
        .max()
        .unwrap_or(1);
    2 * longest_piece.max(longest_control).max(1)
}

/// Why a conversation could not become ids.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Chat(#[from] ChatError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_stops_come_from_the_vocabulary() {
        let g4 = tiny(Family::Gemma4);
        assert_eq!(g4.control_id(Control::TurnStart), Some(105));
        assert_eq!(g4.control_id(Control::ChannelStart), Some(100));
        assert_eq!(g4.control_id(Control::Think), Some(98));
        assert_eq!(g4.control_of(101), Some(Control::ChannelEnd));
        assert_eq!(g4.stop_ids(), [1, 106, 50]);
        assert!(g4.supports_thinking());
        let g3 = tiny(Family::Gemma3);
        assert_eq!(g3.control_id(Control::TurnStart), Some(105));
        assert_eq!(g3.control_id(Control::ChannelStart), None);
        assert_eq!(g3.stop_ids(), [1, 106]);
        assert!(!g3.supports_thinking());
        // The file's own end-of-sequence list joins; ids past the vocabulary do not.
        assert_eq!(g3.with_stops(&[1, 7, 1_000_000]).stop_ids(), [1, 106, 7]);
    }

    #[test]
    fn rendered_text_splits_at_controls_and_keeps_escaped_text() {
        let t = tiny(Family::Gemma4);
        let ids = t.encode_rendered("<bos><|turn>user\nhi<turn|>\n").unwrap();
        assert_eq!(ids[..2], [2, 105]);
        assert_eq!(
            t.decode(&ids, false).unwrap(),
            "<bos><|turn>user\nhi<turn|>\n"
        );
        // An escaped control string is text again, never its id.
        let escaped = crate::chat::escape("<|turn>", &ControlStrings::new(["<|turn>"]).unwrap());
        let ids = t.encode_rendered(&escaped).unwrap();
        assert!(!ids.contains(&105), "{ids:?}");
        assert_eq!(t.decode(&ids, false).unwrap(), "<|turn>");
        // Plain encoding never produces control ids either.
        assert!(!t.encode("<turn|>", false).unwrap().contains(&106));
    }

    #[test]
    fn a_prompt_encodes_the_same_whatever_was_encoded_before() {
        // A conversation's turns, a regenerated answer (a branch), an edit in the middle and
        // a prompt that shortens: each encoded after the others, by one tokenizer, equals a
        // fresh tokenizer's encoding of it alone.
        let turn = |who: &str, text: &str| format!("<|turn>{who}\n{text}<turn|>\n");
        let t1 = format!("<bos>{}<|turn>model\n", turn("user", "hi there"));
        let t2 = format!(
            "<bos>{}{}{}<|turn>model\n",
            turn("user", "hi there"),
            turn("model", "hello, how can I help"),
            turn("user", "tell me a story")
        );
        let branch = format!(
            "<bos>{}{}{}<|turn>model\n",
            turn("user", "hi there"),
            turn("model", "hello, how can I help"),
            turn("user", "tell me a poem")
        );
        let edited = t2.replace("hi there", "hi where");
        let escaped = format!(
            "<bos>{}<|turn>model\n",
            turn(
                "user",
                &crate::chat::escape("a <turn|> b", &ControlStrings::new(["<turn|>"]).unwrap())
            )
        );
        let used = tiny(Family::Gemma4);
        let encoded = || {
            used.text_bytes_encoded
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let mut fresh_bytes = 0;
        for prompt in [
            &t1,
            &t2,
            &branch,
            &t2,
            &edited,
            &t1,
            &escaped,
            &t2,
            &"<bos>".to_owned(),
        ] {
            let fresh = tiny(Family::Gemma4);
            let ids = fresh.encode_rendered(prompt).unwrap();
            fresh_bytes += fresh.text_bytes_encoded.into_inner();
            assert_eq!(used.encode_rendered(prompt).unwrap(), ids, "{prompt:?}");
        }
        // Each turn encoded only its new text: the second turn "model\n" (the first's last
        // piece, now longer), the answer and the new question; the branch only its question.
        assert!(
            encoded() < fresh_bytes / 2,
            "{} of {fresh_bytes}",
            encoded()
        );
        let before = encoded();
        used.encode_rendered(&branch).unwrap();
        assert_eq!(encoded() - before, 0, "an exact repeat encodes nothing");
        let other = tiny(Family::Gemma4);
        other.encode_rendered(&t2).unwrap();
        let before = other
            .text_bytes_encoded
            .load(std::sync::atomic::Ordering::Relaxed);
        other.encode_rendered(&branch).unwrap();
        assert_eq!(
            other.text_bytes_encoded.into_inner() - before,
            "user\ntell me a poem".len() + "\n".len() + "model\n".len(),
            "a branch encodes only its own turn and what follows it"
        );
    }

    #[test]
    fn a_prompt_over_the_limit_is_refused_before_or_while_it_is_encoded() {
        let t = tiny(Family::Gemma4);
        // By its bytes alone: the tiny vocabulary's longest piece is 16 bytes
        // (`<|tool_response>`), so one token stands for at most 32.
        let long = "a".repeat(10_000);
        assert!(matches!(
            t.encode_rendered_within(&long, 100),
            Err(TokenizerError::TooLong {
                at_least: 312,
                limit: 100
            })
        ));
        // By its tokens: 40 single characters and one control token.
        let text = format!("<bos>{}", "ab".repeat(20));
        assert!(matches!(
            t.encode_rendered_within(&text, 30),
            Err(TokenizerError::TooLong {
                at_least: 41,
                limit: 30
            })
        ));
        assert_eq!(t.encode_rendered_within(&text, 41).unwrap().len(), 41);
    }

    #[test]
    fn bad_tokenizer_json_is_an_error() {
        assert!(matches!(
            GemmaTokenizer::from_bytes(b"{not json", Family::Gemma3),
            Err(TokenizerError::Load { .. })
        ));
        assert!(matches!(
            GemmaTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"), Family::Gemma3),
            Err(TokenizerError::Load { .. })
        ));
    }
}

/// A tiny Gemma-shaped tokenizer for unit tests that must not need the real 33 MB file:
/// single characters, byte fallback and the family's control tokens at Gemma's ids (Gemma 4:
/// the tool tokens 46–52 (`<|tool_call>` 48, `<tool_call|>` 49, `<|tool_response>` 50,
/// `<|"|>` 52), `<|think|>` 98, `<|channel>` 100, `<channel|>` 101, `<|turn>` 105,
/// `<turn|>` 106; Gemma 3: `<start_of_turn>` 105, `<end_of_turn>` 106).
#[cfg(test)]
pub(crate) fn tiny(family: Family) -> GemmaTokenizer {
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    let push = |piece: String, vocab: &mut serde_json::Map<String, serde_json::Value>| {
        let id = vocab.len();
        vocab.insert(piece, id.into());
    };
    let control = |id: u32| -> Option<&'static str> {
        let g4 = family == Family::Gemma4;
        Some(match id {
            0 => "<pad>",
            1 => "<eos>",
            2 => "<bos>",
            3 => "<unk>",
            46 if g4 => "<|tool>",
            47 if g4 => "<tool|>",
            48 if g4 => "<|tool_call>",
            49 if g4 => "<tool_call|>",
            50 if g4 => "<|tool_response>",
            51 if g4 => "<tool_response|>",
            52 if g4 => "<|\"|>",
            98 if g4 => "<|think|>",
            100 if g4 => "<|channel>",
            101 if g4 => "<channel|>",
            105 if g4 => "<|turn>",
            106 if g4 => "<turn|>",
            105 => "<start_of_turn>",
            106 => "<end_of_turn>",
            _ => return None,
        })
    };
    for id in 0..110u32 {
        let piece = match (control(id), id) {
            (Some(c), _) => c.to_owned(),
            (None, 107) => "\n".to_owned(),
            (None, _) => format!("<unused{id}>"),
        };
        if control(id).is_some() {
            added.push(
                serde_json::json!({"id": id, "content": piece, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
        }
        push(piece, &mut vocab);
    }
    for b in 0..=255u8 {
        push(format!("<0x{b:02X}>"), &mut vocab);
    }
    let chars = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'";
    for c in chars.chars() {
        push(c.to_string(), &mut vocab);
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    match GemmaTokenizer::from_bytes(json.to_string().as_bytes(), family) {
        Ok(t) => t,
        Err(e) => panic!("tiny tokenizer: {e}"),
    }
}

#[cfg(test)]
mod tiny_tests {
    use super::*;

    #[test]
    fn tiny_tokenizer_round_trips_with_byte_fallback() {
        let t = tiny(Family::Gemma4);
        let ids = t.encode("naïve 🙂", true).unwrap();
        assert_eq!(ids[0], 2);
        // bos, "na", "ï" as two byte pieces, "ve▁", "🙂" as four.
        assert_eq!(ids.len(), 1 + 2 + 2 + 3 + 4);
        assert_eq!(t.decode(&ids, true).unwrap(), "naïve 🙂");
        assert_eq!(t.decode(&ids, false).unwrap(), "<bos>naïve 🙂");
        assert_eq!(t.piece(100).as_deref(), Some("<|channel>"));
        assert!(matches!(
            t.decode(&[5_000_000], false),
            Err(TokenizerError::UnknownId(5_000_000))
        ));
    }
}
