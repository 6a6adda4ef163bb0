//! Saved conversations: one JSON file per session under the app data dir, written atomically
//! (a temp file in the same folder, then rename), so a crash never leaves half a session.
//! The session body is the UI's own JSON; only `id` and `title` are read here.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use ts_rs::TS;

use crate::error::{CommandError, ErrorCode};

/// One line of the session list.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, TS)]
pub struct SessionSummary {
    pub id: String,
    pub title: String,
    pub updated_ms: u64,
}

pub struct SessionStore {
    dir: PathBuf,
}

fn io(path: &Path, e: impl std::fmt::Display) -> CommandError {
    CommandError::new(ErrorCode::Io, format!("{}: {e}", path.display()))
}

/// Ids become file names: only letters, digits, `-` and `_`, at most 64.
fn check_id(id: &str) -> Result<(), CommandError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(CommandError::new(
            ErrorCode::BadSession,
            format!("invalid session id `{id}`"),
        ))
    }
}

impl SessionStore {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn path(&self, id: &str) -> Result<PathBuf, CommandError> {
        check_id(id)?;
        Ok(self.dir.join(format!("{id}.json")))
    }

    /// Writes `session` (which must carry a valid string `id` and `title`) atomically.
    pub fn save(&self, session: &Value) -> Result<SessionSummary, CommandError> {
        let summary = summary_of(session).ok_or_else(|| {
            CommandError::new(
                ErrorCode::BadSession,
                "a session needs a string id and title",
            )
        })?;
        let path = self.path(&summary.id)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let bytes = serde_json::to_vec_pretty(session)
            .map_err(|e| CommandError::new(ErrorCode::BadSession, e.to_string()))?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| io(&self.dir, e))?;
        std::io::Write::write_all(&mut tmp, &bytes).map_err(|e| io(tmp.path(), e))?;
        tmp.as_file().sync_all().map_err(|e| io(tmp.path(), e))?;
        tmp.persist(&path).map_err(|e| io(&path, e.error))?;
        Ok(summary)
    }

    pub fn load(&self, id: &str) -> Result<Value, CommandError> {
        let path = self.path(id)?;
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                CommandError::new(ErrorCode::SessionNotFound, format!("no session `{id}`"))
            }
            _ => io(&path, e),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            CommandError::new(ErrorCode::BadSession, format!("{}: {e}", path.display()))
        })
    }

    /// Every readable session, newest first (unreadable files are skipped, not fatal).
    pub fn list(&self) -> Vec<SessionSummary> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<SessionSummary> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().and_then(|x| x.to_str()) == Some("json"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
            .filter_map(|v| summary_of(&v))
            .collect();
        out.sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then(a.id.cmp(&b.id)));
        out
    }

    pub fn rename(&self, id: &str, title: &str) -> Result<SessionSummary, CommandError> {
        let mut v = self.load(id)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("title".into(), Value::String(title.trim().to_owned()));
        }
        self.save(&v)
    }

    pub fn delete(&self, id: &str) -> Result<(), CommandError> {
        let path = self.path(id)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path, e)),
        }
    }
}

fn summary_of(v: &Value) -> Option<SessionSummary> {
    let id = v.get("id")?.as_str()?.to_owned();
    check_id(&id).ok()?;
    Some(SessionSummary {
        id,
        title: v.get("title")?.as_str()?.to_owned(),
        updated_ms: v.get("updated_ms").and_then(Value::as_u64).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn saves_restores_lists_renames_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path().join("sessions"));
        let a = json!({"id": "a1", "title": "First", "updated_ms": 10, "messages": [{"role": "user", "content": "hi"}]});
        let b = json!({"id": "b2", "title": "Second", "updated_ms": 20});
        store.save(&a).unwrap();
        store.save(&b).unwrap();
        assert_eq!(store.load("a1").unwrap(), a);
        let ids: Vec<_> = store.list().into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["b2", "a1"]);
        assert_eq!(store.rename("a1", " Renamed ").unwrap().title, "Renamed");
        assert_eq!(store.load("a1").unwrap()["messages"][0]["content"], "hi");
        store.delete("a1").unwrap();
        assert_eq!(
            store.load("a1").unwrap_err().code,
            ErrorCode::SessionNotFound
        );
        // No temp files are left behind next to the sessions.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sessions"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["b2.json"]);
    }

    #[test]
    fn overwrite_replaces_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path().to_path_buf());
        store
            .save(&json!({"id": "s", "title": "long", "pad": "x".repeat(10_000)}))
            .unwrap();
        store.save(&json!({"id": "s", "title": "short"})).unwrap();
        assert_eq!(
            store.load("s").unwrap(),
            json!({"id": "s", "title": "short"})
        );
    }

    #[test]
    fn ids_cannot_escape_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path().to_path_buf());
        for bad in ["../x", "a/b", "", "a.json"] {
            assert_eq!(
                store.load(bad).unwrap_err().code,
                ErrorCode::BadSession,
                "{bad}"
            );
        }
        assert_eq!(
            store
                .save(&json!({"id": "../evil", "title": "t"}))
                .unwrap_err()
                .code,
            ErrorCode::BadSession
        );
        std::fs::write(dir.path().join("junk.json"), b"{not json").unwrap();
        assert!(store.list().is_empty());
    }
}
