//! The one way a request reaches the engine thread: [`EngineHandle::submit`] (events on a
//! channel, read through the [`Ticket`]) or [`EngineHandle::submit_with`] (events to a
//! callback). A chat or comparison prompt is rendered and tokenized here, on the caller's
//! thread, and checked against the model's context before anything is queued; then, and
//! only then, it takes a place in the queue ([`super::places`]: refused the moment it
//! arrives when none is left to its client). A dropped ticket cancels its request and, if it
//! had not started, frees its place at once; every other path frees it by the guard's drop.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::places::{client_of, PlaceGuard};
use super::{lock, CancelToken, EngineHandle, Job, JobError, LoadRequest, Shared};
use crate::constrain::Guide;
use crate::contract::CompareFidelity;
use crate::contract::Event;
use crate::contract::ModelCard;
use crate::generate::compare::CompareRequest;
use crate::generate::{self, GenerateError, GenerateRequest, Prompt};
use crate::tokenizer::GemmaTokenizer;

/// A queued request's state, shared by its ticket and the engine thread.
const WAITING: u8 = 0;
const STARTED: u8 = 1;
const GONE: u8 = 2;

/// A request's place in the queue ([`super::places`]): held until the engine starts the
/// request or its ticket goes, and given back by the guard's drop on any other path (a
/// refusal, a request the engine drops unstarted), so no path can keep it.
#[derive(Clone)]
pub(crate) struct Slot(Arc<SlotState>);

struct SlotState {
    state: AtomicU8,
    place: Mutex<PlaceGuard>,
    shared: Arc<Shared>,
}

impl Drop for SlotState {
    fn drop(&mut self) {
        lock(&self.place).release();
        self.shared.publish_queued();
    }
}

impl Slot {
    /// Takes a place for `client`, or refuses with `queue_full` ([`super::places`]).
    fn take(shared: &Arc<Shared>, client: String) -> Result<Self, JobError> {
        let reserve = lock(&shared.pool).reserve_for_user;
        let place = PlaceGuard::take(&shared.places, client, reserve)?;
        shared.publish_queued();
        Ok(Self(Arc::new(SlotState {
            state: AtomicU8::new(WAITING),
            place: Mutex::new(place),
            shared: Arc::clone(shared),
        })))
    }

    /// The client it was taken for.
    pub(crate) fn client(&self) -> String {
        lock(&self.0.place).client().to_owned()
    }

    /// The engine starts the request: false when its ticket went first.
    pub(crate) fn start(&self) -> bool {
        let started = self
            .0
            .state
            .compare_exchange(WAITING, STARTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if started {
            self.release();
        }
        started
    }

    /// The ticket goes: a request still waiting gives its place back now.
    fn leave(&self) {
        if self
            .0
            .state
            .compare_exchange(WAITING, GONE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.release();
        }
    }

    fn release(&self) {
        lock(&self.0.place).release();
        self.0.shared.publish_queued();
    }
}

/// A request on its way: what to run, where its events go, its cancel flag and its place.
pub(crate) struct Queued<T> {
    pub job: T,
    pub cancel: CancelToken,
    pub slot: Slot,
    /// When it arrived (time to first token counts from here).
    pub arrived: Instant,
}

/// A chat turn, its prompt tokenized by `tokenizer` (with the images in it), its
/// constraint compiled over the same vocabulary.
pub(crate) struct GenerateJob {
    pub request: GenerateRequest,
    pub prompt: Rendered,
    pub tokenizer: Arc<GemmaTokenizer>,
    pub guide: Option<Guide>,
    pub sink: super::EventSink,
}

/// A comparison, its prompt tokenized by `tokenizer`, its constraint compiled over the
/// same vocabulary.
pub(crate) struct CompareJob {
    pub request: CompareRequest,
    pub prompt: Vec<u32>,
    pub tokenizer: Arc<GemmaTokenizer>,
    pub guide: Option<Guide>,
    pub sink: super::CompareSink,
}

/// What can be submitted: its events, how its end shows among them, and the request with
/// its sink.
pub trait Submission: Send + 'static {
    /// The events it streams.
    type Event: Send + 'static;
    /// What its end yields.
    type Output;
    /// Its end, read from its last event: `Some` once it has ended.
    fn end(event: &Self::Event) -> Option<Result<Self::Output, JobError>>;
    /// The request with the sink its events go to.
    #[doc(hidden)]
    fn with_sink(self, sink: Box<dyn FnMut(Self::Event) + Send>) -> Request;
}

/// A request and where its events go (what [`Submission::with_sink`] makes).
#[doc(hidden)]
pub enum Request {
    Generate(GenerateRequest, super::EventSink),
    Compare(CompareRequest, super::CompareSink),
    Load(LoadRequest, super::EventSink),
}

impl Request {
    /// The job, or why it cannot be queued: a chat or comparison prompt is tokenized here
    /// and checked against the context, then given a place in the queue.
    fn into_job(self, engine: &EngineHandle, cancel: CancelToken) -> Result<Job, JobError> {
        let arrived = Instant::now();
        Ok(match self {
            Request::Generate(request, sink) => {
                request.check()?;
                // The place last: only a request ready to run takes one.
                let (prompt, tokenizer) = tokenized(engine, &request.prompt, request.context)?;
                // Compiled here, off the engine thread: a slow or refused grammar never holds
                // up the other requests' steps.
                let guide = guide_for(request.constraint.as_ref(), &request.prompt, &tokenizer)?;
                let slot = Slot::take(&engine.shared, client_of(&request.conversation))?;
                Job::Generate(Queued {
                    job: GenerateJob {
                        request,
                        prompt,
                        tokenizer,
                        guide,
                        sink,
                    },
                    cancel,
                    slot,
                    arrived,
                })
            }
            Request::Compare(request, sink) => {
                let ((prompt, images, _), tokenizer) = tokenized(engine, &request.prompt, None)?;
                if !images.is_empty() {
                    return Err(JobError::new(
                        crate::contract::ErrorCode::BadImage,
                        "the comparison does not take images yet: compare a turn without them",
                    ));
                }
                let guide = guide_for(request.constraint.as_ref(), &request.prompt, &tokenizer)?;
                let slot = Slot::take(&engine.shared, String::new())?;
                Job::Compare(Queued {
                    job: CompareJob {
                        request,
                        prompt,
                        tokenizer,
                        guide,
                        sink,
                    },
                    cancel,
                    slot,
                    arrived,
                })
            }
            Request::Load(request, sink) => Job::Load {
                policy: request.cache.policy()?,
                request,
                sink,
                cancel,
            },
        })
    }
}

/// The loaded tokenizer and the prompt rendered for it with its images in their places,
/// checked against the context (the model's, or `context` when less).
fn tokenized(
    engine: &EngineHandle,
    prompt: &Prompt,
    context: Option<usize>,
) -> Result<(Rendered, Arc<GemmaTokenizer>), JobError> {
    let tokenizer = engine.tokenizer().ok_or_else(JobError::no_model)?;
    let config = engine.loaded_config()?;
    let max = context.map_or(config.max_position_embeddings, |c| {
        c.min(config.max_position_embeddings)
    });
    let facts = *lock(&engine.shared.vision);
    let rendered = generate::render_with_images(
        &tokenizer,
        prompt,
        max,
        facts.as_ref().map(|f| (f, &engine.shared.images)),
    )?;
    Ok((rendered, tokenizer))
}

pub(crate) use crate::generate::Rendered;

/// A request's `constraint` on an answer to `prompt`, compiled over `tokenizer`'s
/// vocabulary (`None`: unconstrained).
pub(crate) fn guide_for(
    constraint: Option<&crate::constrain::Constraint>,
    prompt: &Prompt,
    tokenizer: &GemmaTokenizer,
) -> Result<Option<Guide>, JobError> {
    let Some(c) = constraint else {
        return Ok(None);
    };
    Ok(Some(
        Guide::compile(c, prompt.tools(), prompt.thinking(), tokenizer)
            .map_err(GenerateError::from)?,
    ))
}

impl Submission for GenerateRequest {
    type Event = Event;
    /// The generated ids.
    type Output = Vec<u32>;

    fn end(event: &Event) -> Option<Result<Vec<u32>, JobError>> {
        match event {
            Event::Done { token_ids, .. } => Some(Ok(token_ids.clone())),
            Event::Error { code, message } => Some(Err(JobError::new(*code, message))),
            _ => None,
        }
    }

    fn with_sink(self, sink: Box<dyn FnMut(Event) + Send>) -> Request {
        Request::Generate(self, sink)
    }
}

impl Submission for CompareRequest {
    type Event = Event;
    /// The tested cache's fidelity (absent when cancelled or nothing was generated).
    type Output = Option<CompareFidelity>;

    fn end(event: &Event) -> Option<Result<Option<CompareFidelity>, JobError>> {
        match event {
            Event::Finished { fidelity } => Some(Ok(fidelity.clone())),
            Event::Error { code, message } => Some(Err(JobError::new(*code, message))),
            _ => None,
        }
    }

    fn with_sink(self, sink: Box<dyn FnMut(Event) + Send>) -> Request {
        Request::Compare(self, sink)
    }
}

impl Submission for LoadRequest {
    type Event = Event;
    /// The loaded model's card.
    type Output = ModelCard;

    fn end(event: &Event) -> Option<Result<ModelCard, JobError>> {
        match event {
            Event::Loaded { card } => Some(Ok(card.clone())),
            Event::Error { code, message } => Some(Err(JobError::new(*code, message))),
            _ => None,
        }
    }

    fn with_sink(self, sink: Box<dyn FnMut(Event) + Send>) -> Request {
        Request::Load(self, sink)
    }
}

/// A submitted request: its events (when submitted with [`EngineHandle::submit`]) and its
/// cancel flag. Dropping it cancels the request (its client is gone).
pub struct Ticket<R: Submission> {
    events: Option<Receiver<R::Event>>,
    cancel: CancelToken,
    slot: Option<Slot>,
}

impl<R: Submission> Ticket<R> {
    /// The request's events, in order, until its end.
    pub fn events(&self) -> impl Iterator<Item = R::Event> + '_ {
        self.events.iter().flat_map(|rx| rx.iter())
    }

    /// The next event, waiting for it (`None` once the engine dropped the request).
    pub fn recv(&self) -> Option<R::Event> {
        self.events.as_ref()?.recv().ok()
    }

    /// The next event, waiting at most `timeout`.
    pub fn recv_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> Result<R::Event, mpsc::RecvTimeoutError> {
        match &self.events {
            Some(rx) => rx.recv_timeout(timeout),
            None => Err(mpsc::RecvTimeoutError::Disconnected),
        }
    }

    /// The next event if one is there now.
    pub fn try_recv(&self) -> Result<R::Event, mpsc::TryRecvError> {
        match &self.events {
            Some(rx) => rx.try_recv(),
            None => Err(mpsc::TryRecvError::Disconnected),
        }
    }

    /// Waits for the end, showing `on_event` every event first (returning false cancels the
    /// request, which then ends as cancelled).
    pub fn wait(self, mut on_event: impl FnMut(&R::Event) -> bool) -> Result<R::Output, JobError> {
        while let Some(ev) = self.recv() {
            if !on_event(&ev) {
                self.cancel.cancel();
            }
            if let Some(end) = R::end(&ev) {
                return end;
            }
        }
        Err(JobError::stopped())
    }

    /// Its cancel flag (a stop button's).
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Asks the request to stop before its next step.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }
}

impl<R: Submission> Drop for Ticket<R> {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(slot) = &self.slot {
            slot.leave();
        }
    }
}

impl EngineHandle {
    /// Submits `request`: its events arrive in order on the returned ticket, until its end
    /// (`done`, `finished`, `loaded` or `error`). Refused at once when the prompt does not
    /// fit the context or [`super::MAX_QUEUED`] requests already wait.
    pub fn submit<R: Submission>(&self, request: R) -> Result<Ticket<R>, JobError> {
        let (tx, rx) = mpsc::channel();
        let mut ticket = self.submit_with(request, move |ev| tx.send(ev).is_ok())?;
        ticket.events = Some(rx);
        Ok(ticket)
    }

    /// Submits `request` with its events going to `on_event` (on the engine thread: forward
    /// them, don't work); `on_event` returning false (its client is gone) cancels it.
    pub fn submit_with<R: Submission>(
        &self,
        request: R,
        mut on_event: impl FnMut(R::Event) -> bool + Send + 'static,
    ) -> Result<Ticket<R>, JobError> {
        let cancel = CancelToken::new();
        let own = cancel.clone();
        let sink = Box::new(move |ev| {
            if !on_event(ev) {
                own.cancel();
            }
        });
        let job = request.with_sink(sink).into_job(self, cancel.clone())?;
        let slot = match &job {
            Job::Generate(q) => Some(q.slot.clone()),
            Job::Compare(q) => Some(q.slot.clone()),
            _ => None,
        };
        if let Err(e) = self.send(job) {
            if let Some(slot) = &slot {
                slot.leave();
            }
            return Err(e);
        }
        Ok(Ticket {
            events: None,
            cancel,
            slot,
        })
    }
}
