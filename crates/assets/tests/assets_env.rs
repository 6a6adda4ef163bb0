//! `resolve` and the test policy honour `$KVLAB_CACHE` and `$KVLAB_REQUIRE_ASSETS` (their own
//! test binary, since it sets the variables), and the `kvlab-assets` binary answers `path` and
//! `list` from the cache it is given.

use std::process::Command;

use std::sync::Mutex;

use kvlab_assets::{self as assets, AssetError};

/// Tests in one binary run in parallel: the ones that set variables take turns.
static ENV: Mutex<()> = Mutex::new(());

fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn resolve_uses_the_cache_root_from_the_environment() {
    let _env = env_lock();
    let root = tempfile::tempdir().unwrap();
    std::env::set_var(assets::CACHE_ENV, root.path());
    assert_eq!(assets::cache_root().unwrap(), root.path());
    assert_eq!(assets::assets_dir().unwrap(), root.path().join("assets"));
    match assets::resolve("paradise-lost") {
        Err(AssetError::Missing { path, .. }) => {
            assert_eq!(path, root.path().join("assets").join("plrabn12.txt"))
        }
        other => panic!("expected Missing, got {other:?}"),
    }
    std::fs::create_dir_all(root.path().join("assets")).unwrap();
    let file = std::fs::File::create(root.path().join("assets/plrabn12.txt")).unwrap();
    file.set_len(481_861).unwrap();
    let path = assets::resolve("paradise-lost").unwrap();
    assert!(path.is_absolute());
    assert_eq!(path, root.path().join("assets/plrabn12.txt"));
    assert!(matches!(
        assets::resolve("gemma4-e2b"),
        Err(AssetError::UnknownAsset { .. })
    ));
}

#[test]
fn the_test_policy_reads_the_environment() {
    let _env = env_lock();
    let root = tempfile::tempdir().unwrap();
    std::env::set_var(assets::CACHE_ENV, root.path());
    std::env::remove_var(assets::REQUIRE_ENV);
    assert_eq!(kvlab_assets::require_asset!("alice"), None);
    std::env::set_var(assets::REQUIRE_ENV, "1");
    let required = std::panic::catch_unwind(|| kvlab_assets::require_asset!("alice"));
    let message = required.expect_err("a required missing asset must panic");
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        text.contains("the_test_policy_reads_the_environment"),
        "{text}"
    );
    assert!(text.contains("kvlab-assets -- fetch alice"), "{text}");
    std::fs::create_dir_all(root.path().join("assets")).unwrap();
    let file = std::fs::File::create(root.path().join("assets/alice29.txt")).unwrap();
    file.set_len(152_089).unwrap();
    assert_eq!(
        kvlab_assets::require_asset!("alice"),
        Some(root.path().join("assets/alice29.txt"))
    );
    std::env::remove_var(assets::REQUIRE_ENV);
}

fn kvlab_assets(cache: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvlab-assets"))
        .args(args)
        .env(assets::CACHE_ENV, cache)
        .output()
        .expect("run kvlab-assets")
}

#[test]
fn the_binary_locates_and_lists_assets() {
    let root = tempfile::tempdir().unwrap();
    let out = kvlab_assets(root.path(), &["path", "gemma3-270m"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("asset `gemma3-270m` is not present"), "{err}");

    std::fs::create_dir_all(root.path().join("assets")).unwrap();
    let file = std::fs::File::create(root.path().join("assets/plrabn12.txt")).unwrap();
    file.set_len(481_861).unwrap();
    let out = kvlab_assets(root.path(), &["path", "paradise-lost"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        root.path()
            .join("assets/plrabn12.txt")
            .display()
            .to_string()
    );

    let out = kvlab_assets(root.path(), &["list", "--json"]);
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = rows
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        ["gemma3-270m", "gemma-tokenizer", "alice", "paradise-lost"]
    );
    // A file of the right size but unverified content is hashed, found wrong, and reported.
    assert_eq!(rows[3]["state"], "invalid");
    assert_eq!(rows[0]["state"], "missing");
}
