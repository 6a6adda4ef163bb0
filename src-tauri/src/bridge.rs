//! The app's handle on kvlab-engine's engine thread ([`kvlab_engine::EngineHandle`]): it
//! turns UI requests into engine jobs and forwards the engine's own events, cards, markers
//! and errors unchanged. It never holds the model and never holds a lock while the engine
//! works; its blocking waits are meant for `spawn_blocking` threads (the commands run them
//! there), never Tauri's async workers.

use std::path::Path;
use std::sync::mpsc;

use kvlab_engine::compare::{CompareEvent, CompareRequest as EngineCompare};
use kvlab_engine::device::DeviceChoice;
use kvlab_engine::events::{Activity, Event};
use kvlab_engine::generate::{GenerateRequest, Prompt, PREFILL_CHUNK};
use kvlab_engine::kv::CacheSelection;
use kvlab_engine::memory::{MemorySample, RssProbe, SwitchEvent};
use kvlab_engine::sampling::SamplingParams;
use kvlab_engine::worker::{ActivityListener, JobError, LoadRequest};
use kvlab_engine::{
    Engine, EngineHandle, LoadOptions, MemoryEstimate, ModelCard, ModelSource, WeightsChoice,
};
use serde::Deserialize;
use ts_rs::TS;

use crate::error::CommandError;

type Res<T> = Result<T, CommandError>;

/// Tokens sliding layers keep beyond their window, so regenerating an answer of up to this
/// many tokens rewinds the cache instead of prefilling the conversation again.
pub const REWIND_MARGIN: usize = 256;

/// A side-by-side run as the UI sends it: one prompt through two caches.
#[derive(Debug, Clone, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    /// What both panes continue from.
    pub prompt: Prompt,
    /// Sampling, the same for both.
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Most tokens per pane.
    pub max_tokens: usize,
    /// The reference cache (pane 0) and the one tested against it (pane 1).
    pub caches: [CacheSelection; 2],
}

/// The engine thread's handle. Cheap to clone.
#[derive(Clone)]
pub struct EngineBridge {
    handle: EngineHandle,
}

/// Where models load: the best device this build and machine offer, with a safetensors
/// checkpoint's weights held as `weights` says (`None`: what suits that device).
fn load_options(weights: Option<WeightsChoice>) -> Res<LoadOptions> {
    let mut options = LoadOptions::on(DeviceChoice::Auto)?;
    if let Some(w) = weights {
        options.weights = w;
    }
    Ok(options)
}

impl EngineBridge {
    /// Starts the engine thread; `on_activity` hears every change of what it is doing.
    pub fn spawn(on_activity: ActivityListener) -> Res<Self> {
        let handle = Engine::spawn()?;
        handle.set_rewind_margin(REWIND_MARGIN);
        handle.on_activity(on_activity);
        Ok(Self { handle })
    }

    /// The card and memory `context` tokens would take under `cache`, before loading.
    pub fn estimate(
        &self,
        path: &Path,
        context: usize,
        cache: &CacheSelection,
        weights: Option<WeightsChoice>,
    ) -> Res<MemoryEstimate> {
        self.handle
            .estimate(path, &load_options(weights)?, context, cache)
    }

    /// Loads `path` with the cache `cache` selects and returns its card. Blocks until the
    /// engine has loaded it (or kept the previous model on failure).
    pub fn load(
        &self,
        path: &Path,
        cache: &CacheSelection,
        weights: Option<WeightsChoice>,
    ) -> Res<ModelCard> {
        let request = LoadRequest {
            source: ModelSource::Local {
                path: path.to_path_buf(),
            },
            tokenizer: None,
            options: load_options(weights)?,
            policy: cache.policy()?,
            context: kvlab_engine::worker::DEFAULT_LOAD_CONTEXT,
        };
        self.handle.load_blocking(request, |_| {})
    }

    /// Runs one chat turn; `on_event` gets the engine's events as they come (false: the UI
    /// is gone, stop). Blocks until the turn ends.
    pub fn generate(
        &self,
        request: GenerateRequest,
        mut on_event: impl FnMut(Event) -> bool + Send + 'static,
    ) -> Res<()> {
        let (end_tx, end_rx) = mpsc::channel();
        let canceller = self.handle.clone();
        let sent = self.handle.generate(
            request,
            Box::new(move |ev| {
                let end = match &ev {
                    Event::Done { .. } => Some(Ok(())),
                    Event::Error { code, message } => Some(Err(JobError::new(*code, message))),
                    _ => None,
                };
                if !on_event(ev) {
                    canceller.cancel();
                }
                if let Some(end) = end {
                    let _ = end_tx.send(end);
                }
            }),
        );
        finish(sent, end_rx)
    }

    /// Runs one prompt through two caches side by side, then fidelity. Blocks until it ends.
    pub fn compare(
        &self,
        req: CompareRequest,
        mut on_event: impl FnMut(CompareEvent) -> bool + Send + 'static,
    ) -> Res<()> {
        let request = EngineCompare {
            prompt: req.prompt,
            sampling: req.sampling,
            max_tokens: req.max_tokens.max(1),
            policies: [req.caches[0].policy()?, req.caches[1].policy()?],
            prefill_chunk: PREFILL_CHUNK,
        };
        let (end_tx, end_rx) = mpsc::channel();
        let canceller = self.handle.clone();
        let sent = self.handle.compare(
            request,
            Box::new(move |ev| {
                let end = match &ev {
                    CompareEvent::Finished { .. } => Some(Ok(())),
                    CompareEvent::Error { code, message } => {
                        Some(Err(JobError::new(*code, message)))
                    }
                    CompareEvent::Pane { .. } => None,
                };
                if !on_event(ev) {
                    canceller.cancel();
                }
                if let Some(end) = end {
                    let _ = end_tx.send(end);
                }
            }),
        );
        finish(sent, end_rx)
    }

    /// Stops the running generation or comparison before its next token.
    pub fn cancel(&self) {
        self.handle.cancel();
    }

    /// Forgets the conversation in the cache (blocks for the engine's answer).
    pub fn reset(&self) -> Res<()> {
        self.handle.reset()
    }

    /// Re-encodes the conversation's cache as `cache` selects (between two tokens when
    /// generating) and returns the timeline marker. Blocks until done.
    pub fn switch_cache(&self, cache: &CacheSelection) -> Res<SwitchEvent> {
        let policy = cache.policy()?;
        if self.handle.status().model.is_none() {
            return Err(JobError::no_model());
        }
        self.handle.switch_cache(policy)
    }

    /// The engine's handle, for queries answered on the calling thread (token counts,
    /// costs, status): they never wait for a generation.
    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }

    /// A memory timeline point now (never waits for a generation).
    pub fn memory_sample(&self, t_ms: u64, probe: &mut RssProbe) -> MemorySample {
        self.handle.memory_sample(t_ms, probe)
    }

    /// What the engine is doing now.
    pub fn activity(&self) -> Activity {
        self.handle.status().activity
    }
}

/// Waits for a streaming job's end (or its refusal).
fn finish<T>(sent: Result<T, JobError>, end: mpsc::Receiver<Res<()>>) -> Res<()> {
    sent?;
    end.recv().unwrap_or_else(|_| Err(JobError::stopped()))
}
