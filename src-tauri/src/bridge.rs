//! The app's handle on kvlab-engine's engine thread ([`kvlab_engine::EngineHandle`]): it
//! turns UI requests into engine jobs and forwards the engine's own events, cards, markers
//! and errors unchanged. It never holds the model and never holds a lock while the engine
//! works; its blocking waits are meant for `spawn_blocking` threads (the commands run them
//! there), never Tauri's async workers.

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::DeviceChoice;
use kvlab_engine::contract::ModelCard;
use kvlab_engine::contract::{Activity, ConversationId, Event};
use kvlab_engine::contract::{MemoryEstimate, WeightsChoice};
use kvlab_engine::contract::{MemorySample, SwitchEvent};
use kvlab_engine::host::RssProbe;
use kvlab_engine::CompareRequest;
use kvlab_engine::GenerateRequest;
use kvlab_engine::{ActivityListener, LoadRequest, PoolSettings};
use kvlab_engine::{Engine, EngineHandle, LoadOptions, ModelSource};
use std::path::Path;

use crate::error::CommandError;

type Res<T> = Result<T, CommandError>;

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
    /// Conversations' caches spill to, and come back from, `caches` (the sessions folder:
    /// each session's `ID.kvc`), within `disk_budget` bytes.
    pub fn spawn(
        on_activity: ActivityListener,
        caches: std::path::PathBuf,
        disk_budget: u64,
    ) -> Res<Self> {
        let handle = Engine::spawn()?;
        handle.on_activity(on_activity);
        handle.set_pool_settings(PoolSettings {
            spill_dir: Some(caches),
            disk_budget,
            // The Local API's clients never take the places the user's own chats need.
            reserve_for_user: true,
            ..PoolSettings::default()
        });
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
            .map_err(CommandError::from)
    }

    /// Loads `path` with the cache `cache` selects, checked against memory for the `context`
    /// the user chose (the one the estimate showed), and returns its card. Blocks until the
    /// engine has loaded it (or kept the previous model on failure).
    pub fn load(
        &self,
        path: &Path,
        cache: &CacheSelection,
        weights: Option<WeightsChoice>,
        context: usize,
    ) -> Res<ModelCard> {
        let request = LoadRequest {
            source: ModelSource::Local {
                path: path.to_path_buf(),
            },
            tokenizer: None,
            options: load_options(weights)?,
            cache: cache.clone(),
            context,
            mmproj: None,
        };
        self.handle
            .submit(request)?
            .wait(|_| true)
            .map_err(CommandError::from)
    }

    /// Runs one chat turn; `on_event` gets the engine's events as they come (false: the UI
    /// is gone, which cancels the turn). Blocks until the turn ends.
    pub fn generate(
        &self,
        request: GenerateRequest,
        mut on_event: impl FnMut(Event) -> bool + Send + 'static,
    ) -> Res<()> {
        self.handle
            .submit(request)?
            .wait(|ev| on_event(ev.clone()))
            .map(|_| ())
            .map_err(CommandError::from)
    }

    /// Runs one prompt through two caches side by side, then fidelity. Blocks until it ends.
    pub fn compare(
        &self,
        req: CompareRequest,
        mut on_event: impl FnMut(Event) -> bool + Send + 'static,
    ) -> Res<()> {
        let request = CompareRequest {
            max_tokens: req.max_tokens.max(1),
            ..req
        };
        self.handle
            .submit(request)?
            .wait(|ev| on_event(ev.clone()))
            .map(|_| ())
            .map_err(CommandError::from)
    }

    /// Stops `conversation`'s generation (every request: `None`) before its next token.
    pub fn cancel(&self, conversation: Option<&ConversationId>) {
        self.handle.cancel(conversation);
    }

    /// Re-encodes `conversation`'s cache as `cache` selects (between two tokens when
    /// generating; for a conversation not yet in memory, the cache of its next turn; with no
    /// model loaded, the next load's) and returns the timeline marker. Blocks until done.
    pub fn switch_cache(
        &self,
        conversation: &ConversationId,
        cache: &CacheSelection,
    ) -> Res<SwitchEvent> {
        self.handle
            .switch_cache(conversation, cache)
            .map_err(CommandError::from)
    }

    /// The cache new conversations get (the user's choice for new chats).
    pub fn set_default_cache(&self, cache: &CacheSelection) -> Res<SwitchEvent> {
        self.handle
            .set_default_cache(cache)
            .map_err(CommandError::from)
    }

    /// The engine's handle, for queries answered on the calling thread (token counts,
    /// costs, status): they never wait for a generation.
    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }

    /// A memory timeline point now (never waits for a generation): every conversation's
    /// bytes and tier.
    pub fn memory_sample(&self, t_ms: u64, probe: &mut RssProbe) -> MemorySample {
        self.handle.memory_sample(t_ms, probe, None)
    }

    /// The pool's markers (demotions, spills, restores, drops) after number `seen`.
    pub fn markers_since(&self, seen: u64) -> (Vec<SwitchEvent>, u64) {
        self.handle.markers_since(seen)
    }

    /// What the engine is doing now.
    pub fn activity(&self) -> Activity {
        self.handle.status().activity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_engine::MemoryBudget;
    use std::path::PathBuf;

    fn tiny_gguf() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("crates/engine/tests/fixtures/gguf/tiny_gemma3.f32.gguf")
    }

    fn quiet() -> ActivityListener {
        Box::new(|_| {})
    }

    fn spawn() -> Res<EngineBridge> {
        EngineBridge::spawn(
            quiet(),
            std::env::temp_dir().join("kvlab-bridge-test"),
            1 << 20,
        )
    }

    #[test]
    fn the_load_checks_the_context_the_estimate_showed() -> Res<()> {
        let bridge = spawn()?;
        let f32 = CacheSelection::Spec("f32".into());
        let (short, long) = (100, 256);
        let need = |ctx| bridge.estimate(&tiny_gguf(), ctx, &f32, None);
        let (short_need, long_need) = (need(short)?.total_bytes, need(long)?.total_bytes);
        assert!(short_need < long_need);
        // Room for the short context the user picked, not for the model's longest.
        let margin = 4096;
        bridge
            .handle()
            .set_memory_budget(MemoryBudget::fixed(margin + short_need, margin));
        assert!(need(short)?.fit.fits && !need(long)?.fit.fits);
        let card = bridge.load(&tiny_gguf(), &f32, None, short)?;
        assert_eq!(card.name, "tiny_gemma3.f32.gguf");
        let refused = bridge.load(&tiny_gguf(), &f32, None, long).unwrap_err();
        assert_eq!(refused.code, kvlab_engine::contract::ErrorCode::OutOfMemory);
        Ok(())
    }

    #[test]
    fn the_app_rewinds_as_far_as_the_engine_says() -> Res<()> {
        // One margin: the app's engine and a bare one estimate the same sliding layers.
        let bridge = spawn()?;
        let bare = Engine::spawn()?;
        let f16 = CacheSelection::Spec("f16".into());
        let opts = load_options(None)?;
        let app = bridge.estimate(&tiny_gguf(), 200, &f16, None)?;
        let engine = bare.estimate(&tiny_gguf(), &opts, 200, &f16)?;
        assert_eq!(app.kv_bytes, engine.kv_bytes);
        Ok(())
    }
}
