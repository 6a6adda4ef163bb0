//! Saved conversations: one JSON file per session under the app data dir, written atomically
//! (a temp file in the same folder, synced, then renamed over the old one, then the folder
//! synced), so a crash or a kill -9 leaves the old file or the new one, never half of one. A
//! full disk fails the save with `disk_full` and leaves the previous file as it was. A file
//! that is truncated or corrupt anyway (edited by hand, a disk fault) is set aside under a new
//! name, never deleted, and reported, while the other sessions load. The session body is the
//! UI's own JSON; only `id` and `title` are read here.

pub mod caches;
pub mod commands;

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use ts_rs::TS;

use crate::error::{AppCode, Code, CommandError, ErrorCode};

/// One line of the session list.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, TS)]
pub struct SessionSummary {
    pub id: String,
    pub title: String,
    pub updated_ms: u64,
    /// Its saved KV cache, when it has one.
    #[ts(optional)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<caches::SavedCache>,
}

/// A session file that could not be read, and where it went.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, TS)]
pub struct UnreadableSession {
    /// The file's name in the sessions folder.
    pub file: String,
    /// The name it was set aside under (same folder), when it was corrupt; `None` when it
    /// could not be read at all and was left where it is.
    #[ts(optional)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_aside_as: Option<String>,
    /// `session_corrupt`, or `io` for a file that could not be read.
    pub code: Code,
    pub message: String,
}

/// The sessions that load, newest first, and the files that did not.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq, TS)]
pub struct SessionList {
    pub sessions: Vec<SessionSummary>,
    pub unreadable: Vec<UnreadableSession>,
}

/// Writes a session's bytes into its temp file. [`write_all`] on a real store; tests inject
/// a failing one (a disk that fills up mid-write).
pub type Writer = fn(&mut File, &[u8]) -> io::Result<()>;

/// The writer of a real store.
pub fn write_all(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    file.write_all(bytes)
}

pub struct SessionStore {
    dir: PathBuf,
    write: Writer,
}

/// Temp files are named so, so one left by a killed save is known and removed.
const TEMP_PREFIX: &str = ".saving-";
const TEMP_SUFFIX: &str = ".tmp";
/// What a set-aside file's name gains: no longer `.json`, so it is never listed again.
const SET_ASIDE: &str = ".corrupt-";

fn io(path: &Path, e: impl std::fmt::Display) -> CommandError {
    CommandError::new(ErrorCode::Io, format!("{}: {e}", path.display()))
}

/// A failed write: `disk_full` when the disk (or the user's quota) is full, else `io`.
fn write_failed(path: &Path, e: io::Error) -> CommandError {
    if e.kind() == io::ErrorKind::StorageFull || e.kind() == io::ErrorKind::QuotaExceeded {
        return CommandError::new(
            ErrorCode::DiskFull,
            format!(
                "the disk is full, so the session was not saved ({}: {e}); the previous save \
                 is kept — free some space and it saves again on the next change",
                path.display()
            ),
        );
    }
    io(path, e)
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
            AppCode::BadSession,
            format!("invalid session id `{id}`"),
        ))
    }
}

impl SessionStore {
    /// The store in `dir`. Temp files left there by a save that was killed are removed: the
    /// session they belonged to is whole in its own file, old or new.
    pub fn new(dir: PathBuf) -> Self {
        Self::with_writer(dir, write_all)
    }

    /// A store whose saves write through `write` (fault injection in tests).
    pub fn with_writer(dir: PathBuf, write: Writer) -> Self {
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for entry in rd.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Self { dir, write }
    }

    fn path(&self, id: &str) -> Result<PathBuf, CommandError> {
        check_id(id)?;
        Ok(self.dir.join(format!("{id}.json")))
    }

    /// Writes `session` (which must carry a valid string `id` and `title`) atomically. On
    /// any failure the previous file is untouched and the temp file is removed.
    pub fn save(&self, session: &Value) -> Result<SessionSummary, CommandError> {
        let summary = summary_of(session).ok_or_else(|| {
            CommandError::new(AppCode::BadSession, "a session needs a string id and title")
        })?;
        let path = self.path(&summary.id)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| write_failed(&self.dir, e))?;
        let bytes = serde_json::to_vec_pretty(session)
            .map_err(|e| CommandError::new(AppCode::BadSession, e.to_string()))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(TEMP_SUFFIX)
            .tempfile_in(&self.dir)
            .map_err(|e| write_failed(&self.dir, e))?;
        // Dropping `tmp` on an early return removes the temp file.
        (self.write)(tmp.as_file_mut(), &bytes).map_err(|e| write_failed(&path, e))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| write_failed(&path, e))?;
        tmp.persist(&path)
            .map_err(|e| write_failed(&path, e.error))?;
        sync_dir(&self.dir);
        Ok(summary)
    }

    pub fn load(&self, id: &str) -> Result<Value, CommandError> {
        let path = self.path(id)?;
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                CommandError::new(AppCode::SessionNotFound, format!("no session `{id}`"))
            }
            _ => io(&path, e),
        })?;
        match parse(&bytes) {
            Ok((v, _)) => Ok(v),
            Err(why) => {
                let u = self.set_aside(&path, why);
                Err(CommandError::new(u.code, u.message))
            }
        }
    }

    /// Every session that loads, newest first; a corrupt file is set aside and reported, and
    /// the others load all the same.
    pub fn list(&self) -> SessionList {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return SessionList::default();
        };
        let mut out = SessionList::default();
        for entry in rd.flatten() {
            let path = entry.path();
            if path.extension() != Some(OsStr::new("json")) || !path.is_file() {
                continue;
            }
            match std::fs::read(&path) {
                Ok(bytes) => match parse(&bytes) {
                    Ok((_, summary)) => out.sessions.push(summary),
                    Err(why) => out.unreadable.push(self.set_aside(&path, why)),
                },
                Err(e) => out.unreadable.push(UnreadableSession {
                    file: file_name(&path),
                    set_aside_as: None,
                    code: ErrorCode::Io.into(),
                    message: format!("{}: {e}", file_name(&path)),
                }),
            }
        }
        out.sessions
            .sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then(a.id.cmp(&b.id)));
        out.unreadable.sort_by(|a, b| a.file.cmp(&b.file));
        out
    }

    /// Renames the corrupt file at `path` out of the list (`NAME.json.corrupt-MS`), so what
    /// it holds is kept for the user to look at, and says so.
    fn set_aside(&self, path: &Path, why: String) -> UnreadableSession {
        let file = file_name(path);
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let aside = format!("{file}{SET_ASIDE}{ms}");
        match std::fs::rename(path, self.dir.join(&aside)) {
            Ok(()) => {
                tracing::warn!(%file, %aside, %why, "a corrupt session was set aside");
                UnreadableSession {
                    message: format!(
                        "{file} is corrupt ({why}); it was set aside as {aside} in {}",
                        self.dir.display()
                    ),
                    file,
                    set_aside_as: Some(aside),
                    code: AppCode::SessionCorrupt.into(),
                }
            }
            Err(e) => UnreadableSession {
                message: format!("{file} is corrupt ({why}) and could not be set aside: {e}"),
                file,
                set_aside_as: None,
                code: AppCode::SessionCorrupt.into(),
            },
        }
    }

    pub fn rename(&self, id: &str, title: &str) -> Result<SessionSummary, CommandError> {
        let mut v = self.load(id)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("title".into(), Value::String(title.trim().to_owned()));
        }
        self.save(&v)
    }

    /// The folder the sessions are in (the engine keeps their caches' files there too).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Deletes a session (its saved cache is the engine's to remove).
    pub fn delete(&self, id: &str) -> Result<(), CommandError> {
        let path = self.path(id)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path, e)),
        }
    }
}

/// The session in `bytes` and its summary, or why it is corrupt.
fn parse(bytes: &[u8]) -> Result<(Value, SessionSummary), String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            format!("truncated: {e}")
        } else {
            format!("not valid JSON: {e}")
        }
    })?;
    let summary = summary_of(&v).ok_or("no valid string `id` and `title`")?;
    Ok((v, summary))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Makes the rename itself durable (the folder's entry), where the platform can; a failure
/// only weakens that guarantee against power loss, so it is not an error.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

fn summary_of(v: &Value) -> Option<SessionSummary> {
    let id = v.get("id")?.as_str()?.to_owned();
    check_id(&id).ok()?;
    Some(SessionSummary {
        id,
        title: v.get("title")?.as_str()?.to_owned(),
        updated_ms: v.get("updated_ms").and_then(Value::as_u64).unwrap_or(0),
        cache: None,
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
        let ids: Vec<_> = store.list().sessions.into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["b2", "a1"]);
        assert_eq!(store.rename("a1", " Renamed ").unwrap().title, "Renamed");
        assert_eq!(store.load("a1").unwrap()["messages"][0]["content"], "hi");
        store.delete("a1").unwrap();
        assert_eq!(store.load("a1").unwrap_err().code, AppCode::SessionNotFound);
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
                AppCode::BadSession,
                "{bad}"
            );
        }
        assert_eq!(
            store
                .save(&json!({"id": "../evil", "title": "t"}))
                .unwrap_err()
                .code,
            AppCode::BadSession
        );
        std::fs::write(dir.path().join("junk.json"), b"{not json").unwrap();
        assert!(store.list().sessions.is_empty());
    }
}
