//! The one policy for tests that need a real asset: present, the test gets its path; missing,
//! the test fails loudly when `KVLAB_REQUIRE_ASSETS=1` (CI, after fetching) and otherwise
//! prints `skipped: <test>: <reason>` to stderr and returns. No test passes silently without
//! checking anything.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{resolve_in, AssetError};

/// Set to `1` to make a missing asset a test failure instead of a skip.
pub const REQUIRE_ENV: &str = "KVLAB_REQUIRE_ASSETS";

/// The running test's name: libtest names each test's thread after the test; a test run on
/// the main thread (`--test-threads=1` on some toolchains) falls back to `fallback`.
pub fn test_name(fallback: &str) -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => fallback.to_owned(),
    }
}

/// The path of asset `name` for the test called `test`, or `None` after printing why the
/// test is skipped. Panics, naming the fetch command, when the asset is missing and
/// `$KVLAB_REQUIRE_ASSETS` is `1`. An unknown asset name always panics: a typo in a test must
/// not turn into a skip.
pub fn require_or_skip(test: &str, name: &str) -> Option<PathBuf> {
    let required = std::env::var(REQUIRE_ENV).as_deref() == Ok("1");
    match crate::assets_dir() {
        Ok(dir) => require_or_skip_in(&dir, test, name, required),
        Err(e) => skip_or_fail(test, name, &e, required),
    }
}

/// [`require_or_skip`] against the assets directory `dir`, with the policy given (for tests of
/// the policy itself).
pub fn require_or_skip_in(dir: &Path, test: &str, name: &str, required: bool) -> Option<PathBuf> {
    match resolve_in(dir, name) {
        Ok(path) => Some(path),
        Err(e @ AssetError::UnknownAsset { .. }) => panic!("{test}: {e}"),
        Err(e) => skip_or_fail(test, name, &e, required),
    }
}

fn skip_or_fail(test: &str, name: &str, why: &AssetError, required: bool) -> Option<PathBuf> {
    if required {
        panic!(
            "{test}: {why}\n({REQUIRE_ENV}=1 makes a missing asset a failure; fetch it with \
             `cargo run -p kvlab-assets -- fetch {name}`)"
        );
    }
    // Straight to the process's stderr: libtest captures `eprintln!` of passing tests, and a
    // skip nobody sees is the silent pass this policy exists to prevent.
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_present_asset_gives_its_path_either_way() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("alice29.txt")).unwrap();
        file.set_len(152_089).unwrap();
        for required in [false, true] {
            assert_eq!(
                require_or_skip_in(dir.path(), "t", "alice", required),
                Some(dir.path().join("alice29.txt"))
            );
        }
    }

    #[test]
    fn a_missing_asset_is_skipped_when_not_required() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(require_or_skip_in(dir.path(), "t", "alice", false), None);
        // A damaged (wrong-size) file is skipped too, never handed to the test.
        std::fs::write(dir.path().join("alice29.txt"), b"short").unwrap();
        assert_eq!(require_or_skip_in(dir.path(), "t", "alice", false), None);
    }

    #[test]
    #[should_panic(expected = "fetch alice")]
    fn a_missing_asset_fails_when_required() {
        let dir = tempfile::tempdir().unwrap();
        require_or_skip_in(dir.path(), "t", "alice", true);
    }

    #[test]
    #[should_panic(expected = "unknown asset `alic`")]
    fn an_unknown_asset_name_always_fails() {
        let dir = tempfile::tempdir().unwrap();
        require_or_skip_in(dir.path(), "t", "alic", false);
    }

    #[test]
    fn the_test_name_is_the_thread_name() {
        let name = test_name("fallback");
        assert!(
            name == "fallback" || name.ends_with("the_test_name_is_the_thread_name"),
            "{name}"
        );
        let named = std::thread::Builder::new()
            .name("some::test".into())
            .spawn(|| test_name("fallback"))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(named, "some::test");
    }
}
