//! The endpoints: each reads its request, checks it, queues it on the engine and answers in
//! OpenAI's shapes (whole, or as server-sent events ending in `[DONE]`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, StreamExt};
use kvlab_engine::contract::ErrorCode;
use kvlab_engine::JobError;
use serde_json::{json, Value};

use crate::answer::{Answer, Collected, Piece};
use crate::api::{Planned, RequestBody, Usage};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::AppState;

type Shared = State<Arc<AppState>>;

/// The loaded model's name, if the request names it (or names none).
fn served_model(state: &AppState, requested: Option<&str>) -> Result<String, ApiError> {
    let card = state
        .engine
        .status()
        .model
        .ok_or_else(|| ApiError::from(JobError::no_model()))?;
    match requested {
        None | Some("") => Ok(card.name),
        Some(m) if m == card.name => Ok(card.name),
        Some(m) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::ModelNotFound.as_str(),
            format!(
                "model {m:?} is not loaded; this server serves {:?} (see GET /v1/models)",
                card.name
            ),
        )),
    }
}

/// `GET /v1/models`: the loaded model, with its cache and context.
pub async fn models(State(state): Shared) -> Json<Value> {
    let status = state.engine.status();
    let data: Vec<Value> = status
        .model
        .iter()
        .map(|card| {
            json!({
                "id": card.name, "object": "model", "created": 0, "owned_by": "kvlab",
                "max_context": card.max_context, "kv_cache": status.policy.spec_string(),
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `GET /v1/kv`: the memory timeline (exact KV bytes by layer kind and precision, weights,
/// resident memory), newest last, and a sample taken now (not kept: a read changes
/// nothing); the conversations (ids, tiers, tokens, bytes; no text) and what the pool did.
pub async fn kv(State(state): Shared) -> Json<Value> {
    let now = state.sample_now();
    let status = state.engine.status();
    let pool = state.engine.pool_counters();
    let samples: Vec<_> = state
        .timeline
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    Json(json!({
        "now": now, "queued": status.queued, "busy": status.busy, "running": status.running,
        "kv_cache": status.policy.spec_string(), "samples": samples,
        "conversations": status.conversations, "pool": pool,
    }))
}

/// `GET /metrics`.
pub async fn metrics(State(state): Shared) -> Response {
    let text = crate::metrics::render(
        &state.counters,
        &state.engine.status(),
        &state.engine.pool_counters(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The conversation a request names in its `X-Conversation` header.
fn conversation_header(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("x-conversation") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.to_owned()))
            .map_err(|_| ApiError::invalid("X-Conversation is not text")),
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): Shared,
    headers: HeaderMap,
    body: Result<JsonBody<RequestBody>, ApiError>,
) -> Response {
    state.counters.chat_requests.fetch_add(1, Ordering::Relaxed);
    let answered = async {
        let JsonBody(mut req) = body?;
        let model = served_model(&state, req.model.as_deref())?;
        let named = conversation_header(&headers)?;
        let prompt = req.chat_prompt()?;
        let planned = req.plan(prompt, named.as_deref(), state.config.limits)?;
        drop(req);
        respond(&state, Endpoint::Chat, model, planned).await
    }
    .await;
    answered.unwrap_or_else(|e| failed(&state, e))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): Shared,
    headers: HeaderMap,
    body: Result<JsonBody<RequestBody>, ApiError>,
) -> Response {
    state
        .counters
        .completion_requests
        .fetch_add(1, Ordering::Relaxed);
    let answered = async {
        let JsonBody(mut req) = body?;
        let model = served_model(&state, req.model.as_deref())?;
        let named = conversation_header(&headers)?;
        let prompt = req.text_prompt()?;
        let planned = req.plan(prompt, named.as_deref(), state.config.limits)?;
        drop(req);
        respond(&state, Endpoint::Completions, model, planned).await
    }
    .await;
    answered.unwrap_or_else(|e| failed(&state, e))
}

/// What a request in flight gets when the server stops.
fn stopping() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::EngineStopped.as_str(),
        "the server is stopping",
    )
}

fn failed(state: &AppState, e: ApiError) -> Response {
    state
        .counters
        .failed_requests
        .fetch_add(1, Ordering::Relaxed);
    e.into_response()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Completions,
}

/// What every chunk and answer of one request repeats.
struct Head {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Head {
    fn new(endpoint: Endpoint, model: String) -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-kvlab-{n}"),
            created: kvlab_engine::memory::unix_ms() / 1000,
            model,
        }
    }

    /// A whole answer.
    fn answer(&self, a: &Collected) -> Value {
        let usage = a.stats.as_ref().map(Usage::from);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({ "role": "assistant", "content": a.content });
                if !a.reasoning.is_empty() {
                    message["reasoning_content"] = json!(a.reasoning);
                }
                json!({ "index": 0, "message": message, "finish_reason": a.finish_reason, "logprobs": null })
            }
            Endpoint::Completions => {
                json!({ "index": 0, "text": a.content, "finish_reason": a.finish_reason, "logprobs": null })
            }
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created,
            "model": self.model, "choices": [choice], "usage": usage,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    /// One streamed chunk: a delta (`content`, `reasoning_content` or `role`), or the end.
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> SseEvent {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                json!({ "index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null })
            }
            Endpoint::Completions => json!({
                "index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")),
                "finish_reason": finish_reason, "logprobs": null,
            }),
        };
        self.event(json!({ "choices": [choice] }))
    }

    fn event(&self, mut body: Value) -> SseEvent {
        body["id"] = json!(self.id);
        body["object"] = json!(self.object(true));
        body["created"] = json!(self.created);
        body["model"] = json!(self.model);
        SseEvent::default().data(body.to_string())
    }

    /// The SSE events of one piece.
    fn piece_events(&self, piece: Result<Piece, ApiError>, include_usage: bool) -> Vec<SseEvent> {
        match piece {
            Ok(Piece::Content(t)) => vec![self.chunk(json!({ "content": t }), None)],
            Ok(Piece::Reasoning(t)) if self.endpoint == Endpoint::Chat => {
                vec![self.chunk(json!({ "reasoning_content": t }), None)]
            }
            Ok(Piece::Reasoning(_)) => Vec::new(),
            Ok(Piece::End {
                finish_reason,
                stats,
            }) => {
                let mut out = vec![self.chunk(json!({}), Some(finish_reason))];
                if include_usage {
                    let usage = stats.as_ref().map(Usage::from);
                    out.push(self.event(json!({ "choices": [], "usage": usage })));
                }
                out.push(SseEvent::default().data("[DONE]"));
                out
            }
            Err(e) => vec![
                SseEvent::default().data(e.body().to_string()),
                SseEvent::default().data("[DONE]"),
            ],
        }
    }
}

/// Runs `planned` and answers whole or streamed.
async fn respond(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    model: String,
    planned: Planned,
) -> Result<Response, ApiError> {
    let head = Head::new(endpoint, model);
    // The prompt is tokenized as it is submitted: off the async workers.
    let engine = state.engine.clone();
    let submitted = planned.clone();
    let mut answer = tokio::task::spawn_blocking(move || Answer::start(&engine, &submitted))
        .await
        .map_err(|e| ApiError::from(JobError::new(ErrorCode::Internal, e.to_string())))??;
    if !planned.stream {
        let collected = tokio::select! {
            collected = answer.collect() => collected?,
            () = state.closing() => return Err(stopping()),
        };
        if let Some(s) = &collected.stats {
            state.counters.tokens(s.prompt_tokens, s.generated_tokens);
        }
        return Ok(Json(head.answer(&collected)).into_response());
    }
    // The first piece decides the status: a request that fails before its first token (a
    // prompt too long, a cache that does not fit) is an HTTP error, not a broken stream.
    let first = tokio::select! {
        first = answer.next() => match first {
            Some(Err(e)) => return Err(e),
            Some(Ok(piece)) => piece,
            None => return Err(ApiError::from(JobError::stopped())),
        },
        () = state.closing() => return Err(stopping()),
    };
    let include_usage = planned.include_usage;
    let opening = match endpoint {
        Endpoint::Chat => vec![head.chunk(json!({ "role": "assistant", "content": "" }), None)],
        Endpoint::Completions => Vec::new(),
    };
    let counters = Arc::clone(state);
    let rest = stream::unfold(Some((answer, Some(first))), move |st| {
        let counters = Arc::clone(&counters);
        async move {
            let (mut answer, first) = st?;
            let piece = match first {
                Some(p) => Some(Ok(p)),
                // The server stopping ends the stream at once: a last chunk says so, and the
                // answer (so the engine's request) is dropped.
                None => tokio::select! {
                    piece = answer.next() => piece,
                    () = counters.closing() => Some(Ok(Piece::End {
                        finish_reason: "cancelled",
                        stats: None,
                    })),
                },
            };
            let piece = piece?;
            if let Ok(Piece::End { stats: Some(s), .. }) = &piece {
                counters
                    .counters
                    .tokens(s.prompt_tokens, s.generated_tokens);
            }
            let last = !matches!(piece, Ok(Piece::Content(_)) | Ok(Piece::Reasoning(_)));
            Some((piece, (!last).then_some((answer, None))))
        }
    });
    // Each piece becomes its SSE events; the answer (and with it the engine request) is
    // dropped, so cancelled, when the client goes away.
    let events = stream::iter(opening)
        .chain(rest.flat_map(move |piece| stream::iter(head.piece_events(piece, include_usage))))
        .map(Ok::<_, Infallible>);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
