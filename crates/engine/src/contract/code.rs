//! The one error vocabulary every front end shows: a stable snake_case code per failure, the
//! same string in events, command errors, CLI messages and (later) HTTP bodies. Depends on
//! nothing else in the engine.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

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
    /// The engine's request queue is full (it holds [`crate::worker::MAX_QUEUED`] waiting
    /// requests); try again once one has finished.
    QueueFull,
    /// A saved KV cache file is damaged (truncated, a failed checksum, sizes that lie): it was
    /// set aside; the conversation reads its prompt again.
    CacheCorrupt,
    /// A saved KV cache file belongs to another model or policy, or to another format
    /// version: the conversation reads its prompt again.
    CacheMismatch,
}

impl ErrorCode {
    /// Every code, for exhaustive tests and documentation.
    pub const ALL: [ErrorCode; 41] = [
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
        ErrorCode::QueueFull,
        ErrorCode::CacheCorrupt,
        ErrorCode::CacheMismatch,
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
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::CacheCorrupt => "cache_corrupt",
            ErrorCode::CacheMismatch => "cache_mismatch",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
