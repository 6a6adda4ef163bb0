//! What the engine tells its callers: one serde enum of events (loading progress, the loaded
//! model's card, text deltas, stats, the end of a generation, errors with stable codes), and
//! the engine's [`Activity`] for status bars. The types are deliberately Tauri-free so the app, the CLI and the tests
//! consume the same JSON; that JSON is a contract, pinned by the tests below, and the UI's
//! TypeScript types are generated from these definitions.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::card::ModelCard;
use super::code::ErrorCode;
use super::compare::{CompareFidelity, FittedCache, SweepPoint};

/// One thing that happened in the engine, sent to the sink of the job that caused it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A model is being located, downloaded or read.
    Loading {
        /// What is happening now.
        phase: LoadPhase,
        /// Bytes done so far in this phase (downloads), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        done: Option<u64>,
        /// Bytes in total for this phase, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
    /// A model finished loading and is ready.
    Loaded {
        /// What was loaded.
        card: ModelCard,
    },
    /// A piece of the answer.
    Token {
        /// Text to append (never ends inside a character).
        text: String,
    },
    /// A piece of the model's thinking channel.
    Thinking {
        /// Text to append.
        text: String,
    },
    /// A whole tool call the model made (its arguments parsed from the model's call syntax).
    ToolCall {
        /// Its place among this answer's calls, from 0.
        index: usize,
        /// The id a tool's answer names.
        id: String,
        /// The function called.
        name: String,
        /// Its arguments, a JSON object as text.
        arguments: String,
    },
    /// Figures of the generation so far (sent once, just before `done`).
    Stats(GenStats),
    /// The generation ended.
    Done {
        /// Why it ended.
        reason: DoneReason,
        /// Ids of every generated token, the stop token included.
        token_ids: Vec<u32>,
    },
    /// The job failed; the engine is still usable.
    Error {
        /// Machine-readable code.
        code: ErrorCode,
        /// Human-readable message.
        message: String,
    },
    /// A comparison's event of pane 0 (reference) or 1 (test): `token`, `thinking`, `stats`,
    /// `done`.
    Pane {
        /// Which pane.
        pane: usize,
        /// Its event.
        event: Box<Event>,
    },
    /// One cache of a comparison's sweep, scored on the reference's tokens (after the panes'
    /// fidelity, before `finished`).
    SweepPoint {
        /// Its figures.
        point: SweepPoint,
    },
    /// The cache a comparison fitted to its [`FitTarget`](super::compare::FitTarget), once
    /// its probes are scored; its `sweep_point` follows.
    Fitted {
        /// What was chosen.
        fitted: FittedCache,
    },
    /// Progress of a comparison's teacher-forced scoring after the panes: `done` of `total`
    /// token steps (the reference's tokens, once per group of caches scored together).
    Scoring {
        /// Token steps run.
        done: usize,
        /// Token steps in all.
        total: usize,
    },
    /// Both panes of a comparison are done; fidelity is absent when cancelled or nothing was
    /// generated. Every comparison ends with exactly one `finished` or `error`.
    Finished {
        /// The scores.
        fidelity: Option<CompareFidelity>,
    },
}

/// The phases of a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum LoadPhase {
    /// Turning the user's model string into local files.
    Resolving,
    /// Fetching files from the Hugging Face Hub.
    Downloading,
    /// Reading weights into memory.
    Weights,
    /// Reading the tokenizer.
    Tokenizer,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum DoneReason {
    /// The model ended its turn (`<eos>` or end-of-turn).
    Stop,
    /// `max_tokens` reached, or the model's context is full.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// Figures of one generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct GenStats {
    /// Tokens in the rendered prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens found already in the cache (not recomputed).
    pub reused_tokens: usize,
    /// Prompt tokens run through the model in this request.
    pub prefill_tokens: usize,
    /// Tokens generated (the stop token included).
    pub generated_tokens: usize,
    /// Seconds from the request to the first generated token.
    pub time_to_first_token_s: f64,
    /// Prefill throughput (tokens per second; 0 when nothing was prefilled).
    pub prefill_tok_per_s: f64,
    /// Decode throughput (tokens per second; 0 with fewer than two tokens).
    pub decode_tok_per_s: f64,
    /// Tokens the cache now holds (position of the next token).
    pub context_tokens: usize,
    /// The model's maximum context.
    pub max_context: usize,
    /// Bytes the KV cache holds for live tokens.
    pub kv_bytes: usize,
    /// Bytes the KV cache has reserved.
    pub kv_bytes_allocated: usize,
    /// Its TurboQuant layers still hold their first tokens as f16, waiting for the model's
    /// calibration rows (`kv_bytes` are then f16's).
    #[serde(default)]
    pub kv_calibrating: bool,
    /// The cache it ran with at its end, as its canonical SPEC.
    pub cache_spec: String,
    /// The conversation it ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub conversation: Option<super::ConversationId>,
    /// Where its cache came from: held, demoted, restored from disk, or read again.
    #[serde(default)]
    pub cache_origin: super::CacheOrigin,
}

/// What the engine is doing, for a status bar (sent on every change, so low rate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Activity {
    /// Nothing is loaded.
    NoModel,
    /// A model is being located, downloaded or read.
    Loading {
        /// What is loading (path or repository).
        source: String,
    },
    /// A model is loaded and idle.
    Ready {
        /// Its name.
        model: String,
    },
    /// A generation or comparison is running.
    Generating {
        /// The model's name.
        model: String,
    },
    /// The last load failed and nothing is loaded.
    Failed {
        /// Why.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, to_value};

    #[test]
    fn text_events_have_pinned_json() {
        assert_eq!(
            to_value(Event::Token { text: "hi".into() }).unwrap(),
            json!({"type": "token", "text": "hi"})
        );
        assert_eq!(
            to_value(Event::Thinking { text: "hm".into() }).unwrap(),
            json!({"type": "thinking", "text": "hm"})
        );
        assert_eq!(
            to_value(Event::Done {
                reason: DoneReason::Cancelled,
                token_ids: vec![5, 6]
            })
            .unwrap(),
            json!({"type": "done", "reason": "cancelled", "token_ids": [5, 6]})
        );
    }

    #[test]
    fn error_and_loading_events_have_pinned_json() {
        assert_eq!(
            to_value(Event::Error {
                code: ErrorCode::ContextOverflow,
                message: "too long".into()
            })
            .unwrap(),
            json!({"type": "error", "code": "context_overflow", "message": "too long"})
        );
        assert_eq!(
            to_value(Event::Loading {
                phase: LoadPhase::Downloading,
                done: Some(5),
                total: Some(10)
            })
            .unwrap(),
            json!({"type": "loading", "phase": "downloading", "done": 5, "total": 10})
        );
        assert_eq!(
            to_value(Event::Loading {
                phase: LoadPhase::Weights,
                done: None,
                total: None
            })
            .unwrap(),
            json!({"type": "loading", "phase": "weights"})
        );
    }

    #[test]
    fn every_error_code_serializes_as_its_str() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert_eq!(to_value(c).unwrap(), json!(c.as_str()));
            assert_eq!(
                serde_json::from_value::<ErrorCode>(json!(c.as_str())).unwrap(),
                c
            );
            assert!(seen.insert(c.as_str()), "{c} twice");
        }
    }

    #[test]
    fn activity_json_is_pinned() {
        assert_eq!(
            to_value(Activity::Loading {
                source: "/m/x.gguf".into()
            })
            .unwrap(),
            json!({"state": "loading", "source": "/m/x.gguf"})
        );
        assert_eq!(
            to_value(Activity::NoModel).unwrap(),
            json!({"state": "no_model"})
        );
    }

    #[test]
    fn stats_round_trip() {
        let stats = GenStats {
            prompt_tokens: 10,
            reused_tokens: 4,
            prefill_tokens: 6,
            generated_tokens: 3,
            time_to_first_token_s: 0.5,
            prefill_tok_per_s: 12.0,
            decode_tok_per_s: 30.0,
            context_tokens: 12,
            max_context: 256,
            kv_bytes: 1024,
            kv_bytes_allocated: 2048,
            kv_calibrating: true,
            cache_spec: "tq3.5@all".into(),
            conversation: Some(super::super::ConversationId::new("s-1").unwrap()),
            cache_origin: super::super::CacheOrigin::Restored,
        };
        let v = to_value(Event::Stats(stats.clone())).unwrap();
        assert_eq!(v["type"], "stats");
        assert_eq!(v["prefill_tokens"], 6);
        assert_eq!(v["conversation"], "s-1");
        assert_eq!(v["cache_origin"], "restored");
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap(),
            Event::Stats(stats)
        );
    }
}
