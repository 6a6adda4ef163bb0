//! What the engine tells its callers: one serde enum of events (loading progress, the loaded
//! model's card, text deltas, stats, the end of a generation, errors with stable codes). The
//! types are deliberately Tauri-free so the app, the CLI and the tests consume the same JSON;
//! that JSON is a contract, pinned by the tests below.

use serde::{Deserialize, Serialize};

use crate::kv::KvPrecision;

/// One thing that happened in the engine, sent to the sink of the job that caused it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// The phases of a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoneReason {
    /// The model ended its turn (`<eos>` or end-of-turn).
    Stop,
    /// `max_tokens` reached, or the model's context is full.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// Stable, machine-readable error codes (the UI switches on these, so never rename one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The model path, asset or repository does not exist.
    ModelNotFound,
    /// The model file exists but cannot be used (corrupt, unsupported, inconsistent).
    BadModelFile,
    /// No tokenizer could be found for the model.
    TokenizerNotFound,
    /// The tokenizer file cannot be used.
    BadTokenizer,
    /// A job needs a loaded model and none is.
    NoModel,
    /// The prompt does not fit in the model's context.
    ContextOverflow,
    /// The engine is generating and cannot take this job now.
    Busy,
    /// The job was cancelled.
    Cancelled,
    /// The request is malformed (bad sampling values, bad conversation, bad cache spec).
    InvalidRequest,
    /// The Hugging Face Hub could not be reached or refused the download.
    Network,
    /// The engine thread is gone.
    EngineStopped,
    /// Anything else (a tensor operation failed).
    Internal,
}

impl ErrorCode {
    /// The code as its JSON string (e.g. `"context_overflow"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ModelNotFound => "model_not_found",
            ErrorCode::BadModelFile => "bad_model_file",
            ErrorCode::TokenizerNotFound => "tokenizer_not_found",
            ErrorCode::BadTokenizer => "bad_tokenizer",
            ErrorCode::NoModel => "no_model",
            ErrorCode::ContextOverflow => "context_overflow",
            ErrorCode::Busy => "busy",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Network => "network",
            ErrorCode::EngineStopped => "engine_stopped",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Figures of one generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// How many layers of each attention kind a model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerCounts {
    /// Sliding-window layers that own a cache.
    pub sliding: usize,
    /// Full-attention layers that own a cache.
    pub full: usize,
    /// Layers that read another layer's cache (Gemma 4 KV sharing).
    pub shared: usize,
}

/// KV cache bytes one token costs in one precision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvBytesPerToken {
    /// The storage precision.
    pub precision: KvPrecision,
    /// Over sliding layers (these stop growing once the window is full).
    pub sliding: usize,
    /// Over full layers (these grow with every token).
    pub full: usize,
}

/// What a loaded model is: shown by the UI and printed by the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// Display name (file or repository name).
    pub name: String,
    /// `gemma3` or `gemma4`.
    pub architecture: String,
    /// Number of parameters in the weight file(s).
    pub params: u64,
    /// Decoder layers.
    pub layers: usize,
    /// Layers by attention kind.
    pub layer_counts: LayerCounts,
    /// Sliding window (0 without sliding layers).
    pub sliding_window: usize,
    /// Maximum context in tokens.
    pub max_context: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// KV bytes per token for each dense precision.
    pub kv_bytes_per_token: Vec<KvBytesPerToken>,
    /// Whether the model has a thinking mode.
    pub supports_thinking: bool,
    /// Whether the checkpoint ships a chat template (false: a base model, best prompted
    /// with plain text; `None`: unknown).
    pub has_chat_template: Option<bool>,
    /// Config fields that were ignored or defaulted.
    pub warnings: Vec<String>,
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
        use ErrorCode::*;
        for c in [
            ModelNotFound,
            BadModelFile,
            TokenizerNotFound,
            BadTokenizer,
            NoModel,
            ContextOverflow,
            Busy,
            Cancelled,
            InvalidRequest,
            Network,
            EngineStopped,
            Internal,
        ] {
            assert_eq!(to_value(c).unwrap(), json!(c.as_str()));
        }
    }

    #[test]
    fn stats_and_card_round_trip() {
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
        };
        let v = to_value(Event::Stats(stats.clone())).unwrap();
        assert_eq!(v["type"], "stats");
        assert_eq!(v["prefill_tokens"], 6);
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap(),
            Event::Stats(stats)
        );
        let card = ModelCard {
            name: "m".into(),
            architecture: "gemma3".into(),
            params: 7,
            layers: 2,
            layer_counts: LayerCounts {
                sliding: 1,
                full: 1,
                shared: 0,
            },
            sliding_window: 8,
            max_context: 256,
            vocab_size: 512,
            kv_bytes_per_token: vec![KvBytesPerToken {
                precision: KvPrecision::F16,
                sliding: 64,
                full: 64,
            }],
            supports_thinking: false,
            has_chat_template: Some(false),
            warnings: vec![],
        };
        let v = to_value(Event::Loaded { card: card.clone() }).unwrap();
        assert_eq!(v["type"], "loaded");
        assert_eq!(v["card"]["kv_bytes_per_token"][0]["precision"], "f16");
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap(),
            Event::Loaded { card }
        );
    }
}
