//! The app's switch for KV Lab's local OpenAI-compatible server (kvlab-server): started on
//! the app's own engine, so clients use the model the app has loaded; loopback only, as the
//! app never asks for a key. Stopping it is the server's own stop, as Ctrl-C is for `kvlab
//! serve`: each open stream gets a last chunk (`finish_reason: "cancelled"`) and every
//! connection is closed within `kvlab_server::SHUTDOWN_GRACE` (2 s).

use std::sync::Mutex;

use kvlab_engine::contract::ErrorCode;
use kvlab_engine::JobError;
use kvlab_server::ServerConfig;
use serde::Serialize;
use tauri::State;
use ts_rs::TS;

use crate::error::CommandError;
use crate::state::AppState;

/// The port the switch offers first (llama-server's and LM Studio's neighbours use others).
pub const DEFAULT_PORT: u16 = 8080;

/// Whether the server runs, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, TS)]
pub struct ServerInfo {
    /// The base URL clients use (`http://127.0.0.1:8080/v1`) while it runs.
    pub url: Option<String>,
    /// The port it listens on, or the one it would start on.
    pub port: u16,
}

struct Running {
    url: String,
    port: u16,
    stop: tokio::sync::oneshot::Sender<()>,
}

/// The server, when it runs.
#[derive(Default)]
pub struct ApiServer {
    running: Mutex<Option<Running>>,
}

impl ApiServer {
    fn info(&self) -> ServerInfo {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match running.as_ref() {
            Some(r) => ServerInfo {
                url: Some(r.url.clone()),
                port: r.port,
            },
            None => ServerInfo {
                url: None,
                port: DEFAULT_PORT,
            },
        }
    }
}

/// Starts the server on `port` of the loopback (0: any free port), or says where it runs.
#[tauri::command]
pub async fn server_start(
    state: State<'_, AppState>,
    server: State<'_, ApiServer>,
    port: u16,
) -> Result<ServerInfo, CommandError> {
    if server
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some()
    {
        return Ok(server.info());
    }
    let config = ServerConfig::local(port);
    let listener = kvlab_server::bind(&config)
        .await
        .map_err(|e| JobError::new(ErrorCode::Io, e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| JobError::new(ErrorCode::Io, e.to_string()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = state.engine.handle().clone();
    tauri::async_runtime::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(e) = kvlab_server::serve(listener, engine, config, shutdown).await {
            tracing::warn!("the API server stopped: {e}");
        }
    });
    let url = format!("http://{addr}/v1");
    tracing::info!(%url, "API server started");
    *server.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(Running {
        url,
        port: addr.port(),
        stop,
    });
    Ok(server.info())
}

/// Stops the server: open streams end with `cancelled`, connections close within 2 s.
#[tauri::command]
pub fn server_stop(server: State<'_, ApiServer>) -> ServerInfo {
    if let Some(r) = server
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        let _ = r.stop.send(());
    }
    server.info()
}

/// Whether the server runs, and where.
#[tauri::command]
pub fn server_status(server: State<'_, ApiServer>) -> ServerInfo {
    server.info()
}
