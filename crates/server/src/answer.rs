//! One request's answer as the server reads it from the engine: the engine streams the
//! request's events into a channel (its stop strings already applied there); this side turns
//! them into pieces of content, thinking and tool calls, and ends with the finish reason
//! and the figures. Dropping an [`Answer`] (the client went away) drops its ticket, which cancels the
//! request, queued or running, and frees its place at once.

use kvlab_engine::contract::{DoneReason, Event, GenStats};
use kvlab_engine::EngineHandle;
use kvlab_engine::GenerateRequest;
use kvlab_engine::Ticket;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::Planned;
use crate::error::ApiError;

/// A piece of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Answer text.
    Content(String),
    /// Thinking-channel text.
    Reasoning(String),
    /// A whole tool call.
    ToolCall(Call),
    /// The end: OpenAI's finish reason and the engine's figures.
    End {
        finish_reason: &'static str,
        stats: Option<GenStats>,
    },
}

/// A tool call as OpenAI sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub index: usize,
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

impl Call {
    /// OpenAI's `tool_calls[]` entry.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id, "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// A running request.
pub struct Answer {
    events: UnboundedReceiver<Event>,
    stats: Option<GenStats>,
    ended: bool,
    /// Whether the model called a tool (the finish reason is then `tool_calls`).
    called: bool,
    /// Dropped with the answer: that cancels the request.
    _ticket: Ticket<GenerateRequest>,
}

impl Answer {
    /// Submits `planned` to the engine: its prompt is tokenized and checked here, on the
    /// calling thread (call from a blocking task), and it is refused at once when the queue
    /// is full.
    pub fn start(engine: &EngineHandle, planned: &Planned) -> Result<Self, ApiError> {
        let (tx, events) = unbounded_channel();
        let mut request = planned.request.clone();
        // Each image is decoded and cut here (bounded by the limits), then named by its id.
        for (i, bytes) in &planned.images {
            let info = engine.add_image(bytes, planned.image_limits)?;
            if let kvlab_engine::contract::Prompt::Conversation { messages, .. } =
                &mut request.prompt
            {
                if let Some(m) = messages.get_mut(*i) {
                    m.images.push(info.id);
                }
            }
        }
        let ticket = engine.submit_with(request, move |ev| tx.send(ev).is_ok())?;
        Ok(Self {
            events,
            stats: None,
            ended: false,
            called: false,
            _ticket: ticket,
        })
    }

    /// The next piece; `None` after the end. An engine error is `Err` (before any piece, a
    /// request that failed; after some, a stream cut short).
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        if self.ended {
            return None;
        }
        loop {
            let Some(event) = self.events.recv().await else {
                self.ended = true;
                return Some(Err(ApiError::from(kvlab_engine::JobError::stopped())));
            };
            match event {
                Event::Token { text } if !text.is_empty() => return Some(Ok(Piece::Content(text))),
                Event::Thinking { text } => return Some(Ok(Piece::Reasoning(text))),
                Event::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    self.called = true;
                    return Some(Ok(Piece::ToolCall(Call {
                        index,
                        id,
                        name,
                        arguments,
                    })));
                }
                Event::Stats(s) => self.stats = Some(s),
                Event::Done { reason, .. } => {
                    self.ended = true;
                    return Some(Ok(self.end(reason)));
                }
                Event::Error { code, message } => {
                    self.ended = true;
                    return Some(Err(ApiError::from(kvlab_engine::JobError::new(
                        code, message,
                    ))));
                }
                _ => {}
            }
        }
    }

    fn end(&mut self, reason: DoneReason) -> Piece {
        // The engine ends on a stop string as on a stop token: OpenAI's "stop".
        let finish_reason = match reason {
            DoneReason::Length => "length",
            DoneReason::Stop if self.called => "tool_calls",
            DoneReason::Stop | DoneReason::Cancelled => "stop",
        };
        Piece::End {
            finish_reason,
            stats: self.stats.take(),
        }
    }

    /// Reads the whole answer: content, thinking, finish reason and figures.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut out = Collected::default();
        while let Some(piece) = self.next().await {
            match piece? {
                Piece::Content(t) => out.content.push_str(&t),
                Piece::Reasoning(t) => out.reasoning.push_str(&t),
                Piece::ToolCall(c) => out.tool_calls.push(c),
                Piece::End {
                    finish_reason,
                    stats,
                } => {
                    out.finish_reason = finish_reason;
                    out.stats = stats;
                }
            }
        }
        Ok(out)
    }
}

/// A whole answer.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<Call>,
    pub finish_reason: &'static str,
    pub stats: Option<GenStats>,
}
