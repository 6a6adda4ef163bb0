//! Errors as the UI sees them: `{code, message}`, where the code is one flat string set: the
//! engine's [`ErrorCode`]s (model, cache, generation) and the app's own [`AppCode`]s
//! (documents, sessions, the default model), which only the app raises.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

pub use kvlab_engine::contract::ErrorCode;
use kvlab_engine::JobError;

kvlab_engine::error_codes! {
    /// Failures of the app's own commands (documents dropped on the window, saved sessions,
    /// the default model). Their strings never collide with the engine's (a test checks).
    AppCode {
        /// No default model is configured (`KVLAB_DEFAULT_MODEL`), or its file is missing.
        NoDefaultModel = "no_default_model",
        /// A document cannot go into the prompt (not a file, or a file type that is not text).
        DocumentRefused = "document_refused",
        /// A PDF that cannot be parsed.
        PdfUnreadable = "pdf_unreadable",
        /// A password-protected PDF.
        PdfEncrypted = "pdf_encrypted",
        /// A PDF without a text layer (scans, images only).
        PdfNoText = "pdf_no_text",
        /// No saved session has that id.
        SessionNotFound = "session_not_found",
        /// A saved session that cannot be read or written as given.
        BadSession = "bad_session",
        /// A document file holds no bytes.
        DocumentEmpty = "document_empty",
        /// A document is binary (NUL bytes, or a binary file type), not text.
        DocumentBinary = "document_binary",
        /// A document is not UTF-8 text.
        DocumentNotUtf8 = "document_not_utf8",
        /// A document, or the text it expands to, is over the size limit.
        DocumentTooLarge = "document_too_large",
        /// The document reader ran past its time limit (a file that makes the parser loop).
        DocumentTimeout = "document_timeout",
        /// The document reader ran past its memory limit (a decompression bomb).
        DocumentOutOfMemory = "document_out_of_memory",
        /// The document reader crashed (a stack overflow, an abort); the app is unharmed.
        DocumentCrashed = "document_crashed",
        /// A saved session file is truncated or corrupt; it was set aside, renamed, not deleted.
        SessionCorrupt = "session_corrupt",
    }
}

/// A code from either vocabulary; serialized as its plain string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(untagged)]
pub enum Code {
    /// The engine's.
    Engine(ErrorCode),
    /// The app's.
    App(AppCode),
}

impl From<ErrorCode> for Code {
    fn from(c: ErrorCode) -> Self {
        Code::Engine(c)
    }
}

impl From<AppCode> for Code {
    fn from(c: AppCode) -> Self {
        Code::App(c)
    }
}

impl PartialEq<ErrorCode> for Code {
    fn eq(&self, other: &ErrorCode) -> bool {
        *self == Code::Engine(*other)
    }
}

impl PartialEq<AppCode> for Code {
    fn eq(&self, other: &AppCode) -> bool {
        *self == Code::App(*other)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Code::Engine(c) => c.fmt(f),
            Code::App(c) => c.fmt(f),
        }
    }
}

/// What a command answers when it fails. Serialized as `{"code": "...", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize, TS)]
#[error("{code}: {message}")]
pub struct CommandError {
    /// Machine-readable code.
    pub code: Code,
    /// Human-readable message.
    pub message: String,
}

impl CommandError {
    /// An error with `code`.
    pub fn new(code: impl Into<Code>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

impl From<kvlab_engine::EngineError> for CommandError {
    fn from(e: kvlab_engine::EngineError) -> Self {
        JobError::from(e).into()
    }
}

impl From<JobError> for CommandError {
    fn from(e: JobError) -> Self {
        Self::new(e.code, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_and_engine_codes_are_one_flat_string_set() {
        let engine: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        for c in AppCode::ALL {
            assert!(!engine.contains(&c.as_str()), "{c} is also an engine code");
            let v = serde_json::to_value(CommandError::new(c, "m")).unwrap();
            assert_eq!(v["code"], c.as_str());
            let back: CommandError = serde_json::from_value(v).unwrap();
            assert_eq!(back.code, c);
        }
        let v = serde_json::to_value(CommandError::new(ErrorCode::Busy, "m")).unwrap();
        assert_eq!(v, serde_json::json!({"code": "busy", "message": "m"}));
        let back: CommandError = serde_json::from_value(v).unwrap();
        assert_eq!(back.code, ErrorCode::Busy);
    }
}
