//! KV Lab's desktop shell: a thin Tauri layer that turns UI commands into engine jobs and
//! engine output into channel messages and low-rate events. It holds handles, never the model.
//! One folder per domain (`models`, `chat`, `documents`, `sessions`, `downloads`), each with
//! its commands; `bridge` is the one handle on the engine thread; `api_server` is the switch for
//! the local OpenAI-compatible server on that same engine.

mod api_server;
#[cfg(test)]
mod bindings;
mod blocking;
mod bridge;
mod chat;
pub mod documents;
mod downloads;
pub mod error;
mod models;
mod monitor;
pub mod platform;
pub mod sessions;
mod state;
mod webview_guard;
mod window;

use kvlab_engine::contract::Activity;
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
    app.run(|app, event| {
        if let tauri::RunEvent::ExitRequested { .. } = event {
            sessions::commands::save_cache_on_quit(app);
        }
    });
}

/// Wires state, commands and background tasks onto any runtime (the mock runtime in tests).
pub fn build_app<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder
        // A closed or destroyed main window ends the app: its conversation's cache is saved
        // first (once; `RunEvent::ExitRequested` covers the other ways out).
        .on_window_event(|window, event| {
            if matches!(
                event,
                tauri::WindowEvent::CloseRequested { .. } | tauri::WindowEvent::Destroyed
            ) {
                sessions::commands::save_cache_on_quit(window.app_handle());
            }
        })
        .plugin(tauri_plugin_dialog::init())
        .plugin(webview_guard::plugin())
        .manage(downloads::Downloads::default())
        .manage(api_server::ApiServer::default())
        .invoke_handler(tauri::generate_handler![
            models::commands::system_info,
            models::commands::engine_status,
            models::commands::default_model,
            models::commands::inspect_model,
            models::commands::load_model,
            models::commands::pick_model,
            chat::commands::generate,
            chat::commands::preview_prompt,
            chat::commands::compare,
            chat::commands::stop_generation,
            chat::commands::stop_compare,
            chat::commands::switch_cache,
            chat::commands::cache_options,
            chat::commands::context_costs,
            documents::commands::document_fits,
            documents::commands::inspect_document_path,
            documents::commands::inspect_document_bytes,
            sessions::commands::list_sessions,
            sessions::commands::load_session,
            sessions::commands::save_session,
            sessions::commands::rename_session,
            sessions::commands::delete_session,
            sessions::commands::export_file,
            sessions::commands::save_session_cache,
            sessions::commands::restore_session_cache,
            sessions::commands::drop_session_cache,
            sessions::commands::set_kv_budget,
            sessions::commands::set_parallel,
            downloads::hub_models,
            downloads::hub_quants,
            downloads::start_download,
            downloads::cancel_download,
            window::ui_theme,
            api_server::server_start,
            api_server::server_stop,
            api_server::server_status,
        ])
        .setup(|app| {
            window::apply_size(app);
            let data_dir = state::data_dir_from(
                std::env::var_os("KVLAB_DATA_DIR"),
                app.path().app_data_dir().ok(),
            );
            tracing::info!(dir = %data_dir.display(), "app data");
            let handle = app.handle().clone();
            let sessions = sessions::SessionStore::new(data_dir.join("sessions"));
            let engine = bridge::EngineBridge::spawn(
                Box::new(move |a: &Activity| {
                    let _ = handle.emit(STATUS_EVENT, a);
                }),
                sessions.dir().to_path_buf(),
                kvlab_engine::contract::DEFAULT_DISK_BUDGET,
            )?;
            let (sampled, marked) = (engine.clone(), engine.clone());
            monitor::spawn_memory_sampler(
                app.handle().clone(),
                move |t_ms, probe| sampled.memory_sample(t_ms, probe),
                move |seen| marked.markers_since(seen),
                monitor::SAMPLE_PERIOD,
            );
            app.manage(state::AppState {
                engine,
                sessions,
                quitting: Default::default(),
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
