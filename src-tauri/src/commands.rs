//! Tauri commands: each one validates its input, talks to the engine or the OS, and returns
//! plain serde data or a coded error.

use serde::Serialize;
use tauri::State;

use crate::error::CommandError;
use crate::state::AppState;

/// Facts about the machine the app runs on.
#[derive(Debug, Clone, Serialize)]
pub struct SystemInfo {
    pub total_memory_bytes: u64,
    pub cpu_cores: usize,
    pub os: String,
    pub engine_version: &'static str,
}

pub fn read_system_info() -> SystemInfo {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    SystemInfo {
        total_memory_bytes: sys.total_memory(),
        cpu_cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        os: sysinfo::System::long_os_version().unwrap_or_else(|| std::env::consts::OS.to_string()),
        engine_version: env!("CARGO_PKG_VERSION"),
    }
}

#[tauri::command]
pub fn system_info() -> SystemInfo {
    read_system_info()
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    #[serde(flatten)]
    pub status: crate::state::EngineStatus,
    pub label: &'static str,
}

#[tauri::command]
pub fn engine_status(state: State<'_, AppState>) -> Result<StatusView, CommandError> {
    let status = state
        .status
        .lock()
        .map_err(|_| CommandError::new("internal", "engine status lock poisoned"))?
        .clone();
    Ok(StatusView {
        label: status.label(),
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_info_reports_real_memory_and_cores() {
        let info = read_system_info();
        assert!(info.total_memory_bytes > 64 * 1024 * 1024);
        assert!(info.cpu_cores >= 1);
        assert_eq!(
            info.cpu_cores,
            std::thread::available_parallelism().unwrap().get()
        );
    }
}
