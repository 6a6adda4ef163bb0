//! The engine thread's loop: takes jobs in order, owns the loaded model, and keeps the shared
//! status snapshot current.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use super::error::{JobError, LoadError};
use super::{
    lock, CacheFileInfo, CancelToken, CompareSink, EventSink, Job, LoadRequest, Shared, MAX_QUEUED,
};
use crate::budget::{switch_fit, MemoryBudget, Plan};
use crate::card::inspect;
use crate::card::ModelCard;
use crate::compare::{self, CompareEvent, CompareHooks, CompareRequest};
use crate::events::{Activity, DoneReason, ErrorCode, Event, LoadPhase};
use crate::generate::session::Session;
use crate::generate::{self, GenerateError, GenerateRequest, Hooks};
use crate::kv::{KvMemoryReport, PrecisionPolicy};
use crate::memory::{estimate_kv_bytes, format_bytes, KvBytes, RssProbe, SwitchEvent};
use crate::model::Model;
use crate::source::ModelSource;
use crate::tokenizer::GemmaTokenizer;

struct Loaded {
    model: Model,
    /// The weights' file or folder, and their identity once a cache file needed it.
    weights: std::path::PathBuf,
    identity: Option<String>,
    tokenizer: Arc<GemmaTokenizer>,
    session: Session,
    card: ModelCard,
    config: Arc<crate::config::ModelConfig>,
}

pub(super) struct Worker {
    rx: Receiver<Job>,
    shared: Arc<Shared>,
    loaded: Option<Loaded>,
    /// The policy for the next load when no model is loaded.
    policy: PrecisionPolicy,
    /// Jobs that arrived during a generation and run after it.
    deferred: VecDeque<Job>,
    /// Resident-set readings for switch markers.
    probe: RssProbe,
    /// Why the last load failed, while nothing is loaded.
    failure: Option<String>,
}

fn loading(phase: LoadPhase) -> Event {
    Event::Loading {
        phase,
        done: None,
        total: None,
    }
}

impl Worker {
    pub(super) fn new(rx: Receiver<Job>, shared: Arc<Shared>) -> Self {
        let policy = lock(&shared.status).policy.clone();
        Self {
            rx,
            shared,
            loaded: None,
            policy,
            deferred: VecDeque::new(),
            probe: RssProbe::new(),
            failure: None,
        }
    }

    pub(super) fn run(mut self) {
        loop {
            let job = match self.deferred.pop_front() {
                Some(j) => {
                    lock(&self.shared.status).queued = queued_requests(&self.deferred);
                    j
                }
                None => match self.rx.recv() {
                    Ok(j) => j,
                    // Every handle is gone.
                    Err(_) => return,
                },
            };
            if !self.handle(job) {
                return;
            }
        }
    }

    /// Runs one job; false means stop the thread.
    fn handle(&mut self, job: Job) -> bool {
        match job {
            Job::Load {
                request,
                mut sink,
                cancel,
            } => {
                let source = source_label(&request.source);
                self.begin(&cancel, Activity::Loading { source });
                let result = self.load(request, &mut sink, &cancel);
                self.failure = match (&result, &self.loaded) {
                    (Err(e), None) => Some(e.to_string()),
                    _ => None,
                };
                // Status first, then the final event: a caller reacting to it sees the
                // engine idle and up to date.
                self.end();
                match result {
                    Ok(card) => sink(Event::Loaded { card }),
                    Err(e) => sink(JobError::from(e).to_event()),
                }
            }
            Job::Generate {
                request,
                mut sink,
                cancel,
            } => {
                // Cancelled while it waited in the queue (its client left): it never runs.
                if cancel.is_cancelled() {
                    sink(Event::Done {
                        reason: DoneReason::Cancelled,
                        token_ids: Vec::new(),
                    });
                    return true;
                }
                self.begin(&cancel, self.generating());
                let last = match self.generate(&request, &mut sink, &cancel) {
                    Ok(done) => done,
                    Err(e) => Some(e.to_event()),
                };
                self.end();
                if let Some(ev) = last {
                    sink(ev);
                }
            }
            Job::Compare {
                request,
                mut sink,
                cancel,
            } => {
                if cancel.is_cancelled() {
                    let e = JobError::new(ErrorCode::Cancelled, "cancelled before it started");
                    sink(CompareEvent::Error {
                        code: e.code,
                        message: e.message,
                    });
                    return true;
                }
                self.begin(&cancel, self.generating());
                let last = match self.compare(&request, &mut sink, &cancel) {
                    Ok(fidelity) => CompareEvent::Finished { fidelity },
                    Err(e) => CompareEvent::Error {
                        code: e.code,
                        message: e.message,
                    },
                };
                self.end();
                sink(last);
            }
            // Nothing runs: nothing to cancel.
            Job::Cancel => {}
            Job::Reset { reply } => {
                let r = match self.loaded.as_mut() {
                    Some(l) => l.session.reset().map_err(JobError::from),
                    None => Ok(()),
                };
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Job::SwitchCache { policy, reply } => {
                let r = match self.loaded.as_mut() {
                    Some(l) => checked_switch(
                        &mut l.session,
                        &policy,
                        &self.shared.budget,
                        &mut self.probe,
                    ),
                    None => {
                        let empty = empty_report();
                        let marker = SwitchEvent::between(
                            (&self.policy, &empty),
                            (&policy, &empty),
                            0,
                            (0, 0),
                            0.0,
                        );
                        self.policy = policy;
                        Ok(marker)
                    }
                };
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Job::SaveCache { path, reply } => {
                let r = self.save_cache(&path);
                let _ = reply.send(r);
            }
            Job::RestoreCache { path, reply } => {
                let r = self.restore_cache(&path);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Job::Unload { reply } => {
                if let Some(l) = self.loaded.take() {
                    self.policy = l.session.policy().clone();
                }
                self.publish();
                let _ = reply.send(Ok(()));
            }
            Job::Shutdown => return false,
        }
        true
    }

    fn begin(&mut self, cancel: &CancelToken, activity: Activity) {
        *lock(&self.shared.active) = Some(cancel.clone());
        let mut s = lock(&self.shared.status);
        s.busy = true;
        let changed = s.activity != activity;
        s.activity = activity.clone();
        drop(s);
        if changed {
            self.tell(&activity);
        }
    }

    fn end(&mut self) {
        *lock(&self.shared.active) = None;
        self.publish();
    }

    /// The activity of a generation on the loaded model.
    fn generating(&self) -> Activity {
        match &self.loaded {
            Some(l) => Activity::Generating {
                model: l.card.name.clone(),
            },
            None => Activity::NoModel,
        }
    }

    /// The activity when no job runs.
    fn idle(&self) -> Activity {
        match (&self.loaded, &self.failure) {
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

    /// Refreshes the status snapshot (and tells the listener if the activity changed).
    fn publish(&self) {
        let activity = self.idle();
        let mut s = lock(&self.shared.status);
        s.busy = false;
        let changed = s.activity != activity;
        s.activity = activity.clone();
        match &self.loaded {
            Some(l) => {
                let memory = l.session.memory();
                s.model = Some(l.card.clone());
                s.context_tokens = l.session.len();
                s.kv = KvBytes::from_report(&memory);
                s.policy = l.session.policy().clone();
                s.weights_bytes = l.model.weights_bytes() as u64;
            }
            None => {
                s.model = None;
                s.context_tokens = 0;
                s.kv = KvBytes::default();
                s.policy = self.policy.clone();
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
        let mut card = inspection.card;
        let model = Model::load(&resolved.weights, &request.options).map_err(LoadError::Model)?;
        card.name = resolved.name.clone();
        card.weights_bytes = model.weights_bytes() as u64;
        card.weights_measured = true;
        sink(loading(LoadPhase::Tokenizer));
        let (tokenizer, warnings) =
            GemmaTokenizer::for_model(&resolved.tokenizer, &model, &resolved.name)?;
        // What loaded decides: a template that cannot be used leaves a base model.
        card.has_chat_template = Some(tokenizer.template().is_some());
        card.supports_thinking = tokenizer.supports_thinking();
        card.warnings.extend(warnings);
        let mut session = Session::new(&model, &request.policy).map_err(LoadError::Cache)?;
        session.set_rewind_margin(self.shared.rewind_margin.load(Ordering::Relaxed));
        // Only now is the previous model dropped: a failed load loses nothing.
        self.loaded = Some(Loaded {
            weights: resolved.weights.clone(),
            identity: None,
            config: Arc::new(model.config().clone()),
            model,
            tokenizer: Arc::new(tokenizer),
            session,
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
            config: &inspection.config,
            weights_bytes: inspection.card.weights_bytes,
            held_kv_bytes: 0,
            context,
            policy: &request.policy,
            rewind_margin: self.shared.rewind_margin.load(Ordering::Relaxed),
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

    fn generate(
        &mut self,
        request: &GenerateRequest,
        sink: &mut EventSink,
        cancel: &CancelToken,
    ) -> Result<Option<Event>, JobError> {
        let loaded = self.loaded.as_mut().ok_or_else(JobError::no_model)?;
        // A request that names its cache gets it: the conversation's cache is re-encoded
        // (checked against memory first), exactly as a switch from the app would.
        if let Some(cache) = &request.cache {
            let policy = cache.policy()?;
            if &policy != loaded.session.policy() {
                checked_switch(
                    &mut loaded.session,
                    &policy,
                    &self.shared.budget,
                    &mut self.probe,
                )?;
            }
        }
        // Base checkpoints without a chat template get a conversation as plain text.
        let request = GenerateRequest {
            prompt: request
                .prompt
                .clone()
                .for_model(loaded.card.has_chat_template),
            ..request.clone()
        };
        let mut hooks = GenHooks {
            sink,
            queue: Queue {
                rx: &self.rx,
                shared: &self.shared,
                cancel,
                deferred: &mut self.deferred,
                probe: &mut self.probe,
            },
            done: None,
        };
        generate::generate(
            &loaded.model,
            &loaded.tokenizer,
            &mut loaded.session,
            &request,
            cancel.flag(),
            &mut hooks,
        )?;
        Ok(hooks.done)
    }

    fn compare(
        &mut self,
        request: &CompareRequest,
        sink: &mut CompareSink,
        cancel: &CancelToken,
    ) -> Result<Option<compare::CompareFidelity>, JobError> {
        let Loaded {
            model,
            tokenizer,
            session,
            card,
            ..
        } = self.loaded.as_mut().ok_or_else(JobError::no_model)?;
        let request = CompareRequest {
            prompt: request.prompt.clone().for_model(card.has_chat_template),
            ..request.clone()
        };
        let mut hooks = CmpHooks {
            sink,
            session,
            queue: Queue {
                rx: &self.rx,
                shared: &self.shared,
                cancel,
                deferred: &mut self.deferred,
                probe: &mut self.probe,
            },
        };
        Ok(compare::run(
            model,
            tokenizer,
            &request,
            cancel.flag(),
            &mut hooks,
        )?)
    }
}

impl Loaded {
    /// The weights' identity, computed once.
    fn identity(&mut self) -> Result<String, JobError> {
        if let Some(id) = &self.identity {
            return Ok(id.clone());
        }
        let id = crate::kv::persist::weights_identity(&self.weights)?;
        self.identity = Some(id.clone());
        Ok(id)
    }
}

impl Worker {
    fn save_cache(&mut self, path: &std::path::Path) -> Result<CacheFileInfo, JobError> {
        let started = std::time::Instant::now();
        let loaded = self.loaded.as_mut().ok_or_else(JobError::no_model)?;
        let identity = loaded.identity()?;
        let bytes = loaded.session.save_cache(path, &identity)?;
        Ok(CacheFileInfo {
            path: path.to_path_buf(),
            bytes,
            tokens: loaded.session.len(),
            token_ids: loaded.session.history().to_vec(),
            pending: loaded.session.pending().to_vec(),
            spec: loaded.session.policy().spec_string(),
            secs: started.elapsed().as_secs_f64(),
        })
    }

    fn restore_cache(&mut self, path: &std::path::Path) -> Result<CacheFileInfo, JobError> {
        let started = std::time::Instant::now();
        let loaded = self.loaded.as_mut().ok_or_else(JobError::no_model)?;
        let identity = loaded.identity()?;
        match loaded
            .session
            .restore_cache_as_saved(&loaded.model, path, &identity)
        {
            Ok(header) => Ok(CacheFileInfo {
                path: path.to_path_buf(),
                bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
                tokens: header.seq_len,
                token_ids: header.tokens,
                pending: header.pending,
                spec: header.spec,
                secs: started.elapsed().as_secs_f64(),
            }),
            Err(e) => {
                let mut err = JobError::from(e);
                if err.code == ErrorCode::CacheCorrupt {
                    // Set aside, never deleted: the user may want to look at it.
                    let mut aside = path.as_os_str().to_os_string();
                    aside.push(".corrupt");
                    if std::fs::rename(path, &aside).is_ok() {
                        err.message.push_str(&format!(
                            " (set aside as {})",
                            std::path::Path::new(&aside).display()
                        ));
                    }
                }
                Err(err)
            }
        }
    }
}

/// Switches the session's cache to `policy` if the switch fits the memory budget (checked
/// on the plan, before anything is converted) and returns the timeline marker.
fn checked_switch(
    session: &mut Session,
    policy: &PrecisionPolicy,
    budget: &Mutex<MemoryBudget>,
    probe: &mut RssProbe,
) -> Result<SwitchEvent, JobError> {
    let plan = session.plan_switch(policy)?;
    let fit = switch_fit(&plan, &lock(budget));
    if !fit.fits {
        return Err(JobError::new(
            ErrorCode::OutOfMemory,
            fit.message(&format!("switch the KV cache to {}", fit.spec)),
        ));
    }
    Ok(session.switch(&plan, probe)?)
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
    }
}

/// Requests (generations and comparisons) waiting in `deferred`.
fn queued_requests(deferred: &VecDeque<Job>) -> usize {
    deferred
        .iter()
        .filter(|j| matches!(j, Job::Generate { .. } | Job::Compare { .. }))
        .count()
}

/// The engine's queue as a running job sees it: between steps it applies cancels and cache
/// switches, moves a shutdown to the front, queues requests in arrival order (up to
/// [`MAX_QUEUED`]; past it they are refused as `queue_full`), and refuses the jobs that would
/// change the model or the conversation under the running one (`busy`).
struct Queue<'a> {
    rx: &'a Receiver<Job>,
    shared: &'a Shared,
    cancel: &'a CancelToken,
    deferred: &'a mut VecDeque<Job>,
    probe: &'a mut RssProbe,
}

impl Queue<'_> {
    /// Queues a request behind the running one, or refuses it when the queue is full.
    fn enqueue(&mut self, job: Job) {
        let queued = queued_requests(self.deferred);
        if queued < MAX_QUEUED {
            self.deferred.push_back(job);
            lock(&self.shared.status).queued = queued + 1;
            return;
        }
        let e = JobError::queue_full();
        match job {
            Job::Generate { mut sink, .. } => sink(e.to_event()),
            Job::Compare { mut sink, .. } => sink(CompareEvent::Error {
                code: e.code,
                message: e.message,
            }),
            _ => {}
        }
    }

    fn between_steps(&mut self, session: &mut Session) {
        {
            // Live context figures for status queries during a long generation.
            let memory = session.memory();
            let mut st = lock(&self.shared.status);
            st.context_tokens = session.len();
            st.kv = KvBytes::from_report(&memory);
            st.policy = session.policy().clone();
        }
        while let Ok(job) = self.rx.try_recv() {
            match job {
                Job::Cancel => self.cancel.cancel(),
                Job::SwitchCache { policy, reply } => {
                    let _ = reply.send(checked_switch(
                        session,
                        &policy,
                        &self.shared.budget,
                        self.probe,
                    ));
                }
                Job::Shutdown => {
                    self.cancel.cancel();
                    self.deferred.push_front(Job::Shutdown);
                }
                Job::Load { mut sink, .. } => sink(JobError::busy("load a model").to_event()),
                job @ (Job::Generate { .. } | Job::Compare { .. }) => self.enqueue(job),
                Job::Reset { reply } => {
                    let _ = reply.send(Err(JobError::busy("reset")));
                }
                Job::Unload { reply } => {
                    let _ = reply.send(Err(JobError::busy("unload")));
                }
                Job::SaveCache { reply, .. } => {
                    let _ = reply.send(Err(JobError::busy("save the cache")));
                }
                Job::RestoreCache { reply, .. } => {
                    let _ = reply.send(Err(JobError::busy("restore a cache")));
                }
            }
        }
    }
}

/// A generation's view of the engine: forwards events to the job's sink (all but `done`)
/// and drains the queue between tokens.
struct GenHooks<'a> {
    sink: &'a mut EventSink,
    queue: Queue<'a>,
    /// The `done` event, held back until the status snapshot is current.
    done: Option<Event>,
}

impl Hooks for GenHooks<'_> {
    fn emit(&mut self, event: Event) {
        match event {
            Event::Done { .. } => self.done = Some(event),
            other => (self.sink)(other),
        }
    }

    fn between_steps(&mut self, session: &mut Session) {
        self.queue.between_steps(session);
    }

    fn admit(
        &mut self,
        model: &Model,
        session: &Session,
        tokens: usize,
    ) -> Result<(), GenerateError> {
        let fit = Plan {
            config: model.config(),
            weights_bytes: 0,
            held_kv_bytes: session.memory().total.0 as u64,
            context: tokens,
            policy: session.policy(),
            rewind_margin: session.cache().rewind_margin(),
        }
        .fit(&lock(&self.queue.shared.budget))?;
        if fit.fits {
            return Ok(());
        }
        Err(GenerateError::OutOfMemory(
            fit.message("grow the conversation's context"),
        ))
    }
}

/// A comparison's view of the engine: forwards its events and drains the queue between
/// rounds (cache switches apply to the chat session, which the comparison leaves alone).
struct CmpHooks<'a> {
    sink: &'a mut CompareSink,
    session: &'a mut Session,
    queue: Queue<'a>,
}

impl CompareHooks for CmpHooks<'_> {
    fn emit(&mut self, event: CompareEvent) {
        (self.sink)(event)
    }

    fn between_steps(&mut self) {
        self.queue.between_steps(self.session);
    }

    fn admit(
        &mut self,
        model: &Model,
        tokens: usize,
        policies: &[PrecisionPolicy; 2],
    ) -> Result<(), GenerateError> {
        // Two fresh caches of `tokens` each, on top of what is held now.
        let budget = *lock(&self.queue.shared.budget);
        let mut needed = 0u64;
        for policy in policies {
            needed = needed.saturating_add(estimate_kv_bytes(model.config(), policy, tokens, 0)?);
        }
        let usable = budget.available().saturating_sub(budget.margin());
        if needed <= usable {
            return Ok(());
        }
        Err(GenerateError::OutOfMemory(format!(
            "not enough memory to compare two caches of {tokens} tokens: they need {}, {} is \
             available and {} of it is kept free; ask for fewer tokens",
            format_bytes(needed),
            format_bytes(budget.available()),
            format_bytes(budget.margin()),
        )))
    }

    fn kv_room(&mut self) -> u64 {
        let budget = *lock(&self.queue.shared.budget);
        budget.available().saturating_sub(budget.margin())
    }
}
