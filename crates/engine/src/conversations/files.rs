//! A spill directory: one cache file per conversation (`<id>.kvc`, the saved-cache format
//! of [`crate::kv::persist`], written atomically), read back whole or not at all, and kept
//! within a disk budget by removing the files saved longest ago.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use crate::contract::{ConversationId, ErrorCode};
use crate::error::{EngineError, Result};
use crate::generate::session::Session;
use crate::kv::{CacheSpec, PrecisionPolicy};
use crate::models::common::Model;

/// The extension of cache files.
const EXT: &str = "kvc";

/// What a cache file's header says, read without its sections.
#[derive(Debug, Clone)]
pub(crate) struct FileInfo {
    pub policy: PrecisionPolicy,
    pub tokens: usize,
    pub bytes: u64,
}

/// A directory of conversations' cache files.
#[derive(Debug, Clone)]
pub(crate) struct SpillDir {
    dir: PathBuf,
}

/// The file name of `id`'s cache (`:` written `%3A`, so every id has a name of its own on
/// every file system).
pub(crate) fn file_name(id: &ConversationId) -> String {
    format!("{}.{EXT}", id.as_str().replace(':', "%3A"))
}

/// The conversation a cache file belongs to, from its name.
fn id_of(path: &Path) -> Option<ConversationId> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(&format!(".{EXT}"))?;
    ConversationId::new(stem.replace("%3A", ":")).ok()
}

impl SpillDir {
    /// The directory `dir` (created when first written to).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Where `id`'s cache file is.
    pub fn path(&self, id: &ConversationId) -> PathBuf {
        self.dir.join(file_name(id))
    }

    /// The header of `id`'s file, when it has a readable one.
    pub fn peek(&self, id: &ConversationId) -> Option<FileInfo> {
        let path = self.path(id);
        let header = crate::kv::persist::peek(&path).ok()?;
        let policy = CacheSpec::parse(&header.spec).ok()?.to_policy();
        Some(FileInfo {
            policy,
            tokens: header.seq_len,
            bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
        })
    }

    /// Writes `session` as `id`'s cache (atomically: the old file stays until the new one
    /// is whole) for the model whose identity is `identity`; returns its bytes.
    pub fn save(&self, id: &ConversationId, session: &Session, identity: &str) -> Result<u64> {
        std::fs::create_dir_all(&self.dir).map_err(|source| EngineError::CacheIo {
            path: self.dir.clone(),
            source,
        })?;
        session.save_cache(&self.path(id), identity)
    }

    /// Reads `id`'s cache back into a session (the precision it was saved in) and the
    /// seconds it took. A file that fails its checks for corruption is set aside
    /// (`<name>.corrupt`), never deleted.
    pub fn restore(
        &self,
        id: &ConversationId,
        model: &Model,
        identity: &str,
        rewind_margin: usize,
    ) -> Result<(Session, f64)> {
        let path = self.path(id);
        let started = Instant::now();
        let mut session = Session::new(model, &PrecisionPolicy::default())?;
        session.set_rewind_margin(rewind_margin);
        match session.restore_cache_as_saved(model, &path, identity) {
            Ok(_) => Ok((session, started.elapsed().as_secs_f64())),
            Err(e) => {
                if e.code() == ErrorCode::CacheCorrupt {
                    set_aside(&path);
                }
                Err(e)
            }
        }
    }

    /// Removes `id`'s file, if any.
    pub fn remove(&self, id: &ConversationId) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// Removes the files saved longest ago until all of them together take at most
    /// `budget` bytes, never those of `keep`; returns whose files went.
    pub fn enforce_budget(&self, budget: u64, keep: &[ConversationId]) -> Vec<ConversationId> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<(SystemTime, u64, PathBuf, ConversationId)> = entries
            .flatten()
            .filter_map(|e| {
                let path = e.path();
                let id = id_of(&path)?;
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), path, id))
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, b, _, _)| b).sum();
        files.sort_by_key(|(t, _, _, _)| *t);
        let mut removed = Vec::new();
        for (_, bytes, path, id) in files {
            if total <= budget {
                break;
            }
            if keep.contains(&id) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= bytes;
                removed.push(id);
            }
        }
        removed
    }
}

/// Moves a corrupt file to `<name>.corrupt` beside it.
fn set_aside(path: &Path) {
    let mut aside = path.as_os_str().to_os_string();
    aside.push(".corrupt");
    let _ = std::fs::rename(path, aside);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_has_a_file_name_of_its_own() {
        for id in ["s-1", "api:7", "api%3A7x", "a.b_c"] {
            let id = ConversationId::new(id.replace('%', "")).unwrap();
            let name = file_name(&id);
            assert!(!name.contains('/') && !name.contains(':'), "{name}");
            assert_eq!(id_of(Path::new(&name)), Some(id));
        }
        assert_ne!(
            file_name(&ConversationId::new("api:x").unwrap()),
            file_name(&ConversationId::new("api_x").unwrap())
        );
    }
}
