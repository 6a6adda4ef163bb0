//! Errors of engine jobs: typed where they arise (loading), and flattened to a stable code
//! plus message ([`JobError`]) once they cross the engine thread's boundary.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::checkpoint::source::SourceError;
use crate::contract::{ErrorCode, Event};
use crate::error::EngineError;
use crate::generate::GenerateError;
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The model or its tokenizer could not be located.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The weights could not be read.
    #[error("cannot load model: {0}")]
    Model(EngineError),
    /// The tokenizer could not be read.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The cache could not be created.
    #[error("cannot create the KV cache: {0}")]
    Cache(EngineError),
    /// The weights and the cache would not fit the memory available (nothing was read).
    #[error("{0}")]
    OutOfMemory(String),
}

impl LoadError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            LoadError::Source(e) => e.code(),
            // A tensor operation failing while weights are read means a bad file.
            LoadError::Model(e) => match e.code() {
                ErrorCode::Internal => ErrorCode::BadModelFile,
                c => c,
            },
            LoadError::Tokenizer(_) => ErrorCode::BadTokenizer,
            LoadError::Cache(EngineError::InvalidRequest(_)) => ErrorCode::InvalidRequest,
            LoadError::Cache(_) => ErrorCode::Internal,
            LoadError::OutOfMemory(_) => ErrorCode::OutOfMemory,
        }
    }
}

/// A failure as every caller sees it (a job, a command of the app, the CLI): a stable code
/// and a message. Serialized as `{"code": "...", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize, TS)]
#[error("{message}")]
pub struct JobError {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
}

impl JobError {
    /// An error with `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The job was refused because a generation is running.
    pub fn busy(what: &str) -> Self {
        Self::new(
            ErrorCode::Busy,
            format!("cannot {what} while a generation is running; cancel it first"),
        )
    }

    /// No model is loaded.
    pub fn no_model() -> Self {
        Self::new(ErrorCode::NoModel, "no model is loaded")
    }

    /// The request queue is full.
    pub fn queue_full() -> Self {
        Self::new(
            ErrorCode::QueueFull,
            format!(
                "{} requests are already waiting for the engine; try again when one has \
                 finished",
                super::MAX_QUEUED
            ),
        )
    }

    /// The engine thread has stopped.
    pub fn stopped() -> Self {
        Self::new(ErrorCode::EngineStopped, "the engine thread has stopped")
    }

    /// The `error` event carrying this error.
    pub fn to_event(&self) -> Event {
        Event::Error {
            code: self.code,
            message: self.message.clone(),
        }
    }
}

impl From<LoadError> for JobError {
    fn from(e: LoadError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<GenerateError> for JobError {
    fn from(e: GenerateError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<EngineError> for JobError {
    fn from(e: EngineError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_serialize_as_code_and_message() {
        let e = JobError::new(ErrorCode::Busy, "a generation is running");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"code": "busy", "message": "a generation is running"})
        );
    }

    #[test]
    fn engine_errors_get_stable_codes() {
        let e: JobError = EngineError::UnsupportedArchitecture("llama".into()).into();
        assert_eq!(e.code, ErrorCode::UnsupportedModel);
        assert!(e.message.contains("llama"), "{}", e.message);
        let missing = EngineError::Io {
            path: "/nope".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(JobError::from(missing).code, ErrorCode::ModelNotFound);
        let corrupt = EngineError::CorruptFile {
            path: "/x".into(),
            reason: "truncated".into(),
        };
        assert_eq!(LoadError::Model(corrupt).code(), ErrorCode::BadModelFile);
    }
}
