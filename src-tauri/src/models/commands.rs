//! Commands of the model domain: what the machine offers, the engine's activity, the default
//! model, a model's card and estimate before loading, loading it (checked for the context the
//! user chose) and picking one from disk.

use std::path::PathBuf;

use kvlab_engine::contract::Activity;
use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::ModelCard;
use kvlab_engine::contract::{MemoryEstimate, WeightsChoice};
use serde::Serialize;
use tauri::{AppHandle, Runtime, State};
use tauri_plugin_dialog::DialogExt;
use ts_rs::TS;

use crate::blocking::{blocking, Res};
use crate::documents;
use crate::state::AppState;

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
    /// The largest image accepted, likewise.
    pub max_image_bytes: u64,
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
        max_image_bytes: documents::MAX_IMAGE_BYTES as u64,
    }
}

/// What the engine is doing now (the `engine-status` event carries every change).
#[tauri::command]
pub fn engine_status(state: State<'_, AppState>) -> Activity {
    state.engine.activity()
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
