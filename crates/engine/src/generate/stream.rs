//! Splits a generated token stream into typed text deltas: the thinking channel
//! (`<|channel>thought\n…<channel|>`) versus the answer, and stops at the tokenizer's stop
//! ids (the file's end of sequence and the family's end of turn).

use serde::{Deserialize, Serialize};

use crate::generate::detok::Detokenizer;
use crate::tokenizer::{Control, GemmaTokenizer, TokenizerError};

/// A piece of generated text, tagged with the channel it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "text", rename_all = "snake_case")]
pub enum Delta {
    Thinking(String),
    Answer(String),
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
    Stopped,
}

/// Stateful splitter for one generated turn.
#[derive(Debug, Clone)]
pub struct StreamSplitter {
    mode: Mode,
    detok: Detokenizer,
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
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.mode == Mode::Stopped
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

    /// Text still held back at the end of the stream.
    pub fn finish(&mut self, tok: &GemmaTokenizer) -> Result<Vec<Delta>, TokenizerError> {
        let mut out = Vec::new();
        self.flush(tok, &mut out)?;
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

    /// Runs `ids` through a splitter; returns (thinking, answer, stopped-at index).
    fn run(tok: &GemmaTokenizer, ids: &[u32]) -> (String, String, Option<usize>, Vec<Delta>) {
        let mut s = StreamSplitter::new();
        let (mut thinking, mut answer, mut stop, mut all) =
            (String::new(), String::new(), None, vec![]);
        for (i, &id) in ids.iter().enumerate() {
            let step = s.push(tok, id).unwrap();
            all.extend(step.deltas.clone());
            for d in step.deltas {
                match d {
                    Delta::Thinking(t) => thinking.push_str(&t),
                    Delta::Answer(t) => answer.push_str(&t),
                }
            }
            if step.stop && stop.is_none() {
                stop = Some(i);
            }
        }
        for d in s.finish(tok).unwrap() {
            match d {
                Delta::Thinking(t) => thinking.push_str(&t),
                Delta::Answer(t) => answer.push_str(&t),
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
    fn pushes_after_stop_are_ignored() {
        let tok = tiny(Family::Gemma4);
        let mut s = StreamSplitter::new();
        assert!(s.push(&tok, 106).unwrap().stop);
        let step = s.push(&tok, tok.encode("x", false).unwrap()[0]).unwrap();
        assert!(step.stop && step.deltas.is_empty());
        assert!(s.is_stopped());
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
