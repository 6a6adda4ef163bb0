//! Request bodies, read within bounds: a JSON content type, a declared `Content-Length` over
//! the cap refused before a byte is read, room for the body taken from one budget of bytes
//! buffered across all requests as its bytes arrive (a request whose next bytes find the
//! budget spent is refused with `busy`), a cap on what is read, a timeout on silence between
//! the body's frames, and a minimum rate ([`MIN_BODY_RATE`] after [`BODY_GRACE`]), so a
//! client that declares a large body and trickles it holds neither the budget nor its
//! connection for long. The bytes are parsed and dropped before the request goes on.

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

/// The slowest a body may arrive, on average, once [`BODY_GRACE`] has passed (a 8 MiB body
/// then has 36 s; a client on loopback sends it in milliseconds).
pub const MIN_BODY_RATE: usize = 256 << 10;

/// Time a body gets before [`MIN_BODY_RATE`] applies.
pub const BODY_GRACE: Duration = Duration::from_secs(4);

/// Room reserved for a body before its first bytes arrive.
const FIRST_RESERVE: usize = 64 << 10;

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
        let bytes = read_capped(
            request.into_body(),
            declared.map_or(cap, |n| n as usize),
            declared.is_some(),
            &state.bodies,
            state.config.body_timeout,
        )
        .await?;
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("the body is not a valid request: {e}")))?;
        Ok(Self(value))
    }
}

/// The room a body holds in the budget, grown as its bytes arrive and given back on drop.
struct Reservation<'a> {
    budget: &'a BodyBudget,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    bytes: usize,
    /// The body's cap: a reservation never grows past it.
    cap: usize,
}

impl Reservation<'_> {
    /// Holds room for `bytes` in all, or refuses with `busy` when the budget is spent.
    fn grow_to(&mut self, bytes: usize) -> Result<(), ApiError> {
        if bytes <= self.bytes {
            return Ok(());
        }
        // Doubling, so a large body takes a few reservations, not one per frame; never past
        // what the body may be.
        let want = bytes
            .max(self.bytes.saturating_mul(2).min(self.cap))
            .div_ceil(UNIT)
            * UNIT;
        let more = (want - self.bytes).div_ceil(UNIT) as u32;
        let permit = Arc::clone(&self.budget.units)
            .try_acquire_many_owned(more)
            .map_err(|_| busy(self.budget))?;
        match &mut self.permit {
            Some(p) => p.merge(permit),
            None => self.permit = Some(permit),
        }
        self.bytes = want;
        Ok(())
    }
}

fn busy(budget: &BodyBudget) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Busy.as_str(),
        format!(
            "the server is reading {} MiB of request bodies at once already; try again in a moment",
            budget.total.div_ceil(1 << 20)
        ),
    )
}

fn timed_out(why: String) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        HttpCode::RequestTimeout.as_str(),
        why,
    )
}

/// The body's bytes, at most `cap` of them, each frame within `silence` of the last and all
/// of them at [`MIN_BODY_RATE`] on average once [`BODY_GRACE`] has passed; room for them is
/// taken from `budget` as they arrive. A declared length is the buffer's capacity from the
/// start, so the buffer is never copied while it grows: its pages are touched, and counted,
/// only as bytes arrive.
async fn read_capped(
    body: axum::body::Body,
    cap: usize,
    declared: bool,
    budget: &BodyBudget,
    silence: Duration,
) -> Result<Vec<u8>, ApiError> {
    let mut body = body;
    let mut room = Reservation {
        budget,
        permit: None,
        bytes: 0,
        cap,
    };
    room.grow_to(FIRST_RESERVE.min(cap).max(1))?;
    let started = tokio::time::Instant::now();
    let mut out = Vec::with_capacity(if declared {
        cap
    } else {
        cap.min(FIRST_RESERVE)
    });
    loop {
        // Waits no longer than the silence allowed, nor past the time the bytes so far
        // allow at the minimum rate.
        let by_rate =
            started + BODY_GRACE + Duration::from_secs_f64(out.len() as f64 / MIN_BODY_RATE as f64);
        let deadline =
            (tokio::time::Instant::now() + silence).min(by_rate.max(started + BODY_GRACE));
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) if tokio::time::Instant::now() >= by_rate => {
                return Err(timed_out(format!(
                    "the body arrives too slowly: {} bytes in {:.1} s (at least {} KiB/s)",
                    out.len(),
                    started.elapsed().as_secs_f64(),
                    MIN_BODY_RATE >> 10
                )))
            }
            Err(_) => {
                return Err(timed_out(format!(
                    "the body stopped arriving: nothing for {} s",
                    silence.as_secs_f64()
                )))
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
            room.grow_to(out.len() + data.len())?;
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
