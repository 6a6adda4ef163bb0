//! KV Lab's desktop shell: a thin Tauri layer that turns UI commands into engine jobs and
//! engine output into channel messages and low-rate events. It holds handles, never the model.

#[cfg(test)]
mod bindings;
mod bridge;
mod commands;
pub mod documents;
mod download;
pub mod error;
mod monitor;
pub mod platform;
pub mod sessions;
mod state;
mod webview_guard;
mod window;

use kvlab_engine::events::Activity;
use tauri::{Emitter, Manager, Runtime};

/// The `engine-status` event: the engine's [`Activity`], emitted on every change.
pub const STATUS_EVENT: &str = "engine-status";

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
        .plugin(tauri_plugin_dialog::init())
        .plugin(webview_guard::plugin())
        .manage(download::Downloads::default())
        .invoke_handler(tauri::generate_handler![
            commands::system_info,
            commands::engine_status,
            commands::default_model,
            commands::inspect_model,
            commands::load_model,
            commands::pick_model,
            commands::generate,
            commands::preview_prompt,
            commands::compare,
            commands::stop_generation,
            commands::reset_conversation,
            commands::switch_cache,
            commands::cache_options,
            commands::context_costs,
            commands::document_fits,
            commands::inspect_document_path,
            commands::inspect_document_bytes,
            commands::list_sessions,
            commands::load_session,
            commands::save_session,
            commands::rename_session,
            commands::delete_session,
            commands::export_file,
            download::hub_models,
            download::hub_quants,
            download::start_download,
            download::cancel_download,
            window::ui_theme,
        ])
        .setup(|app| {
            window::apply_size(app);
            let data_dir = state::data_dir_from(
                std::env::var_os("KVLAB_DATA_DIR"),
                app.path().app_data_dir().ok(),
            );
            tracing::info!(dir = %data_dir.display(), "app data");
            let handle = app.handle().clone();
            let engine = bridge::EngineBridge::spawn(Box::new(move |a: &Activity| {
                let _ = handle.emit(STATUS_EVENT, a);
            }))?;
            let sampled = engine.clone();
            monitor::spawn_memory_sampler(
                app.handle().clone(),
                move |t_ms, probe| sampled.memory_sample(t_ms, probe),
                monitor::SAMPLE_PERIOD,
            );
            app.manage(state::AppState {
                engine,
                sessions: sessions::SessionStore::new(data_dir.join("sessions")),
                documents: documents::Reader::this_executable(documents::Limits::from_env())?,
                data_dir,
            });
            Ok(())
        })
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVLAB_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
