//! The engine thread's loop: takes jobs in order, owns the loaded model, and keeps the shared
//! status snapshot current.

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use super::card::model_card;
use super::error::{JobError, LoadError};
use super::{lock, CancelToken, EventSink, Job, LoadRequest, Shared};
use crate::events::{Event, LoadPhase, ModelCard};
use crate::generate::{self, tokenizer_family, GenerateRequest, Hooks};
use crate::kv::{KvMemoryReport, PrecisionPolicy};
use crate::model::Model;
use crate::session::Session;
use crate::tokenizer::GemmaTokenizer;

struct Loaded {
    model: Model,
    tokenizer: GemmaTokenizer,
    session: Session,
    card: ModelCard,
}

pub(super) struct Worker {
    rx: Receiver<Job>,
    shared: Arc<Shared>,
    loaded: Option<Loaded>,
    /// The policy for the next load when no model is loaded.
    policy: PrecisionPolicy,
    /// Jobs that arrived during a generation and run after it.
    deferred: VecDeque<Job>,
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
        }
    }

    pub(super) fn run(mut self) {
        loop {
            let job = match self.deferred.pop_front() {
                Some(j) => j,
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
                self.begin(&cancel);
                let result = self.load(request, &mut sink, &cancel);
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
                self.begin(&cancel);
                let last = match self.generate(&request, &mut sink, &cancel) {
                    Ok(done) => done,
                    Err(e) => Some(e.to_event()),
                };
                self.end();
                if let Some(ev) = last {
                    sink(ev);
                }
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
                    Some(l) => switch(l, &policy),
                    None => {
                        self.policy = policy;
                        Ok(empty_report())
                    }
                };
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

    fn begin(&mut self, cancel: &CancelToken) {
        *lock(&self.shared.active) = Some(cancel.clone());
        lock(&self.shared.status).busy = true;
    }

    fn end(&mut self) {
        *lock(&self.shared.active) = None;
        self.publish();
    }

    /// Refreshes the status snapshot.
    fn publish(&self) {
        let mut s = lock(&self.shared.status);
        s.busy = false;
        match &self.loaded {
            Some(l) => {
                s.model = Some(l.card.clone());
                s.context_tokens = l.session.len();
                s.kv_bytes = l.session.memory().total.0;
                s.policy = l.session.policy().clone();
            }
            None => {
                s.model = None;
                s.context_tokens = 0;
                s.kv_bytes = 0;
                s.policy = self.policy.clone();
            }
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
        let model = Model::load(&resolved.weights, &request.options).map_err(LoadError::Model)?;
        sink(loading(LoadPhase::Tokenizer));
        let family = tokenizer_family(model.config().family);
        let tokenizer = GemmaTokenizer::from_file(&resolved.tokenizer, family)?;
        let session = Session::new(&model, &request.policy).map_err(LoadError::Cache)?;
        let card = model_card(
            &resolved.name,
            &model,
            &resolved.weights,
            family.supports_thinking(),
        );
        // Only now is the previous model dropped: a failed load loses nothing.
        self.loaded = Some(Loaded {
            model,
            tokenizer,
            session,
            card: card.clone(),
        });
        Ok(card)
    }

    fn generate(
        &mut self,
        request: &GenerateRequest,
        sink: &mut EventSink,
        cancel: &CancelToken,
    ) -> Result<Option<Event>, JobError> {
        let loaded = self.loaded.as_mut().ok_or_else(JobError::no_model)?;
        let mut hooks = GenHooks {
            sink,
            rx: &self.rx,
            shared: &self.shared,
            cancel,
            deferred: &mut self.deferred,
            done: None,
        };
        generate::generate(
            &loaded.model,
            &loaded.tokenizer,
            &mut loaded.session,
            request,
            cancel.flag(),
            &mut hooks,
        )?;
        Ok(hooks.done)
    }
}

fn switch(l: &mut Loaded, policy: &PrecisionPolicy) -> Result<KvMemoryReport, JobError> {
    l.session.switch_policy(&l.model, policy)?;
    Ok(l.session.memory())
}

fn empty_report() -> KvMemoryReport {
    KvMemoryReport {
        layers: Vec::new(),
        sliding: (0, 0),
        full: (0, 0),
        total: (0, 0),
    }
}

/// A generation's view of the engine: forwards events to the job's sink (all but `done`) and, between
/// tokens, drains the queue (cancel and cache switches apply; model jobs are refused).
struct GenHooks<'a> {
    sink: &'a mut EventSink,
    rx: &'a Receiver<Job>,
    shared: &'a Shared,
    cancel: &'a CancelToken,
    deferred: &'a mut VecDeque<Job>,
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

    fn between_steps(&mut self, model: &Model, session: &mut Session) {
        {
            // Live context figures for status queries during a long generation.
            let mut st = lock(&self.shared.status);
            st.context_tokens = session.len();
            st.kv_bytes = session.memory().total.0;
        }
        while let Ok(job) = self.rx.try_recv() {
            match job {
                Job::Cancel => self.cancel.cancel(),
                Job::SwitchCache { policy, reply } => {
                    let r = session
                        .switch_policy(model, &policy)
                        .map(|()| session.memory())
                        .map_err(JobError::from);
                    let _ = reply.send(r);
                }
                Job::Shutdown => {
                    self.cancel.cancel();
                    self.deferred.push_back(Job::Shutdown);
                }
                Job::Load { mut sink, .. } => sink(JobError::busy("load a model").to_event()),
                Job::Generate { mut sink, .. } => {
                    sink(JobError::busy("start another generation").to_event())
                }
                Job::Reset { reply } => {
                    let _ = reply.send(Err(JobError::busy("reset")));
                }
                Job::Unload { reply } => {
                    let _ = reply.send(Err(JobError::busy("unload")));
                }
            }
        }
    }
}
