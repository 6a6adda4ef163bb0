//! The desktop app's entry point: everything lives in the library so tests can build the app.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    kvlab_app::platform::ensure_valid_locale();
    kvlab_app::run();
}
