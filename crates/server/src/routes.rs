//! The endpoints: each reads its request, checks it, queues it on the engine and answers in
//! OpenAI's shapes (whole, or as server-sent events ending in `[DONE]`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use futures::stream::{self, StreamExt};
use kvlab_engine::contract::{ConversationId, ConversationInfo, ErrorCode};
use kvlab_engine::JobError;
use serde_json::{json, Value};

use crate::answer::{Answer, Collected, Piece};
use crate::api::{Planned, RequestBody, Usage};
use crate::body::JsonBody;
use crate::client::{Client, Peer};
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

/// How many timeline samples one `GET /v1/kv` returns at most (two minutes of them).
pub const KV_PAGE_SAMPLES: usize = 240;

/// `GET /v1/kv`'s query: samples taken after `since` (ms since the Unix epoch).
#[derive(Debug, Default, serde::Deserialize)]
pub struct KvQuery {
    #[serde(default)]
    since: u64,
}

/// `GET /v1/kv`: the memory timeline (exact KV bytes by layer kind and precision, weights,
/// resident memory), oldest first, [`KV_PAGE_SAMPLES`] at most after `?since=` (`next`
/// is the `since` of the next page), and a sample taken now (not kept: a read changes
/// nothing). Conversations are shown by name to their own client only; of everyone
/// else's, the client sees how many there are and their bytes.
pub async fn kv(
    State(state): Shared,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    Query(query): Query<KvQuery>,
) -> Json<Value> {
    let client = Client::of(peer.map(|Extension(p)| p.0), &headers);
    let mut now = state.sample_now();
    let status = state.engine.status();
    let pool = state.engine.pool_counters();
    let (samples, more): (Vec<_>, bool) = {
        let timeline = state.timeline.lock().unwrap_or_else(|p| p.into_inner());
        let mut after = timeline.iter().filter(|s| s.t_ms > query.since);
        let page: Vec<_> = after.by_ref().take(KV_PAGE_SAMPLES).cloned().collect();
        (page, after.next().is_some())
    };
    let next = samples.last().map_or(query.since, |s| s.t_ms);
    let (own, others) = own_conversations(&client, std::mem::take(&mut now.conversations));
    Json(json!({
        "now": now, "queued": status.queued, "busy": status.busy, "running": status.running,
        "kv_cache": status.policy.spec_string(), "samples": samples, "next": next, "more": more,
        "conversations": own, "others": others, "pool": pool,
    }))
}

/// The conversations of `client`, by their names for it, and a summary of all others.
fn own_conversations(
    client: &Client,
    all: Vec<ConversationInfo>,
) -> (Vec<ConversationInfo>, Value) {
    let (mut count, mut bytes, mut disk_bytes, mut tokens) = (0usize, 0u64, 0u64, 0usize);
    let mut own = Vec::new();
    for mut c in all {
        match client.name_of(c.id.as_str()).map(ConversationId::new) {
            Some(Ok(name)) => {
                c.id = name;
                own.push(c);
            }
            _ => {
                count += 1;
                bytes += c.bytes;
                disk_bytes += c.disk_bytes;
                tokens += c.tokens;
            }
        }
    }
    let others =
        json!({ "count": count, "bytes": bytes, "disk_bytes": disk_bytes, "tokens": tokens });
    (own, others)
}

/// `GET /metrics`.
pub async fn metrics(State(state): Shared) -> Response {
    let text = crate::metrics::render(
        &state.counters,
        &state.engine.status(),
        &state.engine.pool_counters(),
        &state.engine.step_counters(),
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
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Result<JsonBody<RequestBody>, ApiError>,
) -> Response {
    state.counters.chat_requests.fetch_add(1, Ordering::Relaxed);
    let client = Client::of(peer.map(|Extension(p)| p.0), &headers);
    let answered = async {
        let JsonBody(mut req) = body?;
        let model = served_model(&state, req.model.as_deref())?;
        let named = conversation_header(&headers)?;
        let prompt = req.chat_prompt()?;
        let planned = req.plan(prompt, named.as_deref(), &client, state.config.limits)?;
        drop(req);
        respond(&state, Endpoint::Chat, model, planned, client).await
    }
    .await;
    answered.unwrap_or_else(|e| failed(&state, e))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): Shared,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Result<JsonBody<RequestBody>, ApiError>,
) -> Response {
    state
        .counters
        .completion_requests
        .fetch_add(1, Ordering::Relaxed);
    let client = Client::of(peer.map(|Extension(p)| p.0), &headers);
    let answered = async {
        let JsonBody(mut req) = body?;
        let model = served_model(&state, req.model.as_deref())?;
        let named = conversation_header(&headers)?;
        let prompt = req.text_prompt()?;
        let planned = req.plan(prompt, named.as_deref(), &client, state.config.limits)?;
        drop(req);
        respond(&state, Endpoint::Completions, model, planned, client).await
    }
    .await;
    answered.unwrap_or_else(|e| failed(&state, e))
}

/// How long a stream waits for its first piece before it answers with its headers (see
/// [`respond`]).
pub const FIRST_BYTE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

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
    /// Whom it answers (its usage names the conversation by the client's name for it).
    client: Client,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Head {
    fn new(endpoint: Endpoint, model: String, client: Client) -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-kvlab-{n}"),
            created: kvlab_engine::host::unix_ms() / 1000,
            model,
            client,
        }
    }

    /// A whole answer.
    fn answer(&self, a: &Collected) -> Value {
        let usage = a.stats.as_ref().map(|s| Usage::of(s, &self.client));
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({ "role": "assistant", "content": a.content });
                if !a.reasoning.is_empty() {
                    message["reasoning_content"] = json!(a.reasoning);
                }
                if !a.tool_calls.is_empty() {
                    message["tool_calls"] = a.tool_calls.iter().map(|c| c.to_json()).collect();
                    if a.content.is_empty() {
                        message["content"] = Value::Null;
                    }
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
            // As OpenAI streams a call: its id and name first, then its arguments.
            Ok(Piece::ToolCall(c)) if self.endpoint == Endpoint::Chat => vec![
                self.chunk(
                    json!({ "tool_calls": [{ "index": c.index, "id": c.id, "type": "function",
                        "function": { "name": c.name, "arguments": "" } }] }),
                    None,
                ),
                self.chunk(
                    json!({ "tool_calls": [{ "index": c.index,
                        "function": { "arguments": c.arguments } }] }),
                    None,
                ),
            ],
            Ok(Piece::ToolCall(_)) => Vec::new(),
            Ok(Piece::End {
                finish_reason,
                stats,
            }) => {
                let mut out = vec![self.chunk(json!({}), Some(finish_reason))];
                if include_usage {
                    let usage = stats.as_ref().map(|s| Usage::of(s, &self.client));
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
    client: Client,
) -> Result<Response, ApiError> {
    let head = Head::new(endpoint, model, client);
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
    // The first piece decides the status when it comes at once: a request that fails
    // before its first token (a cache that does not fit) is an HTTP error, not a broken
    // stream. One that waits longer (for a place, or a long prefill) gets its headers and
    // a comment now, and keep-alive comments while it waits: its client knows the server
    // heard it, and an error that comes later ends the stream.
    let first = tokio::select! {
        first = tokio::time::timeout(FIRST_BYTE_WAIT, answer.next()) => match first {
            Ok(Some(Err(e))) => return Err(e),
            Ok(Some(Ok(piece))) => Some(piece),
            Ok(None) => return Err(ApiError::from(JobError::stopped())),
            Err(_) => None,
        },
        () = state.closing() => return Err(stopping()),
    };
    let include_usage = planned.include_usage;
    let mut opening = Vec::new();
    if first.is_none() {
        opening.push(SseEvent::default().comment("waiting"));
    }
    if endpoint == Endpoint::Chat {
        opening.push(head.chunk(json!({ "role": "assistant", "content": "" }), None));
    }
    let counters = Arc::clone(state);
    let rest = stream::unfold(Some((answer, first)), move |st| {
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
            let last = !matches!(
                piece,
                Ok(Piece::Content(_)) | Ok(Piece::Reasoning(_)) | Ok(Piece::ToolCall(_))
            );
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
