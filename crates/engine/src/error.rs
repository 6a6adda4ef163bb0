//! The engine's one error type: every failure a caller can provoke (files, configs, tensor
//! shapes, cache misuse) comes back as a typed, named variant instead of a panic.

use std::path::PathBuf;

/// Result alias used throughout the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// Everything that can go wrong when loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A config file is not valid JSON or a field has the wrong type.
    #[error("invalid config {origin}: {reason}")]
    ConfigParse {
        /// Where the config came from (path or description).
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// Two config fields disagree (e.g. `layer_types` length ≠ `num_hidden_layers`).
    #[error("contradictory config: {0}")]
    ConfigContradiction(String),
    /// The model architecture is not one this engine implements.
    #[error(
        "unsupported architecture `{0}` (supported: {supported})",
        supported = crate::models::supported_architectures()
    )]
    UnsupportedArchitecture(String),
    /// A weight the architecture needs is absent from the checkpoint.
    #[error("missing tensor `{name}` in {origin}")]
    MissingTensor {
        /// The tensor name as looked up in the file.
        name: String,
        /// The weight file(s).
        origin: String,
    },
    /// A weight has a different shape than the config implies.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The tensor name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape found in the file.
        actual: Vec<usize>,
    },
    /// A weight file is damaged: truncated, bad header, bad index.
    #[error("corrupt weight file {path}: {reason}")]
    CorruptFile {
        /// The damaged file.
        path: PathBuf,
        /// What was found wrong.
        reason: String,
    },
    /// The caller used the model or cache in a way it does not allow.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The TurboQuant codec refused a spec or a vector (e.g. a norm beyond the f16 range).
    #[error("kv codec: {0}")]
    Codec(#[from] kvlab_turboquant::Error),
    /// A cache file could not be written or read (a missing folder, a full disk).
    #[error("cache file {path}: {source}")]
    CacheIo {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A saved KV cache file is damaged: truncated, a checksum that fails, sizes that lie.
    #[error("corrupt cache file: {0}")]
    CacheCorrupt(String),
    /// A saved KV cache file is sound but not for this conversation: another model, another
    /// policy, another format version.
    #[error("the cache file does not fit: {0}")]
    CacheMismatch(String),
    /// A tensor operation failed inside candle.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A request needs more memory than the budget leaves, with nothing left to free (the
    /// message has the figures).
    #[error("{0}")]
    OutOfMemory(String),
    /// A state the engine's own bookkeeping should never reach (a running conversation gone
    /// from memory): a bug, reported rather than panicked on.
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// The stable code a caller sees for this error.
    pub fn code(&self) -> crate::contract::ErrorCode {
        use crate::contract::ErrorCode as C;
        match self {
            EngineError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                C::ModelNotFound
            }
            EngineError::Io { .. } | EngineError::CacheIo { .. } => C::Io,
            EngineError::UnsupportedArchitecture(_) => C::UnsupportedModel,
            EngineError::ConfigParse { .. }
            | EngineError::ConfigContradiction(_)
            | EngineError::MissingTensor { .. }
            | EngineError::ShapeMismatch { .. }
            | EngineError::CorruptFile { .. } => C::BadModelFile,
            EngineError::InvalidRequest(_) => C::InvalidRequest,
            EngineError::CacheCorrupt(_) => C::CacheCorrupt,
            EngineError::CacheMismatch(_) => C::CacheMismatch,
            EngineError::OutOfMemory(_) => C::OutOfMemory,
            EngineError::Codec(_) | EngineError::Candle(_) | EngineError::Internal(_) => {
                C::Internal
            }
        }
    }

    /// Shorthand for [`EngineError::InvalidRequest`].
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidRequest(msg.into())
    }
}
