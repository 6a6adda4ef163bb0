//! The desktop app's entry point: everything lives in the library so tests can build the app.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    // The hidden document-reader mode runs before anything of the app starts.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = kvlab_app::documents::child::main_if_asked(&args) {
        std::process::exit(code);
    }
    // Before any other thread starts: one core fewer than the machine has (the webview
    // renders every streamed token), unless KVLAB_THREADS says otherwise.
    let threads =
        kvlab_engine::host::threads_from_env().unwrap_or_else(kvlab_engine::host::desktop_default);
    if let Err(e) = kvlab_engine::host::set_compute_threads(threads) {
        eprintln!("kvlab: {e}");
    }
    kvlab_app::platform::ensure_valid_locale();
    kvlab_app::platform::prefer_software_rendering_without_gpu();
    kvlab_app::run();
}
