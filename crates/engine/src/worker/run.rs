//! The engine thread's loop: takes jobs as they come, starts queued requests while fewer than
//! the pool's `parallel` run (one per conversation), steps the running ones in turn, answers
//! control jobs between steps, and keeps the shared status snapshot current.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use super::error::{JobError, LoadError};
use super::places::{client_of_id, may_start};
use super::submit::{CompareJob, GenerateJob, Queued};
use super::{
    lock, CacheFileInfo, CancelToken, CompareSink, Control, EventSink, Job, LoadRequest, Shared,
    MARKERS_KEPT,
};
use crate::budget::Plan;
use crate::card::inspect;
use crate::checkpoint::source::ModelSource;
use crate::contract::ModelCard;
use crate::contract::{Activity, DoneReason, ErrorCode, Event, LoadPhase};
use crate::contract::{CacheOrigin, ConversationChoice, ConversationId, MarkerKind};
use crate::conversations::{Host, Need, Pool, PoolSettings, Purpose, SpillDir, TurnAsk};
use crate::generate::compare::{CompareEvent, CompareRun};
use crate::generate::session::Session;
use crate::generate::Turn;
use crate::kv::{CacheSpec, KvMemoryReport, PrecisionPolicy};
use crate::memory::{estimate_kv_bytes, RssProbe, SwitchEvent};
use crate::models::common::Model;
use crate::tokenizer::GemmaTokenizer;

pub(super) struct Loaded {
    pub(super) model: Model,
    /// The weights' file or folder.
    weights: PathBuf,
    pub(super) tokenizer: Arc<GemmaTokenizer>,
    card: ModelCard,
    config: Arc<crate::checkpoint::config::ModelConfig>,
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
            Task::Compare { .. } => Ended::Compare(CompareEvent::Error {
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
    fn client(&self) -> &str {
        match self {
            Task::Turn { id, .. } => client_of_id(id),
            Task::Compare { .. } => "",
        }
    }
}

pub(super) struct Worker {
    rx: Receiver<Job>,
    pub(super) shared: Arc<Shared>,
    pub(super) loaded: Option<Loaded>,
    pub(super) pool: Pool,
    /// The cache new conversations get (and the next load's).
    policy: PrecisionPolicy,
    /// Running requests, stepped together; a step's prefill chunk goes to the first
    /// prefilling one from `next` on.
    pub(super) tasks: Vec<Task>,
    pub(super) next: usize,
    /// How long steps take, to size a prefill chunk beside decodes.
    pub(super) pace: super::step::Pace,
    /// Requests waiting to start, in arrival order.
    waiting: VecDeque<Job>,
    /// Resident-set readings for switch markers.
    probe: RssProbe,
    /// Why the last load failed, while nothing is loaded.
    failure: Option<String>,
    /// The pool's revision and the time of the conversation list last published.
    published: (u64, Instant),
    /// When idle conversations were last looked at for expiry.
    expired_at: Instant,
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

fn loading(phase: LoadPhase) -> Event {
    Event::Loading {
        phase,
        done: None,
        total: None,
    }
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
fn never_ran() -> Event {
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
    fn iteration(&mut self) -> bool {
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
    fn recover(&mut self, why: &str) {
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
                    let ev = CompareEvent::Error {
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
    fn take(&mut self, job: Job) -> bool {
        match job {
            Job::Load {
                request,
                mut sink,
                cancel,
            } => {
                if !self.tasks.is_empty() || !self.waiting.is_empty() {
                    sink(JobError::busy("load a model").to_event());
                    return true;
                }
                let source = source_label(&request.source);
                self.tell_activity(Activity::Loading { source });
                let result = self.load(request, &mut sink, &cancel);
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
    fn stop(&mut self) {
        for task in std::mem::take(&mut self.tasks) {
            match task {
                Task::Turn { id, mut sink, .. } => {
                    self.pool.set_busy(&id, false);
                    sink(never_ran());
                }
                Task::Compare { mut sink, .. } => sink(CompareEvent::Error {
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
                    (q.job.sink)(CompareEvent::Error {
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
    fn start_waiting(&mut self) {
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
    fn drop_cancelled_waiting(&mut self) {
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
                        sink(CompareEvent::Error {
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

    fn rewind_margin(&self) -> usize {
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
    fn kv_setting(&self) -> u64 {
        let set = lock(&self.shared.pool).kv_budget;
        set.unwrap_or_else(|| crate::budget::default_kv_budget(&lock(&self.shared.budget)))
    }

    /// Spills (or drops) the conversations idle for longer than the pool's `idle_ttl`,
    /// looked for at most every [`EXPIRY_PERIOD`]: they come back from their files.
    fn expire_idle(&mut self) {
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
    fn compares_reserved(&self) -> u64 {
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
    fn with_pool<T>(
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
    fn admit(&mut self, need: Need, purpose: Purpose) -> Result<(), JobError> {
        self.with_pool(|pool, host, _| Ok(pool.admit(host, need, purpose)?))
    }

    /// The model's identity in cache files ([`Pool::identity_of`]).
    fn identity(&mut self) -> Result<String, JobError> {
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        Ok(self.pool.identity_of(&loaded.weights)?)
    }

    /// Keeps the pool's markers for front ends, and counts them.
    fn mark(&self, markers: Vec<SwitchEvent>) {
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

    /// The conversation a request runs in (`policy`: the cache it runs with, which an
    /// unnamed request's match must hold).
    fn conversation(
        &mut self,
        choice: &Option<ConversationChoice>,
        prompt: &[u32],
        policy: &PrecisionPolicy,
    ) -> Result<ConversationId, JobError> {
        Ok(match choice {
            None => ConversationId::default_id(),
            Some(ConversationChoice::Id { id }) => id.clone(),
            Some(ConversationChoice::Continuing { prefix }) => {
                match self.pool.continuing(prefix, prompt, policy) {
                    Some(id) => id,
                    None => self.pool.unnamed(prefix)?,
                }
            }
        })
    }

    fn start_turn(&mut self, q: Queued<GenerateJob>) {
        let Queued {
            job,
            cancel,
            arrived,
            ..
        } = q;
        let GenerateJob {
            request,
            prompt,
            tokenizer,
            mut sink,
        } = job;
        match self.prepare_turn(&request, prompt, &tokenizer, arrived) {
            Ok((id, turn)) => {
                self.tasks.push(Task::Turn {
                    id,
                    turn: Box::new(turn),
                    sink,
                    cancel,
                });
            }
            Err(e) => sink(e.to_event()),
        }
    }

    /// Everything before a turn's first step: its conversation (the pool opens the turn:
    /// in memory with room to grow, in the cache the request names), lined up with the
    /// prompt. A refused turn leaves no conversation behind that it registered.
    fn prepare_turn(
        &mut self,
        request: &crate::generate::GenerateRequest,
        prompt: Vec<u32>,
        tokenizer: &Arc<GemmaTokenizer>,
        arrived: Instant,
    ) -> Result<(ConversationId, Turn), JobError> {
        let prompt = self.rendered(&request.prompt, request.context, prompt, tokenizer)?;
        let wanted = match &request.cache {
            Some(cache) => Some(cache.policy()?),
            None => None,
        };
        let effective = wanted.clone().unwrap_or_else(|| self.policy.clone());
        let id = self.conversation(&request.conversation, &prompt, &effective)?;
        let default = self.policy.clone();
        let turn = self.with_pool(|pool, host, loaded| {
            let max_context = request.context_limit(loaded.config.max_position_embeddings);
            let ask = TurnAsk {
                wanted: wanted.as_ref(),
                default: &default,
                grown: Turn::grown_context(&prompt, request, max_context),
                unnamed: matches!(
                    request.conversation,
                    Some(ConversationChoice::Continuing { .. })
                ),
            };
            pool.open_turn(host, &id, ask, |session, origin| {
                Turn::start(
                    &loaded.model,
                    &loaded.tokenizer,
                    session,
                    request,
                    prompt,
                    arrived,
                    (id.clone(), origin),
                )
                .map_err(JobError::from)
            })
        })?;
        self.count(turn.origin());
        Ok((id, turn))
    }

    /// The prompt's ids for the loaded model: as the caller rendered them, unless the model
    /// changed since (then rendered again here).
    fn rendered(
        &self,
        prompt: &crate::generate::Prompt,
        context: Option<usize>,
        ids: Vec<u32>,
        tokenizer: &Arc<GemmaTokenizer>,
    ) -> Result<Vec<u32>, JobError> {
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        if Arc::ptr_eq(tokenizer, &loaded.tokenizer) {
            return Ok(ids);
        }
        let p = prompt.clone().for_model(loaded.card.has_chat_template);
        let model = loaded.config.max_position_embeddings;
        Ok(crate::generate::render_within_context(
            &loaded.tokenizer,
            &p,
            context.map_or(model, |c| c.min(model)),
        )?)
    }

    /// Counts a turn by where its cache came from.
    fn count(&self, origin: CacheOrigin) {
        let mut c = lock(&self.shared.counters);
        match origin {
            CacheOrigin::New => c.new += 1,
            CacheOrigin::Held => c.held += 1,
            CacheOrigin::Demoted => c.demoted_hits += 1,
            CacheOrigin::Restored => c.restored += 1,
            CacheOrigin::Dropped | CacheOrigin::Reread => c.prefilled += 1,
        }
    }

    fn start_compare(&mut self, q: Queued<CompareJob>) {
        let Queued {
            job,
            cancel,
            arrived,
            ..
        } = q;
        let CompareJob {
            request,
            prompt,
            tokenizer,
            mut sink,
        } = job;
        match self.prepare_compare(request, prompt, &tokenizer, arrived) {
            Ok((run, reserved)) => self.tasks.push(Task::Compare {
                run: Box::new(run),
                sink,
                cancel,
                reserved,
            }),
            Err(e) => sink(CompareEvent::Error {
                code: e.code,
                message: e.message,
            }),
        }
    }

    fn prepare_compare(
        &mut self,
        request: crate::generate::compare::CompareRequest,
        prompt: Vec<u32>,
        tokenizer: &Arc<GemmaTokenizer>,
        arrived: Instant,
    ) -> Result<(CompareRun, u64), JobError> {
        let prompt = self.rendered(&request.prompt, None, prompt, tokenizer)?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let needed = CompareRun::needed_bytes(&loaded.model, &prompt, &request)?;
        let tokens = prompt.len() + request.max_tokens;
        self.admit(
            Need {
                owner: None,
                extra: needed,
                what: format!("compare two caches of {tokens} tokens"),
            },
            Purpose::Other,
        )?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let run = CompareRun::start(&loaded.model, &loaded.tokenizer, request, prompt, arrived)?;
        Ok((run, needed))
    }

    /// Runs one step of the next running request, and finishes it when it ends.
    fn control(&mut self, control: Control) {
        match control {
            Control::Cancel(conversation) => {
                for task in &self.tasks {
                    let theirs = match (task, &conversation) {
                        (_, None) => true,
                        (Task::Turn { id, .. }, Some(c)) => id == c,
                        (Task::Compare { .. }, Some(_)) => false,
                    };
                    if theirs {
                        task.cancel().cancel();
                    }
                }
                for job in &self.waiting {
                    if let Job::Generate(q) = job {
                        let theirs = conversation.is_none()
                            || named(&q.job.request.conversation) == conversation;
                        if theirs {
                            q.cancel.cancel();
                        }
                    } else if let (Job::Compare(q), None) = (job, &conversation) {
                        q.cancel.cancel();
                    }
                }
            }
            Control::CancelCompares => {
                for task in &self.tasks {
                    if let Task::Compare { cancel, .. } = task {
                        cancel.cancel();
                    }
                }
                for job in &self.waiting {
                    if let Job::Compare(q) = job {
                        q.cancel.cancel();
                    }
                }
            }
            Control::Forget {
                conversation,
                file,
                reply,
            } => {
                let r = if self.pool.is_busy(&conversation) {
                    Err(JobError::busy("forget a conversation"))
                } else {
                    let (_, spill) = self.settings();
                    if file {
                        self.pool.forget(&conversation, spill.as_ref());
                        Ok(())
                    } else {
                        self.pool.reset(&conversation).map_err(JobError::from)
                    }
                };
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::SwitchCache {
                conversation,
                policy,
                reply,
            } => {
                let r = self.switch(&conversation, &policy);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::SetDefaultPolicy { policy, reply } => {
                let empty = empty_report();
                let marker =
                    SwitchEvent::between((&self.policy, &empty), (&policy, &empty), 0, (0, 0), 0.0);
                self.policy = policy;
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(Ok(marker));
            }
            Control::SaveCache {
                conversation,
                path,
                reply,
            } => {
                let r = self.save_cache(&conversation, path);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::RestoreCache {
                conversation,
                path,
                reply,
            } => {
                let r = self.restore_cache(&conversation, path);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::SaveAll { reply } => {
                let saved = self.save_all(false);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(saved);
            }
            Control::Unload { reply } => {
                let r = if !self.tasks.is_empty() {
                    Err(JobError::busy("unload the model"))
                } else {
                    self.save_all(true);
                    self.pool.clear();
                    self.loaded = None;
                    Ok(())
                };
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::Shutdown => {}
        }
    }

    /// Writes every conversation in memory to its spill file (each its own); with `free`,
    /// their memory goes too.
    fn save_all(&mut self, free: bool) -> Vec<super::SavedCache> {
        let (settings, spill) = self.settings();
        let Some(spill) = spill else {
            return Vec::new();
        };
        if self.loaded.is_none() || self.identity().is_err() {
            return Vec::new();
        }
        self.pool
            .save_all(&spill, free, settings.disk_budget)
            .into_iter()
            .map(|(id, r)| (id, r.map_err(JobError::from)))
            .collect()
    }

    /// A switch by its owner: `conversation` re-encoded in `policy` when in memory (room made
    /// first), else the policy of its next turn; without a model, the next load's.
    fn switch(
        &mut self,
        conversation: &ConversationId,
        policy: &PrecisionPolicy,
    ) -> Result<SwitchEvent, JobError> {
        if self.loaded.is_none() {
            let empty = empty_report();
            let marker =
                SwitchEvent::between((&self.policy, &empty), (policy, &empty), 0, (0, 0), 0.0);
            self.policy = policy.clone();
            return Ok(marker);
        }
        if self.pool.session(conversation).is_some() {
            return self.switch_in_pool(conversation, policy);
        }
        let (_, spill) = self.settings();
        self.pool.ensure(conversation, policy, spill.as_ref());
        let from = self.pool.policy(conversation).cloned().unwrap_or_default();
        self.pool.set_policy(conversation, policy);
        let empty = empty_report();
        Ok(
            SwitchEvent::between((&from, &empty), (policy, &empty), 0, (0, 0), 0.0)
                .of(MarkerKind::Switch, conversation),
        )
    }

    /// Switches `conversation`, in memory, to `policy` ([`Pool::switch_held`]).
    fn switch_in_pool(
        &mut self,
        conversation: &ConversationId,
        policy: &PrecisionPolicy,
    ) -> Result<SwitchEvent, JobError> {
        self.with_pool(|pool, host, _| Ok(pool.switch_held(host, conversation, policy)?))
    }

    fn cache_path(
        &self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<PathBuf, JobError> {
        match path {
            Some(p) => Ok(p),
            None => {
                let (_, spill) = self.settings();
                spill.map(|d| d.path(conversation)).ok_or_else(|| {
                    JobError::new(
                        ErrorCode::InvalidRequest,
                        "no folder for cache files is set",
                    )
                })
            }
        }
    }

    fn save_cache(
        &mut self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<CacheFileInfo, JobError> {
        let started = Instant::now();
        let own_file = path.is_none();
        let path = self.cache_path(conversation, path)?;
        let identity = self.identity()?;
        let session = self.pool.session(conversation).ok_or_else(|| {
            JobError::new(
                ErrorCode::InvalidRequest,
                format!("conversation {conversation} holds no cache in memory"),
            )
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                JobError::from(crate::error::EngineError::CacheIo {
                    path: dir.to_path_buf(),
                    source: e,
                })
            })?;
        }
        let bytes = if own_file {
            let (_, spill) = self.settings();
            match spill {
                Some(spill) => spill.save(conversation, session, &identity)?,
                None => session.save_cache(&path, &identity)?,
            }
        } else {
            session.save_cache(&path, &identity)?
        };
        let info = CacheFileInfo {
            path: path.clone(),
            bytes,
            tokens: session.len(),
            token_ids: session.history().to_vec(),
            pending: session.pending().to_vec(),
            spec: session.policy().spec_string(),
            secs: started.elapsed().as_secs_f64(),
        };
        if own_file {
            self.pool.saved(conversation, bytes, info.tokens);
            let (settings, spill) = self.settings();
            if let Some(spill) = spill {
                self.pool.enforce_disk_budget(&settings, &spill);
            }
        }
        Ok(info)
    }

    fn restore_cache(
        &mut self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<CacheFileInfo, JobError> {
        if self.pool.is_busy(conversation) {
            return Err(JobError::busy("restore a cache into a conversation"));
        }
        let started = Instant::now();
        let path = self.cache_path(conversation, path)?;
        let identity = self.identity()?;
        let header = crate::kv::persist::peek(&path)?;
        let policy = CacheSpec::parse(&header.spec)
            .map(|s| s.to_policy())
            .map_err(|e| JobError::new(ErrorCode::CacheCorrupt, e.to_string()))?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let needed = estimate_kv_bytes(
            &loaded.config,
            &policy,
            header.seq_len,
            self.rewind_margin(),
        )?;
        self.admit(
            Need {
                owner: Some(conversation.clone()),
                extra: needed.saturating_sub(self.pool.bytes_of(conversation)),
                what: format!("restore {} tokens of {conversation}", header.seq_len),
            },
            Purpose::Other,
        )?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let mut session = Session::new(&loaded.model, &policy)?;
        session.set_rewind_margin(self.rewind_margin());
        match session.restore_cache_as_saved(&loaded.model, &path, &identity) {
            Ok(header) => {
                let secs = started.elapsed().as_secs_f64();
                let report = session.memory();
                let marker = SwitchEvent::between(
                    (&policy, &empty_report()),
                    (session.policy(), &report),
                    header.seq_len,
                    (0, 0),
                    secs * 1e3,
                );
                let marker = SwitchEvent {
                    from: "disk".into(),
                    ..marker.of(MarkerKind::Restore, conversation)
                };
                self.pool.put(conversation, session);
                self.mark(vec![marker]);
                Ok(CacheFileInfo {
                    bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
                    path,
                    tokens: header.seq_len,
                    token_ids: header.tokens,
                    pending: header.pending,
                    spec: header.spec,
                    secs,
                })
            }
            Err(e) => {
                let mut err = JobError::from(e);
                if err.code == ErrorCode::CacheCorrupt {
                    // Set aside, never deleted: the user may want to look at it.
                    if let Some(aside) = set_aside(&path) {
                        err.message
                            .push_str(&format!(" (set aside as {})", aside.display()));
                    }
                }
                Err(err)
            }
        }
    }

    fn tell_activity(&self, activity: Activity) {
        let mut s = lock(&self.shared.status);
        let changed = s.activity != activity;
        s.activity = activity.clone();
        s.busy = true;
        drop(s);
        if changed {
            self.tell(&activity);
        }
    }

    fn activity(&self) -> Activity {
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

    fn tell(&self, activity: &Activity) {
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
    fn publish_step(&mut self) {
        self.publish_with(false);
    }

    fn publish_with(&mut self, whole: bool) {
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
                s.weights_bytes = l.model.weights_bytes() as u64;
            }
            None => {
                s.model = None;
                s.weights_bytes = 0;
            }
        }
        drop(s);
        *lock(&self.shared.tokenizer) = self.loaded.as_ref().map(|l| Arc::clone(&l.tokenizer));
        *lock(&self.shared.config) = self.loaded.as_ref().map(|l| Arc::clone(&l.config));
        if changed {
            self.tell(&activity);
        }
    }

    fn load(
        &mut self,
        request: LoadRequest,
        sink: &mut EventSink,
        cancel: &CancelToken,
    ) -> Result<ModelCard, LoadError> {
        sink(loading(LoadPhase::Resolving));
        let resolved = request.source.resolve(
            request.tokenizer.as_deref(),
            &mut |e| sink(e),
            cancel.flag(),
        )?;
        sink(loading(LoadPhase::Weights));
        let inspection = inspect(&resolved.weights, &request.options).map_err(LoadError::Model)?;
        self.admit_load(&inspection, &request, &resolved.name)?;
        let model = Model::from_checkpoint(&inspection.checkpoint).map_err(LoadError::Model)?;
        let mut card = inspection.card;
        card.name = resolved.name.clone();
        card.weights_bytes = model.weights_bytes() as u64;
        card.weights_measured = true;
        sink(loading(LoadPhase::Tokenizer));
        let (tokenizer, warnings) = GemmaTokenizer::for_checkpoint(
            &resolved.tokenizer,
            &inspection.checkpoint,
            &resolved.name,
        )?;
        // The checkpoint's headers go now; the model holds its weights.
        drop(inspection.checkpoint);
        // What loaded decides: a template that cannot be used leaves a base model.
        card.has_chat_template = Some(tokenizer.template().is_some());
        card.supports_thinking = tokenizer.supports_thinking();
        card.warnings.extend(warnings);
        // Only now does the previous model go: a failed load loses nothing. Its
        // conversations' caches go to their files first, each its own.
        self.save_all(true);
        self.pool.clear();
        self.policy = request.policy.clone();
        self.loaded = Some(Loaded {
            weights: resolved.weights.clone(),
            config: Arc::new(model.config().clone()),
            model,
            tokenizer: Arc::new(tokenizer),
            card: card.clone(),
        });
        Ok(card)
    }

    /// Refuses a load whose weights and KV cache (at the request's context) would not fit the
    /// memory available, before a weight is read.
    fn admit_load(
        &self,
        inspection: &crate::card::Inspection,
        request: &LoadRequest,
        name: &str,
    ) -> Result<(), LoadError> {
        let max = inspection.card.max_context;
        let context = if max > 0 {
            request.context.min(max)
        } else {
            request.context
        };
        let fit = Plan {
            allocated: false,
            config: inspection.checkpoint.config(),
            weights_bytes: inspection.card.weights_bytes,
            held_kv_bytes: 0,
            context,
            policy: &request.policy,
            rewind_margin: self.rewind_margin(),
        }
        .fit(&lock(&self.shared.budget))
        .map_err(LoadError::Model)?;
        if fit.fits {
            return Ok(());
        }
        let mut message = fit.message(&format!("load {name}"));
        if self.loaded.is_some() {
            message.push_str(" (the model loaded now stays loaded)");
        }
        Err(LoadError::OutOfMemory(message))
    }
}

/// How a request ended: the last event to send once the status is current.
pub(super) enum Ended {
    Turn(Option<Event>),
    Compare(CompareEvent),
}

/// The conversation a request names, if it names one.
fn named(choice: &Option<ConversationChoice>) -> Option<ConversationId> {
    match choice {
        None => Some(ConversationId::default_id()),
        Some(ConversationChoice::Id { id }) => Some(id.clone()),
        Some(ConversationChoice::Continuing { .. }) => None,
    }
}

/// Moves a corrupt file to `<name>.corrupt` beside it; returns where.
fn set_aside(path: &Path) -> Option<PathBuf> {
    let mut aside = path.as_os_str().to_os_string();
    aside.push(".corrupt");
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside).ok().map(|_| aside)
}

/// What a status bar shows for a model being loaded.
fn source_label(source: &ModelSource) -> String {
    if let ModelSource::Local { path } = source {
        return path.display().to_string();
    }
    if let ModelSource::Hub { repo, .. } = source {
        return repo.clone();
    }
    format!("{source:?}")
}

fn empty_report() -> KvMemoryReport {
    KvMemoryReport {
        layers: Vec::new(),
        sliding: (0, 0),
        full: (0, 0),
        total: (0, 0),
        calibrating: false,
    }
}
