//! Hugging Face Hub downloads (cargo feature `hub`): the files a text model needs, at one
//! resolved commit, into `<dir>/<owner>--<name>/<commit>/`, with per-file and overall byte
//! progress, cancellation, and resume of partial files. hf-hub 1.0 restarts interrupted files
//! from byte 0, so each file is fetched here with its ranged stream API into `<file>.part`,
//! continuing from the bytes already on disk. The async client runs on a private tokio
//! runtime driven by the calling thread; no async code leaks out of this module.
//! A repository of GGUF files (`*-GGUF`) is listed by quantization ([`list_gguf_quants`]) and
//! one quantization is fetched ([`download_model`]); projectors (`mmproj-*`) never are.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::AtomicBool;

use futures::StreamExt;
use hf_hub::repository::{HFRepository, RepoTreeEntry, RepoTypeModel};
use hf_hub::{HFClient, HFError};

use super::gguf_quants::{group_quants, pick, GgufQuant};
use super::hub_fetch::{write_error, Fetch, FileJob};
use super::hub_retry::{self, to_source_error, RetryPolicy};
use super::SourceError;

/// Files of a text model; everything else (images, ONNX, GGUF variants) is skipped.
fn wanted(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".json") || name.ends_with(".safetensors") || name == "tokenizer.model"
}

/// Marker written into a snapshot directory once every file is complete and verified.
const COMPLETE_MARKER: &str = ".kvlab-complete";

/// Where and how to download.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// The Hub base URL; `None` reads `HF_ENDPOINT`, else `https://huggingface.co`.
    pub endpoint: Option<String>,
    /// Download root; `None` is [`default_download_dir`].
    pub dir: Option<PathBuf>,
    /// Access token (gated repos such as Gemma); `None` reads `HF_TOKEN` or the HF token file.
    pub token: Option<String>,
    /// How failed requests are retried (listing and transfers alike).
    pub retry: RetryPolicy,
}

/// One progress report: the file being fetched and the whole download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadProgress {
    /// Repository path of the current file.
    pub file: String,
    /// Bytes of that file on disk.
    pub file_done: u64,
    /// Size of that file.
    pub file_total: u64,
    /// Bytes on disk over all files (including those kept from an earlier, partial run).
    pub done: u64,
    /// Size of all files.
    pub total: u64,
}

/// The default download root: `$KVLAB_CACHE/hub`, else `~/.cache/kvlab/hub` (the cache root
/// the scripts and the offline test assets share).
pub fn default_download_dir() -> Result<PathBuf, SourceError> {
    download_dir_from(std::env::var_os("KVLAB_CACHE"), dirs::home_dir())
        .ok_or(SourceError::NoCacheDir)
}

/// [`default_download_dir`] given `$KVLAB_CACHE` and the home directory (pure, for tests).
fn download_dir_from(cache: Option<std::ffi::OsString>, home: Option<PathBuf>) -> Option<PathBuf> {
    let root = match cache {
        Some(c) if !c.is_empty() => PathBuf::from(c),
        _ => home?.join(".cache").join("kvlab"),
    };
    Some(root.join("hub"))
}

fn net(repo: &str, reason: impl Into<String>) -> SourceError {
    SourceError::Network {
        repo: repo.to_owned(),
        reason: reason.into(),
    }
}

/// `owner--name`, the folder of a repository under the download root.
fn repo_folder(repo: &str) -> String {
    repo.replace('/', "--")
}

/// A repository path as a safe relative path (the listing comes from a server).
fn safe_relative(repo: &str, path: &str) -> Result<PathBuf, SourceError> {
    let p = Path::new(path);
    if path.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(net(repo, format!("the Hub listed an unsafe path `{path}`")));
    }
    Ok(p.to_path_buf())
}

/// `id` when it is a commit id as the Hub writes them (40 hex digits): only then does it
/// become a folder name (a hostile answer or a tampered ref file could name `../..`).
fn commit_id(id: &str) -> Option<&str> {
    let id = id.trim();
    (id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The snapshot folder a finished download of `revision` recorded in its ref.
fn recorded_snapshot(root: &Path, revision: &str) -> Option<PathBuf> {
    let commit = std::fs::read_to_string(root.join("refs").join(revision)).ok()?;
    Some(root.join(commit_id(&commit)?))
}

/// A snapshot completed earlier for `revision` (used when the Hub cannot be reached).
fn completed_snapshot(root: &Path, revision: &str) -> Option<PathBuf> {
    let dir = recorded_snapshot(root, revision)?;
    dir.join(COMPLETE_MARKER).exists().then_some(dir)
}

fn io(path: &Path, e: std::io::Error) -> SourceError {
    write_error(path, e, None)
}

/// The marker of one finished GGUF quantization in a snapshot; it holds the path of the
/// quant's (first) file, relative to the snapshot.
fn gguf_marker(quant: &str) -> String {
    let safe: String = quant
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{COMPLETE_MARKER}-{safe}")
}

/// A GGUF quantization completed earlier for `revision`: its (first) file.
fn completed_gguf(root: &Path, revision: &str, quant: &str) -> Option<PathBuf> {
    let dir = recorded_snapshot(root, revision)?;
    let file = std::fs::read_to_string(dir.join(gguf_marker(quant))).ok()?;
    let path = dir.join(safe_relative("", file.trim()).ok()?);
    path.is_file().then_some(path)
}

/// A private runtime and a client for `repo`, as `options` say.
fn connect(
    repo: &str,
    options: &HubOptions,
) -> Result<(tokio::runtime::Runtime, HFRepository<RepoTypeModel>), SourceError> {
    let (owner, name) = repo
        .split_once('/')
        .ok_or_else(|| net(repo, format!("`{repo}` is not owner/name")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| net(repo, format!("cannot start the download runtime: {e}")))?;
    // One retry policy, ours (see hub_retry): hf-hub's own retries would multiply it.
    let mut builder = HFClient::builder()
        .cache_enabled(false)
        .retry_max_attempts(0);
    if let Some(e) = &options.endpoint {
        builder = builder.endpoint(e.clone());
    }
    if let Some(t) = &options.token {
        builder = builder.token(t.clone());
    }
    let client = builder
        .build()
        .map_err(|e| to_source_error(repo, e, Default::default()))?;
    Ok((runtime, client.model(owner, name)))
}

/// The GGUF quantizations `repo` offers at `revision` (default `main`), smallest first,
/// with their sizes from the listing; nothing is downloaded. Empty for a repository without
/// GGUF files.
pub fn list_gguf_quants(
    repo: &str,
    revision: Option<&str>,
    options: &HubOptions,
    cancel: &AtomicBool,
) -> Result<Vec<GgufQuant>, SourceError> {
    let (runtime, handle) = connect(repo, options)?;
    let revision = revision.unwrap_or("main");
    let listed = runtime.block_on(hub_retry::retry(&options.retry, cancel, || {
        list_files(&handle, revision)
    }))?;
    let (_, files) = listed.map_err(|(e, tries)| to_source_error(repo, e, tries))?;
    Ok(group_quants(files.iter().map(|(p, s, _)| (p.as_str(), *s))))
}

/// Downloads the model files of `repo` at `revision` (default `main`) and returns the local
/// snapshot directory; for a repository of GGUF files only, the default quantization
/// ([`download_model`]). Files already complete are kept; partial files are resumed. When
/// the Hub cannot be reached, a snapshot completed earlier for the same revision is
/// returned.
pub fn download_repo(
    repo: &str,
    revision: Option<&str>,
    options: &HubOptions,
    on_progress: &mut dyn FnMut(&DownloadProgress),
    cancel: &AtomicBool,
) -> Result<PathBuf, SourceError> {
    download_model(repo, revision, None, options, on_progress, cancel)
}

/// [`download_repo`] with a GGUF quantization: with `quant` (`Q4_K_M`, `Q8_0`, …; see
/// [`list_gguf_quants`]), only that quant's file(s) are fetched and the path of its (first)
/// file is returned; without it, a repository with safetensors gives its snapshot
/// directory and one of GGUF files only gives [`super::gguf_quants::DEFAULT_QUANT`] (else
/// the smallest). A quant the repository lacks is `model_not_found`, naming those it has.
pub fn download_model(
    repo: &str,
    revision: Option<&str>,
    quant: Option<&str>,
    options: &HubOptions,
    on_progress: &mut dyn FnMut(&DownloadProgress),
    cancel: &AtomicBool,
) -> Result<PathBuf, SourceError> {
    let revision = revision.unwrap_or("main");
    let base = match &options.dir {
        Some(d) => d.clone(),
        None => default_download_dir()?,
    };
    let root = base.join(repo_folder(repo));
    let (runtime, handle) = connect(repo, options)?;
    let listed = runtime.block_on(hub_retry::retry(&options.retry, cancel, || {
        list_files(&handle, revision)
    }))?;
    let (commit, all) = match listed {
        Ok(v) => v,
        Err((e, tries)) => {
            let err = to_source_error(repo, e, tries);
            // Offline, or the Hub failing: a finished snapshot of the same revision is as
            // good as a download.
            if matches!(
                err,
                SourceError::Network { .. }
                    | SourceError::HubUnavailable { .. }
                    | SourceError::RateLimited { .. }
            ) {
                let done = match quant {
                    Some(q) => completed_gguf(&root, revision, q),
                    None => completed_snapshot(&root, revision).or_else(|| {
                        completed_gguf(&root, revision, super::gguf_quants::DEFAULT_QUANT)
                    }),
                };
                if let Some(found) = done {
                    return Ok(found);
                }
            }
            return Err(err);
        }
    };
    let has_safetensors = all.iter().any(|(p, _, _)| p.ends_with(".safetensors"));
    // (marker name, what the marker holds, what is returned relative to the snapshot)
    let (files, marker, returned) = if quant.is_none() && has_safetensors {
        let files: Vec<_> = all.into_iter().filter(|(p, _, _)| wanted(p)).collect();
        (files, COMPLETE_MARKER.to_owned(), None)
    } else {
        let quants = group_quants(all.iter().map(|(p, s, _)| (p.as_str(), *s)));
        let Some(chosen) = pick(&quants, quant) else {
            let offered: Vec<_> = quants.iter().map(|q| q.name.as_str()).collect();
            return Err(SourceError::HubNotFound {
                repo: repo.to_owned(),
                reason: match quant {
                    Some(q) if !offered.is_empty() => format!(
                        "no {q} GGUF in the repository; it offers {}",
                        offered.join(", ")
                    ),
                    _ => "the repository has no model files (*.safetensors, *.gguf)".into(),
                },
            });
        };
        let first = chosen.files.first().cloned().unwrap_or_default();
        let files: Vec<_> = all
            .into_iter()
            .filter(|(p, _, _)| chosen.files.contains(p))
            .collect();
        (files, gguf_marker(&chosen.name), Some(first))
    };
    if files.is_empty() {
        return Err(SourceError::HubNotFound {
            repo: repo.to_owned(),
            reason: "the repository has no model files (*.safetensors, *.json)".into(),
        });
    }
    let dir = root.join(&commit);
    let mut jobs = Vec::with_capacity(files.len());
    for (path, size, sha256) in files {
        let dest = dir.join(safe_relative(repo, &path)?);
        jobs.push(FileJob {
            path,
            dest,
            size,
            sha256,
        });
    }
    let fetch = Fetch {
        repo,
        handle: &handle,
        commit: &commit,
        cancel,
        retry: &options.retry,
    };
    runtime.block_on(fetch.all(&jobs, on_progress))?;
    let marker_path = dir.join(&marker);
    let content = returned.as_deref().unwrap_or(&commit);
    std::fs::write(&marker_path, content.as_bytes()).map_err(|e| io(&marker_path, e))?;
    let refs = root.join("refs");
    std::fs::create_dir_all(&refs).map_err(|e| io(&refs, e))?;
    // A revision containing `/` (branch `a/b`) gets no offline ref; the download still works.
    if safe_relative(repo, revision).is_ok_and(|p| p.components().count() == 1) {
        let r = refs.join(revision);
        std::fs::write(&r, commit.as_bytes()).map_err(|e| io(&r, e))?;
    }
    match returned {
        Some(file) => Ok(dir.join(safe_relative(repo, &file)?)),
        None => Ok(dir),
    }
}

/// The commit `revision` points at and every file there: (path, size, sha256).
type Listing = (String, Vec<(String, u64, Option<String>)>);

async fn list_files(
    handle: &HFRepository<RepoTypeModel>,
    revision: &str,
) -> Result<Listing, HFError> {
    let info = handle.info().revision(revision.to_owned()).send().await?;
    let commit = info
        .sha
        .as_deref()
        .and_then(commit_id)
        .map(str::to_owned)
        .ok_or_else(|| {
            HFError::InvalidParameter(format!(
                "the Hub gave no valid commit id (40 hex digits) for revision {revision}"
            ))
        })?;
    let stream = handle
        .list_tree()
        .revision(commit.clone())
        .recursive(true)
        .send()?;
    futures::pin_mut!(stream);
    let mut files = Vec::new();
    while let Some(entry) = stream.next().await {
        if let RepoTreeEntry::File {
            path, size, lfs, ..
        } = entry?
        {
            files.push((path, size, lfs.and_then(|l| l.sha256)));
        }
    }
    Ok((commit, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_text_model_files_are_wanted() {
        for p in [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.model",
            "sub/tokenizer.json",
        ] {
            assert!(wanted(p), "{p}");
        }
        for p in [
            "README.md",
            "model.gguf",
            "onnx/model.onnx",
            "tokenizer.model.bak",
        ] {
            assert!(!wanted(p), "{p}");
        }
    }

    #[test]
    fn only_hex_commit_ids_become_folders() {
        let sha = "0123456789abcdef0123456789ABCDEF01234567";
        assert_eq!(commit_id(&format!("{sha}\n")), Some(sha));
        for bad in [
            "../../etc",
            "",
            "main",
            &sha[..39],
            &format!("{sha}0"),
            "0123456789abcdef0123456789abcdef0123456/",
        ] {
            assert_eq!(commit_id(bad), None, "{bad}");
        }
        // A tampered ref file names no folder.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("refs")).unwrap();
        std::fs::write(dir.path().join("refs/main"), "../../outside").unwrap();
        assert_eq!(recorded_snapshot(dir.path(), "main"), None);
    }

    #[test]
    fn server_paths_cannot_escape_the_snapshot() {
        assert_eq!(
            safe_relative("a/b", "sub/x.json").unwrap(),
            PathBuf::from("sub/x.json")
        );
        for bad in ["../x.json", "/etc/passwd", "", "a/../../x"] {
            assert!(safe_relative("a/b", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn downloads_go_under_the_kvlab_cache() {
        let home = Some(PathBuf::from("/home/u"));
        assert_eq!(
            download_dir_from(Some("/c".into()), home.clone()),
            Some(PathBuf::from("/c/hub"))
        );
        assert_eq!(
            download_dir_from(Some("".into()), home.clone()),
            Some(PathBuf::from("/home/u/.cache/kvlab/hub"))
        );
        assert_eq!(
            download_dir_from(None, home),
            Some(PathBuf::from("/home/u/.cache/kvlab/hub"))
        );
        assert_eq!(download_dir_from(None, None), None);
    }

    #[test]
    fn a_finished_snapshot_is_found_by_its_ref() {
        let d = tempfile::tempdir().unwrap();
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(completed_snapshot(d.path(), "main"), None);
        std::fs::create_dir_all(d.path().join("refs")).unwrap();
        std::fs::create_dir_all(d.path().join(sha)).unwrap();
        std::fs::write(d.path().join("refs/main"), format!("{sha}\n")).unwrap();
        // Not complete yet.
        assert_eq!(completed_snapshot(d.path(), "main"), None);
        std::fs::write(d.path().join(sha).join(COMPLETE_MARKER), sha).unwrap();
        assert_eq!(
            completed_snapshot(d.path(), "main"),
            Some(d.path().join(sha))
        );
    }
}
