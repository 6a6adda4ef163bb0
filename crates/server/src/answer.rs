//! One request's answer as the server reads it from the engine: the engine streams the
//! request's events into a channel; this side turns them into pieces of content and
//! thinking, applies the stop strings, and ends with the finish reason and the figures.
//! Dropping an [`Answer`] (the client went away) cancels its request, queued or running.

use kvlab_engine::events::{DoneReason, Event, GenStats};
use kvlab_engine::worker::CancelToken;
use kvlab_engine::EngineHandle;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::Planned;
use crate::error::ApiError;
use crate::stop::StopMatcher;

/// A piece of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Answer text.
    Content(String),
    /// Thinking-channel text.
    Reasoning(String),
    /// The end: OpenAI's finish reason and the engine's figures.
    End {
        finish_reason: &'static str,
        stats: Option<GenStats>,
    },
}

/// Cancels the request when dropped.
struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A running request.
pub struct Answer {
    events: UnboundedReceiver<Event>,
    stops: StopMatcher,
    stats: Option<GenStats>,
    /// The end, held back while the stop matcher's last text goes out first.
    pending_end: Option<DoneReason>,
    ended: bool,
    cancel: CancelOnDrop,
}

impl Answer {
    /// Queues `planned` on the engine.
    pub fn start(engine: &EngineHandle, planned: &Planned) -> Result<Self, ApiError> {
        let (tx, events) = unbounded_channel();
        let cancel = engine.stream(planned.request.clone(), move |ev| tx.send(ev).is_ok())?;
        Ok(Self {
            events,
            stops: StopMatcher::new(planned.stops.clone()),
            stats: None,
            pending_end: None,
            ended: false,
            cancel: CancelOnDrop(cancel),
        })
    }

    /// The next piece; `None` after the end. An engine error is `Err` (before any piece, a
    /// request that failed; after some, a stream cut short).
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        if self.ended {
            return None;
        }
        if let Some(reason) = self.pending_end.take() {
            self.ended = true;
            return Some(Ok(self.end(reason)));
        }
        loop {
            let Some(event) = self.events.recv().await else {
                self.ended = true;
                return Some(Err(ApiError::from(kvlab_engine::JobError::stopped())));
            };
            match event {
                Event::Token { text } => {
                    let out = self.stops.push(&text);
                    if self.stops.stopped() {
                        // The rest is not wanted: stop the engine, keep reading for its figures.
                        self.cancel.0.cancel();
                    }
                    if !out.is_empty() {
                        return Some(Ok(Piece::Content(out)));
                    }
                }
                Event::Thinking { text } if !self.stops.stopped() => {
                    return Some(Ok(Piece::Reasoning(text)))
                }
                Event::Stats(s) => self.stats = Some(s),
                Event::Done { reason, .. } => {
                    let tail = self.stops.finish();
                    if !tail.is_empty() {
                        // The end comes on the next call.
                        self.pending_end = Some(reason);
                        return Some(Ok(Piece::Content(tail)));
                    }
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
        // A stop string ends the answer (by cancelling it, or as the last token came): that
        // is OpenAI's "stop" whatever the engine's own reason.
        let finish_reason = match reason {
            _ if self.stops.stopped() => "stop",
            DoneReason::Length => "length",
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
    pub finish_reason: &'static str,
    pub stats: Option<GenStats>,
}
