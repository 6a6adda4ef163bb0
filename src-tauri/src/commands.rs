//! Tauri commands: each one validates its input, hands work to the engine thread (through
//! [`crate::bridge`]) or the OS, and returns plain serde data or a coded error. Long work
//! never runs on the async workers: the engine has its own thread, and waiting for it, token
//! counting and file reads go through `spawn_blocking`.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;
use tauri::ipc::Channel;
use tauri::{AppHandle, Emitter, Runtime, State};
use tauri_plugin_dialog::DialogExt;

use crate::bridge::{CompareRequest, GenerateRequest};
use crate::card::{estimate, model_card, read_config, MemoryEstimate, ModelCard};
use crate::documents::{self, Document};
use crate::error::CommandError;
use crate::events::{ChatEvent, CompareEvent, SwitchReport};
use crate::sessions::SessionSummary;
use crate::state::AppState;

type Res<T> = Result<T, CommandError>;

/// Facts about the machine the app runs on.
#[derive(Debug, Clone, Serialize)]
pub struct SystemInfo {
    pub total_memory_bytes: u64,
    pub cpu_cores: usize,
    pub os: String,
    pub engine_version: &'static str,
    pub data_dir: String,
}

pub fn read_system_info() -> SystemInfo {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    SystemInfo {
        total_memory_bytes: sys.total_memory(),
        cpu_cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        os: sysinfo::System::long_os_version().unwrap_or_else(|| std::env::consts::OS.to_string()),
        engine_version: env!("CARGO_PKG_VERSION"),
        data_dir: String::new(),
    }
}

#[tauri::command]
pub fn system_info(state: State<'_, AppState>) -> SystemInfo {
    SystemInfo {
        data_dir: state.data_dir.display().to_string(),
        ..read_system_info()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    #[serde(flatten)]
    pub status: crate::events::EngineStatus,
    pub label: String,
}

#[tauri::command]
pub fn engine_status(state: State<'_, AppState>) -> Res<StatusView> {
    let status = state
        .status
        .lock()
        .map_err(|_| CommandError::new("internal", "engine status lock poisoned"))?
        .clone();
    Ok(StatusView {
        label: status.label(),
        status,
    })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Res<T> + Send + 'static) -> Res<T> {
    tauri::async_runtime::spawn_blocking(f)
        .await
        .map_err(|e| CommandError::new("internal", e.to_string()))?
}

/// The offline default model (Gemma 3 270M), if its files are present.
#[derive(Debug, Clone, Serialize)]
pub struct DefaultModel {
    pub path: String,
    pub name: &'static str,
}

#[tauri::command]
pub fn default_model() -> Res<DefaultModel> {
    kvlab_engine::assets::resolve("gemma3-270m")
        .map(|p| DefaultModel {
            path: p.display().to_string(),
            name: "Gemma 3 270M (offline)",
        })
        .map_err(|e| CommandError::new("asset_missing", format!("{e} — run `kvlab assets fetch`")))
}

/// The model card and the memory `context` tokens would take under `spec`, before loading.
#[tauri::command]
pub async fn inspect_model(path: String, context: u64, spec: String) -> Res<MemoryEstimate> {
    blocking(move || {
        let path = PathBuf::from(path);
        let (cfg, format) = read_config(&path)?;
        estimate(model_card(&path, &cfg, format), &cfg, context, &spec)
    })
    .await
}

/// Loads a model on the engine thread; returns the card read from its configuration, with
/// what only loading tells (whether it ships a chat template).
#[tauri::command]
pub async fn load_model(state: State<'_, AppState>, path: String, spec: String) -> Res<ModelCard> {
    let engine = state.engine.clone();
    blocking(move || {
        let path = PathBuf::from(path);
        let (cfg, format) = read_config(&path).inspect_err(|e| engine.load_failed(e))?;
        let card = model_card(&path, &cfg, format);
        let loaded = engine.load(path, card.name.clone(), &spec)?;
        Ok(ModelCard {
            has_chat_template: loaded.has_chat_template,
            ..card
        })
    })
    .await
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

#[tauri::command]
pub async fn generate(
    state: State<'_, AppState>,
    request: GenerateRequest,
    on_event: Channel<ChatEvent>,
) -> Res<()> {
    let engine = state.engine.clone();
    blocking(move || engine.generate(request, move |ev| on_event.send(ev).is_ok())).await
}

/// Runs one conversation through two cache policies side by side, with fidelity.
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

pub const SWITCH_EVENT: &str = "cache-switched";

#[tauri::command]
pub async fn switch_cache<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    spec: String,
) -> Res<SwitchReport> {
    let engine = state.engine.clone();
    let report = blocking(move || engine.switch_cache(&spec)).await?;
    let _ = app.emit(SWITCH_EVENT, &report);
    Ok(report)
}

#[tauri::command]
pub async fn count_tokens(state: State<'_, AppState>, text: String) -> Res<usize> {
    let engine = state.engine.clone();
    blocking(move || engine.count_tokens(&text)).await
}

/// A document with its token count (what the prompt will cost).
#[derive(Debug, Clone, Serialize)]
pub struct InspectedDocument {
    #[serde(flatten)]
    pub doc: Document,
    pub tokens: usize,
}

async fn with_tokens(state: &AppState, doc: Document) -> Res<InspectedDocument> {
    let (engine, text) = (state.engine.clone(), doc.text.clone());
    let tokens = blocking(move || engine.count_tokens(&text)).await?;
    Ok(InspectedDocument { doc, tokens })
}

/// Reads a dropped or picked file by path.
#[tauri::command]
pub async fn inspect_document_path(
    state: State<'_, AppState>,
    path: String,
) -> Res<InspectedDocument> {
    let doc = blocking(move || {
        let p = PathBuf::from(&path);
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(path.clone());
        let meta = std::fs::metadata(&p)
            .map_err(|e| CommandError::new("document_refused", format!("{name}: {e}")))?;
        if !meta.is_file() {
            return Err(CommandError::new(
                "document_refused",
                format!("{name}: not a file"),
            ));
        }
        if meta.len() as usize > documents::MAX_BYTES {
            return documents::inspect(&name, &vec![0; documents::MAX_BYTES + 1]);
        }
        let bytes = std::fs::read(&p)
            .map_err(|e| CommandError::new("document_refused", format!("{name}: {e}")))?;
        documents::inspect(&name, &bytes)
    })
    .await?;
    with_tokens(&state, doc).await
}

/// Reads a file the web view already holds (a DOM drop).
#[tauri::command]
pub async fn inspect_document_bytes(
    state: State<'_, AppState>,
    name: String,
    bytes: Vec<u8>,
) -> Res<InspectedDocument> {
    // PDF extraction can take a while: keep it off the async runtime.
    let doc = blocking(move || documents::inspect(&name, &bytes)).await?;
    with_tokens(&state, doc).await
}

#[tauri::command]
pub fn list_sessions(state: State<'_, AppState>) -> Vec<SessionSummary> {
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
    contents: String,
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
            .map_err(|e| CommandError::new("io", e.to_string()))?;
        std::fs::write(&path, contents)
            .map_err(|e| CommandError::new("io", format!("{}: {e}", path.display())))?;
        Ok(Some(path.display().to_string()))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_info_reports_real_memory_and_cores() {
        let info = read_system_info();
        assert!(info.total_memory_bytes > 64 * 1024 * 1024);
        assert_eq!(
            info.cpu_cores,
            std::thread::available_parallelism().unwrap().get()
        );
    }
}
