//! Chat templates: a conversation rendered by the checkpoint's own Jinja template (a GGUF's
//! `tokenizer.chat_template`, or `chat_template.jinja` / `tokenizer_config.json` beside
//! safetensors), run with minijinja and Python's string and dict methods, as the model was
//! trained to read it: never a rewrite of it.
//!
//! Templates are untrusted input. A template that fails to parse, raises, loops or writes
//! without end is a [`ChatError::BadTemplate`] (naming the line), found within a bounded
//! amount of work ([`FUEL`], [`MAX_OUTPUT`], [`RECURSION`]).
//!
//! The words of users stay text: control strings inside user and system messages (`<|turn>`
//! typed by someone) are escaped before rendering ([`escape`]) and restored after the
//! rendered string is split into control tokens ([`unescape`]), so only the template writes
//! control tokens. A model's earlier answers are passed as they are: the template decides
//! what of them it keeps (Gemma 4's strips earlier thinking).

use aho_corasick::{AhoCorasick, MatchKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::contract::Family;

pub mod tools;

pub use tools::{Tool, ToolCall};

/// Template instructions one render may run: far beyond any real template (Gemma 4's uses
/// about 10k for a 100-turn conversation), reached within a fraction of a second.
pub const FUEL: u64 = 5_000_000;
/// Longest rendered prompt, in bytes (64 MiB: far beyond any context).
pub const MAX_OUTPUT: usize = 64 << 20;
/// Deepest nesting of macro calls and blocks.
pub const RECURSION: usize = 100;

/// Why a conversation cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template cannot be used: it fails to parse or to render, or runs past its limits.
    #[error("the chat template ({origin}) cannot be used{}: {reason}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    BadTemplate {
        /// Where the template came from.
        origin: String,
        /// The template line at fault, when known.
        line: Option<usize>,
        /// What went wrong.
        reason: String,
    },
    /// The template refused this conversation (`raise_exception`), e.g. Gemma 3's
    /// alternating roles.
    #[error("the chat template refused the conversation: {0}")]
    Refused(String),
    /// The model has no thinking channel.
    #[error("{0} has no thinking mode")]
    ThinkingUnsupported(Family),
    /// Tools were offered to a model that cannot take them (why, in words).
    #[error("tools are not supported: {0}")]
    ToolsUnsupported(String),
}

/// Who speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    /// The model (OpenAI's `assistant`).
    Model,
    /// A tool's answer to one of the model's calls.
    Tool,
}

/// One chat message. `thinking` holds a model turn's thought channel; the template decides
/// whether it is rendered back (as `reasoning_content`). A model turn may carry the tool
/// calls it made; a tool turn names the call it answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The calls a model turn made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[ts(optional, as = "Option<Vec<ToolCall>>")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool turn answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub tool_call_id: Option<String>,
    /// The images a user turn shows, by the ids the engine gave them when they were added,
    /// in order before its text (the template places each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[ts(optional, as = "Option<Vec<String>>")]
    pub images: Vec<String>,
}

impl Role {
    /// The role an OpenAI-style message names (`assistant` for the model).
    pub fn from_openai(role: &str) -> Option<Role> {
        Some(match role {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" | "model" => Role::Model,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn model(content: impl Into<String>) -> Self {
        Self::new(Role::Model, content)
    }
    fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            thinking: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            images: Vec::new(),
        }
    }

    /// A tool's answer to the call `id`.
    pub fn tool(id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(id.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// Rendering switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatOptions {
    /// Let the model think first (families with a thinking channel).
    pub thinking: bool,
    /// End with the model's turn opener so the model answers next.
    pub add_generation_prompt: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            thinking: false,
            add_generation_prompt: true,
        }
    }
}

/// Where a template came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TemplateSource {
    /// The GGUF file's `tokenizer.chat_template`.
    Gguf,
    /// A `chat_template.jinja` file.
    Jinja {
        /// The file.
        path: String,
    },
    /// `chat_template` in a `tokenizer_config.json`.
    TokenizerConfig {
        /// The file.
        path: String,
    },
    /// The family's built-in template (an instruct checkpoint that ships none).
    Builtin {
        /// Whose.
        family: Family,
        /// The family as people write it (`Gemma 4`).
        family_name: String,
    },
    /// Given by the caller.
    Custom,
}

impl TemplateSource {
    /// `family`'s built-in template, with the name people write it by.
    pub fn builtin(family: Family) -> Self {
        TemplateSource::Builtin {
            family,
            family_name: family.facts().display_name().to_string(),
        }
    }
}

impl std::fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateSource::Gguf => f.write_str("tokenizer.chat_template in the GGUF file"),
            TemplateSource::Jinja { path } | TemplateSource::TokenizerConfig { path } => {
                f.write_str(path)
            }
            TemplateSource::Builtin { family_name, .. } => {
                write!(f, "the built-in {family_name} template")
            }
            TemplateSource::Custom => f.write_str("a custom template"),
        }
    }
}

/// A parsed chat template.
pub struct ChatTemplate {
    source: TemplateSource,
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish()
    }
}

const NAME: &str = "chat";

/// The template's error as a [`ChatError`].
fn template_error(source: &TemplateSource, e: &minijinja::Error) -> ChatError {
    if e.kind() == ErrorKind::InvalidOperation {
        if let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED)) {
            return ChatError::Refused(msg.to_owned());
        }
    }
    let reason = match e.kind() {
        ErrorKind::OutOfFuel => "it ran past its limit of work (an endless loop?)".to_owned(),
        _ => match e.detail() {
            Some(d) => format!("{}: {d}", e.kind()),
            None => e.kind().to_string(),
        },
    };
    ChatError::BadTemplate {
        origin: source.to_string(),
        line: e.line(),
        reason,
    }
}

/// Prefix of a `raise_exception` message, to tell it apart from the template's own faults.
const RAISED: &str = "raised: ";

impl ChatTemplate {
    /// Parses `text`; a syntax error is [`ChatError::BadTemplate`] naming its line.
    pub fn parse(text: &str, source: TemplateSource) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        // As Hugging Face renders templates: Jinja2 with trim_blocks and lstrip_blocks.
        let syntax = env
            .syntax()
            .to_builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error(&source, &e))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(RECURSION);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{msg}"),
                ))
            },
        );
        env.add_template_owned(NAME, text.to_owned())
            .map_err(|e| template_error(&source, &e))?;
        Ok(Self { source, env })
    }

    /// The family's built-in template.
    pub fn builtin(family: Family) -> Self {
        match Self::parse(
            family.facts().fallback_template(),
            TemplateSource::builtin(family),
        ) {
            Ok(t) => t,
            // The built-in templates are parsed by the tests; this cannot happen.
            Err(e) => unreachable!("built-in template: {e}"),
        }
    }

    /// Where the template came from.
    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    /// The conversation as the string the model reads, with `bos` and `eos` as the
    /// vocabulary writes them, offering `tools` (none: the template is not told of tools).
    /// Control strings inside user, system and tool messages come out escaped (see
    /// [`escape`]): split the result with the vocabulary's control tokens, then [`unescape`]
    /// the text between them.
    pub fn render(
        &self,
        messages: &[Message],
        opts: ChatOptions,
        tools: &[Tool],
        controls: &ControlStrings,
        (bos, eos): (&str, &str),
    ) -> Result<String, ChatError> {
        let msgs: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| {
                let (role, content) = match m.role {
                    Role::System => ("system", escape(&m.content, controls)),
                    Role::User => ("user", escape(&m.content, controls)),
                    Role::Tool => ("tool", escape(&m.content, controls)),
                    // An answer's text never places an image: a marker it wrote stays text.
                    Role::Model => ("assistant", m.content.replace(IMAGE, IMAGE_AS_TEXT)),
                };
                // A turn with images is a list of parts, images first, as transformers'
                // processors pass them: the template writes a marker for each.
                let content = if m.images.is_empty() {
                    serde_json::Value::from(content)
                } else {
                    let mut parts: Vec<serde_json::Value> = m
                        .images
                        .iter()
                        .map(|_| serde_json::json!({ "type": "image" }))
                        .collect();
                    parts.push(serde_json::json!({ "type": "text", "text": content }));
                    serde_json::Value::from(parts)
                };
                let mut v = serde_json::json!({ "role": role, "content": content });
                if let Some(t) = &m.thinking {
                    v["reasoning_content"] = t.clone().into();
                }
                if !m.tool_calls.is_empty() {
                    v["tool_calls"] = m.tool_calls.iter().map(ToolCall::template_value).collect();
                }
                if let Some(id) = &m.tool_call_id {
                    v["tool_call_id"] = id.clone().into();
                }
                v
            })
            .collect();
        let tools: Vec<serde_json::Value> = tools.iter().map(Tool::template_value).collect();
        let ctx = minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(&msgs)),
            tools => (!tools.is_empty()).then(|| minijinja::Value::from(minijinja::value::Serde(&tools))),
            bos_token => bos,
            eos_token => eos,
            add_generation_prompt => opts.add_generation_prompt,
            enable_thinking => opts.thinking,
        };
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&self.source, &e))?;
        let mut out = CappedWriter(Vec::new());
        tmpl.render_captured_to(ctx, &mut out)
            .map_err(|e| template_error(&self.source, &e))?;
        String::from_utf8(out.0).map_err(|_| ChatError::BadTemplate {
            origin: self.source.to_string(),
            line: None,
            reason: "it wrote text that is not UTF-8".into(),
        })
    }
}

impl ChatTemplate {
    /// Whether the template tells the model of the tools it is given: it renders a probe
    /// tool's name (Gemma 3's template ignores `tools`; Gemma 4's declares each).
    pub fn renders_tools(&self) -> bool {
        const PROBE: &str = "kvlab_probe_tool_4f1c";
        let tool = Tool {
            name: PROBE.into(),
            description: Some("probe".into()),
            parameters: Some(serde_json::json!({"type": "object", "properties": {}})),
        };
        self.render(
            &[Message::user("hi")],
            ChatOptions::default(),
            std::slice::from_ref(&tool),
            &ControlStrings::none(),
            ("", ""),
        )
        .is_ok_and(|text| text.contains(PROBE))
    }
}

/// Collects output up to [`MAX_OUTPUT`] bytes, then fails the render.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT {
            return Err(std::io::Error::other(format!(
                "the rendered prompt passed {} MiB",
                MAX_OUTPUT >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The escape mark: a private-use character no template writes.
const MARK: char = '\u{E000}';

/// A vocabulary's control strings (`<start_of_turn>`, `<|turn>`, …), found in text in one
/// pass by an Aho–Corasick automaton: at each place the longest control string that starts
/// there, scanning left to right (what a longest-first check at every character finds, in
/// time linear in the text rather than in text × control strings: Gemma 3's vocabulary has
/// 6,249 of them).
#[derive(Debug, Clone)]
pub struct ControlStrings {
    automaton: AhoCorasick,
    /// The caller's index of each pattern of the automaton.
    index: Vec<usize>,
    /// Bytes of the longest string.
    longest: usize,
}

/// The control strings could not be compiled into one automaton (a vocabulary far past any
/// real one).
#[derive(Debug, thiserror::Error)]
#[error("the vocabulary's control strings cannot be searched: {0}")]
pub struct ControlStringsError(String);

impl ControlStrings {
    /// The automaton over `strings`. Empty strings, and strings holding the escape mark
    /// (which no template writes), are never matched.
    pub fn new<S: AsRef<str>>(
        strings: impl IntoIterator<Item = S>,
    ) -> Result<Self, ControlStringsError> {
        let mut patterns = Vec::new();
        let mut index = Vec::new();
        for (i, s) in strings.into_iter().enumerate() {
            let s = s.as_ref();
            if !s.is_empty() && !s.contains(MARK) {
                patterns.push(s.to_owned());
                index.push(i);
            }
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| ControlStringsError(e.to_string()))?;
        let longest = patterns.iter().map(String::len).max().unwrap_or(0);
        Ok(Self {
            automaton,
            index,
            longest,
        })
    }

    /// No control strings: nothing is escaped or split.
    pub fn none() -> Self {
        match Self::new(std::iter::empty::<&str>()) {
            Ok(c) => c,
            // An automaton over nothing always builds.
            Err(e) => unreachable!("empty automaton: {e}"),
        }
    }

    /// Bytes of the longest control string.
    pub fn longest(&self) -> usize {
        self.longest
    }

    /// The control strings in `text` from byte `from` on, left to right, each as its byte
    /// range and its index in the list this was built from.
    pub fn find_from<'a>(
        &'a self,
        text: &'a str,
        from: usize,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> + 'a {
        let input = aho_corasick::Input::new(text).span(from.min(text.len())..text.len());
        self.automaton
            .find_iter(input)
            .map(move |m| (m.range(), self.index[m.pattern().as_usize()]))
    }
}

/// Where a template places an image, and that string broken by [`MARK`] as [`escape`]
/// breaks a control string.
const IMAGE: &str = "<|image|>";
const IMAGE_AS_TEXT: &str = "<\u{E000}|image|>";

/// `text` with every occurrence of a control string broken by [`MARK`] after its first
/// character, so that no control token can be read in it; marks already in the text are
/// doubled. Linear in the text.
pub fn escape(text: &str, controls: &ControlStrings) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 64);
    let mut last = 0;
    for (range, _) in controls.find_from(text, 0) {
        push_doubling_marks(&mut out, &text[last..range.start]);
        let s = &text[range.clone()];
        let first = s.chars().next().map_or(0, char::len_utf8);
        out.push_str(&s[..first]);
        out.push(MARK);
        out.push_str(&s[first..]);
        last = range.end;
    }
    push_doubling_marks(&mut out, &text[last..]);
    out
}

/// Appends `text` with each [`MARK`] doubled.
fn push_doubling_marks(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let end = at + MARK.len_utf8();
        out.push_str(&rest[..end]);
        out.push(MARK);
        rest = &rest[end..];
    }
    out.push_str(rest);
}

/// Undoes [`escape`] on text between control tokens: a doubled mark is one mark, a single
/// mark is dropped.
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == MARK {
            if chars.peek() == Some(&MARK) {
                chars.next();
                out.push(MARK);
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Whether a checkpoint's name says it is instruction-tuned (`…-it…`, `…instruct…`): such a
/// checkpoint without a template gets its family's built-in one; any other is a base model.
pub fn looks_instruct(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("instruct")
        || n.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == "it")
}

#[cfg(test)]
mod tests;
