//! Hostile documents through the real app binary's reader child (`kvlab-app
//! --parse-document`): a PDF that overflows the parser's stack, one that makes it loop, a
//! decompression bomb, a 0-byte file, renamed binaries, invalid UTF-8 and a 200 MB text file.
//! Each comes back as its own code within its limit, and this process (the app's stand-in)
//! carries on: the next, good document still reads. Every fault prints one `HOSTILE` line for
//! `scripts/hostile.sh`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvlab_app::documents::{DocumentKind, Limits, Reader, MAX_BYTES};
use kvlab_app::error::AppCode;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/documents")
        .join(name)
}

fn reader(limits: Limits) -> Reader {
    Reader::new(PathBuf::from(env!("CARGO_BIN_EXE_kvlab-app")), limits)
}

/// Reads `path` (named by its file name) and asserts the code and that it came back within
/// `within`; returns the message.
fn refused(reader: &Reader, path: &Path, code: AppCode, within: Duration) -> String {
    let start = Instant::now();
    let got = reader.inspect_path(path);
    let took = start.elapsed();
    let e = got.expect_err("a hostile document must be refused");
    assert_eq!(e.code, code, "{}: {}", path.display(), e.message);
    assert!(
        took < within,
        "{}: took {took:?}, over {within:?}",
        path.display()
    );
    crate::tally::row(
        &format!(
            "document {} ({:.1} s)",
            path.file_name().unwrap().to_string_lossy(),
            took.as_secs_f64()
        ),
        code,
    );
    e.message
}

/// The app goes on reading documents after each fault: a good PDF still gives its text.
fn still_reads(reader: &Reader) {
    let doc = reader.inspect_path(&fixture("report.pdf")).unwrap();
    assert_eq!((doc.kind, doc.pages), (DocumentKind::Pdf, Some(2)));
    assert!(doc.text.contains("The secret word is pineapple."));
}

#[test]
fn hostile_pdf_that_overflows_the_stack_crashes_only_the_reader() {
    let limits = Limits::default();
    let r = reader(limits);
    let msg = refused(
        &r,
        &fixture("deep-recursion.pdf"),
        AppCode::DocumentCrashed,
        limits.wall,
    );
    assert!(msg.contains("stack overflow"), "{msg}");
    assert!(msg.contains("conversation is untouched"), "{msg}");
    still_reads(&r);
}

#[test]
fn hostile_pdf_that_makes_the_parser_loop_is_stopped_at_the_wall_clock() {
    let limits = Limits {
        wall: Duration::from_secs(2),
        ..Limits::default()
    };
    let r = reader(limits);
    let msg = refused(
        &r,
        &fixture("endless-loop.pdf"),
        AppCode::DocumentTimeout,
        limits.wall + Duration::from_secs(2),
    );
    assert!(msg.contains("longer than 2.0 s"), "{msg}");
    still_reads(&r);
}

#[cfg(target_os = "linux")]
#[test]
fn hostile_decompression_bomb_hits_the_memory_limit() {
    let limits = Limits::default();
    let r = reader(limits);
    let msg = refused(
        &r,
        &fixture("inflate-bomb.pdf"),
        AppCode::DocumentOutOfMemory,
        limits.wall,
    );
    assert!(msg.contains("more than 512 MiB"), "{msg}");
    still_reads(&r);
}

#[test]
fn hostile_empty_binary_and_non_utf8_files_get_their_own_codes() {
    let r = reader(Limits::default());
    let dir = tempfile::tempdir().unwrap();
    let within = Limits::default().wall;
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let msg = refused(&r, &write("empty.txt", b""), AppCode::DocumentEmpty, within);
    assert_eq!(msg, "empty.txt: the file is empty");
    // A real binary (the app's PNG icon) renamed as text, and as a PDF.
    let png = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("icons/32x32.png")).unwrap();
    let msg = refused(
        &r,
        &write("notes.txt", &png),
        AppCode::DocumentBinary,
        within,
    );
    assert!(msg.contains("NUL bytes"), "{msg}");
    let msg = refused(&r, &write("scan.pdf", &png), AppCode::PdfUnreadable, within);
    assert!(msg.contains("does not start with %PDF-"), "{msg}");
    // Latin-1 "café au lait": 0xE9 is no UTF-8 sequence.
    let msg = refused(
        &r,
        &write("latin1.txt", b"caf\xe9 au lait"),
        AppCode::DocumentNotUtf8,
        within,
    );
    assert!(msg.contains("offset 3"), "{msg}");
    still_reads(&r);
}

#[test]
fn hostile_200_mb_text_file_is_refused_by_its_size_unread() {
    let r = reader(Limits::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.txt");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let block: Vec<u8> = b"all work and no play makes a long file\n"
            .iter()
            .cycle()
            .take(1_000_000)
            .copied()
            .collect();
        for _ in 0..200 {
            f.write_all(&block).unwrap();
        }
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 200_000_000);
    const { assert!(200_000_000 > 40 * MAX_BYTES) };
    let msg = refused(&r, &path, AppCode::DocumentTooLarge, Duration::from_secs(1));
    assert!(
        msg.starts_with("huge.txt: 190.7 MiB is over the 4 MiB limit"),
        "{msg}"
    );
    still_reads(&r);
}
