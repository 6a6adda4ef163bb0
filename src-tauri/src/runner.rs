//! The app's engine thread: owns the model, tokenizer and KV cache; takes jobs from a channel
//! and answers through the sender each job carries. Nothing here runs on Tauri's async
//! workers. Stand-in for kvlab-engine's own worker (`Engine::spawn`) until that lands; the
//! commands only see [`EngineHandle`], so swapping it is local to this file.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kvlab_engine::chat::{ChatOptions, ChatTemplate, Message};
use kvlab_engine::config::{AttentionKind, Family as ModelFamily};
use kvlab_engine::device::{preferred_dtype, select_device, DeviceChoice};
use kvlab_engine::sampling::{Sampler, SamplingParams};
use kvlab_engine::stream::{Delta, StreamSplitter};
use kvlab_engine::tokenizer::{Family, GemmaTokenizer};
use kvlab_engine::{KvCache, KvPrecision, LoadOptions, Logits, Model, PrecisionPolicy};
use serde::Deserialize;
use tauri::async_runtime::Sender as Reply;

use crate::cachespec::{policy_for, policy_label};
use crate::card::{model_card, read_config, ModelCard};
use crate::error::CommandError;
use crate::events::{
    ChatEvent, CompareEvent, EngineMemory, EngineStatus, GenerationStats, KvPart, StopReason,
    SwitchReport,
};

/// Tokens sliding layers keep beyond their window so a turn can be rewound and re-run.
const REWIND_MARGIN: usize = 256;
/// Prompt tokens per forward pass while prefilling.
const PREFILL_CHUNK: usize = 256;

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

type Sink = Box<dyn FnMut(ChatEvent) -> bool + Send>;
type CompareSink = Box<dyn FnMut(CompareEvent) -> bool + Send>;

/// A side-by-side run: one conversation through two cache policies of the loaded model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// The reference policy (e.g. `f16`) and the one tested against it (e.g. `tq3.5@all`).
    pub specs: [String; 2],
}
type Res<T> = Result<T, CommandError>;

/// Work for the engine thread.
pub enum Job {
    Load {
        path: PathBuf,
        tokenizer: Option<PathBuf>,
        spec: String,
        reply: Reply<Res<ModelCard>>,
    },
    Generate {
        req: GenerateRequest,
        sink: Sink,
        reply: Reply<Res<()>>,
    },
    SwitchCache {
        spec: String,
        reply: Reply<Res<SwitchReport>>,
    },
    Reset {
        reply: Reply<Res<()>>,
    },
    CountTokens {
        text: String,
        reply: Reply<Res<usize>>,
    },
    Compare {
        req: CompareRequest,
        sink: CompareSink,
        reply: Reply<Res<()>>,
    },
}

/// What the commands hold: a job sender, a cancel flag and the latest memory snapshot.
#[derive(Clone)]
pub struct EngineHandle {
    jobs: mpsc::Sender<Job>,
    cancel: Arc<AtomicBool>,
    pub memory: Arc<Mutex<EngineMemory>>,
}

impl EngineHandle {
    pub fn send(&self, job: Job) -> Res<()> {
        self.jobs
            .send(job)
            .map_err(|_| CommandError::new("engine_stopped", "the engine thread has stopped"))
    }

    /// Asks the running generation to stop after its current token.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

/// Starts the engine thread. `status` is called on every state change.
pub fn spawn(status: Box<dyn Fn(EngineStatus) + Send>) -> EngineHandle {
    let (tx, rx) = mpsc::channel::<Job>();
    let cancel = Arc::new(AtomicBool::new(false));
    let memory = Arc::new(Mutex::new(EngineMemory::default()));
    let mut worker = Worker {
        loaded: None,
        cancel: cancel.clone(),
        memory: memory.clone(),
        status,
    };
    let spawned = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                worker.run(job);
            }
        });
    if let Err(e) = spawned {
        tracing::error!("engine thread not started: {e}");
    }
    EngineHandle {
        jobs: tx,
        cancel,
        memory,
    }
}

struct Loaded {
    card: ModelCard,
    model: Model,
    tokenizer: GemmaTokenizer,
    template: ChatTemplate,
    /// False for base checkpoints that ship no chat template (the offline Gemma 3 270M):
    /// they continue plain text, and wrapping it in turn markers makes them babble.
    chat_template: bool,
    cache: KvCache,
    policy: PrecisionPolicy,
    /// The token ids whose keys and values the cache holds, in order.
    cached: Vec<u32>,
}

struct Worker {
    loaded: Option<Loaded>,
    cancel: Arc<AtomicBool>,
    memory: Arc<Mutex<EngineMemory>>,
    status: Box<dyn Fn(EngineStatus) + Send>,
}

/// The prompt's token ids: the model's chat template, or for a base model without one, the
/// conversation as plain text (each message a paragraph) for the model to continue.
fn render_prompt(l: &Loaded, messages: &[Message], opts: ChatOptions) -> Res<Vec<u32>> {
    if l.chat_template {
        return Ok(l.template.render_ids(&l.tokenizer, messages, opts)?);
    }
    let text = plain_transcript(messages);
    Ok(l.tokenizer.encode(&text, true)?)
}

/// Messages joined as paragraphs, trimmed, with no role markers.
fn plain_transcript(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| m.content.trim())
        .filter(|c| !c.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
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

impl Worker {
    fn run(&mut self, job: Job) {
        match job {
            Job::Load {
                path,
                tokenizer,
                spec,
                reply,
            } => {
                let r = self.load(path, tokenizer, &spec);
                let _ = reply.blocking_send(r);
            }
            Job::Generate {
                req,
                mut sink,
                reply,
            } => {
                let r = self.generate(req, &mut sink);
                if let Err(e) = &r {
                    sink(ChatEvent::Error {
                        code: e.code.into(),
                        message: e.message.clone(),
                    });
                }
                self.ready();
                let _ = reply.blocking_send(r);
            }
            Job::SwitchCache { spec, reply } => {
                let r = self.switch(&spec);
                let _ = reply.blocking_send(r);
            }
            Job::Reset { reply } => {
                let r = match self.loaded.as_mut() {
                    Some(l) => {
                        l.cached.clear();
                        l.cache.reset().map_err(CommandError::from)
                    }
                    None => Ok(()),
                };
                self.publish_memory();
                let _ = reply.blocking_send(r);
            }
            Job::Compare {
                req,
                mut sink,
                reply,
            } => {
                let r = self.compare(req, &mut sink);
                if let Err(e) = &r {
                    for pane in 0..2 {
                        let event = ChatEvent::Error {
                            code: e.code.into(),
                            message: e.message.clone(),
                        };
                        sink(CompareEvent::Pane { pane, event });
                    }
                }
                self.ready();
                let _ = reply.blocking_send(r);
            }
            Job::CountTokens { text, reply } => {
                let r = match self.loaded.as_ref() {
                    Some(l) => l
                        .tokenizer
                        .encode(&text, false)
                        .map(|ids| ids.len())
                        .map_err(CommandError::from),
                    None => Err(no_model()),
                };
                let _ = reply.blocking_send(r);
            }
        }
    }

    fn ready(&self) {
        if let Some(l) = &self.loaded {
            (self.status)(EngineStatus::Ready {
                model: l.card.name.clone(),
            });
        }
    }

    fn load(&mut self, path: PathBuf, tokenizer: Option<PathBuf>, spec: &str) -> Res<ModelCard> {
        (self.status)(EngineStatus::Loading {
            path: path.display().to_string(),
        });
        let r = self.try_load(path, tokenizer, spec);
        match &r {
            Ok(_) => self.ready(),
            // A failed load that left the previous model in place goes back to serving it.
            Err(_) if self.loaded.is_some() => self.ready(),
            Err(e) => (self.status)(EngineStatus::Failed {
                message: e.message.clone(),
            }),
        }
        self.publish_memory();
        r
    }

    fn try_load(
        &mut self,
        path: PathBuf,
        tokenizer: Option<PathBuf>,
        spec: &str,
    ) -> Res<ModelCard> {
        let (cfg, format) = read_config(&path)?;
        let policy = policy_for(spec, &PrecisionPolicy::uniform(KvPrecision::F16))?;
        let family = match cfg.family {
            ModelFamily::Gemma3 => Family::Gemma3,
            ModelFamily::Gemma4 => Family::Gemma4,
        };
        let tok_path = tokenizer
            .or_else(|| {
                let dir = if path.is_dir() {
                    path.clone()
                } else {
                    path.parent()?.to_path_buf()
                };
                Some(dir.join("tokenizer.json")).filter(|p| p.exists())
            })
            .or_else(|| kvlab_engine::assets::resolve("gemma-tokenizer").ok())
            .ok_or_else(|| {
                CommandError::new(
                    "tokenizer_missing",
                    "no tokenizer.json beside the model and no offline Gemma tokenizer",
                )
            })?;
        // Free the previous model before reading the next one.
        self.loaded = None;
        let device = select_device(DeviceChoice::Auto).map_err(CommandError::from)?;
        let opts = LoadOptions {
            dtype: preferred_dtype(&device),
            device,
        };
        let model = Model::load(&path, &opts).map_err(CommandError::from)?;
        let tokenizer = GemmaTokenizer::from_file(&tok_path, family)?;
        let mut cache = model.new_cache(&policy).map_err(CommandError::from)?;
        cache.set_rewind_margin(REWIND_MARGIN);
        let card = model_card(&path, model.config(), format);
        self.loaded = Some(Loaded {
            card: card.clone(),
            model,
            tokenizer,
            template: ChatTemplate::new(family),
            chat_template: kvlab_engine::worker::has_chat_template(&path).unwrap_or(true),
            cache,
            policy,
            cached: Vec::new(),
        });
        Ok(card)
    }

    fn publish_memory(&self) {
        let snapshot = match &self.loaded {
            None => EngineMemory::default(),
            Some(l) => memory_of(l),
        };
        if let Ok(mut m) = self.memory.lock() {
            *m = snapshot;
        }
    }

    fn switch(&mut self, spec: &str) -> Res<SwitchReport> {
        let l = self.loaded.as_mut().ok_or_else(no_model)?;
        let next = policy_for(spec, &l.policy)?;
        let before = l.cache.memory().total.0 as u64;
        let from = policy_label(&l.policy);
        let t = Instant::now();
        l.cache.convert(&next).map_err(CommandError::from)?;
        let convert_ms = t.elapsed().as_secs_f64() * 1000.0;
        l.policy = next;
        let report = SwitchReport {
            t_ms: now_ms(),
            from,
            to: policy_label(&l.policy),
            before_bytes: before,
            after_bytes: l.cache.memory().total.0 as u64,
            convert_ms,
        };
        self.publish_memory();
        Ok(report)
    }

    fn generate(&mut self, req: GenerateRequest, sink: &mut Sink) -> Res<()> {
        self.cancel.store(false, Ordering::SeqCst);
        if req.max_tokens == 0 {
            return Err(CommandError::new(
                "bad_sampling",
                "max_tokens must be at least 1",
            ));
        }
        let start = Instant::now();
        let mut sampler = Sampler::new(req.sampling)?;
        let l = self.loaded.as_mut().ok_or_else(no_model)?;
        (self.status)(EngineStatus::Generating {
            model: l.card.name.clone(),
        });
        let opts = ChatOptions {
            thinking: req.thinking,
            add_generation_prompt: true,
        };
        let prompt = render_prompt(l, &req.messages, opts)?;
        if prompt.len() + req.max_tokens > l.card.max_context.max(1) {
            return Err(CommandError::new(
                "context_full",
                format!(
                    "{} prompt tokens + {} new exceed the model's context of {}",
                    prompt.len(),
                    req.max_tokens,
                    l.card.max_context
                ),
            ));
        }
        // Reuse the longest cached prefix; at least one prompt token must run to get logits.
        let mut keep = prompt
            .iter()
            .zip(&l.cached)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        if keep < l.cache.seq_len() {
            if l.cache.can_rewind(keep) {
                l.cache.rewind(keep).map_err(CommandError::from)?;
            } else {
                l.cache.reset().map_err(CommandError::from)?;
                keep = 0;
            }
        }
        l.cached.truncate(keep);
        let mut logits = None;
        for chunk in prompt[keep..].chunks(PREFILL_CHUNK) {
            logits = Some(
                l.model
                    .forward(chunk, &mut l.cache, Logits::Last)
                    .map_err(CommandError::from)?,
            );
            l.cached.extend_from_slice(chunk);
            if self.cancel.load(Ordering::SeqCst) {
                break;
            }
        }
        let prefill_s = start.elapsed().as_secs_f64();
        let prefill_tokens = prompt.len() - keep;
        let mut stats = GenerationStats {
            prefill_tokens,
            reused_tokens: keep,
            prefill_tok_s: prefill_tokens as f64 / prefill_s.max(1e-9),
            cache_policy: policy_label(&l.policy),
            ..Default::default()
        };
        let mut splitter = StreamSplitter::new(l.template.family());
        let mut reason = StopReason::MaxTokens;
        let mut first: Option<Instant> = None;
        let mut logits = logits.ok_or_else(|| CommandError::new("internal", "empty prompt"))?;
        for n in 0..req.max_tokens {
            if self.cancel.load(Ordering::SeqCst) {
                reason = StopReason::Cancelled;
                break;
            }
            let row: Vec<f32> = logits
                .to_vec1()
                .map_err(|e| CommandError::new("engine", e.to_string()))?;
            let id = sampler.sample(&row)?;
            let step = splitter.push(&l.tokenizer, id)?;
            stats.decode_tokens = n + 1;
            for d in step.deltas {
                if first.is_none() {
                    first = Some(Instant::now());
                    stats.ttft_ms = start.elapsed().as_secs_f64() * 1000.0;
                }
                let ev = match d {
                    Delta::Answer(text) => ChatEvent::Token { text },
                    Delta::Thinking(text) => ChatEvent::Thinking { text },
                };
                if !sink(ev) {
                    self.cancel.store(true, Ordering::SeqCst);
                }
            }
            if step.stop {
                reason = StopReason::EndOfTurn;
                break;
            }
            if n + 1 == req.max_tokens {
                break;
            }
            logits = l
                .model
                .forward(&[id], &mut l.cache, Logits::Last)
                .map_err(CommandError::from)?;
            l.cached.push(id);
            if n % 8 == 0 {
                if let Ok(mut m) = self.memory.lock() {
                    *m = memory_of(l);
                }
            }
        }
        for d in splitter.finish(&l.tokenizer)? {
            let ev = match d {
                Delta::Answer(text) => ChatEvent::Token { text },
                Delta::Thinking(text) => ChatEvent::Thinking { text },
            };
            sink(ev);
        }
        let decode_start = first.unwrap_or_else(Instant::now);
        let decode_s = decode_start.elapsed().as_secs_f64();
        stats.decode_tok_s = if stats.decode_tokens > 1 {
            (stats.decode_tokens - 1) as f64 / decode_s.max(1e-9)
        } else {
            0.0
        };
        if stats.ttft_ms == 0.0 {
            stats.ttft_ms = start.elapsed().as_secs_f64() * 1000.0;
        }
        stats.context_tokens = l.cache.seq_len();
        stats.kv_bytes = l.cache.memory().total.0 as u64;
        let snapshot = memory_of(l);
        if let Ok(mut m) = self.memory.lock() {
            *m = snapshot;
        }
        sink(ChatEvent::Done { reason, stats });
        Ok(())
    }
}

impl Worker {
    /// Runs the conversation through two fresh caches in lockstep (both panes stream at
    /// once), then scores the test cache against the reference, teacher-forced on the
    /// reference's tokens. The chat's own cache is not touched.
    fn compare(&mut self, req: CompareRequest, sink: &mut CompareSink) -> Res<()> {
        self.cancel.store(false, Ordering::SeqCst);
        let l = self.loaded.as_ref().ok_or_else(no_model)?;
        (self.status)(EngineStatus::Generating {
            model: l.card.name.clone(),
        });
        let policies = [
            policy_for(&req.specs[0], &l.policy)?,
            policy_for(&req.specs[1], &l.policy)?,
        ];
        let prompt = render_prompt(l, &req.messages, ChatOptions::default())?;
        let max_tokens = req
            .max_tokens
            .clamp(1, l.card.max_context.saturating_sub(prompt.len()).max(1));
        struct Pane {
            cache: KvCache,
            sampler: Sampler,
            splitter: StreamSplitter,
            ids: Vec<u32>,
            logits: Vec<f32>,
            done: Option<StopReason>,
            stats: GenerationStats,
            start: Instant,
            first: Option<Instant>,
        }
        let mut panes = Vec::with_capacity(2);
        for policy in &policies {
            let start = Instant::now();
            let mut cache = l.model.new_cache(policy).map_err(CommandError::from)?;
            let mut logits = None;
            for chunk in prompt.chunks(PREFILL_CHUNK) {
                logits = Some(
                    l.model
                        .forward(chunk, &mut cache, Logits::Last)
                        .map_err(CommandError::from)?,
                );
            }
            let logits: Vec<f32> = logits
                .ok_or_else(|| CommandError::new("internal", "empty prompt"))?
                .to_vec1()
                .map_err(|e| CommandError::new("engine", e.to_string()))?;
            let prefill_s = start.elapsed().as_secs_f64();
            panes.push(Pane {
                cache,
                sampler: Sampler::new(req.sampling)?,
                splitter: StreamSplitter::new(l.template.family()),
                ids: prompt.clone(),
                logits,
                done: None,
                stats: GenerationStats {
                    prefill_tokens: prompt.len(),
                    prefill_tok_s: prompt.len() as f64 / prefill_s.max(1e-9),
                    cache_policy: policy_label(policy),
                    ..Default::default()
                },
                start,
                first: None,
            });
        }
        for n in 0..max_tokens {
            if panes.iter().all(|p| p.done.is_some()) {
                break;
            }
            for (i, p) in panes.iter_mut().enumerate() {
                if p.done.is_some() {
                    continue;
                }
                if self.cancel.load(Ordering::SeqCst) {
                    p.done = Some(StopReason::Cancelled);
                    continue;
                }
                let id = p.sampler.sample(&p.logits)?;
                let step = p.splitter.push(&l.tokenizer, id)?;
                p.stats.decode_tokens = n + 1;
                for d in step.deltas {
                    if p.first.is_none() {
                        p.first = Some(Instant::now());
                        p.stats.ttft_ms = p.start.elapsed().as_secs_f64() * 1000.0;
                    }
                    let event = match d {
                        Delta::Answer(text) => ChatEvent::Token { text },
                        Delta::Thinking(text) => ChatEvent::Thinking { text },
                    };
                    if !sink(CompareEvent::Pane { pane: i, event }) {
                        self.cancel.store(true, Ordering::SeqCst);
                    }
                }
                if step.stop {
                    p.done = Some(StopReason::EndOfTurn);
                    continue;
                }
                if n + 1 == max_tokens {
                    p.done = Some(StopReason::MaxTokens);
                    continue;
                }
                p.ids.push(id);
                p.logits = l
                    .model
                    .forward(&[id], &mut p.cache, Logits::Last)
                    .map_err(CommandError::from)?
                    .to_vec1()
                    .map_err(|e| CommandError::new("engine", e.to_string()))?;
            }
        }
        for (i, p) in panes.iter_mut().enumerate() {
            let decode_s = p.first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
            p.stats.decode_tok_s = if p.stats.decode_tokens > 1 {
                (p.stats.decode_tokens - 1) as f64 / decode_s.max(1e-9)
            } else {
                0.0
            };
            p.stats.context_tokens = p.cache.seq_len();
            p.stats.kv_bytes = p.cache.memory().total.0 as u64;
            let reason = p.done.unwrap_or(StopReason::MaxTokens);
            sink(CompareEvent::Pane {
                pane: i,
                event: ChatEvent::Done {
                    reason,
                    stats: p.stats.clone(),
                },
            });
        }
        let kv_bytes = [panes[0].stats.kv_bytes, panes[1].stats.kv_bytes];
        let reference_ids = panes[0].ids.clone();
        drop(panes);
        let report = kvlab_engine::fidelity::compare_caches(
            &l.model,
            &reference_ids,
            &policies[0],
            &policies[1],
            64,
            &mut |_, _| {},
        )
        .map_err(CommandError::from)?;
        sink(CompareEvent::Fidelity {
            mean_kld: report.mean_kld,
            max_kld: report.max_kld,
            top1_agreement: report.top1_agreement,
            tokens_scored: report.tokens_scored,
            kv_bytes,
        });
        Ok(())
    }
}

/// KV bytes by kind and precision, weights, context: what the memory timeline plots.
fn memory_of(l: &Loaded) -> EngineMemory {
    let report = l.cache.memory();
    let mut kv: Vec<KvPart> = Vec::new();
    for layer in &report.layers {
        let Some(p) = layer.precision else { continue };
        let kind = match layer.kind {
            AttentionKind::Full => "full",
            AttentionKind::Sliding => "sliding",
        };
        let precision = p.to_string();
        match kv
            .iter_mut()
            .find(|k| k.kind == kind && k.precision == precision)
        {
            Some(k) => k.bytes += layer.bytes_used as u64,
            None => kv.push(KvPart {
                kind,
                precision,
                bytes: layer.bytes_used as u64,
            }),
        }
    }
    EngineMemory {
        weights_bytes: l.card.weights_bytes,
        kv,
        context_tokens: l.cache.seq_len(),
        cache_policy: policy_label(&l.policy),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_transcript_joins_messages_as_paragraphs_without_markers() {
        let messages = vec![
            Message::system("  Be brief. "),
            Message::user("What is the capital of France?"),
            Message::user("   "),
        ];
        assert_eq!(
            plain_transcript(&messages),
            "Be brief.\n\nWhat is the capital of France?"
        );
    }
}
