//! Managed app state: handles shared by commands (never the model itself).

use std::sync::Mutex;

/// What the engine is doing, as the status bar shows it.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum EngineStatus {
    NoModel,
}

impl EngineStatus {
    pub fn label(&self) -> &'static str {
        match self {
            EngineStatus::NoModel => "no model loaded",
        }
    }
}

pub struct AppState {
    pub status: Mutex<EngineStatus>,
}

impl AppState {
    pub fn new() -> Self {
        Self {
            status: Mutex::new(EngineStatus::NoModel),
        }
    }
}

impl Default for AppState {
    fn default() -> Self {
        Self::new()
    }
}
