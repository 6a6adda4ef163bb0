//! A session's saved KV cache, as the session list and the save and restore commands report
//! it. The engine owns the files (their names, where they live, the disk budget that keeps
//! them, their headers: `EngineHandle::saved_caches`); this module only words its answers
//! for the UI.

use serde::Serialize;
use ts_rs::TS;

use kvlab_engine::contract::CacheFileInfo;
pub use kvlab_engine::contract::SavedCache;

/// A save or restore of a session's cache.
#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct CacheTransfer {
    /// The session.
    pub id: String,
    pub cache: SavedCache,
    /// Seconds the engine took.
    pub secs: f64,
    /// Sessions whose saved caches were dropped to keep within the budget.
    pub dropped: Vec<String>,
}

impl CacheTransfer {
    /// Session `id`'s save or restore, from the engine's report of it.
    pub fn of(id: String, info: &CacheFileInfo) -> Self {
        Self {
            id,
            cache: info.saved_cache(),
            secs: info.secs,
            dropped: info.dropped.iter().map(|c| c.as_str().to_owned()).collect(),
        }
    }
}
