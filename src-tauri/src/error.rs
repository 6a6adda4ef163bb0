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
}
