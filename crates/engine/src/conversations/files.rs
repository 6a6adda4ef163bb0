//! A spill directory: one cache file per conversation (`<id>.kvc`, the saved-cache format
//! of [`crate::kv::persist`], written atomically, readable by its owner only), read back
//! whole or not at all, and kept within a disk budget by removing the files saved longest
//! ago, of those it wrote itself: every file it writes is listed in its manifest
//! ([`MANIFEST`]), and no other file is ever removed. A namespaced conversation (`api:…`, a
//! server client's) is filed in a folder of its namespace's first part (`api/`), apart from
//! the app's own conversations. Folders are made 0700 on Unix.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use crate::contract::{ConversationId, ErrorCode, SavedCache};
use crate::error::{EngineError, Result};
use crate::generate::session::Session;
use crate::kv::PrecisionPolicy;
use crate::models::common::Model;

/// The extension of cache files.
const EXT: &str = "kvc";

/// The list of the files a spill directory wrote (their paths within it, one a line): the
/// only files its disk budget may remove.
pub(crate) const MANIFEST: &str = ".kvlab-spilled";

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

/// The file name of `id`'s cache within its folder: `:` written `%3A` and each capital
/// letter `%u` and the letter in lower case, so every id has a name of its own on every file
/// system, case-insensitive ones too (`%` is no id's letter).
pub(crate) fn file_name(id: &ConversationId) -> String {
    let mut name = String::with_capacity(id.as_str().len() + 8);
    for ch in id.as_str().chars() {
        match ch {
            ':' => name.push_str("%3A"),
            c if c.is_ascii_uppercase() => {
                name.push_str("%u");
                name.push(c.to_ascii_lowercase());
            }
            c => name.push(c),
        }
    }
    format!("{name}.{EXT}")
}

/// The conversation a cache file belongs to, from its name.
fn id_of(path: &Path) -> Option<ConversationId> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(&format!(".{EXT}"))?;
    let mut id = String::with_capacity(stem.len());
    let mut chars = stem.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            id.push(ch);
            continue;
        }
        match (chars.next()?, chars.next()?) {
            ('3', 'A') => id.push(':'),
            ('u', c) if c.is_ascii_lowercase() => id.push(c.to_ascii_uppercase()),
            _ => return None,
        }
    }
    ConversationId::new(id).ok()
}

/// The folder within the spill directory that `id`'s file is in: none for the app's own
/// conversations, the first part of its namespace for a namespaced one (`api`).
fn folder_of(id: &ConversationId) -> Option<&str> {
    id.as_str()
        .split_once(':')
        .map(|(first, _)| first)
        .filter(|f| !f.is_empty() && !f.starts_with('.'))
}

/// Makes `dir` and the folders above it, the ones it makes private (0700 on Unix).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

impl SpillDir {
    /// The directory `dir` (created when first written to).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Where `id`'s cache file is.
    pub fn path(&self, id: &ConversationId) -> PathBuf {
        match folder_of(id) {
            Some(folder) => self.dir.join(folder).join(file_name(id)),
            None => self.dir.join(file_name(id)),
        }
    }

    /// `id`'s file's path within the directory, as the manifest lists it.
    fn listed(id: &ConversationId) -> String {
        match folder_of(id) {
            Some(folder) => format!("{folder}/{}", file_name(id)),
            None => file_name(id),
        }
    }

    /// The files the manifest lists.
    fn manifest(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join(MANIFEST))
            .map(|text| {
                text.lines()
                    .filter(|l| !l.is_empty() && !l.contains(".."))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes the manifest (atomically: a crash leaves the old list or the new).
    fn write_manifest(&self, files: &[String]) {
        let path = self.dir.join(MANIFEST);
        let tmp = self
            .dir
            .join(format!("{MANIFEST}.tmp-{}", std::process::id()));
        let mut text = files.join("\n");
        text.push('\n');
        let written = (|| {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            std::io::Write::write_all(&mut options.open(&tmp)?, text.as_bytes())?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            tracing::warn!("the spill manifest {} was not written: {e}", path.display());
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Lists `id`'s file in the manifest: the directory wrote it.
    pub fn record(&self, id: &ConversationId) {
        let name = Self::listed(id);
        let mut files = self.manifest();
        if !files.contains(&name) {
            files.push(name);
            self.write_manifest(&files);
        }
    }

    /// The header of `id`'s file, when it has a readable one.
    pub fn peek(&self, id: &ConversationId) -> Option<FileInfo> {
        let path = self.path(id);
        let header = crate::kv::persist::peek(&path).ok()?;
        let policy = crate::kv::parse_policy(&header.spec).ok()?;
        Some(FileInfo {
            policy,
            tokens: header.seq_len,
            bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
        })
    }

    /// Writes `session` as `id`'s cache (atomically: the old file stays until the new one
    /// is whole) for the model whose identity is `identity`; returns its bytes.
    pub fn save(&self, id: &ConversationId, session: &Session, identity: &str) -> Result<u64> {
        let path = self.path(id);
        let folder = path.parent().unwrap_or(&self.dir).to_path_buf();
        private_dir(&folder).map_err(|source| EngineError::CacheIo {
            path: folder,
            source,
        })?;
        // Listed before it is written: a crash between the two leaves a listed file that is
        // missing (skipped), never an unlisted file of ours.
        self.record(id);
        session.save_cache(&path, identity)
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

    /// Every file the directory wrote that is there and has a readable header, with whose
    /// conversation it is, oldest first.
    pub fn list(&self) -> Vec<(ConversationId, SavedCache)> {
        let mut out: Vec<(ConversationId, SavedCache)> = self
            .manifest()
            .iter()
            .filter_map(|name| {
                let path = self.dir.join(name);
                Some((id_of(&path)?, saved_cache(&path)?))
            })
            .collect();
        out.sort_by(|a, b| (a.1.saved_ms, &a.0).cmp(&(b.1.saved_ms, &b.0)));
        out
    }

    /// `id`'s file as [`SpillDir::list`] lists it, reading that header alone.
    pub fn saved(&self, id: &ConversationId) -> Option<SavedCache> {
        let name = Self::listed(id);
        self.manifest()
            .contains(&name)
            .then(|| saved_cache(&self.dir.join(&name)))?
    }

    /// Removes `id`'s file, when the directory wrote it.
    pub fn remove(&self, id: &ConversationId) {
        let name = Self::listed(id);
        let mut files = self.manifest();
        if let Some(i) = files.iter().position(|f| *f == name) {
            let _ = std::fs::remove_file(self.dir.join(&name));
            files.remove(i);
            self.write_manifest(&files);
        }
    }

    /// Removes the files saved longest ago, of those the directory wrote, until they take at
    /// most `budget` bytes together, never those of `keep`; returns whose files went.
    pub fn enforce_budget(&self, budget: u64, keep: &[ConversationId]) -> Vec<ConversationId> {
        let listed = self.manifest();
        if listed.is_empty() {
            return Vec::new();
        }
        let mut files: Vec<(SystemTime, u64, String, ConversationId)> = listed
            .iter()
            .filter_map(|name| {
                let path = self.dir.join(name);
                let id = id_of(&path)?;
                let meta = std::fs::symlink_metadata(&path).ok()?;
                meta.is_file()
                    .then(|| Some((meta.modified().ok()?, meta.len(), name.clone(), id)))?
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, b, _, _)| b).sum();
        files.sort_by_key(|(t, _, _, _)| *t);
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for (_, bytes, name, id) in files {
            if total > budget
                && !keep.contains(&id)
                && std::fs::remove_file(self.dir.join(&name)).is_ok()
            {
                total -= bytes;
                removed.push(id);
            } else {
                kept.push(name);
            }
        }
        // Listed files that are missing, or were removed, leave the list.
        if kept.len() != listed.len() {
            self.write_manifest(&kept);
        }
        removed
    }
}

/// When the file at `path` was last written, in ms since the Unix epoch (0 when the file
/// system does not say).
pub(crate) fn modified_ms(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// The cache file at `path` (a plain file, never through a link) as the store lists it,
/// from its header alone.
fn saved_cache(path: &Path) -> Option<SavedCache> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let header = crate::kv::persist::peek(path).ok()?;
    Some(SavedCache {
        bytes: meta.len(),
        tokens: header.seq_len,
        spec: header.spec,
        saved_ms: modified_ms(path),
    })
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
        for id in [
            "s-1",
            "api:7",
            "api%3A7x",
            "a.b_c",
            "Chat",
            "chat",
            "api:ab:X-Y",
        ] {
            let id = ConversationId::new(id.replace('%', "")).unwrap();
            let name = file_name(&id);
            assert!(!name.contains('/') && !name.contains(':'), "{name}");
            assert_eq!(id_of(Path::new(&name)), Some(id));
        }
        assert_ne!(
            file_name(&ConversationId::new("api:x").unwrap()),
            file_name(&ConversationId::new("api_x").unwrap())
        );
        // No two ids differ only by case once written: a case-insensitive file system
        // cannot alias two conversations.
        let lower = |id: &str| file_name(&ConversationId::new(id).unwrap()).to_lowercase();
        assert_ne!(lower("Chat"), lower("chat"));
        assert_ne!(lower("api:ab:X"), lower("api:ab:x"));
    }

    #[test]
    fn only_files_it_wrote_are_removed_and_they_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let spill = SpillDir::new(dir.path().join("spill"));
        private_dir(&dir.path().join("spill")).unwrap();
        // A file the user put there, named like a cache, and one of ours.
        let planted = dir.path().join("spill/user-session.kvc");
        std::fs::write(&planted, vec![7u8; 4096]).unwrap();
        let ours = ConversationId::new("api:ab:mine").unwrap();
        spill.record(&ours);
        let path = spill.path(&ours);
        assert!(path.starts_with(dir.path().join("spill/api")), "{path:?}");
        private_dir(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![1u8; 4096]).unwrap();
        // A budget of nothing removes ours only.
        assert_eq!(spill.enforce_budget(0, &[]), vec![ours.clone()]);
        assert!(planted.exists() && !path.exists());
        assert!(spill.manifest().is_empty());
        // Remove is as careful.
        spill.remove(&ConversationId::new("user-session").unwrap());
        assert!(planted.exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }
}
