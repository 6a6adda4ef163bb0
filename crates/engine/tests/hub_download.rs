//! Hub downloads against a tiny in-test HTTP server that answers the requests hf-hub makes
//! (`/api/models/<repo>/revision/<rev>`, `/api/models/<repo>/tree/<commit>`, HEAD and ranged
//! GET on `/<repo>/resolve/<commit>/<file>`): progress, cancellation leaving a partial file,
//! resume with an HTTP range to the exact bytes, and the offline fallback.
#![cfg(feature = "hub")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kvlab_engine::events::ErrorCode;
use kvlab_engine::source::hub::{download_repo, DownloadProgress, HubOptions};
use kvlab_engine::source::SourceError;
use sha2::{Digest, Sha256};

const REPO: &str = "tiny/gemma3";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const MODEL: &str = "model.safetensors";
/// The stalled transfer sends this many bytes of the model, then waits for the client.
const STALL_AT: usize = 300_000;

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_gemma3");
    std::fs::read(p.join(name)).unwrap()
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
struct Request {
    method: String,
    path: String,
    range: Option<String>,
}

/// A fake Hub serving one repository at one commit.
struct FakeHub {
    files: Vec<(String, Vec<u8>)>,
    requests: Mutex<Vec<Request>>,
    /// The next GET of this file stops after [`STALL_AT`] bytes until the client hangs up.
    stall_next: Mutex<Option<String>>,
    /// Answer ranged GETs with the whole file (200), as some servers do.
    ignore_range: bool,
}

impl FakeHub {
    fn new(ignore_range: bool) -> Arc<Self> {
        Arc::new(FakeHub {
            files: vec![
                ("config.json".into(), fixture("config.json")),
                (MODEL.into(), fixture(MODEL)),
                ("README.md".into(), b"# not a model file\n".to_vec()),
            ],
            requests: Mutex::new(Vec::new()),
            stall_next: Mutex::new(None),
            ignore_range,
        })
    }

    /// Serves on a free local port; returns the endpoint URL.
    fn serve(self: &Arc<Self>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let hub = Arc::clone(self);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let hub = Arc::clone(&hub);
                std::thread::spawn(move || hub.answer(conn));
            }
        });
        url
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    fn tree(&self) -> String {
        let entries: Vec<_> = self
            .files
            .iter()
            .map(|(path, bytes)| {
                let mut e = serde_json::json!({
                    "type": "file", "oid": "0000", "size": bytes.len(), "path": path,
                });
                if path.ends_with(".safetensors") {
                    let sha = sha_hex(bytes);
                    e["lfs"] = serde_json::json!({"size": bytes.len(), "sha256": sha});
                }
                e
            })
            .collect();
        serde_json::Value::Array(entries).to_string()
    }

    fn answer(&self, mut conn: TcpStream) {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = match (parts.next(), parts.next()) {
            (Some(m), Some(t)) => (m.to_owned(), t.to_owned()),
            _ => return,
        };
        let mut range = None;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("range") {
                    range = Some(v.trim().to_owned());
                }
            }
        }
        let path = target.split('?').next().unwrap_or("").to_owned();
        self.requests.lock().unwrap().push(Request {
            method: method.clone(),
            path: path.clone(),
            range: range.clone(),
        });
        let api = format!("/api/models/{REPO}");
        let resolve = format!("/{REPO}/resolve/{COMMIT}/");
        if path == format!("{api}/revision/main") {
            let body = serde_json::json!({"id": REPO, "sha": COMMIT}).to_string();
            return reply(&mut conn, "200 OK", &[], body.as_bytes(), &method);
        }
        if path == format!("{api}/tree/{COMMIT}") {
            return reply(&mut conn, "200 OK", &[], self.tree().as_bytes(), &method);
        }
        let file = path
            .strip_prefix(&resolve)
            .and_then(|f| self.files.iter().find(|(n, _)| n == f));
        let Some((name, bytes)) = file else {
            let body = br#"{"error":"Repository not found"}"#;
            return reply(&mut conn, "404 Not Found", &[], body, &method);
        };
        let commit = ("X-Repo-Commit", COMMIT.to_owned());
        let etag = ("ETag", format!("\"{}\"", sha_hex(bytes)));
        let (status, body, extra) = match range.as_deref().and_then(parse_range) {
            Some((a, b)) if !self.ignore_range && method == "GET" => {
                let b = b.min(bytes.len() as u64 - 1);
                let cr = format!("bytes {a}-{b}/{}", bytes.len());
                (
                    "206 Partial Content",
                    &bytes[a as usize..=b as usize],
                    Some(("Content-Range", cr)),
                )
            }
            _ => ("200 OK", &bytes[..], None),
        };
        let mut headers = vec![commit, etag];
        headers.extend(extra);
        let stall = method == "GET" && {
            let mut s = self.stall_next.lock().unwrap();
            let hit = s.as_deref() == Some(name.as_str());
            if hit {
                *s = None;
            }
            hit
        };
        if stall {
            write_head(&mut conn, status, &headers, body.len());
            let _ = conn.write_all(&body[..STALL_AT]);
            let _ = conn.flush();
            // Hold the connection open until the client drops it (cancellation).
            let _ = reader.read(&mut [0u8; 1]);
            return;
        }
        reply(&mut conn, status, &headers, body, &method);
    }
}

fn parse_range(v: &str) -> Option<(u64, u64)> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse().unwrap_or(u64::MAX)))
}

fn write_head(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], len: usize) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n");
    head.push_str("Content-Type: application/json\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
}

fn reply(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], m: &str) {
    write_head(conn, status, headers, body.len());
    if m != "HEAD" {
        let _ = conn.write_all(body);
    }
    let _ = conn.flush();
}

fn options(endpoint: &str, dir: &Path) -> HubOptions {
    HubOptions {
        endpoint: Some(endpoint.to_owned()),
        dir: Some(dir.to_path_buf()),
        token: Some("test-token".into()),
    }
}

/// Runs one download, cancelling once the model file has some bytes when `cancel_mid` is set.
fn run(
    opts: &HubOptions,
    cancel_mid: bool,
) -> (Result<PathBuf, SourceError>, Vec<DownloadProgress>) {
    let cancel = AtomicBool::new(false);
    let mut seen = Vec::new();
    let result = download_repo(
        REPO,
        None,
        opts,
        &mut |p| {
            if cancel_mid && p.file == MODEL && p.file_done > 0 {
                cancel.store(true, Ordering::Relaxed);
            }
            seen.push(p.clone());
        },
        &cancel,
    );
    (result, seen)
}

fn gets_of<'a>(requests: &'a [Request], file: &str) -> Vec<&'a Request> {
    let path = format!("/{REPO}/resolve/{COMMIT}/{file}");
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .collect()
}

fn assert_monotonic(seen: &[DownloadProgress]) {
    for w in seen.windows(2) {
        assert!(w[1].done >= w[0].done, "progress went back: {w:?}");
    }
    for p in seen {
        assert!(p.file_done <= p.file_total && p.done <= p.total, "{p:?}");
    }
}

/// Cancels mid-model, checks the partial, resumes and checks the bytes; returns the partial
/// length and the snapshot directory.
fn cancel_then_resume(hub: &Arc<FakeHub>, dir: &Path) -> (u64, PathBuf) {
    let opts = options(&hub.serve(), dir);
    let config = fixture("config.json");
    let model = fixture(MODEL);
    let total = (config.len() + model.len()) as u64;
    let snapshot = dir.join("tiny--gemma3").join(COMMIT);

    *hub.stall_next.lock().unwrap() = Some(MODEL.into());
    let (first, seen) = run(&opts, true);
    assert!(matches!(first, Err(SourceError::Cancelled)), "{first:?}");
    assert_eq!(first.unwrap_err().code(), ErrorCode::Cancelled);
    assert_monotonic(&seen);
    assert_eq!(seen.first().map(|p| (p.done, p.total)), Some((0, total)));
    let part = snapshot.join("model.safetensors.part");
    let partial = std::fs::metadata(&part).unwrap().len();
    assert!(
        partial > 0 && partial <= STALL_AT as u64,
        "partial {partial}"
    );
    assert_eq!(std::fs::read(&part).unwrap(), model[..partial as usize]);
    assert!(!snapshot.join(MODEL).exists());
    assert_eq!(std::fs::read(snapshot.join("config.json")).unwrap(), config);
    let before = hub.requests().len();

    let (second, seen) = run(&opts, false);
    assert_eq!(second.unwrap(), snapshot);
    assert_eq!(std::fs::read(snapshot.join(MODEL)).unwrap(), model);
    assert_eq!(std::fs::read(snapshot.join("config.json")).unwrap(), config);
    assert!(!part.exists());
    let resumed = &hub.requests()[before..];
    let model_gets = gets_of(resumed, MODEL);
    assert_eq!(model_gets.len(), 1, "{resumed:?}");
    let want = format!("bytes={partial}-{}", model.len() - 1);
    assert_eq!(model_gets[0].range.as_deref(), Some(want.as_str()));
    assert!(
        gets_of(resumed, "config.json").is_empty(),
        "config.json fetched again"
    );
    // The resumed run starts where the first stopped and ends at the total.
    assert_eq!(
        seen.first().map(|p| p.done),
        Some(config.len() as u64 + partial)
    );
    assert_eq!(seen.last().map(|p| (p.done, p.total)), Some((total, total)));
    (partial, snapshot)
}

#[test]
fn downloads_with_progress_cancels_and_resumes_with_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::new(false);
    let (_, snapshot) = cancel_then_resume(&hub, dir.path());
    assert!(
        hub.requests()
            .iter()
            .all(|r| !r.path.ends_with("README.md")),
        "non-model files are skipped"
    );

    // A finished snapshot downloads nothing again.
    let before = hub.requests().len();
    let (again, seen) = run(&options(&hub.serve(), dir.path()), false);
    assert_eq!(again.unwrap(), snapshot);
    assert!(gets_of(&hub.requests()[before..], MODEL).is_empty());
    let total = seen.last().map(|p| p.total).unwrap();
    assert!(seen.iter().all(|p| p.done == total));
}

#[test]
fn a_server_ignoring_ranges_still_yields_the_right_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::new(true);
    let (partial, snapshot) = cancel_then_resume(&hub, dir.path());
    assert!(partial > 0);
    let got = std::fs::read(snapshot.join(MODEL)).unwrap();
    assert_eq!(sha_hex(&got), sha_hex(&fixture(MODEL)));
}

/// An endpoint nobody listens on.
fn dead_endpoint() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

#[test]
fn unreachable_hub_is_a_network_error_unless_a_finished_snapshot_exists() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_endpoint();
    let (err, _) = run(&options(&dead, dir.path()), false);
    let err = err.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Network, "{err}");
    assert!(err.to_string().contains(REPO), "{err}");

    let hub = FakeHub::new(false);
    let (done, _) = run(&options(&hub.serve(), dir.path()), false);
    let snapshot = done.unwrap();
    let (offline, _) = run(&options(&dead, dir.path()), false);
    assert_eq!(offline.unwrap(), snapshot);
}

#[test]
fn unknown_repository_is_model_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::new(false);
    let cancel = AtomicBool::new(false);
    let err = download_repo(
        "nobody/nothing",
        None,
        &options(&hub.serve(), dir.path()),
        &mut |_| {},
        &cancel,
    )
    .unwrap_err();
    assert!(matches!(err, SourceError::HubNotFound { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::ModelNotFound);
}
