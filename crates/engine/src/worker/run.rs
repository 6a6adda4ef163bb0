//! The engine thread's loop: takes jobs as they come, starts queued requests while fewer than
//! the pool's `parallel` run (one per conversation), steps the running ones together
//! ([`super::step`]), answers control jobs between steps, and keeps the shared status snapshot
//! current. Starting a request ([`super::start`]), control jobs ([`super::control`]) and
//! loading a model ([`super::load`]) live beside it, one file each.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use super::error::JobError;
use super::load::source_label;
use super::places::{client_of_id, may_start};
use super::{lock, CancelToken, CompareSink, Control, EventSink, Job, Shared, MARKERS_KEPT};
use crate::contract::ModelCard;
use crate::contract::{Activity, DoneReason, ErrorCode, Event};
use crate::contract::{ConversationChoice, ConversationId, MarkerKind};
use crate::conversations::{Host, Need, Pool, PoolSettings, Purpose, SpillDir};
use crate::generate::compare::CompareRun;
use crate::generate::Turn;
use crate::kv::PrecisionPolicy;
use crate::memory::{RssProbe, SwitchEvent};
use crate::models::common::Model;
use crate::tokenizer::GemmaTokenizer;

pub(super) struct Loaded {
    pub(super) model: Model,
    /// The weights' file or folder.
    pub(super) weights: PathBuf,
    pub(super) tokenizer: Arc<GemmaTokenizer>,
    pub(super) card: ModelCard,
    pub(super) config: Arc<crate::checkpoint::config::ModelConfig>,
    /// Its vision tower and what reading images takes, when it reads them.
    pub(super) vision: Option<Vision>,
}

/// A loaded model's vision tower and its image facts.
#[derive(Debug)]
pub(super) struct Vision {
    pub(super) tower: crate::models::vision::VisionTower,
    pub(super) facts: crate::images::ImageFacts,
}

/// A request in progress.
pub(super) enum Task {
    /// A chat turn in a conversation.
    Turn {
        id: ConversationId,
        turn: Box<Turn>,
        sink: EventSink,
        cancel: CancelToken,
    },
    /// A comparison (fresh caches, no conversation), holding `reserved` bytes of the KV
    /// budget while it runs.
    Compare {
        run: Box<CompareRun>,
        sink: CompareSink,
        cancel: CancelToken,
        reserved: u64,
    },
}

impl Task {
    /// Whether its next step is a prefill chunk.
    pub(super) fn prefilling(&self) -> bool {
        match self {
            Task::Turn { turn, .. } => turn.prefilling(),
            Task::Compare { run, .. } => run.prefilling(),
        }
    }

    /// How it ends when the engine failed on it (`why`, a panic's message).
    pub(super) fn failed(&self, why: &str) -> Ended {
        let e = JobError::new(
            ErrorCode::Internal,
            format!("the engine failed on this request ({why}); the model is still loaded"),
        );
        match self {
            Task::Turn { .. } => Ended::Turn(Some(e.to_event())),
            Task::Compare { .. } => Ended::Compare(Event::Error {
                code: e.code,
                message: e.message,
            }),
        }
    }

    /// Sends its last event (after a panic, the sink itself may be what panicked).
    pub(super) fn finish(self, ended: Ended, panicked: bool) {
        match (self, ended) {
            (Task::Turn { mut sink, .. }, Ended::Turn(Some(ev))) => {
                if panicked {
                    let _ = catch_unwind(AssertUnwindSafe(|| sink(ev)));
                } else {
                    sink(ev);
                }
            }
            (Task::Compare { mut sink, .. }, Ended::Compare(ev)) => {
                if panicked {
                    let _ = catch_unwind(AssertUnwindSafe(|| sink(ev)));
                } else {
                    sink(ev);
                }
            }
            _ => {}
        }
    }

    pub(super) fn cancel(&self) -> &CancelToken {
        match self {
            Task::Turn { cancel, .. } | Task::Compare { cancel, .. } => cancel,
        }
    }

    /// The client it runs for ([`super::places`]): comparisons are the local user's.
    pub(super) fn client(&self) -> &str {
        match self {
            Task::Turn { id, .. } => client_of_id(id),
            Task::Compare { .. } => "",
        }
    }
}

pub(super) struct Worker {
    pub(super) rx: Receiver<Job>,
    pub(super) shared: Arc<Shared>,
    pub(super) loaded: Option<Loaded>,
    pub(super) pool: Pool,
    /// The cache new conversations get (and the next load's).
    pub(super) policy: PrecisionPolicy,
    /// Running requests, stepped together; a step's prefill chunk goes to the first
    /// prefilling one from `next` on.
    pub(super) tasks: Vec<Task>,
    pub(super) next: usize,
    /// How long steps take, to size a prefill chunk beside decodes.
    pub(super) pace: super::step::Pace,
    /// Requests waiting to start, in arrival order.
    pub(super) waiting: VecDeque<Job>,
    /// Resident-set readings for switch markers.
    pub(super) probe: RssProbe,
    /// Why the last load failed, while nothing is loaded.
    pub(super) failure: Option<String>,
    /// The pool's revision and the time of the conversation list last published.
    pub(super) published: (u64, Instant),
    /// When idle conversations were last looked at for expiry.
    pub(super) expired_at: Instant,
}

/// How often, at most, the status's conversation list is rebuilt while requests step.
const INFOS_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// How often idle conversations are looked at for expiry, at most.
const EXPIRY_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// How often idle conversations are looked at when they expire after `ttl`: a tenth of it,
/// at most [`EXPIRY_PERIOD`], at least every 10 ms.
fn expiry_period(ttl: std::time::Duration) -> std::time::Duration {
    (ttl / 10).clamp(std::time::Duration::from_millis(10), EXPIRY_PERIOD)
}

/// What a panic said (its `&str` or `String` payload).
pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    text.chars().take(200).collect()
}

/// The `done` of a request that never ran.
pub(super) fn never_ran() -> Event {
    Event::Done {
        reason: DoneReason::Cancelled,
        token_ids: Vec::new(),
    }
}

impl Worker {
    pub(super) fn new(rx: Receiver<Job>, shared: Arc<Shared>) -> Self {
        let policy = lock(&shared.status).policy.clone();
        Self {
            rx,
            shared,
            loaded: None,
            pool: Pool::default(),
            policy,
            tasks: Vec::new(),
            next: 0,
            pace: Default::default(),
            waiting: VecDeque::new(),
            probe: RssProbe::new(),
            failure: None,
            published: (u64::MAX, Instant::now()),
            expired_at: Instant::now(),
        }
    }

    /// The loop, until a shutdown or every handle is gone. A panic in a step ends that
    /// request alone ([`Worker::step_batch`]); one anywhere else ends the requests in flight
    /// with `internal` and the loop goes on, the model still loaded.
    pub(super) fn run(mut self) {
        loop {
            match catch_unwind(AssertUnwindSafe(|| self.iteration())) {
                Ok(true) => {}
                Ok(false) => return self.stop(),
                Err(panic) => self.recover(&panic_message(&*panic)),
            }
        }
    }

    /// Takes the jobs that arrived (waiting for one when idle), starts what can start and
    /// steps one request; false means stop the thread.
    pub(super) fn iteration(&mut self) -> bool {
        if self.tasks.is_empty() && self.waiting.is_empty() {
            // Idle: wait for a job, waking now and then to expire idle conversations.
            let ttl = lock(&self.shared.pool).idle_ttl;
            match self
                .rx
                .recv_timeout(ttl.map_or(EXPIRY_PERIOD, expiry_period))
            {
                Ok(job) => {
                    if !self.take(job) {
                        return false;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    self.expire_idle();
                    return true;
                }
                // Every handle is gone.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
        while let Ok(job) = self.rx.try_recv() {
            if !self.take(job) {
                return false;
            }
        }
        self.start_waiting();
        if !self.tasks.is_empty() {
            self.step_batch();
        }
        self.expire_idle();
        self.publish_step();
        true
    }

    /// After a panic outside a step (a job, a start, a control): every request in flight
    /// ends with `internal`, its conversation's cache emptied (it may be half written);
    /// the model and the other conversations stay.
    pub(super) fn recover(&mut self, why: &str) {
        tracing::error!("the engine thread recovered from a panic: {why}");
        let error = JobError::new(
            ErrorCode::Internal,
            format!("the engine failed on this request ({why}); the model is still loaded"),
        );
        for task in std::mem::take(&mut self.tasks) {
            match task {
                Task::Turn { id, mut sink, .. } => {
                    self.pool.set_busy(&id, false);
                    let _ = self.pool.reset(&id);
                    let ev = error.to_event();
                    let _ = catch_unwind(AssertUnwindSafe(|| sink(ev)));
                }
                Task::Compare { mut sink, .. } => {
                    let ev = Event::Error {
                        code: error.code,
                        message: error.message.clone(),
                    };
                    let _ = catch_unwind(AssertUnwindSafe(|| sink(ev)));
                }
            }
        }
        self.publish();
    }

    /// Takes one job as it arrives; false means stop the thread.
    pub(super) fn take(&mut self, job: Job) -> bool {
        match job {
            Job::Load {
                request,
                policy,
                mut sink,
                cancel,
            } => {
                if !self.tasks.is_empty() || !self.waiting.is_empty() {
                    sink(JobError::busy("load a model").to_event());
                    return true;
                }
                let source = source_label(&request.source);
                self.tell_activity(Activity::Loading { source });
                let result = self.load(request, policy, &mut sink, &cancel);
                self.failure = match (&result, &self.loaded) {
                    (Err(e), None) => Some(e.to_string()),
                    _ => None,
                };
                // Status first, then the final event: a caller reacting to it sees the
                // engine idle and up to date.
                self.publish();
                match result {
                    Ok(card) => sink(Event::Loaded { card }),
                    Err(e) => sink(JobError::from(e).to_event()),
                }
            }
            job @ (Job::Generate(_) | Job::Compare(_)) => {
                // Started at once when it can: jobs that arrive after it (a switch) then
                // apply after its cache was lined up with its prompt, in arrival order.
                self.waiting.push_back(job);
                self.start_waiting();
            }
            Job::Control(Control::Shutdown) => return false,
            Job::Control(control) => {
                self.control(control);
                self.publish();
            }
        }
        true
    }

    /// Ends every request (running or waiting) as cancelled, saying so to each.
    pub(super) fn stop(&mut self) {
        for task in std::mem::take(&mut self.tasks) {
            match task {
                Task::Turn { id, mut sink, .. } => {
                    self.pool.set_busy(&id, false);
                    sink(never_ran());
                }
                Task::Compare { mut sink, .. } => sink(Event::Error {
                    code: ErrorCode::Cancelled,
                    message: "the engine stopped".into(),
                }),
            }
        }
        for job in std::mem::take(&mut self.waiting) {
            match job {
                Job::Generate(mut q) => {
                    q.slot.start();
                    (q.job.sink)(never_ran());
                }
                Job::Compare(mut q) => {
                    q.slot.start();
                    (q.job.sink)(Event::Error {
                        code: ErrorCode::Cancelled,
                        message: "the engine stopped".into(),
                    });
                }
                _ => {}
            }
        }
    }

    /// Starts waiting requests while places are free ([`super::places`]): cancelled ones
    /// are answered and dropped; of the others, the one whose client runs fewest requests
    /// starts first (then the oldest). A request whose conversation is busy waits for it,
    /// and later ones may pass it.
    pub(super) fn start_waiting(&mut self) {
        self.drop_cancelled_waiting();
        let (reserve, parallel) = {
            let p = lock(&self.shared.pool);
            (p.reserve_for_user, p.parallel.clamp(1, super::MAX_PARALLEL))
        };
        loop {
            let namespaced = self.tasks.iter().filter(|t| !t.client().is_empty()).count();
            let mut best: Option<(usize, usize)> = None;
            for (i, job) in self.waiting.iter().enumerate() {
                let (client, busy) = match job {
                    Job::Generate(q) => (
                        q.slot.client(),
                        named(&q.job.request.conversation).is_some_and(|id| self.pool.is_busy(&id)),
                    ),
                    Job::Compare(q) => (q.slot.client(), false),
                    _ => continue,
                };
                if busy || !may_start(&client, self.tasks.len(), namespaced, reserve, parallel) {
                    continue;
                }
                let runs = self.tasks.iter().filter(|t| t.client() == client).count();
                if best.is_none_or(|(r, _)| runs < r) {
                    best = Some((runs, i));
                }
            }
            let Some((_, i)) = best else {
                return;
            };
            match self.waiting.remove(i) {
                Some(Job::Generate(q)) => {
                    if q.slot.start() {
                        self.start_turn(q);
                    }
                }
                Some(Job::Compare(q)) => {
                    if q.slot.start() {
                        self.start_compare(q);
                    }
                }
                Some(other) => self.waiting.push_back(other),
                None => return,
            }
        }
    }

    /// Answers and drops the waiting requests whose clients cancelled them (or left).
    pub(super) fn drop_cancelled_waiting(&mut self) {
        let mut kept = VecDeque::new();
        while let Some(job) = self.waiting.pop_front() {
            match job {
                Job::Generate(q) if q.cancel.is_cancelled() => {
                    if q.slot.start() {
                        let mut sink = q.job.sink;
                        sink(never_ran());
                    }
                }
                Job::Compare(q) if q.cancel.is_cancelled() => {
                    if q.slot.start() {
                        let mut sink = q.job.sink;
                        sink(Event::Error {
                            code: ErrorCode::Cancelled,
                            message: "cancelled before it started".into(),
                        });
                    }
                }
                other => kept.push_back(other),
            }
        }
        self.waiting = kept;
    }

    /// The pool's settings and spill directory now.
    pub(super) fn settings(&self) -> (PoolSettings, Option<SpillDir>) {
        let settings = lock(&self.shared.pool).clone();
        let spill = settings.spill_dir.clone().map(SpillDir::new);
        (settings, spill)
    }

    pub(super) fn rewind_margin(&self) -> usize {
        self.shared.rewind_margin.load(Ordering::Relaxed)
    }

    /// KV bytes all conversations may hold now: the pool's budget, and never more than what
    /// they hold plus what the machine has available beyond the margin; less what running
    /// comparisons hold.
    pub(super) fn kv_limit(&self) -> u64 {
        let budget = *lock(&self.shared.budget);
        let held = self.pool.held_bytes();
        let system = held.saturating_add(budget.available().saturating_sub(budget.margin()));
        system
            .min(self.kv_setting())
            .saturating_sub(self.compares_reserved())
    }

    /// The KV budget as set, or the default one ([`crate::budget::default_kv_budget`]).
    pub(super) fn kv_setting(&self) -> u64 {
        let set = lock(&self.shared.pool).kv_budget;
        set.unwrap_or_else(|| crate::budget::default_kv_budget(&lock(&self.shared.budget)))
    }

    /// Spills (or drops) the conversations idle for longer than the pool's `idle_ttl`,
    /// looked for at most every [`EXPIRY_PERIOD`]: they come back from their files.
    pub(super) fn expire_idle(&mut self) {
        let Some(ttl) = lock(&self.shared.pool).idle_ttl else {
            return;
        };
        if self.expired_at.elapsed() < expiry_period(ttl) || self.loaded.is_none() {
            return;
        }
        self.expired_at = Instant::now();
        let (settings, spill) = self.settings();
        if settings.spill_dir.is_some() {
            let _ = self.identity();
        }
        let actions = self.pool.expired(ttl, &settings);
        if actions.is_empty() {
            return;
        }
        let markers = self
            .pool
            .apply(&actions, &settings, spill.as_ref(), &mut self.probe, "");
        self.mark(markers);
        self.publish();
    }

    /// KV bytes the running comparisons were admitted for.
    pub(super) fn compares_reserved(&self) -> u64 {
        self.tasks
            .iter()
            .map(|t| match t {
                Task::Compare { reserved, .. } => *reserved,
                Task::Turn { .. } => 0,
            })
            .sum()
    }

    /// The model's identity in cache files, computed once (a digest of samples of its
    /// weights).
    /// Runs `f` on the pool with what it borrows from the loop ([`Host`]); the markers it
    /// made are kept, whatever its outcome.
    pub(super) fn with_pool<T>(
        &mut self,
        f: impl FnOnce(&mut Pool, &mut Host<'_>, &Loaded) -> Result<T, JobError>,
    ) -> Result<T, JobError> {
        let (settings, spill) = self.settings();
        let limit = self.kv_limit();
        let rewind_margin = self.rewind_margin();
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let mut host = Host {
            model: &loaded.model,
            weights: &loaded.weights,
            limit,
            settings: &settings,
            spill: spill.as_ref(),
            rewind_margin,
            probe: &mut self.probe,
            markers: Vec::new(),
        };
        let out = f(&mut self.pool, &mut host, loaded);
        let markers = host.markers;
        self.mark(markers);
        out
    }

    /// [`Pool::admit`], its markers kept.
    pub(super) fn admit(&mut self, need: Need, purpose: Purpose) -> Result<(), JobError> {
        self.with_pool(|pool, host, _| Ok(pool.admit(host, need, purpose)?))
    }

    /// The model's identity in cache files ([`Pool::identity_of`]).
    pub(super) fn identity(&mut self) -> Result<String, JobError> {
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        Ok(self.pool.identity_of(&loaded.weights)?)
    }

    /// Keeps the pool's markers for front ends, and counts them.
    pub(super) fn mark(&self, markers: Vec<SwitchEvent>) {
        if markers.is_empty() {
            return;
        }
        let mut counters = lock(&self.shared.counters);
        for m in &markers {
            match m.kind {
                MarkerKind::Demote => counters.demotions += 1,
                MarkerKind::Spill => counters.spills += 1,
                MarkerKind::Drop => counters.drops += 1,
                _ => {}
            }
        }
        drop(counters);
        let mut ring = lock(&self.shared.markers);
        for m in markers {
            ring.0 += 1;
            ring.1.push_back(m);
            if ring.1.len() > MARKERS_KEPT {
                ring.1.pop_front();
            }
        }
    }

    pub(super) fn tell_activity(&self, activity: Activity) {
        let mut s = lock(&self.shared.status);
        let changed = s.activity != activity;
        s.activity = activity.clone();
        s.busy = true;
        drop(s);
        if changed {
            self.tell(&activity);
        }
    }

    pub(super) fn activity(&self) -> Activity {
        match (&self.loaded, &self.failure) {
            (Some(l), _) if !self.tasks.is_empty() => Activity::Generating {
                model: l.card.name.clone(),
            },
            (Some(l), _) => Activity::Ready {
                model: l.card.name.clone(),
            },
            (None, Some(message)) => Activity::Failed {
                message: message.clone(),
            },
            (None, None) => Activity::NoModel,
        }
    }

    pub(super) fn tell(&self, activity: &Activity) {
        if let Some(listener) = lock(&self.shared.listener).as_ref() {
            listener(activity);
        }
    }

    /// Refreshes the status snapshot (and tells the listener if the activity changed). The
    /// conversation list is rebuilt when the pool changed, at the end of a request, and at
    /// most every [`INFOS_PERIOD`] while requests step: a step costs the running
    /// conversations' bytes, never a walk over every conversation held.
    pub(super) fn publish(&mut self) {
        self.publish_with(true);
    }

    /// [`Worker::publish`] between two steps: the list only when due.
    pub(super) fn publish_step(&mut self) {
        self.publish_with(false);
    }

    pub(super) fn publish_with(&mut self, whole: bool) {
        let activity = self.activity();
        let rebuild = whole
            || self.published.0 != self.pool.revision()
            || self.published.1.elapsed() >= INFOS_PERIOD;
        let conversations = rebuild.then(|| self.pool.infos());
        if rebuild {
            self.published = (self.pool.revision(), Instant::now());
        }
        let (kv, tokens) = self.pool.kv_totals();
        let kv_limit = self.kv_setting();
        let mut s = lock(&self.shared.status);
        let changed = s.activity != activity;
        s.activity = activity.clone();
        s.busy = !self.tasks.is_empty();
        s.running = self.tasks.len();
        s.queued = self.shared.queued();
        if let Some(conversations) = conversations {
            s.conversations = conversations;
        }
        s.kv = kv;
        s.context_tokens = tokens;
        s.policy = self.policy.clone();
        s.kv_limit = kv_limit;
        match &self.loaded {
            Some(l) => {
                s.model = Some(l.card.clone());
                // The text model's and the vision tower's (as the card counts them).
                s.weights_bytes = l.card.weights_bytes;
            }
            None => {
                s.model = None;
                s.weights_bytes = 0;
            }
        }
        drop(s);
        *lock(&self.shared.tokenizer) = self.loaded.as_ref().map(|l| Arc::clone(&l.tokenizer));
        *lock(&self.shared.config) = self.loaded.as_ref().map(|l| Arc::clone(&l.config));
        let facts = self
            .loaded
            .as_ref()
            .and_then(|l| l.vision.as_ref().map(|v| v.facts));
        let mut vision = lock(&self.shared.vision);
        if *vision != facts {
            // Another processor cuts images otherwise: they are added again.
            lock(&self.shared.images).clear();
            *vision = facts;
        }
        if changed {
            self.tell(&activity);
        }
    }
}

/// How a request ended: the last event to send once the status is current.
pub(super) enum Ended {
    Turn(Option<Event>),
    Compare(Event),
}

/// The conversation a request names, if it names one.
pub(super) fn named(choice: &Option<ConversationChoice>) -> Option<ConversationId> {
    match choice {
        None => Some(ConversationId::default_id()),
        Some(ConversationChoice::Id { id }) => Some(id.clone()),
        Some(ConversationChoice::Continuing { .. }) => None,
    }
}
