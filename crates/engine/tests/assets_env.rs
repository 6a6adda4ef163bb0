//! `assets::resolve` honours `$KVLAB_CACHE` (its own test binary, since it sets the variable).

use kvlab_engine::assets::{self, AssetError};

#[test]
fn resolve_uses_the_cache_root_from_the_environment() {
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
