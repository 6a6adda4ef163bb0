//! Errors as OpenAI's clients expect them: `{"error": {"message", "type", "code"}}` with an
//! HTTP status, where `code` is the engine's own stable code (`invalid_request`,
//! `context_overflow`, `queue_full`, …) so a client can switch on it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvlab_engine::contract::ErrorCode;
use kvlab_engine::JobError;

/// The longest error message sent: what a client sent is never echoed at length.
pub const MAX_MESSAGE_BYTES: usize = 512;

/// Seconds a client is told to wait before retrying a full queue.
pub const RETRY_AFTER_S: u64 = 1;

/// The server's own codes, for what only HTTP can get wrong; every other code is an engine
/// [`ErrorCode`]'s. (`scripts/hostile.sh` reads this list for its vocabulary.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpCode {
    Unauthorized,
    ForbiddenHost,
    RequestTooLarge,
    RequestTimeout,
    TooManyConnections,
}

impl HttpCode {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpCode::Unauthorized => "unauthorized",
            HttpCode::ForbiddenHost => "forbidden_host",
            HttpCode::RequestTooLarge => "request_too_large",
            HttpCode::RequestTimeout => "request_timeout",
            HttpCode::TooManyConnections => "too_many_connections",
        }
    }
}

/// A refused or failed request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: [{code}] {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code: an engine [`ErrorCode`]'s string, or an [`HttpCode`]'s.
    pub code: String,
    /// For a person.
    pub message: String,
}

impl ApiError {
    /// An error with this status and code; a message over [`MAX_MESSAGE_BYTES`] (one that
    /// quotes what the client sent) is cut there.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE_BYTES {
            let mut end = MAX_MESSAGE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        Self {
            status,
            code: code.to_string(),
            message,
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
        ErrorCode::InvalidRequest
        | ErrorCode::ContextOverflow
        | ErrorCode::BadChatTemplate
        | ErrorCode::BadImage => StatusCode::BAD_REQUEST,
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
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
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

    #[test]
    fn a_message_quoting_the_client_is_cut_short() {
        let e = ApiError::invalid(format!("bad value {:?}", "é".repeat(1 << 20)));
        assert!(e.message.len() <= MAX_MESSAGE_BYTES + '…'.len_utf8());
        assert!(
            e.message.starts_with("bad value \"é"),
            "{}",
            &e.message[..20]
        );
    }
}
