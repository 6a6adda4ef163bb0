//! Splits a generated token stream into typed deltas: the thinking channel
//! (`<|channel>thought\n…<channel|>`) versus the answer, tool calls
//! (`<|tool_call>call:NAME{…}<tool_call|>`, read back as JSON by
//! [`crate::chat::tools::parse_call`]; one that does not parse stays answer text), and stops
//! at the tokenizer's stop ids (the file's end of sequence and the family's end of turn).

use serde::{Deserialize, Serialize};

use crate::chat::tools::{parse_call, QUOTE};
use crate::generate::detok::Detokenizer;
use crate::tokenizer::{Control, GemmaTokenizer, TokenizerError};

/// A piece of generated text, tagged with the channel it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "text", rename_all = "snake_case")]
pub enum Delta {
    Thinking(String),
    Answer(String),
    /// A whole tool call: the function and its arguments as JSON text.
    ToolCall {
        name: String,
        arguments: String,
    },
}

/// What one pushed token produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    pub deltas: Vec<Delta>,
    /// The token ended the turn (`<eos>` or end-of-turn); generation should stop.
    pub stop: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Answer,
    /// Inside `<|channel>`, reading the channel name up to its newline.
    Header(String),
    Thinking,
    /// Inside a tool call, its text so far (`<|"|>` as [`QUOTE`]).
    Call(String),
    Stopped,
}

/// Stateful splitter for one generated turn.
#[derive(Debug, Clone)]
pub struct StreamSplitter {
    mode: Mode,
    detok: Detokenizer,
    /// Whether tool calls are read (only when the prompt offered tools: otherwise a call
    /// the model writes anyway stays text).
    calls: bool,
}

impl Default for StreamSplitter {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamSplitter {
    /// A splitter starting in the answer (the thinking channel opens only on `<|channel>`).
    pub fn new() -> Self {
        Self {
            mode: Mode::Answer,
            detok: Detokenizer::new(),
            calls: false,
        }
    }

    /// This splitter reading tool calls (the family's call syntax) when `calls`.
    pub fn reading_calls(mut self, calls: bool) -> Self {
        self.calls = calls && self.mode == Mode::Answer;
        self
    }

    /// Feeds one generated token.
    pub fn push(&mut self, tok: &GemmaTokenizer, id: u32) -> Result<Step, TokenizerError> {
        let mut step = Step::default();
        if self.mode == Mode::Stopped {
            step.stop = true;
            return Ok(step);
        }
        if tok.stop_ids().contains(&id) {
            self.flush(tok, &mut step.deltas)?;
            if let Mode::Call(text) = &self.mode {
                push_delta(&mut step.deltas, call_delta(text, false));
            }
            self.mode = Mode::Stopped;
            step.stop = true;
            return Ok(step);
        }
        match tok.control_of(id) {
            Some(Control::ChannelStart) => {
                self.flush(tok, &mut step.deltas)?;
                self.mode = Mode::Header(String::new());
            }
            Some(Control::ChannelEnd) => {
                self.flush(tok, &mut step.deltas)?;
                self.mode = Mode::Answer;
            }
            Some(Control::ToolCallStart) if self.calls && tok.family().facts().tool_calls() => {
                self.flush(tok, &mut step.deltas)?;
                self.mode = Mode::Call(String::new());
            }
            Some(Control::Quote) if matches!(self.mode, Mode::Call(_)) => {
                self.flush(tok, &mut step.deltas)?;
                if let Mode::Call(text) = &mut self.mode {
                    text.push(QUOTE);
                }
            }
            Some(Control::ToolCallEnd) if matches!(self.mode, Mode::Call(_)) => {
                self.flush(tok, &mut step.deltas)?;
                if let Mode::Call(text) = std::mem::replace(&mut self.mode, Mode::Answer) {
                    push_delta(&mut step.deltas, call_delta(&text, true));
                }
            }
            // Other control tokens carry no text of their own.
            Some(_) => self.flush(tok, &mut step.deltas)?,
            None => {
                if let Some(text) = self.detok.push(tok, id)? {
                    self.emit(text, &mut step.deltas);
                }
            }
        }
        Ok(step)
    }

    /// Text still held back at the end of the stream (a call left open is answer text).
    pub fn finish(&mut self, tok: &GemmaTokenizer) -> Result<Vec<Delta>, TokenizerError> {
        let mut out = Vec::new();
        self.flush(tok, &mut out)?;
        if let Mode::Call(text) = std::mem::replace(&mut self.mode, Mode::Stopped) {
            push_delta(&mut out, call_delta(&text, false));
        }
        Ok(out)
    }

    fn flush(&mut self, tok: &GemmaTokenizer, out: &mut Vec<Delta>) -> Result<(), TokenizerError> {
        if let Some(text) = self.detok.finish(tok)? {
            self.emit(text, out);
        }
        Ok(())
    }

    fn emit(&mut self, text: String, out: &mut Vec<Delta>) {
        match &mut self.mode {
            Mode::Answer | Mode::Stopped => push_delta(out, Delta::Answer(text)),
            Mode::Call(call) => call.push_str(&text),
            Mode::Thinking => push_delta(out, Delta::Thinking(text)),
            Mode::Header(name) => {
                name.push_str(&text);
                // The channel name ("thought") ends at the first newline; the rest is thinking.
                if let Some(nl) = name.find('\n') {
                    let rest = name[nl + 1..].to_owned();
                    self.mode = Mode::Thinking;
                    if !rest.is_empty() {
                        push_delta(out, Delta::Thinking(rest));
                    }
                }
            }
        }
    }
}

/// A call's text as a [`Delta::ToolCall`], or, when it does not parse (or never `closed`), as
/// the answer text it was, markers and all: nothing the model wrote is lost.
fn call_delta(text: &str, closed: bool) -> Delta {
    if closed {
        if let Ok((name, args)) = parse_call(text) {
            return Delta::ToolCall {
                name,
                arguments: args.to_string(),
            };
        }
    }
    let raw = text.replace(QUOTE, "<|\"|>");
    Delta::Answer(format!(
        "<|tool_call>{raw}{}",
        if closed { "<tool_call|>" } else { "" }
    ))
}

/// Appends `delta`, merging with the previous one of the same channel.
fn push_delta(out: &mut Vec<Delta>, delta: Delta) {
    match (out.last_mut(), delta) {
        (Some(Delta::Thinking(a)), Delta::Thinking(b))
        | (Some(Delta::Answer(a)), Delta::Answer(b)) => a.push_str(&b),
        (_, d) => out.push(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Family;
    use crate::tokenizer::tiny;

    /// Runs `ids` through a splitter reading calls; returns (thinking, answer, stopped-at
    /// index, every delta).
    fn run(tok: &GemmaTokenizer, ids: &[u32]) -> (String, String, Option<usize>, Vec<Delta>) {
        run_with(tok, ids, true)
    }

    fn run_with(
        tok: &GemmaTokenizer,
        ids: &[u32],
        calls: bool,
    ) -> (String, String, Option<usize>, Vec<Delta>) {
        let mut s = StreamSplitter::new().reading_calls(calls);
        let (mut thinking, mut answer, mut stop, mut all) =
            (String::new(), String::new(), None, vec![]);
        for (i, &id) in ids.iter().enumerate() {
            let step = s.push(tok, id).unwrap();
            all.extend(step.deltas.clone());
            for d in step.deltas {
                match d {
                    Delta::Thinking(t) => thinking.push_str(&t),
                    Delta::Answer(t) => answer.push_str(&t),
                    Delta::ToolCall { .. } => {}
                }
            }
            if step.stop && stop.is_none() {
                stop = Some(i);
            }
        }
        for d in s.finish(tok).unwrap() {
            all.push(d.clone());
            match d {
                Delta::Thinking(t) => thinking.push_str(&t),
                Delta::Answer(t) => answer.push_str(&t),
                Delta::ToolCall { .. } => {}
            }
        }
        (thinking, answer, stop, all)
    }

    #[test]
    fn thinking_and_answer_are_separated() {
        let tok = tiny(Family::Gemma4);
        let ids = tok
            .encode_rendered(
                "<|channel>thought\nLet me think: 東京?<channel|>Tokyo 🙂.<turn|>ignored",
            )
            .unwrap();
        let (thinking, answer, stop, all) = run(&tok, &ids);
        assert_eq!(thinking, "Let me think: 東京?");
        assert_eq!(answer, "Tokyo 🙂.");
        assert_eq!(stop, Some(ids.iter().position(|&i| i == 106).unwrap()));
        assert!(matches!(all.first(), Some(Delta::Thinking(_))));
        assert!(matches!(all.last(), Some(Delta::Answer(_))));
    }

    #[test]
    fn answer_only_streams_and_stops_on_eos() {
        let tok = tiny(Family::Gemma4);
        let mut ids = tok.encode("Just café.", false).unwrap();
        ids.push(1);
        ids.extend(tok.encode("after", false).unwrap());
        let (thinking, answer, stop, _) = run(&tok, &ids);
        assert_eq!((thinking.as_str(), answer.as_str()), ("", "Just café."));
        assert_eq!(stop, Some(ids.iter().position(|&i| i == 1).unwrap()));
    }

    #[test]
    fn empty_thought_channel_yields_no_thinking() {
        let tok = tiny(Family::Gemma4);
        let ids = tok
            .encode_rendered("<|channel>thought\n<channel|>Hi")
            .unwrap();
        let (thinking, answer, _, all) = run(&tok, &ids);
        assert_eq!((thinking.as_str(), answer.as_str()), ("", "Hi"));
        assert!(all.iter().all(|d| matches!(d, Delta::Answer(_))));
    }

    #[test]
    fn gemma3_has_no_channels_and_stops_on_end_of_turn() {
        let tok = tiny(Family::Gemma3);
        let mut ids = tok.encode("Paris.", false).unwrap();
        ids.push(106);
        let (thinking, answer, stop, _) = run(&tok, &ids);
        assert_eq!(
            (thinking.as_str(), answer.as_str(), stop),
            ("", "Paris.", Some(ids.len() - 1))
        );
    }

    #[test]
    fn gemma4_also_stops_where_a_tool_call_hands_over() {
        let tok = tiny(Family::Gemma4);
        let mut ids = tok.encode("call", false).unwrap();
        ids.push(50);
        let (_, answer, stop, _) = run(&tok, &ids);
        assert_eq!((answer.as_str(), stop), ("call", Some(ids.len() - 1)));
    }

    #[test]
    fn tool_calls_are_read_back_and_a_broken_one_stays_text() {
        let tok = tiny(Family::Gemma4);
        let ids = tok
            .encode_rendered(
                "Sure. <|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:2}<tool_call|>\
                 <|tool_call>call:ping{}<tool_call|><|tool_response>",
            )
            .unwrap();
        let (_, answer, stop, all) = run(&tok, &ids);
        assert_eq!(answer, "Sure. ");
        assert_eq!(stop, Some(ids.len() - 1));
        let calls: Vec<_> = all
            .iter()
            .filter_map(|d| match d {
                Delta::ToolCall { name, arguments } => Some((name.as_str(), arguments.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("get_weather", r#"{"city":"Paris, FR","days":2}"#),
                ("ping", "{}")
            ]
        );
        // A call that does not parse, or never closes, is answer text as written.
        let ids = tok
            .encode_rendered("<|tool_call>call:f{a:<tool_call|>x<|tool_call>call:g{")
            .unwrap();
        let (_, answer, _, all) = run(&tok, &ids);
        assert_eq!(
            answer,
            "<|tool_call>call:f{a:<tool_call|>x<|tool_call>call:g{"
        );
        assert!(all.iter().all(|d| matches!(d, Delta::Answer(_))));
        // Without tools offered, a call stays text as written.
        let ids = tok
            .encode_rendered("<|tool_call>call:ping{}<tool_call|>")
            .unwrap();
        let (_, answer, _, _) = run_with(&tok, &ids, false);
        assert_eq!(answer, "call:ping{}");
        // Gemma 3 has no call syntax: nothing is read as a call.
        let g3 = tiny(Family::Gemma3);
        let ids = g3.encode("call:f{}", false).unwrap();
        let (_, answer, _, _) = run(&g3, &ids);
        assert_eq!(answer, "call:f{}");
    }

    #[test]
    fn pushes_after_stop_are_ignored() {
        let tok = tiny(Family::Gemma4);
        let mut s = StreamSplitter::new();
        assert!(s.push(&tok, 106).unwrap().stop);
        let step = s.push(&tok, tok.encode("x", false).unwrap()[0]).unwrap();
        assert!(step.stop && step.deltas.is_empty());
        assert!(s.mode == Mode::Stopped);
    }

    #[test]
    fn delta_json_shape_is_pinned() {
        assert_eq!(
            serde_json::to_string(&Delta::Thinking("hm".into())).unwrap(),
            r#"{"kind":"thinking","text":"hm"}"#
        );
        assert_eq!(
            serde_json::to_string(&Delta::Answer("ok".into())).unwrap(),
            r#"{"kind":"answer","text":"ok"}"#
        );
    }
}
