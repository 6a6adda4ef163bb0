//! Build script: lets tauri-build read `tauri.conf.json` and the capabilities under `src-tauri/`.

fn main() {
    println!("cargo:rerun-if-changed=src-tauri/capabilities");
    let attributes =
        tauri_build::Attributes::new().capabilities_path_pattern("src-tauri/capabilities/**/*");
    tauri_build::try_build(attributes).expect("tauri-build failed: check tauri.conf.json");
}
