//! Errors as OpenAI's clients expect them: `{"error": {"message", "type", "code"}}` with an
//! HTTP status, where `code` is the engine's own stable code (`invalid_request`,
//! `context_overflow`, `queue_full`, …) so a client can switch on it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvlab_engine::events::ErrorCode;
use kvlab_engine::worker::JobError;

/// Seconds a client is told to wait before retrying a full queue.
pub const RETRY_AFTER_S: u64 = 1;

/// A refused or failed request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: [{code}] {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code (an engine [`ErrorCode`]'s string, or one of the server's own:
    /// `unauthorized`, `forbidden_host`).
    pub code: String,
    /// For a person.
    pub message: String,
}

impl ApiError {
    /// An error with this status and code.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.to_string(),
            message: message.into(),
        }
    }

    /// A malformed request (400 `invalid_request`).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest.as_str(),
            message,
        )
    }

    /// OpenAI's error `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": { "message": self.message, "type": self.kind(), "param": null, "code": self.code }
        })
    }
}

/// The HTTP status an engine error answers with.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidRequest | ErrorCode::ContextOverflow | ErrorCode::BadChatTemplate => {
            StatusCode::BAD_REQUEST
        }
        ErrorCode::ModelNotFound => StatusCode::NOT_FOUND,
        ErrorCode::QueueFull => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::Busy | ErrorCode::NoModel => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::OutOfMemory => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        Self::new(status_of(e.code), e.code.as_str(), e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_codes_keep_their_names_and_get_openai_statuses() {
        let e = ApiError::from(JobError::queue_full());
        assert_eq!(
            (e.status, e.code.as_str()),
            (StatusCode::TOO_MANY_REQUESTS, "queue_full")
        );
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let overflow = ApiError::from(JobError::new(ErrorCode::ContextOverflow, "too long"));
        assert_eq!(overflow.status, StatusCode::BAD_REQUEST);
        assert_eq!(overflow.body()["error"]["code"], "context_overflow");
        assert_eq!(overflow.body()["error"]["message"], "too long");
    }
}
