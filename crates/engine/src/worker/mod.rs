//! The engine thread: one dedicated std thread owns the model, its tokenizer and its KV cache;
//! jobs come in over a std channel, and each job carries its own event sink (mistral.rs
//! style), so the app can forward to an IPC channel and the CLI to stdout. Status is readable
//! at any time without waiting for a running generation.
//!
//! Between two generated tokens the thread looks at its queue: `Cancel` and `SwitchCache`
//! take effect there (control jobs never wait); generations and comparisons wait in a FIFO
//! queue of at most [`MAX_QUEUED`] (`queue_full` past it); loads, resets and unloads, which
//! would change what the running job stands on, answer `busy`.
//!
//! [`EngineHandle::stream`] is the one way a front end runs a request: events go to its
//! callback until the request ends, and a callback that returns false (its client is gone)
//! cancels that request, running or still queued, and no other.
//!
//! Besides generation the thread runs side-by-side comparisons of two cache policies
//! ([`crate::compare`]). Nothing that only reads waits for it: the loaded tokenizer and
//! configuration are shared, so token counts ([`EngineHandle::count_tokens`]), context and
//! document costs ([`EngineHandle::context_costs`], [`EngineHandle::document_fits`]) and memory
//! timeline points ([`EngineHandle::memory_sample`]) are answered on the caller's thread. The
//! engine's [`Activity`] goes to a listener on every change (a status bar).

mod error;
mod run;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

pub use error::{JobError, LoadError};

pub use crate::budget::MemoryBudget;

use crate::card::MemoryEstimate;
use crate::card::ModelCard;
use crate::compare::{CompareEvent, CompareRequest};
use crate::config::ModelConfig;
use crate::events::{Activity, ErrorCode, Event};
use crate::generate::session::REWIND_MARGIN;
use crate::generate::{self, GenerateRequest, Prompt, PromptPreview};
use crate::kv::{CacheSelection, PrecisionPolicy};
use crate::memory::{
    context_costs, document_fits, ContextCost, DocumentFit, KvBytes, MemorySample, RssProbe,
    SwitchEvent,
};
use crate::model::LoadOptions;
use crate::source::ModelSource;
use crate::tokenizer::GemmaTokenizer;

/// Where a job's events go. Called on the engine thread; keep it quick (forward, don't work).
pub type EventSink = Box<dyn FnMut(Event) + Send + 'static>;

/// Where a comparison's events go (on the engine thread, like [`EventSink`]).
pub type CompareSink = Box<dyn FnMut(CompareEvent) + Send + 'static>;

/// A shared flag that stops a running job before its next token (or download chunk).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A fresh, unset token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the job to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The flag itself.
    pub fn flag(&self) -> &AtomicBool {
        &self.0
    }
}

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    /// The model.
    pub source: ModelSource,
    /// An explicit `tokenizer.json` (else found beside the model, or the Gemma asset).
    pub tokenizer: Option<PathBuf>,
    /// Device and dtype.
    pub options: LoadOptions,
    /// KV storage precision per layer.
    pub policy: PrecisionPolicy,
    /// Tokens the caller means to hold (clipped to the model's context): the load is refused,
    /// before any weight is read, when the weights and the KV cache of this context do not
    /// fit the memory available ([`MemoryBudget`]).
    pub context: usize,
}

/// The context a load is checked for unless the caller says otherwise.
pub const DEFAULT_LOAD_CONTEXT: usize = 4096;

impl LoadRequest {
    /// Loads `source` on the CPU in f32 with an f16 KV cache, checked for a context of
    /// [`DEFAULT_LOAD_CONTEXT`] tokens.
    pub fn new(source: ModelSource) -> Self {
        Self {
            source,
            tokenizer: None,
            options: LoadOptions::default(),
            policy: PrecisionPolicy::default(),
            context: DEFAULT_LOAD_CONTEXT,
        }
    }
}

/// Requests that may wait behind the running one; one more is refused as `queue_full`.
pub const MAX_QUEUED: usize = 16;

/// A request to the engine thread.
pub enum Job {
    /// Load a model (replacing the current one only once the new one is ready).
    Load {
        /// What to load.
        request: LoadRequest,
        /// Receives `loading`, then `loaded` or `error`.
        sink: EventSink,
        /// Stops a download.
        cancel: CancelToken,
    },
    /// Generate a reply.
    Generate {
        /// The request.
        request: GenerateRequest,
        /// Receives `token`/`thinking` deltas, `stats`, then `done`; or one `error`.
        sink: EventSink,
        /// Checked before every token.
        cancel: CancelToken,
    },
    /// Run one prompt through two cache policies side by side, then score their fidelity.
    Compare {
        /// The request.
        request: CompareRequest,
        /// Receives `pane` events, then `finished`; or one `error`.
        sink: CompareSink,
        /// Checked before every round.
        cancel: CancelToken,
    },
    /// Stop the running generation (also reachable directly through [`EngineHandle::cancel`]).
    Cancel,
    /// Forget the conversation held in the cache.
    Reset {
        /// The outcome.
        reply: Sender<Result<(), JobError>>,
    },
    /// Re-encode the cache in another precision (between two tokens when generating),
    /// answered with the timeline marker: policies, bytes and resident memory before and
    /// after, and the conversion's wall time.
    SwitchCache {
        /// The new precisions.
        policy: PrecisionPolicy,
        /// The switch marker.
        reply: Sender<Result<SwitchEvent, JobError>>,
    },
    /// Save the conversation's cache to a file, in the precision it holds.
    SaveCache {
        /// Where (written atomically).
        path: PathBuf,
        /// What was written.
        reply: Sender<Result<CacheFileInfo, JobError>>,
    },
    /// Replace the conversation's cache with a saved one (all checks first; on any error the
    /// conversation is as it was, and a corrupt file is set aside).
    RestoreCache {
        /// The file.
        path: PathBuf,
        /// What was restored.
        reply: Sender<Result<CacheFileInfo, JobError>>,
    },
    /// Drop the model.
    Unload {
        /// The outcome.
        reply: Sender<Result<(), JobError>>,
    },
    /// Stop the thread.
    Shutdown,
}

/// A saved cache file, as written or restored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheFileInfo {
    /// The file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Tokens the cache holds.
    pub tokens: usize,
    /// Their ids, in order.
    pub token_ids: Vec<u32>,
    /// Ids sampled after them but not run yet (a continuation runs them first).
    pub pending: Vec<u32>,
    /// The cache policy, as its canonical SPEC.
    pub spec: String,
    /// Seconds the save or restore took.
    pub secs: f64,
}

/// A snapshot of the engine's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStatus {
    /// The loaded model's card.
    pub model: Option<ModelCard>,
    /// A job is running (load or generate).
    pub busy: bool,
    /// Tokens in the cache.
    pub context_tokens: usize,
    /// The cache precisions (of the loaded model, or for the next load).
    pub policy: PrecisionPolicy,
    /// Bytes of the loaded model's weights as held (0 without a model).
    #[serde(default)]
    pub weights_bytes: u64,
    /// The cache's bytes: per layer, kind and precision, used and allocated (the one shape
    /// KV bytes take outside the cache).
    #[serde(default)]
    pub kv: KvBytes,
    /// What the engine is doing, for a status bar.
    pub activity: Activity,
    /// Requests waiting behind the running one.
    #[serde(default)]
    pub queued: usize,
}

/// Called with the engine's activity whenever it changes (on the engine thread: keep it
/// quick).
pub type ActivityListener = Box<dyn Fn(&Activity) + Send + Sync + 'static>;

pub(crate) struct Shared {
    status: Mutex<EngineStatus>,
    /// Cancel token of the running job.
    active: Mutex<Option<CancelToken>>,
    /// The loaded model's tokenizer, for callers that count tokens without the thread.
    tokenizer: Mutex<Option<Arc<GemmaTokenizer>>>,
    /// The loaded model's configuration, for cost queries without the thread.
    config: Mutex<Option<Arc<ModelConfig>>>,
    /// Told of every activity change.
    listener: Mutex<Option<ActivityListener>>,
    /// Tokens the next loaded session keeps beyond the sliding windows.
    rewind_margin: AtomicUsize,
    /// What loads and growing contexts must fit in.
    budget: Mutex<MemoryBudget>,
}

/// Locks, recovering from a poisoned mutex (the data is a plain snapshot, always valid).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the engine thread.
pub struct Engine;

impl Engine {
    /// Spawns the engine thread and returns its handle.
    pub fn spawn() -> Result<EngineHandle, JobError> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            status: Mutex::new(EngineStatus {
                model: None,
                busy: false,
                context_tokens: 0,
                policy: PrecisionPolicy::default(),
                weights_bytes: 0,
                kv: KvBytes::default(),
                activity: Activity::NoModel,
                queued: 0,
            }),
            active: Mutex::new(None),
            tokenizer: Mutex::new(None),
            config: Mutex::new(None),
            listener: Mutex::new(None),
            rewind_margin: AtomicUsize::new(REWIND_MARGIN),
            budget: Mutex::new(MemoryBudget::default()),
        });
        let worker_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("kvlab-engine".into())
            .spawn(move || run::Worker::new(rx, worker_shared).run())
            .map_err(|e| JobError::new(ErrorCode::Internal, e.to_string()))?;
        Ok(EngineHandle {
            tx,
            shared,
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }
}

/// The way in: cheap to clone, usable from any thread (Tauri state holds one).
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Job>,
    shared: Arc<Shared>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl EngineHandle {
    /// Sends a raw job.
    pub fn send(&self, job: Job) -> Result<(), JobError> {
        self.tx.send(job).map_err(|_| JobError::stopped())
    }

    /// Starts loading; events go to `sink`. Returns the token that cancels a download.
    pub fn load(&self, request: LoadRequest, sink: EventSink) -> Result<CancelToken, JobError> {
        let cancel = CancelToken::new();
        self.send(Job::Load {
            request,
            sink,
            cancel: cancel.clone(),
        })?;
        Ok(cancel)
    }

    /// Loads and waits; `on_event` sees the `loading` events on the calling thread.
    pub fn load_blocking(
        &self,
        request: LoadRequest,
        mut on_event: impl FnMut(&Event),
    ) -> Result<ModelCard, JobError> {
        let (tx, rx) = mpsc::channel();
        self.load(request, channel_sink(tx))?;
        for ev in rx {
            on_event(&ev);
            match ev {
                Event::Loaded { card } => return Ok(card),
                Event::Error { code, message } => return Err(JobError::new(code, message)),
                _ => {}
            }
        }
        Err(JobError::stopped())
    }

    /// Starts a generation; events go to `sink`. Returns its cancel token.
    pub fn generate(
        &self,
        request: GenerateRequest,
        sink: EventSink,
    ) -> Result<CancelToken, JobError> {
        let cancel = CancelToken::new();
        self.send(Job::Generate {
            request,
            sink,
            cancel: cancel.clone(),
        })?;
        Ok(cancel)
    }

    /// Runs a generation, queued behind any running one: `on_event` gets its events on the
    /// engine thread (keep it quick: forward them) until `done` or `error`; returning false
    /// (the caller's client is gone) cancels this request and no other. Returns its cancel
    /// token (a stop button's).
    pub fn stream(
        &self,
        request: GenerateRequest,
        mut on_event: impl FnMut(Event) -> bool + Send + 'static,
    ) -> Result<CancelToken, JobError> {
        let cancel = CancelToken::new();
        let own = cancel.clone();
        self.send(Job::Generate {
            request,
            sink: Box::new(move |ev| {
                if !on_event(ev) {
                    own.cancel();
                }
            }),
            cancel: cancel.clone(),
        })?;
        Ok(cancel)
    }

    /// [`EngineHandle::stream`], waiting on the calling thread until the request ends: `Ok`
    /// after `done`, the job's error after `error`. `on_event` sees every event first.
    pub fn stream_blocking(
        &self,
        request: GenerateRequest,
        on_event: impl FnMut(Event) -> bool + Send + 'static,
    ) -> Result<(), JobError> {
        let (tx, rx) = mpsc::channel();
        let mut on_event = on_event;
        self.stream(request, move |ev| {
            let end = match &ev {
                Event::Done { .. } => Some(Ok(())),
                Event::Error { code, message } => Some(Err(JobError::new(*code, message))),
                _ => None,
            };
            let keep = on_event(ev);
            if let Some(end) = end {
                let _ = tx.send(end);
            }
            keep
        })?;
        rx.recv().unwrap_or_else(|_| Err(JobError::stopped()))
    }

    /// Starts a generation whose events arrive on the returned receiver (ends after `done`
    /// or `error`); dropping the receiver cancels it ([`EngineHandle::stream`]).
    pub fn generate_channel(
        &self,
        request: GenerateRequest,
    ) -> Result<(Receiver<Event>, CancelToken), JobError> {
        let (tx, rx) = mpsc::channel();
        let cancel = self.stream(request, move |ev| tx.send(ev).is_ok())?;
        Ok((rx, cancel))
    }

    /// Starts a side-by-side comparison; events go to `sink`. Returns its cancel token.
    pub fn compare(
        &self,
        request: CompareRequest,
        sink: CompareSink,
    ) -> Result<CancelToken, JobError> {
        let cancel = CancelToken::new();
        self.send(Job::Compare {
            request,
            sink,
            cancel: cancel.clone(),
        })?;
        Ok(cancel)
    }

    /// Runs a comparison, queued like a generation, waiting on the calling thread until it
    /// ends: `Ok` after `finished`, its error after `error`. `on_event` (on the engine
    /// thread) sees every event first; returning false cancels this comparison.
    pub fn compare_blocking(
        &self,
        request: CompareRequest,
        mut on_event: impl FnMut(CompareEvent) -> bool + Send + 'static,
    ) -> Result<(), JobError> {
        let (tx, rx) = mpsc::channel();
        let cancel = CancelToken::new();
        let own = cancel.clone();
        self.send(Job::Compare {
            request,
            sink: Box::new(move |ev| {
                let end = match &ev {
                    CompareEvent::Finished { .. } => Some(Ok(())),
                    CompareEvent::Error { code, message } => {
                        Some(Err(JobError::new(*code, message)))
                    }
                    CompareEvent::Pane { .. }
                    | CompareEvent::SweepPoint { .. }
                    | CompareEvent::Scoring { .. } => None,
                };
                if !on_event(ev) {
                    own.cancel();
                }
                if let Some(end) = end {
                    let _ = tx.send(end);
                }
            }),
            cancel,
        })?;
        rx.recv().unwrap_or_else(|_| Err(JobError::stopped()))
    }

    /// Starts a comparison whose events arrive on the returned receiver (ends after
    /// `finished` or `error`).
    pub fn compare_channel(
        &self,
        request: CompareRequest,
    ) -> Result<(Receiver<CompareEvent>, CancelToken), JobError> {
        let (tx, rx) = mpsc::channel();
        let cancel = self.compare(
            request,
            Box::new(move |ev| {
                let _ = tx.send(ev);
            }),
        )?;
        Ok((rx, cancel))
    }

    /// The loaded model's tokenizer (shared; encoding with it never waits for the engine).
    pub fn tokenizer(&self) -> Option<Arc<GemmaTokenizer>> {
        lock(&self.shared.tokenizer).clone()
    }

    /// Tokens `text` takes on its own (no `<bos>`), counted on the calling thread.
    pub fn count_tokens(&self, text: &str) -> Result<usize, JobError> {
        let tokenizer = self.tokenizer().ok_or_else(JobError::no_model)?;
        let ids = tokenizer
            .encode(text, false)
            .map_err(|e| JobError::new(ErrorCode::BadTokenizer, e.to_string()))?;
        Ok(ids.len())
    }

    /// `prompt` as the loaded model would read it (rendered by its chat template, or as plain
    /// text for a base model, exactly as a generation would), on the calling thread.
    pub fn preview_prompt(&self, prompt: Prompt) -> Result<PromptPreview, JobError> {
        let tokenizer = self.tokenizer().ok_or_else(JobError::no_model)?;
        let prompt = prompt.for_model(Some(tokenizer.template().is_some()));
        Ok(generate::preview_prompt(&tokenizer, &prompt)?)
    }

    /// Tokens sessions keep beyond their sliding windows so a turn can be rewound (and an
    /// answer regenerated) without prefilling again; applies from the next load.
    pub fn set_rewind_margin(&self, tokens: usize) {
        self.shared.rewind_margin.store(tokens, Ordering::Relaxed);
    }

    /// Sets what loads and growing contexts must fit in (the system's available memory by
    /// default; a fixed figure makes tests independent of the machine).
    pub fn set_memory_budget(&self, budget: MemoryBudget) {
        *lock(&self.shared.budget) = budget;
    }

    /// What loads and growing contexts must fit in now.
    pub fn memory_budget(&self) -> MemoryBudget {
        *lock(&self.shared.budget)
    }

    /// A memory timeline point from the status snapshot (never waits for a generation):
    /// the conversation's exact KV bytes, the weights, and the process's resident set.
    pub fn memory_sample(&self, t_ms: u64, probe: &mut RssProbe) -> MemorySample {
        let s = self.status();
        MemorySample {
            t_ms,
            tokens_in_context: s.context_tokens,
            kv: s.kv,
            weights_bytes: s.weights_bytes,
            rss_bytes: probe.rss_bytes(),
            cache_spec: s.policy.spec_string(),
        }
    }

    /// Cancels the running job, if any (takes effect before its next token).
    pub fn cancel(&self) {
        if let Some(t) = lock(&self.shared.active).as_ref() {
            t.cancel();
        }
        // The queue copy matters only if the job has not started yet; a stopped engine has
        // nothing to cancel.
        let _ = self.tx.send(Job::Cancel);
    }

    /// Forgets the conversation in the cache.
    pub fn reset(&self) -> Result<(), JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::Reset { reply })?;
        rx.recv().map_err(|_| JobError::stopped())?
    }

    /// Re-encodes the cache in `policy` (applied between two tokens if generating) and
    /// returns the switch marker (policies, bytes before and after, conversion time) for a
    /// memory timeline. Without a model, sets the policy for the next load.
    pub fn switch_cache(&self, policy: PrecisionPolicy) -> Result<SwitchEvent, JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::SwitchCache { policy, reply })?;
        rx.recv().map_err(|_| JobError::stopped())?
    }

    /// Calls `listener` with the engine's activity now and on every change.
    pub fn on_activity(&self, listener: ActivityListener) {
        listener(&self.status().activity);
        *lock(&self.shared.listener) = Some(listener);
    }

    fn loaded_config(&self) -> Result<Arc<ModelConfig>, JobError> {
        lock(&self.shared.config)
            .clone()
            .ok_or_else(JobError::no_model)
    }

    fn rewind_margin(&self) -> usize {
        self.shared.rewind_margin.load(Ordering::Relaxed)
    }

    /// The KV bytes a context of `tokens` would hold under every preset, on the loaded
    /// model (never waits for a generation).
    pub fn context_costs(&self, tokens: usize) -> Result<Vec<ContextCost>, JobError> {
        let config = self.loaded_config()?;
        Ok(context_costs(&config, tokens, self.rewind_margin()))
    }

    /// What each of `documents` (token counts, in attachment order) adds to the current
    /// conversation under every preset, and whether it still fits with `reserve` tokens
    /// left for the answer (never waits for a generation).
    pub fn document_fits(
        &self,
        documents: &[usize],
        reserve: usize,
    ) -> Result<Vec<DocumentFit>, JobError> {
        let config = self.loaded_config()?;
        let context = self.status().context_tokens;
        Ok(document_fits(
            &config,
            context,
            documents,
            reserve,
            self.rewind_margin(),
        ))
    }

    /// The memory the model at `path`, loaded with `options`, would need for `context`
    /// tokens in the cache `selection` picks, with this engine's rewind margin, and whether
    /// that fits its [`MemoryBudget`]. Reads headers only, on the calling thread.
    pub fn estimate(
        &self,
        path: &std::path::Path,
        options: &LoadOptions,
        context: usize,
        selection: &CacheSelection,
    ) -> Result<MemoryEstimate, JobError> {
        Ok(crate::card::estimate(
            path,
            options,
            context,
            selection,
            self.rewind_margin(),
            &self.memory_budget(),
        )?)
    }

    /// Saves the conversation's cache to `path` (blocks until written).
    pub fn save_cache(&self, path: impl Into<PathBuf>) -> Result<CacheFileInfo, JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::SaveCache {
            path: path.into(),
            reply,
        })?;
        rx.recv().map_err(|_| JobError::stopped())?
    }

    /// Restores the conversation's cache from `path` (blocks until done). Errors are
    /// `cache_mismatch` (another model, policy or format version) and `cache_corrupt` (the
    /// file was set aside as `<name>.corrupt`); either way the conversation is as it was.
    pub fn restore_cache(&self, path: impl Into<PathBuf>) -> Result<CacheFileInfo, JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::RestoreCache {
            path: path.into(),
            reply,
        })?;
        rx.recv().map_err(|_| JobError::stopped())?
    }

    /// Drops the model.
    pub fn unload(&self) -> Result<(), JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::Unload { reply })?;
        rx.recv().map_err(|_| JobError::stopped())?
    }

    /// The engine's state now (never waits for a generation).
    pub fn status(&self) -> EngineStatus {
        lock(&self.shared.status).clone()
    }

    /// Stops the running job and the thread, and waits for it to end.
    pub fn shutdown(&self) {
        if let Some(t) = lock(&self.shared.active).as_ref() {
            t.cancel();
        }
        let _ = self.tx.send(Job::Shutdown);
        if let Some(t) = lock(&self.thread).take() {
            // A panic on the engine thread has already been reported by the panic hook.
            let _ = t.join();
        }
    }
}

/// A sink that forwards events into a std channel (dropped receivers are ignored).
pub fn channel_sink(tx: Sender<Event>) -> EventSink {
    Box::new(move |ev| {
        let _ = tx.send(ev);
    })
}
