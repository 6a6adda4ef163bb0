//! Build script: lets tauri-build read `tauri.conf.json` and the capabilities under
//! `src-tauri/`, and declares the app's commands so that each needs a permission: the web view
//! may call only those `capabilities/default.json` grants.

include!("src/ui_commands.rs");

fn main() {
    println!("cargo:rerun-if-changed=src-tauri/capabilities");
    println!("cargo:rerun-if-changed=src-tauri/src/ui_commands.rs");
    let attributes = tauri_build::Attributes::new()
        .capabilities_path_pattern("src-tauri/capabilities/**/*")
        .app_manifest(tauri_build::AppManifest::new().commands(UI_COMMANDS));
    tauri_build::try_build(attributes).expect("tauri-build failed: check tauri.conf.json");
}
