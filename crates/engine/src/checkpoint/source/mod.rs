//! Where a model comes from: a local path or a Hugging Face Hub repository, parsed from one
//! user string and resolved to local files (weights plus a tokenizer: a `tokenizer.json`, or
//! the GGUF file's own vocabulary). Resolution never panics: every failure is a
//! [`SourceError`] with a code. Offline test assets are named by the CLI, which resolves them
//! to paths itself (crate `kvlab-assets`); the engine knows nothing of them.

// Without `hub` nothing picks among a repository's quantizations but the tests.
#[cfg_attr(not(feature = "hub"), allow(dead_code))]
pub mod gguf_quants;
#[cfg(feature = "hub")]
pub mod hub;
#[cfg(feature = "hub")]
mod hub_fetch;
#[cfg(feature = "hub")]
pub mod hub_retry;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use crate::contract::{ErrorCode, Event};

/// A model as the user named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// A file or directory on disk.
    Local {
        /// The path.
        path: PathBuf,
    },
    /// A Hugging Face Hub repository (`owner/name`, optionally `:QUANT` for a GGUF
    /// repository, as llama.cpp's `-hf` takes it, and `@revision`).
    Hub {
        /// `owner/name`.
        repo: String,
        /// Branch, tag or commit; `None` for the default branch.
        revision: Option<String>,
        /// The GGUF quantization to fetch (`Q4_K_M`, `Q8_0`, …); `None`: the safetensors,
        /// or in a GGUF-only repository its default quant.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quant: Option<String>,
    },
}

/// Why a model could not be located.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The local path does not exist.
    #[error("model not found: {0} does not exist")]
    NotFound(PathBuf),
    /// No tokenizer could be found (a non-GGUF model without `tokenizer.json`).
    #[error(
        "no tokenizer for {model}: pass --tokenizer PATH or put tokenizer.json beside the model"
    )]
    NoTokenizer {
        /// The model path.
        model: PathBuf,
    },
    /// The explicit tokenizer path does not exist.
    #[error("tokenizer not found: {0} does not exist")]
    TokenizerNotFound(PathBuf),
    /// The Hub could not be reached (or answered something unusable).
    #[error("Hugging Face Hub download of {repo} failed: {reason}")]
    Network {
        /// The repository.
        repo: String,
        /// What went wrong.
        reason: String,
    },
    /// The Hub wants a token (401), or the token has no access (403: a gated repository).
    #[error("the Hugging Face Hub refused {repo} ({status}): {advice}")]
    HubAuth {
        /// The repository.
        repo: String,
        /// 401 or 403.
        status: u16,
        /// What to do (how to set `HF_TOKEN`).
        advice: String,
    },
    /// The Hub answered 429 and kept doing so, or asked for a wait too long to sit through.
    #[error(
        "the Hugging Face Hub is rate-limiting downloads of {repo} (429, {tries} tries): {}; \
         requests with a token (HF_TOKEN) get higher limits",
        wait_advice(*retry_after_s)
    )]
    RateLimited {
        /// The repository.
        repo: String,
        /// The server's `Retry-After`, in seconds, when it sent one.
        retry_after_s: Option<u64>,
        /// Tries made.
        tries: u32,
    },
    /// The Hub kept failing with a server error.
    #[error(
        "the Hugging Face Hub kept failing for {repo}: HTTP {status} on each of {tries} tries \
         over {waited} of backoff; the Hub or the mirror in HF_ENDPOINT is having trouble, \
         try again later (what was downloaded is kept)"
    )]
    HubUnavailable {
        /// The repository.
        repo: String,
        /// The last status.
        status: u16,
        /// Tries made.
        tries: u32,
        /// Time spent waiting between them.
        waited: String,
    },
    /// A file's transfer kept ending early; the bytes that arrived are kept for resume.
    #[error(
        "the download of {file} from {repo} kept ending early: {have} of {size} bytes after \
         {tries} tries; the {have} bytes are kept and the next try resumes from there"
    )]
    Incomplete {
        /// The repository.
        repo: String,
        /// The repository path of the file.
        file: String,
        /// Bytes on disk.
        have: u64,
        /// Bytes listed.
        size: u64,
        /// Tries made.
        tries: u32,
    },
    /// A downloaded file is not the one the Hub listed; it was discarded.
    #[error("{file} from {repo} is corrupt ({reason}); it was discarded, try again")]
    Corrupt {
        /// The repository.
        repo: String,
        /// The repository path of the file.
        file: String,
        /// What did not match.
        reason: String,
    },
    /// No room on the disk (or past the file system's file-size limit).
    #[error("{}", disk_full_text(path, *needed, *available, reason))]
    DiskFull {
        /// Where the write went.
        path: PathBuf,
        /// Bytes still to write, when known.
        needed: Option<u64>,
        /// Bytes free there, when known.
        available: Option<u64>,
        /// The system's words.
        reason: String,
    },
    /// A local file could not be written or read while downloading.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The Hub has no such repository or revision.
    #[error("Hugging Face Hub has no {repo}: {reason}")]
    HubNotFound {
        /// The repository.
        repo: String,
        /// The server's answer.
        reason: String,
    },
    /// Built without Hub support.
    #[error(
        "cannot download {0}: this build has no Hugging Face Hub support (cargo feature `hub`)"
    )]
    HubDisabled(String),
    /// The download was cancelled.
    #[error("download cancelled")]
    Cancelled,
    /// Neither `$KVLAB_CACHE` nor a home directory says where downloads go.
    #[error("cannot locate the download directory: set KVLAB_CACHE or HOME")]
    NoCacheDir,
}

impl SourceError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            SourceError::NotFound(_) | SourceError::HubNotFound { .. } => ErrorCode::ModelNotFound,
            SourceError::NoTokenizer { .. } | SourceError::TokenizerNotFound(_) => {
                ErrorCode::TokenizerNotFound
            }
            SourceError::Network { .. } | SourceError::HubDisabled(_) => ErrorCode::Network,
            SourceError::HubAuth { .. } => ErrorCode::HubAuth,
            SourceError::RateLimited { .. } => ErrorCode::HubRateLimited,
            SourceError::HubUnavailable { .. } => ErrorCode::HubUnavailable,
            SourceError::Incomplete { .. } => ErrorCode::DownloadIncomplete,
            SourceError::Corrupt { .. } => ErrorCode::DownloadCorrupt,
            SourceError::DiskFull { .. } => ErrorCode::DiskFull,
            SourceError::Io { .. } => ErrorCode::Io,
            SourceError::Cancelled => ErrorCode::Cancelled,
            SourceError::NoCacheDir => ErrorCode::Internal,
        }
    }
}

/// What a rate-limited client should do, given the server's `Retry-After` in seconds.
fn wait_advice(retry_after_s: Option<u64>) -> String {
    match retry_after_s {
        Some(s) if s >= 120 => format!(
            "the Hub asks to wait {} minutes before retrying",
            s.div_ceil(60)
        ),
        Some(s) => format!("the Hub asks to wait {s} s before retrying"),
        None => "wait a minute before retrying".into(),
    }
}

/// The disk-full message: where, how much is missing, and what to do.
fn disk_full_text(
    path: &Path,
    needed: Option<u64>,
    available: Option<u64>,
    reason: &str,
) -> String {
    use crate::memory::format_bytes;
    let mut s = format!("no room to write {}: {reason}", path.display());
    match (needed, available) {
        (Some(n), Some(a)) => s.push_str(&format!(
            " ({} still to download, {} free there)",
            format_bytes(n),
            format_bytes(a)
        )),
        (Some(n), None) => s.push_str(&format!(" ({} still to download)", format_bytes(n))),
        _ => {}
    }
    s.push_str(
        "; free some space (or set KVLAB_CACHE to a disk with room) and retry: what was \
         downloaded is kept and resumes",
    );
    s
}

/// Local files ready for [`crate::Model::load`] and [`crate::tokenizer::GemmaTokenizer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedModel {
    /// Display name.
    pub name: String,
    /// What `Model::load` takes (file or directory).
    pub weights: PathBuf,
    /// What [`crate::tokenizer::GemmaTokenizer::from_file`] takes: a `tokenizer.json`, or the
    /// GGUF weights file itself when its own vocabulary is the tokenizer.
    pub tokenizer: PathBuf,
}

fn is_hub_id(s: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match s.split_once('/') {
        Some((owner, name)) => ok(owner) && ok(name),
        None => false,
    }
}

/// `owner/name[:QUANT][@revision]` by its form alone (no file system check) as (repo, quant,
/// revision): the one rule every front end uses for a Hub id (the UI checks its typing
/// against examples generated from this function).
pub fn hub_id(s: &str) -> Option<(String, Option<String>, Option<String>)> {
    let (head, revision) = match s.split_once('@') {
        Some((_, "")) => return None,
        Some((_, rev)) if rev.contains('@') => return None,
        Some((head, rev)) => (head, Some(rev.to_owned())),
        None => (s, None),
    };
    let (repo, quant) = match head.split_once(':') {
        Some((_, "")) => return None,
        Some((_, q)) if q.contains(':') => return None,
        Some((repo, q)) => (repo, Some(q.to_owned())),
        None => (head, None),
    };
    is_hub_id(repo).then(|| (repo.to_owned(), quant, revision))
}

impl ModelSource {
    /// Reads a user string: an existing path is `Local`; `owner/name[:QUANT][@revision]` is
    /// `Hub`; anything else is a (missing) `Local`.
    pub fn parse(s: &str) -> Self {
        let path = Path::new(s);
        if path.exists() {
            return Self::Local { path: path.into() };
        }
        if let Some((repo, quant, revision)) = hub_id(s) {
            return Self::Hub {
                repo,
                revision,
                quant,
            };
        }
        Self::Local { path: path.into() }
    }

    /// A short display name.
    pub fn display_name(&self) -> String {
        match self {
            ModelSource::Local { path } => {
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                // `model.safetensors` says nothing: name a Hugging Face folder instead.
                let generic = file.as_deref().is_some_and(|f| f.starts_with("model"))
                    && path.extension().is_none_or(|e| e != "gguf");
                let dir = path
                    .parent()
                    .and_then(|p| p.file_name())
                    .map(|f| f.to_string_lossy().into_owned());
                match (file, dir) {
                    (_, Some(d)) if generic => d,
                    (Some(f), _) => f,
                    _ => path.display().to_string(),
                }
            }
            ModelSource::Hub {
                repo,
                revision,
                quant,
            } => {
                let mut name = repo.clone();
                if let Some(q) = quant {
                    name = format!("{name}:{q}");
                }
                match revision {
                    Some(r) => format!("{name}@{r}"),
                    None => name,
                }
            }
        }
    }

    /// Resolves to local files: downloads Hub repositories (reporting `loading` events and
    /// stopping when `cancel` is set), then finds the tokenizer (`tokenizer` when given).
    pub fn resolve(
        &self,
        tokenizer: Option<&Path>,
        emit: &mut dyn FnMut(Event),
        cancel: &AtomicBool,
    ) -> Result<ResolvedModel, SourceError> {
        let weights = self.weights(emit, cancel)?;
        let tokenizer = find_tokenizer(&weights, tokenizer)?;
        Ok(ResolvedModel {
            name: self.display_name(),
            weights,
            tokenizer,
        })
    }

    /// Resolves the weights only (what [`crate::Model::load`] takes), for jobs that need no
    /// tokenizer (logits, parity checks).
    pub fn weights(
        &self,
        emit: &mut dyn FnMut(Event),
        cancel: &AtomicBool,
    ) -> Result<PathBuf, SourceError> {
        Ok(match self {
            ModelSource::Local { path } => {
                if !path.exists() {
                    return Err(SourceError::NotFound(path.clone()));
                }
                path.clone()
            }
            ModelSource::Hub {
                repo,
                revision,
                quant,
            } => hub_download(repo, revision.as_deref(), quant.as_deref(), emit, cancel)?,
        })
    }
}

#[cfg(feature = "hub")]
fn hub_download(
    repo: &str,
    revision: Option<&str>,
    quant: Option<&str>,
    emit: &mut dyn FnMut(Event),
    cancel: &AtomicBool,
) -> Result<PathBuf, SourceError> {
    let mut forward = |p: &hub::DownloadProgress| {
        emit(Event::Loading {
            phase: crate::contract::LoadPhase::Downloading,
            done: Some(p.done),
            total: Some(p.total),
        })
    };
    hub::download_model(
        repo,
        revision,
        quant,
        &hub::HubOptions::default(),
        &mut forward,
        cancel,
    )
}

#[cfg(not(feature = "hub"))]
fn hub_download(
    repo: &str,
    _revision: Option<&str>,
    _quant: Option<&str>,
    _emit: &mut dyn FnMut(Event),
    _cancel: &AtomicBool,
) -> Result<PathBuf, SourceError> {
    Err(SourceError::HubDisabled(repo.to_owned()))
}

/// The tokenizer for the model at `weights`: `explicit` if given, else `tokenizer.json` in
/// the model's directory, else, for a GGUF file, the vocabulary it carries (the file itself:
/// see [`crate::tokenizer::gguf`]).
pub fn find_tokenizer(weights: &Path, explicit: Option<&Path>) -> Result<PathBuf, SourceError> {
    if let Some(p) = explicit {
        return if p.exists() {
            Ok(p.to_path_buf())
        } else {
            Err(SourceError::TokenizerNotFound(p.to_path_buf()))
        };
    }
    let dir = if weights.is_dir() {
        Some(weights)
    } else {
        weights.parent()
    };
    if let Some(beside) = dir.map(|d| d.join("tokenizer.json")) {
        if beside.exists() {
            return Ok(beside);
        }
    }
    let is_gguf = weights
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf && weights.is_file() {
        return Ok(weights.to_path_buf());
    }
    Err(SourceError::NoTokenizer {
        model: weights.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_tells_paths_and_repos_apart() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().to_str().unwrap();
        assert_eq!(
            ModelSource::parse(p),
            ModelSource::Local {
                path: dir.path().into()
            }
        );
        assert_eq!(
            ModelSource::parse("google/gemma-3-270m-it"),
            ModelSource::Hub {
                repo: "google/gemma-3-270m-it".into(),
                revision: None,
                quant: None
            }
        );
        assert_eq!(
            ModelSource::parse("google/gemma-3-270m@main"),
            ModelSource::Hub {
                repo: "google/gemma-3-270m".into(),
                revision: Some("main".into()),
                quant: None
            }
        );
        let gguf = ModelSource::parse("ggml-org/gemma-4-E4B-it-GGUF:Q8_0@main");
        assert_eq!(
            gguf,
            ModelSource::Hub {
                repo: "ggml-org/gemma-4-E4B-it-GGUF".into(),
                revision: Some("main".into()),
                quant: Some("Q8_0".into())
            }
        );
        assert_eq!(
            gguf.display_name(),
            "ggml-org/gemma-4-E4B-it-GGUF:Q8_0@main"
        );
        // Not a repo id: missing paths stay local so the error names the path. Asset names
        // mean nothing here (the CLI resolves them before the engine sees a source).
        for s in [
            "./x/y",
            "/nope/model.gguf",
            "a/b/c",
            "model.gguf",
            "gemma3-270m",
            // One revision and one quant at most, neither empty.
            "a/b@c@d",
            "a/b:Q8:x",
            "a/b@",
            "a/b:",
        ] {
            assert_eq!(ModelSource::parse(s), ModelSource::Local { path: s.into() });
        }
    }

    #[test]
    fn missing_local_path_is_model_not_found() {
        let never = AtomicBool::new(false);
        let err = ModelSource::parse("/definitely/not/here.gguf")
            .resolve(None, &mut |_| {}, &never)
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ModelNotFound);
        assert!(err.to_string().contains("/definitely/not/here.gguf"));
    }

    #[test]
    fn tokenizer_is_explicit_or_beside_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.safetensors");
        std::fs::write(&model, b"x").unwrap();
        let never = AtomicBool::new(false);
        let src = ModelSource::parse(model.to_str().unwrap());
        let err = src.resolve(None, &mut |_| {}, &never).unwrap_err();
        assert_eq!(err.code(), ErrorCode::TokenizerNotFound);
        assert!(err.to_string().contains("--tokenizer"));

        let tok = dir.path().join("tokenizer.json");
        std::fs::write(&tok, b"{}").unwrap();
        let r = src.resolve(None, &mut |_| {}, &never).unwrap();
        assert_eq!((r.weights, r.tokenizer), (model.clone(), tok.clone()));
        // A generic weight file name gives way to its folder's name.
        assert_eq!(
            Some(r.name.as_str()),
            dir.path().file_name().and_then(|f| f.to_str())
        );
        assert_eq!(
            ModelSource::parse("/m/gemma-3-270m-q4_k_m.gguf").display_name(),
            "gemma-3-270m-q4_k_m.gguf"
        );

        let other = dir.path().join("other.json");
        assert!(matches!(
            find_tokenizer(&model, Some(&other)),
            Err(SourceError::TokenizerNotFound(p)) if p == other
        ));
        std::fs::write(&other, b"{}").unwrap();
        assert_eq!(find_tokenizer(&model, Some(&other)).unwrap(), other);
        // A directory model looks inside itself.
        assert_eq!(find_tokenizer(dir.path(), None).unwrap(), tok);
    }

    #[test]
    fn a_gguf_without_tokenizer_json_is_its_own_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.GGUF");
        std::fs::write(&model, b"GGUF").unwrap();
        assert_eq!(find_tokenizer(&model, None).unwrap(), model);
        // tokenizer.json beside it wins, and an explicit path wins over both.
        let beside = dir.path().join("tokenizer.json");
        std::fs::write(&beside, b"{}").unwrap();
        assert_eq!(find_tokenizer(&model, None).unwrap(), beside);
        let explicit = dir.path().join("other.json");
        std::fs::write(&explicit, b"{}").unwrap();
        assert_eq!(find_tokenizer(&model, Some(&explicit)).unwrap(), explicit);
        // A folder named like a GGUF is not a vocabulary.
        let folder = tempfile::tempdir().unwrap();
        let fake = folder.path().join("x.gguf");
        std::fs::create_dir(&fake).unwrap();
        assert_eq!(
            find_tokenizer(&fake, None).unwrap_err().code(),
            ErrorCode::TokenizerNotFound
        );
    }

    #[cfg(not(feature = "hub"))]
    #[test]
    fn hub_without_the_feature_is_a_clear_network_error() {
        let never = AtomicBool::new(false);
        let err = ModelSource::parse("google/gemma-3-270m")
            .resolve(None, &mut |_| {}, &never)
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Network);
        assert!(err.to_string().contains("google/gemma-3-270m"));
    }

    #[test]
    fn source_json_is_tagged() {
        assert_eq!(
            serde_json::to_value(ModelSource::Hub {
                repo: "a/b".into(),
                revision: None,
                quant: None
            })
            .unwrap(),
            serde_json::json!({"kind": "hub", "repo": "a/b", "revision": null})
        );
    }
}
