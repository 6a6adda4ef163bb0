//! The app's handle on kvlab-engine's own engine thread ([`kvlab_engine::EngineHandle`]): it
//! turns UI requests into engine jobs, forwards the engine's events in the UI's wire shapes
//! ([`crate::translate`]), and keeps the status bar's state. It never holds the model and never
//! holds a lock while the engine works; its blocking waits are meant for `spawn_blocking`
//! threads (the commands run them there), never Tauri's async workers.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use kvlab_engine::chat::Message;
use kvlab_engine::compare::CompareRequest as EngineCompare;
use kvlab_engine::device::{preferred_dtype, select_device, DeviceChoice};
use kvlab_engine::events::ModelCard as EngineCard;
use kvlab_engine::generate::{GenerateRequest as EngineGenerate, Prompt, PREFILL_CHUNK};
use kvlab_engine::sampling::SamplingParams;
use kvlab_engine::worker::{JobError, LoadRequest};
use kvlab_engine::{Engine, EngineHandle, LoadOptions, ModelSource};
use serde::Deserialize;

use crate::cachespec::{policy_for, policy_label};
use crate::error::CommandError;
use crate::events::{ChatEvent, CompareEvent, EngineMemory, EngineStatus, SwitchReport};
use crate::translate::{engine_memory, translate_compare, ChatStream};

type Res<T> = Result<T, CommandError>;

/// Tokens sliding layers keep beyond their window, so regenerating an answer of up to this
/// many tokens rewinds the cache instead of prefilling the conversation again.
pub const REWIND_MARGIN: usize = 256;

/// A generation request as the UI sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    #[serde(default)]
    pub thinking: bool,
}

/// A side-by-side run as the UI sends it: one conversation through two cache policies.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// The reference SPEC (e.g. `f16`) and the one tested against it (e.g. `tq3.5@all`).
    pub specs: [String; 2],
}

impl From<JobError> for CommandError {
    fn from(e: JobError) -> Self {
        CommandError::new(e.code.as_str(), e.message)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn no_model() -> CommandError {
    CommandError::new("no_model", "no model is loaded")
}

fn stopped() -> CommandError {
    CommandError::new("engine_stopped", "the engine thread has stopped")
}

/// Called on every status change (the `engine-status` event).
pub type StatusNotify = Arc<dyn Fn(EngineStatus) + Send + Sync>;

/// The engine thread's handle plus the status the UI shows. Cheap to clone.
#[derive(Clone)]
pub struct EngineBridge {
    handle: EngineHandle,
    status: Arc<Mutex<EngineStatus>>,
    notify: StatusNotify,
    /// The loaded model's display name (the app's card), for status labels.
    model: Arc<Mutex<Option<String>>>,
}

impl EngineBridge {
    /// Starts the engine thread.
    pub fn spawn(status: Arc<Mutex<EngineStatus>>, notify: StatusNotify) -> Res<Self> {
        let handle = Engine::spawn()?;
        handle.set_rewind_margin(REWIND_MARGIN);
        Ok(Self {
            handle,
            status,
            notify,
            model: Arc::new(Mutex::new(None)),
        })
    }

    fn set_status(&self, s: EngineStatus) {
        if let Ok(mut cur) = self.status.lock() {
            *cur = s.clone();
        }
        (self.notify)(s);
    }

    fn model_name(&self) -> Option<String> {
        self.model.lock().ok().and_then(|m| m.clone())
    }

    /// Waits for a streaming job's end (or its refusal), then settles the status bar.
    fn finish<T>(&self, sent: Result<T, JobError>, end: mpsc::Receiver<Res<()>>) -> Res<()> {
        let r = match sent {
            Ok(_) => end.recv().unwrap_or_else(|_| Err(stopped())),
            Err(e) => Err(e.into()),
        };
        self.settle();
        r
    }

    /// Back to `ready` (or `no_model`) once a job ends.
    fn settle(&self) {
        match self.model_name() {
            Some(model) => self.set_status(EngineStatus::Ready { model }),
            None => self.set_status(EngineStatus::NoModel),
        }
    }

    /// Loads `path` with the cache as `spec` says; `name` is the card's display name.
    /// Blocks until the engine has loaded it (or kept the previous model on failure), and
    /// returns the engine's card for it.
    pub fn load(&self, path: PathBuf, name: String, spec: &str) -> Res<EngineCard> {
        let policy = policy_for(spec)?;
        self.set_status(EngineStatus::Loading {
            path: path.display().to_string(),
        });
        let device = select_device(DeviceChoice::Auto).map_err(CommandError::from);
        let r = device.and_then(|device| {
            let request = LoadRequest {
                source: ModelSource::Local { path },
                tokenizer: None,
                options: LoadOptions {
                    dtype: preferred_dtype(&device),
                    device,
                },
                policy,
            };
            self.handle
                .load_blocking(request, |_| {})
                .map_err(CommandError::from)
        });
        match &r {
            Ok(_) => {
                if let Ok(mut m) = self.model.lock() {
                    *m = Some(name);
                }
                self.settle();
            }
            Err(e) => self.load_failed(e),
        }
        r
    }

    /// Shows a failed load: the previous model, which a failed load leaves in place, is
    /// served again; without one the status bar shows the error.
    pub fn load_failed(&self, e: &CommandError) {
        if self.model_name().is_some() {
            self.settle();
        } else {
            self.set_status(EngineStatus::Failed {
                message: e.message.clone(),
            });
        }
    }

    /// Runs one chat turn; `on_event` gets the UI's stream (false: the UI is gone, stop).
    /// Blocks until the turn ends.
    pub fn generate(
        &self,
        req: GenerateRequest,
        mut on_event: impl FnMut(ChatEvent) -> bool + Send + 'static,
    ) -> Res<()> {
        if req.max_tokens == 0 {
            return Err(CommandError::new(
                "invalid_request",
                "max_tokens must be at least 1",
            ));
        }
        let model = self.model_name().ok_or_else(no_model)?;
        let request = EngineGenerate {
            prompt: Prompt::Conversation {
                messages: req.messages,
                thinking: req.thinking,
            },
            sampling: req.sampling,
            max_tokens: req.max_tokens,
            prefill_chunk: PREFILL_CHUNK,
        };
        let (end_tx, end_rx) = mpsc::channel();
        let status = self.handle.clone();
        let canceller = self.handle.clone();
        let mut stream = ChatStream::default();
        self.set_status(EngineStatus::Generating { model });
        let sent = self.handle.generate(
            request,
            Box::new(move |ev| {
                let label = || policy_label(&status.status().policy);
                let Some((event, end)) = stream.translate(ev, label) else {
                    return;
                };
                if !on_event(event) {
                    canceller.cancel();
                }
                if let Some(end) = end {
                    let _ = end_tx.send(end);
                }
            }),
        );
        self.finish(sent, end_rx)
    }

    /// Runs one conversation through two cache policies side by side, then fidelity.
    /// Blocks until it ends.
    pub fn compare(
        &self,
        req: CompareRequest,
        mut on_event: impl FnMut(CompareEvent) -> bool + Send + 'static,
    ) -> Res<()> {
        let model = self.model_name().ok_or_else(no_model)?;
        let policies = [policy_for(&req.specs[0])?, policy_for(&req.specs[1])?];
        let labels = [policy_label(&policies[0]), policy_label(&policies[1])];
        let request = EngineCompare {
            prompt: Prompt::Conversation {
                messages: req.messages,
                thinking: false,
            },
            sampling: req.sampling,
            max_tokens: req.max_tokens.max(1),
            policies,
            prefill_chunk: PREFILL_CHUNK,
        };
        let (end_tx, end_rx) = mpsc::channel();
        let canceller = self.handle.clone();
        let mut panes = [ChatStream::default(), ChatStream::default()];
        self.set_status(EngineStatus::Generating { model });
        let sent = self.handle.compare(
            request,
            Box::new(move |ev| {
                let (events, end) = translate_compare(ev, &mut panes, &labels);
                for e in events {
                    if !on_event(e) {
                        canceller.cancel();
                    }
                }
                if let Some(end) = end {
                    let _ = end_tx.send(end);
                }
            }),
        );
        self.finish(sent, end_rx)
    }

    /// Stops the running generation or comparison before its next token.
    pub fn cancel(&self) {
        self.handle.cancel();
    }

    /// Forgets the conversation in the cache (blocks for the engine's answer).
    pub fn reset(&self) -> Res<()> {
        Ok(self.handle.reset()?)
    }

    /// Re-encodes the conversation's cache as `spec` says (between two tokens when
    /// generating) and returns the timeline marker. Blocks until done.
    pub fn switch_cache(&self, spec: &str) -> Res<SwitchReport> {
        let next = policy_for(spec)?;
        let before = self.handle.status();
        if before.model.is_none() {
            return Err(no_model());
        }
        let marker = self.handle.switch_cache_marked(next.clone())?;
        Ok(SwitchReport {
            t_ms: now_ms(),
            from: policy_label(&before.policy),
            to: policy_label(&next),
            before_bytes: marker.kv_before.used,
            after_bytes: marker.kv_after.used,
            convert_ms: marker.duration_ms,
        })
    }

    /// Tokens `text` costs, counted on the engine's shared tokenizer on the calling thread
    /// (never waits for a generation).
    pub fn count_tokens(&self, text: &str) -> Res<usize> {
        Ok(self.handle.count_tokens(text)?)
    }

    /// The engine's memory now, as the timeline plots it (never waits for a generation).
    pub fn memory(&self) -> EngineMemory {
        engine_memory(&self.handle.status())
    }
}
