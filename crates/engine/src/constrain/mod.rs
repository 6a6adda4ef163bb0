//! Constrained decoding: an answer held to a grammar (any JSON object, JSON valid under a
//! schema, or a call of the offered tools in the model's own call syntax) by masking each
//! step's logits to the tokens the grammar allows. The grammar engine is llguidance, over
//! the model's own vocabulary ([`vocab`]); this module only says what grammar a request
//! means. A grammar is compiled on the submitting thread, never the engine's; its size, its
//! lexer and each step's work are bounded ([`limits`]), so a hostile schema is refused at
//! submit, or ends its own answer with `bad_grammar`, within a bound per step.

mod calls;
pub(crate) mod vocab;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::Matcher;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use ts_rs::TS;

use crate::chat::Tool;
use crate::models::Control;
use crate::tokenizer::GemmaTokenizer;

/// What an answer is held to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Constraint {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid under `schema` (OpenAI's `json_schema`).
    JsonSchema {
        /// The schema (draft 2020-12, as llguidance reads it).
        #[ts(type = "unknown")]
        schema: Value,
    },
    /// A call of the prompt's tools in the model's call syntax, arguments held to each
    /// tool's schema: only `name` when given; one call, or several when `parallel`.
    ToolCall {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[ts(optional)]
        name: Option<String>,
        #[serde(default)]
        parallel: bool,
    },
}

/// Why a constraint cannot be held.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstrainError {
    /// The request's grammar is refused: it is invalid, or past a bound.
    #[error("{0}")]
    Refused(String),
    /// The grammar could not go on (a step past its bound of work, or a token it did not
    /// allow): the answer ends here.
    #[error("the answer's grammar stopped: {0}")]
    Stopped(String),
}

/// Most bytes of a schema or tool list a request may hold to (a real one is a few KiB).
pub const MAX_SCHEMA_BYTES: usize = 256 << 10;

/// The bounds every grammar runs under: a compile within tens of milliseconds, and each
/// step's mask within a few (llguidance's own measures: lexer fuel ≈ 14k/ms, Earley items
/// ≈ 20k/ms), whatever the schema.
pub fn limits() -> ParserLimits {
    ParserLimits {
        max_items_in_row: 2_000,
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 100_000,
        step_max_items: 40_000,
        max_lexer_states: 100_000,
        max_grammar_size: 200_000,
        precompute_large_lexemes: true,
        verbose_errors: false,
    }
}

/// A compiled constraint for one answer: the mask of each step, and the tokens taken.
pub struct Guide {
    /// Boxed: a matcher is some hundreds of bytes, and guides ride in queued jobs.
    matcher: Box<Matcher>,
    /// Tokens of the vocabulary (logits past it are never allowed).
    vocab: usize,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide").field("vocab", &self.vocab).finish()
    }
}

impl Guide {
    /// Compiles `constraint` for an answer to a prompt offering `tools` (with the thinking
    /// channel first when `thinking`), over `tokenizer`'s vocabulary.
    pub fn compile(
        constraint: &Constraint,
        tools: &[Tool],
        thinking: bool,
        tokenizer: &GemmaTokenizer,
    ) -> Result<Self, ConstrainError> {
        let id = |c: Control| {
            tokenizer.control_id(c).ok_or_else(|| {
                ConstrainError::Refused(format!(
                    "the vocabulary has no {} token",
                    tokenizer.family().text(c).unwrap_or("control")
                ))
            })
        };
        let body = match constraint {
            Constraint::JsonObject => json_body(&serde_json::json!({"type": "object"}))?,
            Constraint::JsonSchema { schema } => json_body(schema)?,
            Constraint::ToolCall { name, parallel } => {
                tokenizer
                    .tool_support()
                    .map_err(|e| ConstrainError::Refused(format!("tools: {e}")))?;
                let offered: Vec<&Tool> = match name {
                    None => tools.iter().collect(),
                    Some(n) => tools.iter().filter(|t| &t.name == n).collect(),
                };
                if offered.is_empty() {
                    return Err(ConstrainError::Refused(match name {
                        Some(n) => format!("tool_choice names {n:?}, which is not in tools"),
                        None => "a tool call is required but no tools are offered".into(),
                    }));
                }
                let markers = calls::Markers {
                    open: id(Control::ToolCallStart)?,
                    close: id(Control::ToolCallEnd)?,
                    quote: id(Control::Quote)?,
                    handover: tokenizer.control_id(Control::ToolResponse),
                };
                calls::grammar(&offered, *parallel, &markers)?
            }
        };
        let lark = if thinking && tokenizer.supports_thinking() {
            let (open, close) = (id(Control::ChannelStart)?, id(Control::ChannelEnd)?);
            format!("start: thought? body\nthought: <[{open}]> /(.|\\n)*/ <[{close}]>\n{body}")
        } else {
            format!("start: body\n{body}")
        };
        let factory = vocab::factory(tokenizer)?;
        let parser = factory.create_parser(TopLevelGrammar::from_lark(lark));
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Refused(short(&e)));
        }
        Ok(Self {
            matcher: Box::new(matcher),
            vocab: tokenizer.vocab_size(),
        })
    }

    /// A copy in the same state, going on independently (each compare pane holds its own).
    pub fn duplicate(&self) -> Self {
        Self {
            matcher: Box::new(self.matcher.deep_clone()),
            vocab: self.vocab,
        }
    }

    /// Sets every logit the grammar does not allow next to −∞.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstrainError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstrainError::Stopped(short(&e.to_string())))?;
        // A word of the mask at a time: a vocabulary of 262k is 8k words, most of them all
        // allowed (free text) or none (structure).
        let words = allowed.as_slice();
        let vocab = self.vocab.min(logits.len());
        for (w, chunk) in logits[..vocab].chunks_mut(32).enumerate() {
            match words.get(w).copied().unwrap_or(0) {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                bits => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if bits & (1 << b) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        logits[vocab..].fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Takes the sampled token.
    pub fn commit(&mut self, id: u32) -> Result<(), ConstrainError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| ConstrainError::Stopped(short(&e.to_string())))
    }
}

/// A grammar error on one line, cut to a readable length (llguidance's may quote the whole
/// grammar).
fn short(e: &str) -> String {
    let line = e.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > 300 {
        let mut end = 300;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &line[..end])
    } else {
        line
    }
}

/// The Lark rule `body` for JSON under `schema`: compact separators and no free whitespace
/// (an answer cannot pad itself out), unless the schema's own `x-guidance` says otherwise.
fn json_body(schema: &Value) -> Result<String, ConstrainError> {
    let Value::Object(map) = schema else {
        return Err(ConstrainError::Refused(
            "the JSON schema must be an object".into(),
        ));
    };
    let mut map = map.clone();
    map.entry("x-guidance").or_insert_with(|| {
        serde_json::json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        })
    });
    let text = serde_json::to_string(&Value::Object(map))
        .map_err(|e| ConstrainError::Refused(e.to_string()))?;
    if text.len() > MAX_SCHEMA_BYTES {
        return Err(ConstrainError::Refused(format!(
            "the JSON schema is {} KiB, more than the {} KiB allowed",
            text.len() >> 10,
            MAX_SCHEMA_BYTES >> 10
        )));
    }
    Ok(format!("body: %json {text}\n"))
}

#[cfg(test)]
mod tests;
