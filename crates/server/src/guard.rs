//! What every request must pass before it reaches the engine: a `Host` header naming this
//! machine's loopback or a host the user configured (a web page in a browser can make the
//! browser send requests to 127.0.0.1, but with its own host name in `Host`: DNS rebinding),
//! and, when a key is set, `Authorization: Bearer <key>`.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use crate::error::{ApiError, HttpCode};
use crate::AppState;

/// Host names always accepted (with any port).
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The host name of a `Host` header value, without its port (`[::1]:8080` → `::1`).
pub fn host_name(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    value.rsplit_once(':').map_or(value, |(h, _)| h)
}

/// Whether `host` (a `Host` header value) is loopback or one of `allowed`.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host).to_ascii_lowercase();
    LOOPBACK_NAMES.contains(&name.as_str()) || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
}

/// Compares without stopping at the first difference (the key's length is not secret).
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// Checks `Host` and the key.
pub fn check(headers: &HeaderMap, allowed: &[String], key: Option<&str>) -> Result<(), ApiError> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !host_allowed(host, allowed) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            HttpCode::ForbiddenHost.as_str(),
            format!("Host {host:?} is not this server's: requests must name 127.0.0.1, localhost or a host given with --allow-host"),
        ));
    }
    if let Some(key) = key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_key(given.as_bytes(), key.as_bytes()) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                HttpCode::Unauthorized.as_str(),
                "a valid API key is required: Authorization: Bearer <key>",
            ));
        }
    }
    Ok(())
}

/// The middleware.
pub async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match check(
        request.headers(),
        &state.config.allowed_hosts,
        state.config.api_key.as_deref(),
    ) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(host: &str, auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    #[test]
    fn only_loopback_and_configured_hosts_pass() {
        for ok in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080"] {
            assert!(check(&headers(ok, None), &[], None).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "",
            "[::2]:80",
        ] {
            let e = check(&headers(bad, None), &[], None).unwrap_err();
            assert_eq!(
                (e.status, e.code.as_str()),
                (StatusCode::FORBIDDEN, "forbidden_host"),
                "{bad}"
            );
        }
        assert!(check(&headers("box.lan:8080", None), &["box.lan".into()], None).is_ok());
    }

    #[test]
    fn a_set_key_is_required_exactly() {
        let key = Some("s3cret");
        assert!(check(&headers("localhost", Some("Bearer s3cret")), &[], key).is_ok());
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("s3cret"),
            Some("Bearer s3cretx"),
        ] {
            let e = check(&headers("localhost", bad), &[], key).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
    }
}
