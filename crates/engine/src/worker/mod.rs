//! The engine thread and the way in. One dedicated std thread owns the model and the pool of
//! conversations ([`crate::conversations`]); it steps sequences as llama.cpp steps sequence
//! ids: it picks the next running request (round robin, up to [`MAX_RUNNING`] at once, one
//! per conversation), runs one step of it (a prefill chunk, a token, a scoring chunk), sends
//! that request's events to its own sink, and answers control jobs (cancel, switch, save,
//! restore, status) between steps. Requests never own the loop, and nothing calls back into
//! it.
//!
//! There is one way to submit a request: [`EngineHandle::submit`] (a [`Ticket`] whose events
//! arrive on a channel) or [`EngineHandle::submit_with`] (events to a callback, for async
//! front ends). A chat request's prompt is rendered and tokenized right there, on the
//! caller's thread, and checked against the context before it is queued; at most
//! [`MAX_QUEUED`] requests wait (`queue_full` past it, refused the moment they arrive), and a
//! request whose ticket is dropped (its client left) frees its place at once, queued or
//! running.
//!
//! Reading never waits for the thread: the loaded tokenizer and configuration are shared,
//! so token counts, context and document costs, status and memory samples are answered on
//! the caller's thread. The engine's [`Activity`] goes to a listener on every change.

mod control;
mod error;
mod load;
mod places;
mod run;
mod start;
mod step;
mod submit;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

pub use error::JobError;
pub(crate) use places::client_of_id;
pub use places::PER_CLIENT_QUEUED;
pub use submit::{Submission, Ticket};

pub use crate::budget::MemoryBudget;
pub use crate::conversations::{PoolSettings, DEFAULT_DISK_BUDGET, DEFAULT_IDLE_TTL};

use crate::card::MemoryEstimate;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::source::ModelSource;
use crate::checkpoint::LoadOptions;
use crate::contract::ModelCard;
use crate::contract::{Activity, ErrorCode, Event};
use crate::contract::{ConversationId, ConversationInfo, SavedCache};

use crate::generate::session::REWIND_MARGIN;
use crate::generate::{self, Prompt, PromptPreview};
use crate::kv::{CacheSelection, PrecisionPolicy};
use crate::memory::{
    context_costs, document_fits, ContextCost, DocumentFit, KvBytes, MemorySample, RssProbe,
    SwitchEvent,
};
use crate::tokenizer::GemmaTokenizer;

/// Where a job's events go. Called on the engine thread; keep it quick (forward, don't work).
pub type EventSink = Box<dyn FnMut(Event) + Send + 'static>;

/// Where a comparison's events go (on the engine thread, like [`EventSink`]).
pub type CompareSink = Box<dyn FnMut(Event) + Send + 'static>;

/// A shared flag that stops a running job before its next step (or download chunk).
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
    /// The KV cache new conversations get.
    pub cache: CacheSelection,
    /// Tokens the caller means to hold (clipped to the model's context): the load is refused,
    /// before any weight is read, when the weights and the KV cache of this context do not
    /// fit the memory available ([`MemoryBudget`]).
    pub context: usize,
    /// The vision tower's mmproj GGUF for a GGUF model (else an `mmproj*.gguf` beside the
    /// model is used; a safetensors checkpoint carries its own).
    pub mmproj: Option<PathBuf>,
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
            cache: CacheSelection::Spec("f16".into()),
            context: DEFAULT_LOAD_CONTEXT,
            mmproj: None,
        }
    }
}

/// Requests that may wait to start; one more is refused as `queue_full`.
pub const MAX_QUEUED: usize = 16;

/// Requests that run at once (each in its own conversation), stepped in turn, unless the
/// pool's settings say otherwise ([`PoolSettings::parallel`]).
pub const MAX_RUNNING: usize = 4;

/// The most requests a setting may run at once.
pub const MAX_PARALLEL: usize = 64;

/// A control job: answered between two steps of the running requests.
pub(crate) enum Control {
    /// Stop the requests of a conversation (all of them: `None`).
    Cancel(Option<ConversationId>),
    /// Stop the comparisons.
    CancelCompares,
    /// Forget a conversation: its cache, and its file when `file`.
    Forget {
        conversation: ConversationId,
        file: bool,
        reply: Sender<Result<(), JobError>>,
    },
    /// Re-encode a conversation's cache in another precision (between two tokens when it
    /// is generating), answered with the timeline marker.
    SwitchCache {
        conversation: ConversationId,
        policy: PrecisionPolicy,
        reply: Sender<Result<SwitchEvent, JobError>>,
    },
    /// Write a conversation's cache to a file, in the precision it holds (its own spill file
    /// when `path` is `None`).
    SaveCache {
        conversation: ConversationId,
        path: Option<PathBuf>,
        reply: Sender<Result<CacheFileInfo, JobError>>,
    },
    /// Replace a conversation's cache with a saved one (its own spill file when `path` is
    /// `None`; all checks first; on any error the conversation is as it was, and a corrupt
    /// file is set aside).
    RestoreCache {
        conversation: ConversationId,
        path: Option<PathBuf>,
        reply: Sender<Result<CacheFileInfo, JobError>>,
    },
    /// Write every conversation in memory to its spill file (a quit).
    SaveAll { reply: Sender<Vec<SaveOutcome>> },
    /// The cache files the engine wrote that are there, with whose they are.
    /// (`only`: that conversation's alone, its header the only one read.)
    SavedCaches {
        only: Option<ConversationId>,
        reply: Sender<Result<Vec<(ConversationId, SavedCache)>, JobError>>,
    },
    /// Remove a conversation's own cache file (what it holds in memory stays).
    DropSavedCache {
        conversation: ConversationId,
        reply: Sender<Result<(), JobError>>,
    },
    /// The cache new conversations get.
    SetDefaultPolicy {
        policy: PrecisionPolicy,
        reply: Sender<Result<SwitchEvent, JobError>>,
    },
    /// Drop the model.
    Unload { reply: Sender<Result<(), JobError>> },
    /// Stop the thread.
    Shutdown,
}

/// A request to the engine thread.
pub(crate) enum Job {
    /// Load a model (replacing the current one only once the new one is ready).
    Load {
        request: LoadRequest,
        /// The policy `request.cache` selects (checked when submitted).
        policy: PrecisionPolicy,
        sink: EventSink,
        cancel: CancelToken,
    },
    /// A chat turn, its prompt already tokenized on the caller's thread.
    Generate(submit::Queued<submit::GenerateJob>),
    /// A side-by-side comparison.
    Compare(submit::Queued<submit::CompareJob>),
    /// Answered between steps.
    Control(Control),
}

/// A conversation's cache written to its own file (its bytes), or why not.
pub type SaveOutcome = (ConversationId, Result<u64, JobError>);

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
    /// Conversations whose own files a save removed to keep within the disk budget.
    pub dropped: Vec<ConversationId>,
}

impl CacheFileInfo {
    /// The file as the store lists it ([`EngineHandle::saved_caches`]).
    pub fn saved_cache(&self) -> SavedCache {
        SavedCache {
            bytes: self.bytes,
            tokens: self.tokens,
            spec: self.spec.clone(),
            saved_ms: crate::conversations::modified_ms(&self.path),
        }
    }
}

/// A snapshot of the engine's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStatus {
    /// The loaded model's card.
    pub model: Option<ModelCard>,
    /// A request is running.
    pub busy: bool,
    /// Tokens all conversations hold in memory.
    pub context_tokens: usize,
    /// The cache new conversations get.
    pub policy: PrecisionPolicy,
    /// Bytes of the loaded model's weights as held (0 without a model).
    #[serde(default)]
    pub weights_bytes: u64,
    /// All conversations' caches in memory: per layer kind and precision, used and allocated.
    #[serde(default)]
    pub kv: KvBytes,
    /// What the engine is doing, for a status bar.
    pub activity: Activity,
    /// Requests waiting to start.
    #[serde(default)]
    pub queued: usize,
    /// Requests running.
    #[serde(default)]
    pub running: usize,
    /// Every conversation: tier, tokens, bytes (no text).
    #[serde(default)]
    pub conversations: Vec<ConversationInfo>,
    /// The KV limit the pool keeps to now, and the bytes its files take on disk.
    #[serde(default)]
    pub kv_limit: u64,
}

/// What the pool did since the engine started, for `/metrics` and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounters {
    /// Turns whose cache was held in memory as its owner left it.
    pub held: u64,
    /// Turns whose cache was held demoted.
    pub demoted_hits: u64,
    /// Turns whose cache came back from disk.
    pub restored: u64,
    /// Turns that read their history again (a dropped cache, or rows decoded from codes).
    pub prefilled: u64,
    /// Conversations' first turns.
    pub new: u64,
    /// Demotions, spills and drops the pool made.
    pub demotions: u64,
    pub spills: u64,
    pub drops: u64,
}

/// The engine's forward passes since it started: how many, and the sequences and tokens
/// they ran together (their ratios are sequences and tokens per step), for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepCounters {
    /// Forward passes (steps) that ran at least one row.
    pub steps: u64,
    /// Sequences summed over the steps.
    pub sequences: u64,
    /// Rows (tokens) summed over the steps.
    pub tokens: u64,
    /// Steps that ran a prefill chunk beside other sequences' decodes.
    pub prefill_beside_decodes: u64,
    /// The last step's sequences and rows.
    pub last_sequences: u64,
    pub last_tokens: u64,
}

/// Called with the engine's activity whenever it changes (on the engine thread: keep it
/// quick).
pub type ActivityListener = Box<dyn Fn(&Activity) + Send + Sync + 'static>;

/// Markers kept for front ends that read them later ([`EngineHandle::markers_since`]).
const MARKERS_KEPT: usize = 256;

pub(crate) struct Shared {
    status: Mutex<EngineStatus>,
    /// The loaded model's tokenizer, for callers that render and count without the thread.
    tokenizer: Mutex<Option<Arc<GemmaTokenizer>>>,
    /// The loaded model's configuration, for cost queries without the thread.
    config: Mutex<Option<Arc<ModelConfig>>>,
    /// What the loaded model needs to read images (`None`: it reads none).
    vision: Mutex<Option<crate::images::ImageFacts>>,
    /// The images added for prompts, by id.
    images: Mutex<crate::images::ImageStore>,
    /// Told of every activity change.
    listener: Mutex<Option<ActivityListener>>,
    /// Tokens sessions keep beyond their sliding windows.
    rewind_margin: AtomicUsize,
    /// What loads and growing contexts must fit in.
    budget: Mutex<MemoryBudget>,
    /// The pool's settings.
    pool: Mutex<PoolSettings>,
    /// Requests submitted and not yet started, by client (the queue's bounds apply to these).
    places: Arc<Mutex<places::Places>>,
    /// The pool's markers (demotions, spills, restores, drops), newest last, numbered.
    markers: Mutex<(u64, std::collections::VecDeque<SwitchEvent>)>,
    /// What the pool did.
    counters: Mutex<PoolCounters>,
    /// What the steps ran.
    steps: Mutex<StepCounters>,
}

impl Shared {
    /// Requests waiting to start now.
    fn queued(&self) -> usize {
        lock(&self.places).waiting()
    }

    /// Puts the number of waiting requests in the status snapshot.
    fn publish_queued(&self) {
        let queued = self.queued();
        lock(&self.status).queued = queued;
    }
}

/// A `bad_image` refusal saying `why`.
fn bad_image(why: String) -> JobError {
    JobError::new(ErrorCode::BadImage, why)
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
                running: 0,
                conversations: Vec::new(),
                kv_limit: 0,
            }),
            tokenizer: Mutex::new(None),
            config: Mutex::new(None),
            vision: Mutex::new(None),
            images: Mutex::new(crate::images::ImageStore::default()),
            listener: Mutex::new(None),
            rewind_margin: AtomicUsize::new(REWIND_MARGIN),
            budget: Mutex::new(MemoryBudget::default()),
            pool: Mutex::new(PoolSettings::default()),
            places: Arc::new(Mutex::new(places::Places::default())),
            markers: Mutex::new((0, std::collections::VecDeque::new())),
            counters: Mutex::new(PoolCounters::default()),
            steps: Mutex::new(StepCounters::default()),
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
    fn send(&self, job: Job) -> Result<(), JobError> {
        self.tx.send(job).map_err(|_| JobError::stopped())
    }

    /// Sends a control job and waits for its reply.
    fn control<T>(
        &self,
        make: impl FnOnce(Sender<Result<T, JobError>>) -> Control,
    ) -> Result<T, JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::Control(make(reply)))?;
        rx.recv().map_err(|_| JobError::stopped())?
    }

    /// The loaded model's tokenizer (shared; encoding with it never waits for the engine).
    pub fn tokenizer(&self) -> Option<Arc<GemmaTokenizer>> {
        lock(&self.shared.tokenizer).clone()
    }

    /// Decodes an image file (PNG, JPEG, WebP, GIF's first frame) within `limits` and cuts
    /// it for the loaded model's vision tower, on the calling thread; keeps it for prompts
    /// whose messages name its id, and says what it costs in tokens. Refused (`bad_image`)
    /// when the model reads no images or the file cannot be read.
    pub fn add_image(
        &self,
        bytes: &[u8],
        limits: crate::contract::ImageLimits,
    ) -> Result<crate::contract::ImageInfo, JobError> {
        let facts = self.image_facts()?;
        let resized = facts
            .processor
            .read(bytes, limits)
            .map_err(|e| bad_image(e.to_string()))?;
        self.keep_image(bytes, facts, resized)
    }

    /// How the loaded model's processor reads images (`None`: it reads none), for a reader
    /// that decodes and resizes them elsewhere (the app's isolated reader).
    pub fn image_processor(&self) -> Option<crate::contract::ImageProcessor> {
        (*lock(&self.shared.vision)).map(|f| f.processor)
    }

    /// [`EngineHandle::add_image`] for an image another process decoded and resized with
    /// [`EngineHandle::image_processor`]: `file` is the file's bytes (its id is their
    /// digest); `resized` is checked against the processor before it is cut.
    pub fn add_resized_image(
        &self,
        file: &[u8],
        resized: crate::contract::ResizedImage,
    ) -> Result<crate::contract::ImageInfo, JobError> {
        let facts = self.image_facts()?;
        self.keep_image(file, facts, resized)
    }

    fn image_facts(&self) -> Result<crate::images::ImageFacts, JobError> {
        (*lock(&self.shared.vision)).ok_or_else(|| {
            bad_image(
                crate::images::ImageError::Unsupported(" (it has no vision tower)".into())
                    .to_string(),
            )
        })
    }

    /// Cuts `resized` into patches and keeps it under the digest of `file`.
    fn keep_image(
        &self,
        file: &[u8],
        facts: crate::images::ImageFacts,
        resized: crate::contract::ResizedImage,
    ) -> Result<crate::contract::ImageInfo, JobError> {
        let patches = facts
            .processor
            .cut(resized)
            .map_err(|e| bad_image(e.to_string()))?;
        let image = crate::images::PreparedImage {
            id: crate::images::image_id(file),
            patches,
        };
        let info = image.info();
        // The model may have changed while the image was cut: keep it only for the same one.
        if *lock(&self.shared.vision) == Some(facts) {
            lock(&self.shared.images).insert(image);
        }
        Ok(info)
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
    /// answer regenerated) without prefilling again; applies to caches made from now on.
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

    /// Sets the pool's KV and disk budgets, spill directory and demotion preset; they apply
    /// from the next request.
    pub fn set_pool_settings(&self, settings: PoolSettings) {
        *lock(&self.shared.pool) = settings;
    }

    /// The pool's settings now.
    pub fn pool_settings(&self) -> PoolSettings {
        lock(&self.shared.pool).clone()
    }

    /// A memory timeline point from the status snapshot (never waits for a generation):
    /// every conversation's exact KV bytes, the weights and the process's resident set;
    /// the token count and cache label are `focus`'s (the conversation on screen).
    pub fn memory_sample(
        &self,
        t_ms: u64,
        probe: &mut RssProbe,
        focus: Option<&ConversationId>,
    ) -> MemorySample {
        let s = self.status();
        let focused = focus.and_then(|id| s.conversations.iter().find(|c| &c.id == id));
        MemorySample {
            t_ms,
            tokens_in_context: focused.map_or(0, |c| c.tokens),
            kv: s.kv,
            weights_bytes: s.weights_bytes,
            rss_bytes: probe.rss_bytes(),
            cache_spec: focused.map_or_else(|| s.policy.spec_string(), |c| c.spec.clone()),
            calibrating: focused.is_some_and(|c| c.calibrating),
            conversations: s.conversations,
        }
    }

    /// The pool's markers (demotions, spills, restores, drops) after number `seen`, and the
    /// number of the last one (pass it next time).
    pub fn markers_since(&self, seen: u64) -> (Vec<SwitchEvent>, u64) {
        let markers = lock(&self.shared.markers);
        let (last, ring) = (&markers.0, &markers.1);
        let first = last - ring.len() as u64;
        let skip = seen.saturating_sub(first) as usize;
        (ring.iter().skip(skip).cloned().collect(), *last)
    }

    /// What the pool did since the engine started.
    pub fn pool_counters(&self) -> PoolCounters {
        *lock(&self.shared.counters)
    }

    /// What the engine's steps ran since it started.
    pub fn step_counters(&self) -> StepCounters {
        *lock(&self.shared.steps)
    }

    /// Cancels the requests of `conversation` (all requests: `None`), running or queued;
    /// each ends before its next step.
    pub fn cancel(&self, conversation: Option<&ConversationId>) {
        // A stopped engine has nothing to cancel.
        let _ = self.send(Job::Control(Control::Cancel(conversation.cloned())));
    }

    /// Cancels every comparison, running or queued.
    pub fn cancel_compares(&self) {
        let _ = self.send(Job::Control(Control::CancelCompares));
    }

    /// Forgets `conversation`'s cache (it reads its history again on its next turn); with
    /// `file`, its cache file too. Busy when a request runs in it.
    pub fn forget(&self, conversation: &ConversationId, file: bool) -> Result<(), JobError> {
        self.control(|reply| Control::Forget {
            conversation: conversation.clone(),
            file,
            reply,
        })
    }

    /// Re-encodes `conversation`'s cache as `cache` selects (applied between two tokens if
    /// it is generating; for a conversation not in memory, the cache of its next turn) and
    /// returns the switch marker for a memory timeline.
    pub fn switch_cache(
        &self,
        conversation: &ConversationId,
        cache: &CacheSelection,
    ) -> Result<SwitchEvent, JobError> {
        let policy = cache.policy()?;
        self.control(|reply| Control::SwitchCache {
            conversation: conversation.clone(),
            policy,
            reply,
        })
    }

    /// Sets the cache new conversations get (and, with no model loaded, the next load's).
    pub fn set_default_cache(&self, cache: &CacheSelection) -> Result<SwitchEvent, JobError> {
        let policy = cache.policy()?;
        self.control(|reply| Control::SetDefaultPolicy { policy, reply })
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

    /// What each of `documents` (token counts, in attachment order) adds to `conversation`
    /// under every preset, and whether it still fits with `reserve` tokens left for the
    /// answer (never waits for a generation).
    pub fn document_fits(
        &self,
        conversation: Option<&ConversationId>,
        documents: &[usize],
        reserve: usize,
    ) -> Result<Vec<DocumentFit>, JobError> {
        let config = self.loaded_config()?;
        let context = conversation
            .and_then(|id| {
                self.status()
                    .conversations
                    .into_iter()
                    .find(|c| &c.id == id)
            })
            .map_or(0, |c| c.tokens);
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

    /// Saves `conversation`'s cache to `path` (its own spill file when `None`), in the
    /// precision it holds; blocks until written.
    pub fn save_cache(
        &self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<CacheFileInfo, JobError> {
        self.control(|reply| Control::SaveCache {
            conversation: conversation.clone(),
            path,
            reply,
        })
    }

    /// Restores `conversation`'s cache from `path` (its own spill file when `None`), in the
    /// precision it was saved in; blocks until done. Errors are `cache_mismatch` (another
    /// model or format version) and `cache_corrupt` (the file was set aside as
    /// `<name>.corrupt`); either way the conversation is as it was.
    pub fn restore_cache(
        &self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<CacheFileInfo, JobError> {
        self.control(|reply| Control::RestoreCache {
            conversation: conversation.clone(),
            path,
            reply,
        })
    }

    /// The cache files the engine wrote into its folder (see [`PoolSettings::spill_dir`]) that
    /// are there and read, oldest first: the one list of saved caches, which the disk budget
    /// keeps. Empty without a folder.
    pub fn saved_caches(&self) -> Result<Vec<(ConversationId, SavedCache)>, JobError> {
        self.control(|reply| Control::SavedCaches { only: None, reply })
    }

    /// `conversation`'s own cache file, as [`EngineHandle::saved_caches`] lists it, reading
    /// that file's header alone; `None` when the engine wrote none (or it is gone).
    pub fn saved_cache(
        &self,
        conversation: &ConversationId,
    ) -> Result<Option<SavedCache>, JobError> {
        let one = self.control(|reply| Control::SavedCaches {
            only: Some(conversation.clone()),
            reply,
        })?;
        Ok(one.into_iter().next().map(|(_, cache)| cache))
    }

    /// Removes `conversation`'s own cache file, if the engine wrote one; what it holds in
    /// memory stays (one only on disk is dropped, read again on its next turn).
    pub fn drop_saved_cache(&self, conversation: &ConversationId) -> Result<(), JobError> {
        self.control(|reply| Control::DropSavedCache {
            conversation: conversation.clone(),
            reply,
        })
    }

    /// Writes every conversation in memory to its own spill file (a quit): each its own
    /// cache, never another's. Returns what was written, or why not.
    pub fn save_all(&self) -> Result<Vec<SaveOutcome>, JobError> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::Control(Control::SaveAll { reply }))?;
        rx.recv().map_err(|_| JobError::stopped())
    }

    /// Drops the model.
    pub fn unload(&self) -> Result<(), JobError> {
        self.control(|reply| Control::Unload { reply })
    }

    /// The engine's state now (never waits for a generation).
    pub fn status(&self) -> EngineStatus {
        lock(&self.shared.status).clone()
    }

    /// Stops every request and the thread, and waits for it to end.
    pub fn shutdown(&self) {
        let _ = self.send(Job::Control(Control::Shutdown));
        if let Some(t) = lock(&self.thread).take() {
            // A panic on the engine thread has already been reported by the panic hook.
            let _ = t.join();
        }
    }
}
