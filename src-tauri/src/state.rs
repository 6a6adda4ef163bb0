//! Managed app state: handles shared by commands (never the model itself), and where the app
//! keeps its data and finds its default model.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::bridge::EngineBridge;
use crate::documents::Reader;
use crate::error::{AppCode, CommandError};
use crate::models::commands::DefaultModel;
use crate::sessions::SessionStore;

pub struct AppState {
    pub engine: EngineBridge,
    pub sessions: SessionStore,
    /// Set once the quit's cache saving ran (quitting raises more than one event).
    pub quitting: std::sync::atomic::AtomicBool,
    /// Reads attached documents in a child process with limits.
    pub documents: Reader,
    pub data_dir: PathBuf,
}

/// The app data dir: `$KVLAB_DATA_DIR` when set (tests use a temp dir), else the platform's.
pub fn data_dir_from(env: Option<OsString>, platform: Option<PathBuf>) -> PathBuf {
    env.filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or(platform)
        .unwrap_or_else(|| std::env::temp_dir().join("kvlab"))
}

/// The default model named by `$KVLAB_DEFAULT_MODEL` (the offline Gemma 3 270M, which
/// `scripts/run.sh` fetches and names): an error when unset or missing, so the UI offers the
/// picker and the Hub instead.
pub fn default_model(env: Option<OsString>) -> Result<DefaultModel, CommandError> {
    let path = env
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            CommandError::new(
                AppCode::NoDefaultModel,
                "no default model: open a GGUF file or a model folder, or download one",
            )
        })?;
    if !path.exists() {
        return Err(CommandError::new(
            AppCode::NoDefaultModel,
            format!(
                "the default model {} is missing — run `cargo run -p kvlab-assets -- fetch gemma3-270m`",
                path.display()
            ),
        ));
    }
    Ok(DefaultModel {
        name: "Gemma 3 270M (offline)".into(),
        path: path.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_the_platform_dir() {
        let p = Some(PathBuf::from("/p"));
        assert_eq!(
            data_dir_from(Some("/e".into()), p.clone()),
            PathBuf::from("/e")
        );
        assert_eq!(
            data_dir_from(Some("".into()), p.clone()),
            PathBuf::from("/p")
        );
        assert_eq!(data_dir_from(None, p), PathBuf::from("/p"));
    }

    #[test]
    fn the_default_model_must_be_named_and_present() {
        assert_eq!(
            default_model(None).unwrap_err().code,
            AppCode::NoDefaultModel
        );
        let missing = default_model(Some("/nonexistent/model.gguf".into())).unwrap_err();
        assert_eq!(missing.code, AppCode::NoDefaultModel);
        assert!(
            missing
                .message
                .contains("cargo run -p kvlab-assets -- fetch gemma3-270m"),
            "{}",
            missing.message
        );
        let file = tempfile::NamedTempFile::new().unwrap();
        let found = default_model(Some(file.path().into())).unwrap();
        assert_eq!(found.path, file.path().display().to_string());
    }
}
