//! Commands of the chat domain: a turn streamed over a channel (in the session's own
//! conversation, which the request names), the prompt as the model reads it, the side-by-side
//! comparison, stop, and the cache: its menu, its costs, switching a conversation's and
//! choosing new chats' (the marker goes back to the caller, which draws it on the timeline).

use kvlab_engine::contract::{cache_options as engine_cache_options, CacheOptions, CacheSelection};
use kvlab_engine::contract::{ContextCost, SwitchEvent};
use kvlab_engine::contract::{ConversationId, Event};
use kvlab_engine::contract::{Prompt, PromptPreview};
use kvlab_engine::GenerateRequest;
use tauri::ipc::Channel;
use tauri::State;

use crate::blocking::{blocking, Res};
use crate::state::AppState;
use kvlab_engine::CompareRequest;

/// Runs one chat turn; the engine's events stream over `on_event`.
#[tauri::command]
pub async fn generate(
    state: State<'_, AppState>,
    request: GenerateRequest,
    on_event: Channel<Event>,
) -> Res<()> {
    let engine = state.engine.clone();
    blocking(move || engine.generate(request, move |ev| on_event.send(ev).is_ok())).await
}

/// A prompt as the loaded model reads it: the text its chat template renders (or the plain
/// text of a base model), the token ids and the stop set.
#[tauri::command]
pub async fn preview_prompt(state: State<'_, AppState>, prompt: Prompt) -> Res<PromptPreview> {
    let engine = state.engine.clone();
    blocking(move || {
        engine
            .handle()
            .preview_prompt(prompt)
            .map_err(crate::error::CommandError::from)
    })
    .await
}

/// Runs one prompt through two caches side by side, with fidelity.
#[tauri::command]
pub async fn compare(
    state: State<'_, AppState>,
    request: CompareRequest,
    on_event: Channel<Event>,
) -> Res<()> {
    let engine = state.engine.clone();
    blocking(move || engine.compare(request, move |ev| on_event.send(ev).is_ok())).await
}

/// Stops the side-by-side comparison before its next step.
#[tauri::command]
pub fn stop_compare(state: State<'_, AppState>) {
    state.engine.handle().cancel_compares();
}

/// Stops session `conversation`'s generation before its next token.
#[tauri::command]
pub fn stop_generation(state: State<'_, AppState>, conversation: ConversationId) {
    state.engine.cancel(Some(&conversation));
}

/// Re-encodes session `conversation`'s cache (or sets the cache of its first turn); returns
/// the timeline marker. The cache is also what new chats get from now on.
#[tauri::command]
pub async fn switch_cache(
    state: State<'_, AppState>,
    conversation: ConversationId,
    cache: CacheSelection,
) -> Res<SwitchEvent> {
    let engine = state.engine.clone();
    blocking(move || {
        engine.set_default_cache(&cache)?;
        engine.switch_cache(&conversation, &cache)
    })
    .await
}

/// The cache menu: presets and formats, each with its canonical SPEC.
#[tauri::command]
pub fn cache_options() -> CacheOptions {
    engine_cache_options()
}

/// KV bytes of a context of `tokens` under every preset, on the loaded model.
#[tauri::command]
pub fn context_costs(state: State<'_, AppState>, tokens: usize) -> Res<Vec<ContextCost>> {
    state
        .engine
        .handle()
        .context_costs(tokens)
        .map_err(crate::error::CommandError::from)
}
