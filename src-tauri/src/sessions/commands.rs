//! Commands of the sessions domain: list, load, save, rename and delete saved conversations,
//! export one to a file the user picks, and save, restore or drop a session's KV cache. Each
//! session is its own conversation in the engine's pool (its id the session's); on quit every
//! conversation's cache goes to its own file.

use std::sync::atomic::Ordering;

use serde_json::Value;
use tauri::{AppHandle, Manager, Runtime, State};
use tauri_plugin_dialog::DialogExt;

use super::caches::CacheTransfer;
use super::{SessionList, SessionSummary};
use kvlab_engine::contract::ConversationId;

use crate::blocking::{blocking, Res};
use crate::error::{AppCode, CommandError, ErrorCode};
use crate::state::AppState;

/// The saved sessions, and the files that could not be read (a corrupt one is set aside).
#[tauri::command]
pub async fn list_sessions(state: State<'_, AppState>) -> Res<SessionList> {
    let engine = state.engine.clone();
    let mut list = state.sessions.list();
    // Each session's saved cache, from the engine's one list of the files it wrote.
    let saved = blocking(move || Ok(engine.handle().saved_caches()?)).await?;
    for summary in &mut list.sessions {
        summary.cache = saved
            .iter()
            .find(|(c, _)| c.as_str() == summary.id)
            .map(|(_, cache)| cache.clone());
    }
    Ok(list)
}

#[tauri::command]
pub fn load_session(state: State<'_, AppState>, id: String) -> Res<Value> {
    state.sessions.load(&id)
}

#[tauri::command]
pub fn save_session(state: State<'_, AppState>, session: Value) -> Res<SessionSummary> {
    state.sessions.save(&session)
}

/// Session `id` as the engine's conversation.
fn conversation(id: &str) -> Res<ConversationId> {
    ConversationId::new(id)
        .map_err(|e| CommandError::new(AppCode::BadSession, format!("session `{id}`: {e}")))
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
        let mut pool = state.engine.handle().pool_settings();
        pool.disk_budget = b;
        state.engine.handle().set_pool_settings(pool);
    }
    let engine = state.engine.clone();
    blocking(move || save_cache(&engine, &id)).await
}

fn save_cache(engine: &crate::bridge::EngineBridge, id: &str) -> Res<Option<CacheTransfer>> {
    let conversation = conversation(id)?;
    let holds = engine
        .handle()
        .status()
        .conversations
        .iter()
        .any(|c| c.id == conversation && c.bytes > 0 && c.tokens > 0);
    if !holds {
        return Ok(None);
    }
    // The engine names the file, writes it into its folder and keeps the disk budget.
    let info = engine.handle().save_cache(&conversation, None)?;
    Ok(Some(CacheTransfer::of(id.to_owned(), &info)))
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
    let engine = state.engine.clone();
    blocking(move || {
        let conversation = conversation(&id)?;
        // Held already (the pool kept it since it was last used): nothing to read.
        let held = engine
            .handle()
            .status()
            .conversations
            .into_iter()
            .any(|c| c.id == conversation && c.bytes > 0);
        if held || engine.handle().saved_cache(&conversation)?.is_none() {
            return Ok(None);
        }
        let info = engine.handle().restore_cache(&conversation, None)?;
        Ok(Some(CacheTransfer::of(id, &info)))
    })
    .await
}

/// Sets what all conversations' KV caches may hold in memory together (`None`: what the
/// machine has available beside the weights): past it, idle conversations are demoted, then
/// spilled to their files.
#[tauri::command]
pub fn set_kv_budget(state: State<'_, AppState>, bytes: Option<u64>) {
    let mut pool = state.engine.handle().pool_settings();
    pool.kv_budget = bytes;
    state.engine.handle().set_pool_settings(pool);
}

/// Sets how many requests run at once (chats, compare panes, Local API clients), each
/// sequence one row of the engine's shared forward pass; clamped to 1 to the engine's most.
/// Returns the count applied.
#[tauri::command]
pub fn set_parallel(state: State<'_, AppState>, requests: usize) -> usize {
    let mut pool = state.engine.handle().pool_settings();
    pool.parallel = requests.clamp(1, kvlab_engine::contract::MAX_PARALLEL);
    state.engine.handle().set_pool_settings(pool.clone());
    pool.parallel
}

/// Drops session `id`'s saved cache (the session itself stays, and so does a cache the
/// engine holds in memory for it).
#[tauri::command]
pub async fn drop_session_cache(state: State<'_, AppState>, id: String) -> Res<()> {
    let engine = state.engine.clone();
    blocking(move || Ok(engine.handle().drop_saved_cache(&conversation(&id)?)?)).await
}

/// On quit: every conversation the engine holds goes to its own cache file (each session's
/// `ID.kvc`, never another's), so reopening one reads nothing again. Generations still
/// running are stopped first; a failure is logged, never in the way of quitting. Runs once.
pub fn save_cache_on_quit<R: Runtime>(app: &AppHandle<R>) {
    let Some(state) = app.try_state::<AppState>() else {
        return;
    };
    // Quitting raises more than one of the events that call this.
    if state.quitting.swap(true, Ordering::AcqRel) {
        return;
    }
    state.engine.cancel(None);
    match state.engine.handle().save_all() {
        Ok(saved) => {
            for (id, r) in saved {
                match r {
                    Ok(bytes) => {
                        tracing::info!(conversation = %id, bytes, "saved its cache on quit")
                    }
                    Err(e) => {
                        tracing::warn!(conversation = %id, code = %e.code, "cache not saved on quit: {}", e.message)
                    }
                }
            }
        }
        Err(e) => tracing::warn!("caches not saved on quit: {e}"),
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
pub async fn delete_session(state: State<'_, AppState>, id: String) -> Res<()> {
    let engine = state.engine.clone();
    let owner = conversation(&id)?;
    blocking(move || Ok(engine.handle().drop_saved_cache(&owner)?)).await?;
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
