//! Tauri commands: each one validates its input, hands work to the engine (through
//! [`crate::bridge`]) or the OS, and returns the engine's own values or a coded error. Long
//! work never runs on the async workers: the engine has its own thread, and waiting for it,
//! header reads, token counting and file reads go through `spawn_blocking`.

use std::path::PathBuf;

use kvlab_engine::compare::CompareEvent;
use kvlab_engine::events::{Activity, Event};
use kvlab_engine::generate::{GenerateRequest, Prompt, PromptPreview};
use kvlab_engine::kv::{cache_options as engine_cache_options, CacheOptions, CacheSelection};
use kvlab_engine::memory::{ContextCost, DocumentFit, SwitchEvent};
use kvlab_engine::{MemoryEstimate, ModelCard, WeightsChoice};
use serde::Serialize;
use serde_json::Value;
use tauri::ipc::Channel;
use tauri::{AppHandle, Emitter, Runtime, State};
use tauri_plugin_dialog::DialogExt;
use ts_rs::TS;

use crate::bridge::CompareRequest;
use crate::documents::{self, Document};
use crate::error::{CommandError, ErrorCode};
use crate::sessions::{SessionList, SessionSummary};
use crate::state::AppState;

type Res<T> = Result<T, CommandError>;

/// Facts about the machine the app runs on.
#[derive(Debug, Clone, Serialize, TS)]
pub struct SystemInfo {
    pub total_memory_bytes: u64,
    pub cpu_cores: usize,
    pub os: String,
    pub engine_version: String,
    pub data_dir: String,
    /// The largest document accepted: the web view sends a larger file's size, not its bytes.
    pub max_document_bytes: u64,
}

#[tauri::command]
pub fn system_info(state: State<'_, AppState>) -> SystemInfo {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    SystemInfo {
        total_memory_bytes: sys.total_memory(),
        cpu_cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        os: sysinfo::System::long_os_version().unwrap_or_else(|| std::env::consts::OS.to_string()),
        engine_version: env!("CARGO_PKG_VERSION").to_string(),
        data_dir: state.data_dir.display().to_string(),
        max_document_bytes: documents::MAX_BYTES as u64,
    }
}

/// What the engine is doing now (the `engine-status` event carries every change).
#[tauri::command]
pub fn engine_status(state: State<'_, AppState>) -> Activity {
    state.engine.activity()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Res<T> + Send + 'static) -> Res<T> {
    tauri::async_runtime::spawn_blocking(f)
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}

/// The model the app opens when nothing else is chosen.
#[derive(Debug, Clone, Serialize, TS)]
pub struct DefaultModel {
    pub path: String,
    pub name: String,
}

/// The offline default model (Gemma 3 270M): `$KVLAB_DEFAULT_MODEL`, set by `scripts/run.sh`.
#[tauri::command]
pub fn default_model() -> Res<DefaultModel> {
    crate::state::default_model(std::env::var_os("KVLAB_DEFAULT_MODEL"))
}

/// The card and the memory `context` tokens would take under `cache`, before loading, with
/// a safetensors checkpoint's weights held as `weights` says (`None`: the device's default).
#[tauri::command]
pub async fn inspect_model(
    state: State<'_, AppState>,
    path: String,
    context: usize,
    cache: CacheSelection,
    weights: Option<WeightsChoice>,
) -> Res<MemoryEstimate> {
    let engine = state.engine.clone();
    blocking(move || engine.estimate(&PathBuf::from(path), context, &cache, weights)).await
}

/// Loads a model on the engine thread; returns its card.
#[tauri::command]
pub async fn load_model(
    state: State<'_, AppState>,
    path: String,
    cache: CacheSelection,
    weights: Option<WeightsChoice>,
    context: usize,
) -> Res<ModelCard> {
    let engine = state.engine.clone();
    blocking(move || engine.load(&PathBuf::from(path), &cache, weights, context)).await
}

/// Opens the system file dialog for a GGUF file or a model folder.
#[tauri::command]
pub async fn pick_model<R: Runtime>(app: AppHandle<R>, folder: bool) -> Res<Option<String>> {
    blocking(move || {
        let dialog = app.dialog().file().set_title("Open a model");
        let picked = if folder {
            dialog.blocking_pick_folder()
        } else {
            dialog
                .add_filter("GGUF model", &["gguf"])
                .blocking_pick_file()
        };
        Ok(picked
            .and_then(|p| p.into_path().ok())
            .map(|p| p.display().to_string()))
    })
    .await
}

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
    blocking(move || engine.handle().preview_prompt(prompt)).await
}

/// Runs one prompt through two caches side by side, with fidelity.
#[tauri::command]
pub async fn compare(
    state: State<'_, AppState>,
    request: CompareRequest,
    on_event: Channel<CompareEvent>,
) -> Res<()> {
    let engine = state.engine.clone();
    blocking(move || engine.compare(request, move |ev| on_event.send(ev).is_ok())).await
}

#[tauri::command]
pub fn stop_generation(state: State<'_, AppState>) {
    state.engine.cancel();
}

#[tauri::command]
pub async fn reset_conversation(state: State<'_, AppState>) -> Res<()> {
    let engine = state.engine.clone();
    blocking(move || engine.reset()).await
}

/// The `cache-switched` event: every switch's marker, for other windows and the timeline.
pub const SWITCH_EVENT: &str = "cache-switched";

/// Re-encodes the conversation's cache; returns the timeline marker.
#[tauri::command]
pub async fn switch_cache<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    cache: CacheSelection,
) -> Res<SwitchEvent> {
    let engine = state.engine.clone();
    let marker = blocking(move || engine.switch_cache(&cache)).await?;
    let _ = app.emit(SWITCH_EVENT, &marker);
    Ok(marker)
}

/// The cache menu: presets and formats, each with its canonical SPEC.
#[tauri::command]
pub fn cache_options() -> CacheOptions {
    engine_cache_options()
}

/// KV bytes of a context of `tokens` under every preset, on the loaded model.
#[tauri::command]
pub fn context_costs(state: State<'_, AppState>, tokens: usize) -> Res<Vec<ContextCost>> {
    state.engine.handle().context_costs(tokens)
}

/// What each attached document (token counts, in order) adds to the conversation.
#[tauri::command]
pub fn document_fits(
    state: State<'_, AppState>,
    documents: Vec<usize>,
    reserve: usize,
) -> Res<Vec<DocumentFit>> {
    state.engine.handle().document_fits(&documents, reserve)
}

/// A document with its token count (what the prompt will cost).
#[derive(Debug, Clone, Serialize, TS)]
pub struct InspectedDocument {
    #[serde(flatten)]
    pub doc: Document,
    pub tokens: usize,
}

async fn with_tokens(state: &AppState, doc: Document) -> Res<InspectedDocument> {
    let (engine, text) = (state.engine.clone(), doc.text.clone());
    let tokens = blocking(move || engine.handle().count_tokens(&text)).await?;
    Ok(InspectedDocument { doc, tokens })
}

/// Reads a dropped or picked file by path; its bytes are parsed in the document reader's
/// child process.
#[tauri::command]
pub async fn inspect_document_path(
    state: State<'_, AppState>,
    path: String,
) -> Res<InspectedDocument> {
    let reader = state.documents.clone();
    let doc = blocking(move || reader.inspect_path(&PathBuf::from(path))).await?;
    with_tokens(&state, doc).await
}

/// Reads a file the web view already holds (a DOM drop or the picker). `size` is the file's
/// size as the web view knows it: a file over the limit is refused by it and sent empty, so
/// the web view never copies hundreds of megabytes over IPC.
#[tauri::command]
pub async fn inspect_document_bytes(
    state: State<'_, AppState>,
    name: String,
    bytes: Vec<u8>,
    size: Option<u64>,
) -> Res<InspectedDocument> {
    documents::check_size(&name, size.unwrap_or(0).max(bytes.len() as u64))?;
    let reader = state.documents.clone();
    // Parsing waits on a child process: keep it off the async runtime.
    let doc = blocking(move || reader.inspect(&name, &bytes)).await?;
    with_tokens(&state, doc).await
}

/// The saved sessions, and the files that could not be read (a corrupt one is set aside).
#[tauri::command]
pub fn list_sessions(state: State<'_, AppState>) -> SessionList {
    state.sessions.list()
}

#[tauri::command]
pub fn load_session(state: State<'_, AppState>, id: String) -> Res<Value> {
    state.sessions.load(&id)
}

#[tauri::command]
pub fn save_session(state: State<'_, AppState>, session: Value) -> Res<SessionSummary> {
    state.sessions.save(&session)
}

#[tauri::command]
pub fn rename_session(
    state: State<'_, AppState>,
    id: String,
    title: String,
) -> Res<SessionSummary> {
    state.sessions.rename(&id, &title)
}

#[tauri::command]
pub fn delete_session(state: State<'_, AppState>, id: String) -> Res<()> {
    state.sessions.delete(&id)
}

/// Asks where to save and writes `contents` there (session export).
#[tauri::command]
pub async fn export_file<R: Runtime>(
    app: AppHandle<R>,
    file_name: String,
    contents: Vec<u8>,
) -> Res<Option<String>> {
    blocking(move || {
        let Some(path) = app
            .dialog()
            .file()
            .set_file_name(&file_name)
            .blocking_save_file()
        else {
            return Ok(None);
        };
        let path = path
            .into_path()
            .map_err(|e| CommandError::new(ErrorCode::Io, e.to_string()))?;
        std::fs::write(&path, contents)
            .map_err(|e| CommandError::new(ErrorCode::Io, format!("{}: {e}", path.display())))?;
        Ok(Some(path.display().to_string()))
    })
    .await
}
