//! Commands of the sessions domain: list, load, save, rename and delete saved conversations,
//! export one to a file the user picks, and save, restore or drop a session's KV cache (also
//! saved on quit, for the session the engine's cache holds).

use std::sync::atomic::Ordering;

use serde_json::Value;
use tauri::{AppHandle, Manager, Runtime, State};
use tauri_plugin_dialog::DialogExt;

use super::caches::{CacheTransfer, SavedCache};
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
    let summary = state.sessions.save(&session)?;
    // The session saved is the one on screen, whose conversation the engine holds.
    set_owner(&state, Some(summary.id.clone()));
    Ok(summary)
}

fn set_owner(state: &AppState, id: Option<String>) {
    if let Ok(mut owner) = state.cache_owner.lock() {
        *owner = id;
    }
}

/// Saves the engine's cache as session `id`'s, then keeps all saved caches within
/// `budget_bytes` (the user's setting; it stays the budget for later saves). `None` when
/// the cache holds nothing to save.
#[tauri::command]
pub async fn save_session_cache(
    state: State<'_, AppState>,
    id: String,
    budget_bytes: Option<u64>,
) -> Res<Option<CacheTransfer>> {
    if let Some(b) = budget_bytes {
        state.cache_budget.store(b, Ordering::Relaxed);
    }
    let budget = state.cache_budget.load(Ordering::Relaxed);
    let engine = state.engine.clone();
    let caches = state.sessions.caches().clone();
    blocking(move || save_cache(&engine, &caches, &id, budget)).await
}

fn save_cache(
    engine: &crate::bridge::EngineBridge,
    caches: &super::caches::SessionCaches,
    id: &str,
    budget: u64,
) -> Res<Option<CacheTransfer>> {
    let path = caches.path(id)?;
    if engine.handle().status().context_tokens == 0 {
        return Ok(None);
    }
    caches.ensure_dir()?;
    let info = engine.handle().save_cache(&path)?;
    let secs = info.secs;
    Ok(Some(CacheTransfer {
        id: id.to_owned(),
        cache: SavedCache::from_engine(info),
        secs,
        dropped: caches.enforce_budget(budget, id),
    }))
}

/// Restores session `id`'s saved cache into the engine, in the precision it was saved in,
/// so its next answer reads only the new tokens. `None` when it has none; `cache_mismatch`
/// (another model, a format this build does not read) or `cache_corrupt` (set aside) leave
/// the conversation to be read again on the next answer, with nothing lost.
#[tauri::command]
pub async fn restore_session_cache(
    state: State<'_, AppState>,
    id: String,
) -> Res<Option<CacheTransfer>> {
    set_owner(&state, Some(id.clone()));
    let engine = state.engine.clone();
    let caches = state.sessions.caches().clone();
    blocking(move || {
        let path = caches.path(&id)?;
        if !path.exists() {
            return Ok(None);
        }
        let info = engine.handle().restore_cache(&path)?;
        Ok(Some(CacheTransfer {
            id,
            secs: info.secs,
            cache: SavedCache::from_engine(info),
            dropped: Vec::new(),
        }))
    })
    .await
}

/// Drops session `id`'s saved cache (the session itself stays).
#[tauri::command]
pub fn drop_session_cache(state: State<'_, AppState>, id: String) -> Res<()> {
    state.sessions.caches().remove(&id)
}

/// On quit: saves the cache of the session the engine holds, so reopening it reads nothing
/// again. A generation still running is stopped first; a failure is logged, never in the
/// way of quitting.
pub fn save_cache_on_quit<R: Runtime>(app: &AppHandle<R>) {
    let Some(state) = app.try_state::<AppState>() else {
        return;
    };
    // Taken, not read: quitting raises more than one of the events that call this.
    let Some(id) = state.cache_owner.lock().ok().and_then(|mut o| o.take()) else {
        return;
    };
    state.engine.cancel();
    let budget = state.cache_budget.load(Ordering::Relaxed);
    match save_cache(&state.engine, state.sessions.caches(), &id, budget) {
        Ok(Some(t)) => tracing::info!(
            session = %id,
            tokens = t.cache.tokens,
            bytes = t.cache.bytes,
            "saved the conversation's cache on quit"
        ),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(session = %id, code = %e.code, "cache not saved on quit: {}", e.message)
        }
    }
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
