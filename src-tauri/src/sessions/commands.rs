//! Commands of the sessions domain: list, load, save, rename and delete saved conversations,
//! and export one to a file the user picks.

use serde_json::Value;
use tauri::{AppHandle, Runtime, State};
use tauri_plugin_dialog::DialogExt;

use super::{SessionList, SessionSummary};
use crate::blocking::{blocking, Res};
use crate::error::{CommandError, ErrorCode};
use crate::state::AppState;

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
