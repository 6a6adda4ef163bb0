//! What the engine tells its callers: one serde enum of events (loading progress, the loaded
//! model's card, text deltas, stats, the end of a generation, errors with stable codes), the
//! one [`ErrorCode`] vocabulary every front end shows, and the engine's [`Activity`] for
//! status bars. The types are deliberately Tauri-free so the app, the CLI and the tests
//! consume the same JSON; that JSON is a contract, pinned by the tests below, and the UI's
//! TypeScript types are generated from these definitions.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

pub use crate::card::{HeadShape, LayerCounts, ModelCard};

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

/// Stable, machine-readable error codes: the one vocabulary of the engine, the app and the UI
/// (which switches on them, so never rename one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
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
    /// The Hugging Face Hub could not be reached.
    Network,
    /// The Hub wants a token, or the token has no access (a gated repository): the message
    /// says how to set `HF_TOKEN`.
    HubAuth,
    /// The Hub is rate-limiting this client (429); the message says how long to wait.
    HubRateLimited,
    /// The Hub kept failing (5xx) after retries with backoff.
    HubUnavailable,
    /// A download ended before its last byte after retries; what arrived is kept for resume.
    DownloadIncomplete,
    /// A downloaded file is not what the Hub listed (checksum or size); it was discarded.
    DownloadCorrupt,
    /// The disk (or the file system's file-size limit) has no room for what is being written:
    /// nothing was written, and the previous file is intact.
    DiskFull,
    /// The model, or its context, needs more memory than the machine has available.
    OutOfMemory,
    /// The model produced NaN or infinite logits (bad weights or an overflow).
    NonFiniteLogits,
    /// The engine thread is gone.
    EngineStopped,
    /// The model's architecture is not one the engine implements.
    UnsupportedModel,
    /// A file could not be read or written.
    Io,
    /// No default model is configured (`KVLAB_DEFAULT_MODEL`), or its file is missing.
    NoDefaultModel,
    /// A document cannot go into the prompt (not a file, or a file type that is not text).
    DocumentRefused,
    /// A PDF that cannot be parsed.
    PdfUnreadable,
    /// A password-protected PDF.
    PdfEncrypted,
    /// A PDF without a text layer (scans, images only).
    PdfNoText,
    /// No saved session has that id.
    SessionNotFound,
    /// A saved session that cannot be read or written as given.
    BadSession,
    /// Anything else (a tensor operation failed).
    Internal,
    /// A document file holds no bytes.
    DocumentEmpty,
    /// A document is binary (NUL bytes, or a binary file type), not text.
    DocumentBinary,
    /// A document is not UTF-8 text.
    DocumentNotUtf8,
    /// A document, or the text it expands to, is over the size limit.
    DocumentTooLarge,
    /// The document reader ran past its time limit (a file that makes the parser loop).
    DocumentTimeout,
    /// The document reader ran past its memory limit (a decompression bomb).
    DocumentOutOfMemory,
    /// The document reader crashed (a stack overflow, an abort); the app is unharmed.
    DocumentCrashed,
    /// A saved session file is truncated or corrupt; it was set aside, renamed, not deleted.
    SessionCorrupt,
    /// The model's chat template cannot be used (it fails to parse or render, or runs past
    /// its limits): the message names the line; the model still continues plain text.
    BadChatTemplate,
}

impl ErrorCode {
    /// Every code, for exhaustive tests and documentation.
    pub const ALL: [ErrorCode; 38] = [
        ErrorCode::ModelNotFound,
        ErrorCode::BadModelFile,
        ErrorCode::TokenizerNotFound,
        ErrorCode::BadTokenizer,
        ErrorCode::NoModel,
        ErrorCode::ContextOverflow,
        ErrorCode::Busy,
        ErrorCode::Cancelled,
        ErrorCode::InvalidRequest,
        ErrorCode::Network,
        ErrorCode::HubAuth,
        ErrorCode::HubRateLimited,
        ErrorCode::HubUnavailable,
        ErrorCode::DownloadIncomplete,
        ErrorCode::DownloadCorrupt,
        ErrorCode::DiskFull,
        ErrorCode::OutOfMemory,
        ErrorCode::NonFiniteLogits,
        ErrorCode::EngineStopped,
        ErrorCode::UnsupportedModel,
        ErrorCode::Io,
        ErrorCode::NoDefaultModel,
        ErrorCode::DocumentRefused,
        ErrorCode::PdfUnreadable,
        ErrorCode::PdfEncrypted,
        ErrorCode::PdfNoText,
        ErrorCode::SessionNotFound,
        ErrorCode::BadSession,
        ErrorCode::Internal,
        ErrorCode::DocumentEmpty,
        ErrorCode::DocumentBinary,
        ErrorCode::DocumentNotUtf8,
        ErrorCode::DocumentTooLarge,
        ErrorCode::DocumentTimeout,
        ErrorCode::DocumentOutOfMemory,
        ErrorCode::DocumentCrashed,
        ErrorCode::SessionCorrupt,
        ErrorCode::BadChatTemplate,
    ];
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
            ErrorCode::HubAuth => "hub_auth",
            ErrorCode::HubRateLimited => "hub_rate_limited",
            ErrorCode::HubUnavailable => "hub_unavailable",
            ErrorCode::DownloadIncomplete => "download_incomplete",
            ErrorCode::DownloadCorrupt => "download_corrupt",
            ErrorCode::DiskFull => "disk_full",
            ErrorCode::OutOfMemory => "out_of_memory",
            ErrorCode::NonFiniteLogits => "non_finite_logits",
            ErrorCode::EngineStopped => "engine_stopped",
            ErrorCode::UnsupportedModel => "unsupported_model",
            ErrorCode::Io => "io",
            ErrorCode::NoDefaultModel => "no_default_model",
            ErrorCode::DocumentRefused => "document_refused",
            ErrorCode::PdfUnreadable => "pdf_unreadable",
            ErrorCode::PdfEncrypted => "pdf_encrypted",
            ErrorCode::PdfNoText => "pdf_no_text",
            ErrorCode::SessionNotFound => "session_not_found",
            ErrorCode::BadSession => "bad_session",
            ErrorCode::Internal => "internal",
            ErrorCode::DocumentEmpty => "document_empty",
            ErrorCode::DocumentBinary => "document_binary",
            ErrorCode::DocumentNotUtf8 => "document_not_utf8",
            ErrorCode::DocumentTooLarge => "document_too_large",
            ErrorCode::DocumentTimeout => "document_timeout",
            ErrorCode::DocumentOutOfMemory => "document_out_of_memory",
            ErrorCode::DocumentCrashed => "document_crashed",
            ErrorCode::SessionCorrupt => "session_corrupt",
            ErrorCode::BadChatTemplate => "bad_chat_template",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// The cache it ran with at its end, as its canonical SPEC.
    pub cache_spec: String,
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
            cache_spec: "tq3.5@all".into(),
        };
        let v = to_value(Event::Stats(stats.clone())).unwrap();
        assert_eq!(v["type"], "stats");
        assert_eq!(v["prefill_tokens"], 6);
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap(),
            Event::Stats(stats)
        );
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_gemma3");
        let card = crate::card::inspect(&path, &crate::model::LoadOptions::default())
            .unwrap()
            .card;
        let v = to_value(Event::Loaded { card: card.clone() }).unwrap();
        assert_eq!(v["type"], "loaded");
        assert_eq!(v["card"]["token_costs"][1]["spec"], "f16");
        assert_eq!(v["card"]["architecture"], "gemma3");
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap(),
            Event::Loaded { card }
        );
    }
}
