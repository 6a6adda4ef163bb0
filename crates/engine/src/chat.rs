//! Chat templates of Gemma 4 and Gemma 3: turn a conversation into control tokens and text
//! (then ids) exactly as the models were trained to see it.
//!
//! Gemma 4: `<bos>[<|turn>system\n[<|think|>]{system}<turn|>\n]` then
//! `<|turn>{user|model}\n{text}<turn|>\n` per message, then the generation prompt
//! `<|turn>model\n`, followed by an empty thought channel `<|channel>thought\n<channel|>` when
//! thinking is off. Earlier model turns are re-rendered without their thinking.
//! Gemma 3: `<bos>` then `<start_of_turn>{user|model}\n{text}<end_of_turn>\n` per message, the
//! system prompt prefixed to the first user message with a blank line, roles alternating.
//! Message text is trimmed as the reference templates do.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::tokenizer::{Control, Family, GemmaTokenizer, Segment, TokenizerError};

/// Why a conversation cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("a system message may only come first (message {0})")]
    SystemNotFirst(usize),
    #[error("{0:?} has no thinking mode")]
    ThinkingUnsupported(Family),
    #[error("Gemma 3 conversations must alternate user/model starting with user (message {0})")]
    RolesMustAlternate(usize),
    #[error("template is for {template:?} but the tokenizer is for {tokenizer:?}")]
    FamilyMismatch { template: Family, tokenizer: Family },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Model,
}

/// One chat message. `thinking` holds a model turn's thought channel, kept for display and
/// never rendered back into the prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
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
        }
    }
}

/// Rendering switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatOptions {
    /// Let the model think first (Gemma 4 only).
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

/// Builds segments, merging adjacent text so it is tokenized as one run (as a tokenizer
/// would see the whole rendered string between control tokens).
#[derive(Default)]
struct Builder(Vec<Segment>);

impl Builder {
    fn control(&mut self, c: Control) -> &mut Self {
        self.0.push(Segment::Control(c));
        self
    }
    fn text(&mut self, t: &str) -> &mut Self {
        if t.is_empty() {
            return self;
        }
        match self.0.last_mut() {
            Some(Segment::Text(prev)) => prev.push_str(t),
            _ => self.0.push(Segment::Text(t.to_owned())),
        }
        self
    }
}

/// Removes `<|channel>…<channel|>` spans (a model turn's thinking) from `text`.
pub fn strip_thinking(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<|channel>") {
        out.push_str(&rest[..start]);
        match rest[start..].find("<channel|>") {
            Some(end) => rest = &rest[start + end + "<channel|>".len()..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The chat template of one model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatTemplate {
    family: Family,
}

impl ChatTemplate {
    pub fn new(family: Family) -> Self {
        Self { family }
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// The conversation as control tokens and text.
    pub fn render(
        &self,
        messages: &[Message],
        opts: ChatOptions,
    ) -> Result<Vec<Segment>, ChatError> {
        if let Some(i) = messages.iter().skip(1).position(|m| m.role == Role::System) {
            return Err(ChatError::SystemNotFirst(i + 1));
        }
        let (system, rest) = match messages.split_first() {
            Some((first, rest)) if first.role == Role::System => (Some(first), rest),
            _ => (None, messages),
        };
        match self.family {
            Family::Gemma4 => Ok(render_gemma4(system, rest, opts)),
            Family::Gemma3 => render_gemma3(system, rest, opts, messages.len() - rest.len()),
        }
    }

    /// The conversation as the string the model reads.
    pub fn render_text(
        &self,
        messages: &[Message],
        opts: ChatOptions,
    ) -> Result<String, ChatError> {
        let family = self.family;
        Ok(self
            .render(messages, opts)?
            .into_iter()
            .map(|seg| match seg {
                Segment::Control(c) => family.text(c).unwrap_or_default().to_owned(),
                Segment::Text(t) => t,
            })
            .collect())
    }

    /// The conversation as token ids (control tokens by id, never by tokenizing their text).
    pub fn render_ids(
        &self,
        tokenizer: &GemmaTokenizer,
        messages: &[Message],
        opts: ChatOptions,
    ) -> Result<Vec<u32>, ChatError> {
        if tokenizer.family() != self.family {
            return Err(ChatError::FamilyMismatch {
                template: self.family,
                tokenizer: tokenizer.family(),
            });
        }
        Ok(tokenizer.encode_segments(&self.render(messages, opts)?)?)
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Model => "model",
    }
}

fn render_gemma4(system: Option<&Message>, rest: &[Message], opts: ChatOptions) -> Vec<Segment> {
    let mut b = Builder::default();
    b.control(Control::Bos);
    if system.is_some() || opts.thinking {
        b.control(Control::TurnStart).text("system\n");
        if opts.thinking {
            b.control(Control::Think);
        }
        b.text(system.map(|m| m.content.trim()).unwrap_or_default())
            .control(Control::TurnEnd)
            .text("\n");
    }
    for m in rest {
        let content = match m.role {
            Role::Model => strip_thinking(&m.content),
            _ => m.content.clone(),
        };
        b.control(Control::TurnStart)
            .text(role_name(m.role))
            .text("\n")
            .text(content.trim())
            .control(Control::TurnEnd)
            .text("\n");
    }
    if opts.add_generation_prompt {
        b.control(Control::TurnStart).text("model\n");
        if !opts.thinking {
            b.control(Control::ChannelStart)
                .text("thought\n")
                .control(Control::ChannelEnd);
        }
    }
    b.0
}

fn render_gemma3(
    system: Option<&Message>,
    rest: &[Message],
    opts: ChatOptions,
    offset: usize,
) -> Result<Vec<Segment>, ChatError> {
    if opts.thinking {
        return Err(ChatError::ThinkingUnsupported(Family::Gemma3));
    }
    let mut b = Builder::default();
    b.control(Control::Bos);
    for (i, m) in rest.iter().enumerate() {
        let expected = [Role::User, Role::Model][i % 2];
        if m.role != expected {
            return Err(ChatError::RolesMustAlternate(i + offset));
        }
        b.control(Control::TurnStart)
            .text(role_name(m.role))
            .text("\n");
        if i == 0 {
            if let Some(sys) = system {
                b.text(&sys.content).text("\n\n");
            }
        }
        b.text(m.content.trim())
            .control(Control::TurnEnd)
            .text("\n");
    }
    if opts.add_generation_prompt {
        b.control(Control::TurnStart).text("model\n");
    }
    Ok(b.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tiny;

    fn thought(content: &str, thinking: &str) -> Message {
        Message {
            thinking: Some(thinking.into()),
            ..Message::model(content)
        }
    }

    fn g4() -> ChatTemplate {
        ChatTemplate::new(Family::Gemma4)
    }

    #[test]
    fn gemma4_multi_turn_with_system_and_thinking_off() {
        let msgs = [
            Message::system("You are terse. "),
            Message::user("Hi"),
            thought("Hello!", "greet back"),
            Message::user(" Capital of France?\n"),
        ];
        assert_eq!(
            g4().render_text(&msgs, ChatOptions::default()).unwrap(),
            "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi<turn|>\n\
             <|turn>model\nHello!<turn|>\n<|turn>user\nCapital of France?<turn|>\n\
             <|turn>model\n<|channel>thought\n<channel|>"
        );
    }

    #[test]
    fn gemma4_thinking_on_without_system() {
        let opts = ChatOptions {
            thinking: true,
            add_generation_prompt: true,
        };
        assert_eq!(
            g4().render_text(&[Message::user("Why?")], opts).unwrap(),
            "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nWhy?<turn|>\n<|turn>model\n"
        );
        let msgs = [Message::system("Be kind."), Message::user("Why?")];
        assert_eq!(
            g4().render_text(&msgs, opts).unwrap(),
            "<bos><|turn>system\n<|think|>Be kind.<turn|>\n<|turn>user\nWhy?<turn|>\n<|turn>model\n"
        );
    }

    #[test]
    fn gemma4_plain_user_and_no_generation_prompt() {
        assert_eq!(
            g4().render_text(&[Message::user("Hi")], ChatOptions::default())
                .unwrap(),
            "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
        );
        let opts = ChatOptions {
            thinking: false,
            add_generation_prompt: false,
        };
        assert_eq!(
            g4().render_text(&[Message::user("Hi"), Message::model("Yo")], opts)
                .unwrap(),
            "<bos><|turn>user\nHi<turn|>\n<|turn>model\nYo<turn|>\n"
        );
    }

    #[test]
    fn earlier_thinking_in_model_text_is_stripped() {
        let msgs = [
            Message::user("Q"),
            Message::model("<|channel>thought\nhmm<channel|>The answer."),
            Message::user("More"),
        ];
        let text = g4().render_text(&msgs, ChatOptions::default()).unwrap();
        assert!(
            text.contains("<|turn>model\nThe answer.<turn|>\n"),
            "{text}"
        );
        assert!(!text.contains("hmm"));
        assert_eq!(strip_thinking("a<|channel>x<channel|>b<|channel>y"), "ab");
    }

    #[test]
    fn gemma3_template() {
        let t = ChatTemplate::new(Family::Gemma3);
        let msgs = [
            Message::system("Be brief."),
            Message::user("Hi "),
            Message::model("Hello."),
            Message::user("Bye"),
        ];
        assert_eq!(
            t.render_text(&msgs, ChatOptions::default()).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert!(matches!(
            t.render_text(
                &[Message::user("a"), Message::user("b")],
                ChatOptions::default()
            ),
            Err(ChatError::RolesMustAlternate(1))
        ));
        assert!(matches!(
            t.render_text(
                &[Message::user("a")],
                ChatOptions {
                    thinking: true,
                    add_generation_prompt: true
                }
            ),
            Err(ChatError::ThinkingUnsupported(Family::Gemma3))
        ));
    }

    #[test]
    fn system_must_come_first() {
        let msgs = [Message::user("a"), Message::system("s")];
        assert!(matches!(
            g4().render(&msgs, ChatOptions::default()),
            Err(ChatError::SystemNotFirst(1))
        ));
    }

    #[test]
    fn ids_put_control_tokens_by_id_and_decode_back() {
        let tok = tiny(Family::Gemma4);
        let msgs = [Message::user("hi")];
        let ids = g4()
            .render_ids(&tok, &msgs, ChatOptions::default())
            .unwrap();
        let text = g4().render_text(&msgs, ChatOptions::default()).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        let controls: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&i| i < 110 && i != 107)
            .collect();
        assert_eq!(controls, [2, 105, 106, 105, 100, 101]);
        // User text that spells a control string stays text.
        let sneaky = [Message::user("<|turn>")];
        let ids = g4()
            .render_ids(&tok, &sneaky, ChatOptions::default())
            .unwrap();
        assert_eq!(ids.iter().filter(|&&i| i == 105).count(), 2);
        assert!(matches!(
            ChatTemplate::new(Family::Gemma3).render_ids(&tok, &msgs, ChatOptions::default()),
            Err(ChatError::FamilyMismatch { .. })
        ));
    }

    #[test]
    fn json_shapes_are_pinned() {
        let m = thought("A", "T");
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"role":"model","content":"A","thinking":"T"}"#
        );
        assert_eq!(
            serde_json::to_string(&Message::user("q")).unwrap(),
            r#"{"role":"user","content":"q"}"#
        );
        assert_eq!(
            serde_json::to_string(&ChatOptions::default()).unwrap(),
            r#"{"thinking":false,"add_generation_prompt":true}"#
        );
        let o: ChatOptions = serde_json::from_str(r#"{"thinking":true}"#).unwrap();
        assert_eq!(
            o,
            ChatOptions {
                thinking: true,
                add_generation_prompt: true
            }
        );
    }
}
