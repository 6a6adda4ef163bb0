//! Saved KV caches beside their sessions: `<id>.kvc` in the sessions folder, in the format the
//! engine owns (`kvlab_engine::kv::persist`). This module only chooses where each file lives,
//! reads what each holds from its header, and keeps them all under a disk budget the user
//! sets, the least recently saved dropped first (never the one just saved).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;
use ts_rs::TS;

use super::check_id;
use crate::error::{CommandError, ErrorCode};

/// What saved caches may take on disk, all together, unless the user chooses otherwise.
pub const DEFAULT_CACHE_BUDGET_BYTES: u64 = 2 << 30;

/// The extension of a saved cache.
const EXTENSION: &str = "kvc";

/// A session's saved cache, as the session list shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, TS)]
pub struct SavedCache {
    /// The file's size.
    #[ts(type = "number")]
    pub bytes: u64,
    /// Tokens it holds.
    pub tokens: usize,
    /// Its precision, as a cache SPEC.
    pub spec: String,
    /// When it was written (ms since the Unix epoch).
    #[ts(type = "number")]
    pub saved_ms: u64,
}

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

/// The saved caches in one folder.
#[derive(Debug, Clone)]
pub struct SessionCaches {
    dir: PathBuf,
}

fn ms_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SessionCaches {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where session `id`'s cache lives.
    pub fn path(&self, id: &str) -> Result<PathBuf, CommandError> {
        check_id(id)?;
        Ok(self.dir.join(format!("{id}.{EXTENSION}")))
    }

    /// The folder, created if missing (a cache can be saved before its session is).
    pub fn ensure_dir(&self) -> Result<(), CommandError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| CommandError::new(ErrorCode::Io, format!("{}: {e}", self.dir.display())))
    }

    /// What session `id`'s saved cache holds, from its header alone; `None` when there is
    /// none or it does not read (a restore then reports why and sets it aside).
    pub fn info(&self, id: &str) -> Option<SavedCache> {
        let path = self.path(id).ok()?;
        saved_cache(&path)
    }

    /// Drops session `id`'s saved cache, if any.
    pub fn remove(&self, id: &str) -> Result<(), CommandError> {
        let path = self.path(id)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CommandError::new(
                ErrorCode::Io,
                format!("{}: {e}", path.display()),
            )),
        }
    }

    /// Every saved cache of a session (its `<id>.json` beside it): session id, bytes, last
    /// write; oldest first. A `.kvc` file without its session is not ours: it is never
    /// counted, listed or removed.
    fn all(&self) -> Vec<(String, u64, SystemTime)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<(String, u64, SystemTime)> = rd
            .flatten()
            .filter_map(|e| {
                let path = e.path();
                if path.extension()?.to_str()? != EXTENSION {
                    return None;
                }
                let id = path.file_stem()?.to_str()?.to_owned();
                if !self.dir.join(format!("{id}.json")).is_file() {
                    return None;
                }
                let meta = e.metadata().ok()?;
                if !meta.is_file() {
                    return None;
                }
                Some((id, meta.len(), meta.modified().ok()?))
            })
            .collect();
        out.sort_by(|a, b| a.2.cmp(&b.2).then(a.0.cmp(&b.0)));
        out
    }

    /// Bytes all saved caches take.
    pub fn total_bytes(&self) -> u64 {
        self.all().iter().map(|c| c.1).sum()
    }

    /// Drops the least recently saved caches, never `keep`'s, until all of them fit in
    /// `budget` bytes; returns the sessions whose caches went.
    pub fn enforce_budget(&self, budget: u64, keep: &str) -> Vec<String> {
        let all = self.all();
        let mut total: u64 = all.iter().map(|c| c.1).sum();
        let mut dropped = Vec::new();
        for (id, bytes, _) in all {
            if total <= budget {
                break;
            }
            if id == keep {
                continue;
            }
            if self.remove(&id).is_ok() {
                total -= bytes;
                dropped.push(id);
            }
        }
        dropped
    }
}

impl SavedCache {
    /// The file the engine just saved or restored, from the engine's own report of it.
    pub fn from_engine(info: kvlab_engine::worker::CacheFileInfo) -> Self {
        Self {
            saved_ms: modified_ms(&info.path),
            bytes: info.bytes,
            tokens: info.tokens,
            spec: info.spec,
        }
    }
}

/// When the file at `path` was last written (ms since the Unix epoch; 0 if unknown).
fn modified_ms(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(ms_since_epoch)
        .unwrap_or(0)
}

/// The saved cache at `path`, from its header.
fn saved_cache(path: &Path) -> Option<SavedCache> {
    let meta = std::fs::metadata(path).ok()?;
    let header = kvlab_engine::kv::persist::peek(path).ok()?;
    Some(SavedCache {
        bytes: meta.len(),
        tokens: header.seq_len,
        spec: header.spec,
        saved_ms: modified_ms(path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A session `id` and its saved cache.
    fn write(dir: &Path, id: &str, bytes: usize, age_s: u64) {
        std::fs::write(dir.join(format!("{id}.json")), b"{}").unwrap();
        let path = dir.join(format!("{id}.kvc"));
        std::fs::write(&path, vec![0u8; bytes]).unwrap();
        let t = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn the_budget_drops_the_oldest_caches_but_never_the_one_just_saved() {
        let dir = tempfile::tempdir().unwrap();
        let caches = SessionCaches::new(dir.path().into());
        write(dir.path(), "old", 400, 300);
        write(dir.path(), "middle", 300, 200);
        write(dir.path(), "kept", 500, 250);
        write(dir.path(), "new", 200, 100);
        // A cache file no session of ours owns: never counted nor removed.
        let planted = dir.path().join("user-session.kvc");
        std::fs::write(&planted, vec![0u8; 5000]).unwrap();
        assert_eq!(caches.total_bytes(), 1400);
        // Over by 400: "old" goes (400); "kept" is older than "middle" but is the one kept.
        assert_eq!(caches.enforce_budget(1000, "kept"), vec!["old".to_string()]);
        assert_eq!(caches.total_bytes(), 1000);
        // Over by 300: "kept" is now the oldest, and no longer protected.
        assert_eq!(caches.enforce_budget(700, "new"), vec!["kept".to_string()]);
        // Only the protected one fits nowhere near a tiny budget: it stays, the rest go.
        assert_eq!(caches.enforce_budget(10, "middle"), vec!["new".to_string()]);
        assert_eq!(caches.total_bytes(), 300);
        assert!(dir.path().join("new.json").exists());
        assert!(
            planted.exists(),
            "a file the app did not write is never removed"
        );
    }

    #[test]
    fn a_file_that_is_not_a_cache_lists_as_none_and_ids_stay_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let caches = SessionCaches::new(dir.path().into());
        write(dir.path(), "junk", 64, 0);
        assert_eq!(caches.info("junk"), None);
        assert_eq!(caches.info("absent"), None);
        assert!(caches.path("../escape").is_err());
        caches.remove("junk").unwrap();
        caches.remove("junk").unwrap();
    }
}
