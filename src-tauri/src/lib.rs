//! KV Lab's desktop shell: a thin Tauri layer that turns UI commands into engine jobs and
//! engine output into channel messages and low-rate events. It holds handles, never the model.

mod commands;
mod error;
mod monitor;
pub mod platform;
mod state;

use tauri::{Manager, Runtime};

/// Starts the desktop app.
pub fn run() {
    init_tracing();
    let app = build_app(tauri::Builder::default())
        .build(tauri::generate_context!())
        .unwrap_or_else(|e| {
            eprintln!("KV Lab could not start: {e}");
            std::process::exit(1);
        });
    app.run(|_, _| {});
}

/// Wires state, commands and background tasks onto any runtime (the mock runtime in tests).
pub fn build_app<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder
        .manage(state::AppState::new())
        .invoke_handler(tauri::generate_handler![
            commands::system_info,
            commands::engine_status,
        ])
        .setup(|app| {
            monitor::spawn_memory_sampler(app.handle().clone(), monitor::SAMPLE_PERIOD);
            if let Some(window) = app.get_webview_window("main") {
                tracing::debug!(label = window.label(), "main window ready");
            }
            Ok(())
        })
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVLAB_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
