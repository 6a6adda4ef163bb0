//! Errors as the UI sees them: a stable machine-readable code and a readable message.

use serde::Serialize;

/// An error returned by a command. Serialized as `{ "code": "...", "message": "..." }`.
#[derive(Debug, Clone, Serialize, thiserror::Error, PartialEq, Eq)]
#[error("{code}: {message}")]
pub struct CommandError {
    pub code: &'static str,
    pub message: String,
}

impl CommandError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<kvlab_engine::EngineError> for CommandError {
    fn from(e: kvlab_engine::EngineError) -> Self {
        use kvlab_engine::EngineError as E;
        let code = match &e {
            E::Io { .. } => "io",
            E::UnsupportedArchitecture(_) => "unsupported_model",
            E::ConfigParse { .. } | E::ConfigContradiction(_) => "bad_model",
            E::MissingTensor { .. } | E::ShapeMismatch { .. } | E::CorruptFile { .. } => {
                "bad_model"
            }
            _ => "engine",
        };
        Self::new(code, e.to_string())
    }
}

impl From<kvlab_engine::chat::ChatError> for CommandError {
    fn from(e: kvlab_engine::chat::ChatError) -> Self {
        Self::new("bad_conversation", e.to_string())
    }
}

impl From<kvlab_engine::tokenizer::TokenizerError> for CommandError {
    fn from(e: kvlab_engine::tokenizer::TokenizerError) -> Self {
        Self::new("tokenizer", e.to_string())
    }
}

impl From<kvlab_engine::sampling::SamplingError> for CommandError {
    fn from(e: kvlab_engine::sampling::SamplingError) -> Self {
        Self::new("bad_sampling", e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_code_and_message() {
        let e = CommandError::new("engine_busy", "a generation is running");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"code": "engine_busy", "message": "a generation is running"})
        );
    }

    #[test]
    fn engine_errors_get_stable_codes() {
        let e: CommandError =
            kvlab_engine::EngineError::UnsupportedArchitecture("llama".into()).into();
        assert_eq!(e.code, "unsupported_model");
        assert!(e.message.contains("llama"), "{}", e.message);
    }
}
