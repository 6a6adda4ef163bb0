//! Managed app state: handles shared by commands (never the model itself).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::bridge::EngineBridge;
use crate::events::EngineStatus;
use crate::sessions::SessionStore;

pub struct AppState {
    pub engine: EngineBridge,
    pub status: Arc<Mutex<EngineStatus>>,
    pub sessions: SessionStore,
    pub data_dir: PathBuf,
}

/// The app data dir: `$KVLAB_DATA_DIR` when set (tests use a temp dir), else the platform's.
pub fn data_dir_from(env: Option<std::ffi::OsString>, platform: Option<PathBuf>) -> PathBuf {
    env.filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or(platform)
        .unwrap_or_else(|| std::env::temp_dir().join("kvlab"))
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
}
