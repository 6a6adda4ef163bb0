//! Request bodies, read within bounds: a JSON content type, a declared `Content-Length` over
//! the cap refused before a byte is read, room for the body taken from one budget of bytes
//! buffered across all requests (refused with `busy` when it is spent), a cap on what is
//! read, and a timeout on silence between the body's frames. The bytes are parsed and
//! dropped before the request goes on.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use http_body_util::BodyExt;
use kvlab_engine::contract::ErrorCode;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::error::{ApiError, HttpCode};
use crate::AppState;

/// Bytes are reserved in units of this many (the semaphore counts in `u32`).
const UNIT: usize = 1024;

/// The bytes all request bodies being read at once may take.
#[derive(Debug)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
    total: usize,
}

impl BodyBudget {
    /// A budget of `bytes` (at least one body of `max_body` bytes fits).
    pub fn new(bytes: usize, max_body: usize) -> Self {
        let units = bytes
            .max(max_body)
            .div_ceil(UNIT)
            .min(u32::MAX as usize / 2);
        Self {
            units: Arc::new(Semaphore::new(units)),
            total: units * UNIT,
        }
    }

    /// Bytes not reserved now.
    pub fn available(&self) -> usize {
        self.units.available_permits() * UNIT
    }
}

/// A JSON body read within the server's bounds (see the module doc).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let headers = request.headers();
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| {
                let t = t.trim().to_ascii_lowercase();
                t == "application/json" || (t.starts_with("application/") && t.ends_with("+json"))
            });
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::InvalidRequest.as_str(),
                "the body must be JSON (Content-Type: application/json)",
            ));
        }
        let cap = state.config.max_body_bytes;
        let declared = match headers.get(header::CONTENT_LENGTH) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| ApiError::invalid("Content-Length is not a number"))?,
            ),
        };
        if let Some(n) = declared.filter(|&n| n > cap as u64) {
            return Err(too_large(Some(n), cap));
        }
        // Room for the whole body before any of it is read (a chunked body: the cap).
        let reserve = declared.map_or(cap, |n| n as usize);
        let units = reserve.div_ceil(UNIT).max(1) as u32;
        let budget = &state.bodies;
        let _permit = Arc::clone(&budget.units)
            .try_acquire_many_owned(units)
            .map_err(|_| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::Busy.as_str(),
                    format!(
                        "the server is reading {} MiB of request bodies at once already; try again in a moment",
                        budget.total.div_ceil(1 << 20)
                    ),
                )
            })?;
        let bytes = read_capped(
            request.into_body(),
            reserve.min(cap),
            declared.is_some(),
            state.config.body_timeout,
        )
        .await?;
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("the body is not a valid request: {e}")))?;
        Ok(Self(value))
    }
}

/// The body's bytes, at most `cap` of them, each frame within `silence` of the last. A
/// declared length is the buffer's size from the start (it was reserved), so the buffer is
/// never copied while it grows: the body takes its own size and no more.
async fn read_capped(
    body: axum::body::Body,
    cap: usize,
    declared: bool,
    silence: Duration,
) -> Result<Vec<u8>, ApiError> {
    let mut body = body;
    let mut out = Vec::with_capacity(if declared { cap } else { cap.min(64 * 1024) });
    loop {
        let frame = match tokio::time::timeout(silence, body.frame()).await {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    HttpCode::RequestTimeout.as_str(),
                    format!(
                        "the body stopped arriving: nothing for {} s",
                        silence.as_secs_f64()
                    ),
                ))
            }
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => {
                return Err(ApiError::invalid(format!(
                    "the body could not be read: {e}"
                )))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > cap {
                return Err(too_large(None, cap));
            }
            out.extend_from_slice(&data);
        }
    }
}

fn too_large(declared: Option<u64>, cap: usize) -> ApiError {
    let size = declared.map_or_else(|| "more".to_string(), |n| format!("{n} bytes"));
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        HttpCode::RequestTooLarge.as_str(),
        format!("the body is {size}; this server reads at most {cap} bytes (--max-body-bytes)"),
    )
}
