//! Hub downloads against a tiny in-test HTTP server that answers the requests hf-hub makes
//! (`/api/models/<repo>/revision/<rev>`, `/api/models/<repo>/tree/<commit>`, HEAD and ranged
//! GET on `/<repo>/resolve/<commit>/<file>`): progress, cancellation leaving a partial file,
//! resume with an HTTP range to the exact bytes, and the offline fallback. Then the faults
//! (tests named `hostile_*`, each printing `HOSTILE <fault> -> <code>`): 401 and 403 saying
//! how to set `HF_TOKEN`, 404, 429 with `Retry-After` (waited out when short, reported when
//! long), 5xx retried with backoff, bodies shorter than their `Content-Length`, a wrong
//! SHA-256, a stale partial that is not a prefix, and a disk that fills up (before the
//! download, and mid-download in a child process under a file-size rlimit). Each asserts its
//! code, its message, and that a partial file is kept only when it is a true prefix.
#![cfg(feature = "hub")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use kvlab_engine::contract::ErrorCode;
use kvlab_engine::hub::RetryPolicy;
use kvlab_engine::hub::SourceError;
use kvlab_engine::hub::{download_repo, DownloadProgress, HubOptions};
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
    at: Instant,
}

/// A canned answer for requests of one file: `times` answers of `status` with `headers`.
struct Script {
    file: String,
    status: &'static str,
    headers: Vec<(&'static str, String)>,
    times: usize,
}

/// A fake Hub serving one repository at one commit.
struct FakeHub {
    files: Vec<(String, Vec<u8>)>,
    requests: Mutex<Vec<Request>>,
    /// The next GET of this file stops after [`STALL_AT`] bytes until the client hangs up.
    stall_next: Mutex<Option<String>>,
    /// Answer ranged GETs with the whole file (200), as some servers do.
    ignore_range: bool,
    /// Canned error answers, taken before the real ones.
    scripts: Mutex<Vec<Script>>,
    /// Every GET body of the model stops after this many bytes (its Content-Length whole).
    truncate_at: Mutex<Option<usize>>,
    /// Serve the model with one byte changed (its listed SHA-256 stays the real one).
    corrupt: AtomicBool,
    /// List the model with this size instead of its own.
    listed_size: Mutex<Option<u64>>,
    /// Name this as the revision's commit instead of the real one.
    commit_named: Mutex<Option<String>>,
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
            scripts: Mutex::new(Vec::new()),
            truncate_at: Mutex::new(None),
            corrupt: AtomicBool::new(false),
            listed_size: Mutex::new(None),
            commit_named: Mutex::new(None),
        })
    }

    /// Answers the next `times` requests of `file` (HEAD and GET) with `status`.
    fn script(
        &self,
        file: &str,
        status: &'static str,
        headers: &[(&'static str, &str)],
        times: usize,
    ) {
        self.scripts.lock().unwrap().push(Script {
            file: file.into(),
            status,
            headers: headers.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            times,
        });
    }

    /// The canned answer for `path`, if one is due (used up one at a time).
    fn scripted(&self, path: &str) -> Option<(&'static str, Vec<(&'static str, String)>)> {
        let mut scripts = self.scripts.lock().unwrap();
        let s = scripts
            .iter_mut()
            .find(|s| s.times > 0 && path.ends_with(&format!("/{}", s.file)))?;
        s.times -= 1;
        Some((s.status, s.headers.clone()))
    }

    /// Serves on a free local port; returns the endpoint URL.
    fn serve(self: &Arc<Self>) -> String {
        let hub = Arc::clone(self);
        common::serve_http(move |conn| hub.answer(conn))
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    fn tree(&self) -> String {
        let entries: Vec<_> = self
            .files
            .iter()
            .map(|(path, bytes)| {
                let size = match *self.listed_size.lock().unwrap() {
                    Some(s) if path == MODEL => s,
                    _ => bytes.len() as u64,
                };
                let mut e = serde_json::json!({
                    "type": "file", "oid": "0000", "size": size, "path": path,
                });
                if path.ends_with(".safetensors") {
                    let sha = sha_hex(bytes);
                    e["lfs"] = serde_json::json!({"size": size, "sha256": sha});
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
            at: Instant::now(),
        });
        if let Some((status, headers)) = self.scripted(&path) {
            let body = br#"{"error":"scripted fault"}"#;
            return reply(&mut conn, status, &headers, body, &method);
        }
        let api = format!("/api/models/{REPO}");
        let resolve = format!("/{REPO}/resolve/{COMMIT}/");
        if path == format!("{api}/revision/main") {
            let named = self.commit_named.lock().unwrap().clone();
            let sha = named.unwrap_or_else(|| COMMIT.to_owned());
            let body = serde_json::json!({"id": REPO, "sha": sha}).to_string();
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
        let mut bytes = bytes.clone();
        if name == MODEL && self.corrupt.load(Ordering::Relaxed) {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x5a;
        }
        let bytes = &bytes;
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
        let cut = *self.truncate_at.lock().unwrap();
        if let (Some(cut), true) = (cut, method == "GET" && name == MODEL) {
            // Promise the whole body, send part of it, hang up.
            write_head(&mut conn, status, &headers, body.len());
            let _ = conn.write_all(&body[..cut.min(body.len())]);
            let _ = conn.flush();
            let _ = conn.shutdown(std::net::Shutdown::Both);
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

/// Tries per request in these tests, and their short waits.
const ATTEMPTS: u32 = 3;

fn options(endpoint: &str, dir: &Path) -> HubOptions {
    HubOptions {
        endpoint: Some(endpoint.to_owned()),
        dir: Some(dir.to_path_buf()),
        token: Some("test-token".into()),
        retry: RetryPolicy {
            attempts: ATTEMPTS,
            base_delay: Duration::from_millis(40),
            max_delay: Duration::from_millis(200),
            max_retry_after: Duration::from_secs(5),
        },
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

/// Prints the tally line `scripts/hostile.sh` counts and checks the code.
fn hostile(row: &str, err: &SourceError, want: ErrorCode) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{}\n", format_args!("HOSTILE {row} -> {}", err.code())).as_bytes());
    assert_eq!(err.code(), want, "{row}: {err}");
}

/// A fresh fake Hub, its options and a download folder.
fn hub_and_dir() -> (Arc<FakeHub>, HubOptions, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::new(false);
    let opts = options(&hub.serve(), dir.path());
    (hub, opts, dir)
}

fn snapshot(dir: &Path) -> PathBuf {
    dir.join("tiny--gemma3").join(COMMIT)
}

/// Asserts the model's `.part` file is a true prefix of the model and returns its length
/// (0 when there is none).
fn prefix_kept(dir: &Path) -> u64 {
    let part = snapshot(dir).join("model.safetensors.part");
    let Ok(bytes) = std::fs::read(&part) else {
        return 0;
    };
    let model = fixture(MODEL);
    assert!(bytes.len() <= model.len(), "partial longer than the file");
    assert_eq!(bytes, model[..bytes.len()], "the partial is not a prefix");
    bytes.len() as u64
}

/// What the user had stays: config.json, fetched before the fault, is complete.
fn config_kept(dir: &Path) {
    assert_eq!(
        std::fs::read(snapshot(dir).join("config.json")).unwrap(),
        fixture("config.json")
    );
}

fn model_requests(hub: &FakeHub) -> Vec<Request> {
    let path = format!("/{REPO}/resolve/{COMMIT}/{MODEL}");
    hub.requests()
        .into_iter()
        .filter(|r| r.path == path)
        .collect()
}

#[test]
fn hostile_hub_401_says_how_to_set_hf_token() {
    let (hub, opts, dir) = hub_and_dir();
    hub.script(MODEL, "401 Unauthorized", &[], usize::MAX);
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub 401 (token needed)", &err, ErrorCode::HubAuth);
    let msg = err.to_string();
    for want in ["401", "HF_TOKEN", "settings/tokens", REPO] {
        assert!(msg.contains(want), "{want} missing: {msg}");
    }
    // Retrying cannot help: one request.
    assert_eq!(model_requests(&hub).len(), 1);
    config_kept(dir.path());
}

#[test]
fn hostile_hub_403_gated_says_to_accept_the_license() {
    let (hub, opts, dir) = hub_and_dir();
    hub.script(MODEL, "403 Forbidden", &[], usize::MAX);
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub 403 (gated)", &err, ErrorCode::HubAuth);
    let msg = err.to_string();
    for want in ["403", "license", "HF_TOKEN", "gated"] {
        assert!(msg.contains(want), "{want} missing: {msg}");
    }
    assert_eq!(model_requests(&hub).len(), 1);
    config_kept(dir.path());
}

#[test]
fn hostile_hub_commit_id_that_names_a_path_is_refused_before_any_folder() {
    let (hub, opts, dir) = hub_and_dir();
    let outside = dir.path().join("escaped");
    *hub.commit_named.lock().unwrap() = Some("../../escaped".into());
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub commit id ../../escaped", &err, ErrorCode::Network);
    assert!(err.to_string().contains("commit id"), "{err}");
    assert!(!outside.exists());
    assert!(model_requests(&hub).is_empty());
}

#[test]
fn hostile_hub_404_is_model_not_found() {
    let (hub, opts, _dir) = hub_and_dir();
    hub.script(MODEL, "404 Not Found", &[], usize::MAX);
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub 404", &err, ErrorCode::ModelNotFound);
    assert!(err.to_string().contains(MODEL), "{err}");
    assert_eq!(model_requests(&hub).len(), 1);
}

#[test]
fn hostile_hub_429_short_retry_after_is_waited_out() {
    let (hub, opts, dir) = hub_and_dir();
    hub.script(MODEL, "429 Too Many Requests", &[("Retry-After", "1")], 1);
    run(&opts, false)
        .0
        .expect("the download succeeds after the wait");
    let reqs = model_requests(&hub);
    // The 429, then the HEAD and GET of the real transfer, the first at least 1 s later.
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    let gap = reqs[1].at - reqs[0].at;
    assert!(gap >= Duration::from_secs(1), "waited only {gap:?}");
    assert_eq!(
        std::fs::read(snapshot(dir.path()).join(MODEL)).unwrap(),
        fixture(MODEL)
    );
}

#[test]
fn hostile_hub_429_long_retry_after_fails_at_once_saying_how_long() {
    let (hub, opts, dir) = hub_and_dir();
    hub.script(
        MODEL,
        "429 Too Many Requests",
        &[("Retry-After", "3600")],
        usize::MAX,
    );
    let t = Instant::now();
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub 429 with Retry-After", &err, ErrorCode::HubRateLimited);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "it waited: {:?}",
        t.elapsed()
    );
    let msg = err.to_string();
    assert!(msg.contains("60 minutes") && msg.contains("429"), "{msg}");
    assert_eq!(model_requests(&hub).len(), 1);
    config_kept(dir.path());
}

#[test]
fn hostile_hub_5xx_is_retried_with_backoff() {
    // Two failures, then the real answer: the download succeeds on the third try, each wait
    // longer than the one before.
    let (hub, opts, dir) = hub_and_dir();
    hub.script(MODEL, "503 Service Unavailable", &[], 2);
    run(&opts, false).0.expect("succeeds on the third try");
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{}\n", format_args!("HOSTILE hub 5xx twice -> recovered")).as_bytes());
    let reqs = model_requests(&hub);
    assert_eq!(reqs.len(), 4, "503, 503, HEAD, GET: {reqs:?}");
    let (w1, w2) = (reqs[1].at - reqs[0].at, reqs[2].at - reqs[1].at);
    assert!(w1 >= Duration::from_millis(40), "first wait {w1:?}");
    assert!(w2 >= Duration::from_millis(80), "second wait {w2:?}");
    assert_eq!(
        std::fs::read(snapshot(dir.path()).join(MODEL)).unwrap(),
        fixture(MODEL)
    );

    // Failing every time: hub_unavailable after the policy's tries, config.json kept.
    let (hub, opts, dir) = hub_and_dir();
    hub.script(MODEL, "502 Bad Gateway", &[], usize::MAX);
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub 5xx after retries", &err, ErrorCode::HubUnavailable);
    let msg = err.to_string();
    assert!(
        msg.contains("502") && msg.contains(&format!("{ATTEMPTS} tries")),
        "{msg}"
    );
    assert_eq!(model_requests(&hub).len(), ATTEMPTS as usize);
    config_kept(dir.path());
}

#[test]
fn hostile_hub_body_shorter_than_content_length_keeps_a_true_prefix() {
    const CUT: usize = 100_000;
    let (hub, opts, dir) = hub_and_dir();
    *hub.truncate_at.lock().unwrap() = Some(CUT);
    let err = run(&opts, false).0.unwrap_err();
    hostile(
        "hub body shorter than Content-Length",
        &err,
        ErrorCode::DownloadIncomplete,
    );
    // Each try resumed where the last one stopped, so every try added CUT bytes.
    let kept = prefix_kept(dir.path());
    assert_eq!(kept, (CUT * ATTEMPTS as usize) as u64);
    let gets: Vec<_> = model_requests(&hub)
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    assert_eq!(gets.len(), ATTEMPTS as usize);
    assert_eq!(gets[0].range, None);
    let len = fixture(MODEL).len();
    assert_eq!(
        gets[1].range.as_deref(),
        Some(format!("bytes={CUT}-{}", len - 1).as_str())
    );
    assert!(
        err.to_string().contains(&format!("{kept} of {len} bytes")),
        "{err}"
    );
    config_kept(dir.path());

    // The Hub behaves again: the next run resumes from the kept bytes and finishes.
    *hub.truncate_at.lock().unwrap() = None;
    run(&opts, false).0.expect("resumes");
    let last = model_requests(&hub).pop().unwrap();
    assert_eq!(last.range, Some(format!("bytes={kept}-{}", len - 1)));
    assert_eq!(
        std::fs::read(snapshot(dir.path()).join(MODEL)).unwrap(),
        fixture(MODEL)
    );
}

#[test]
fn hostile_hub_wrong_sha256_discards_the_file() {
    let (hub, opts, dir) = hub_and_dir();
    hub.corrupt.store(true, Ordering::Relaxed);
    let err = run(&opts, false).0.unwrap_err();
    hostile("hub wrong sha256", &err, ErrorCode::DownloadCorrupt);
    assert!(err.to_string().contains("SHA-256"), "{err}");
    // Not a prefix of the listed file: nothing of it is kept.
    let snap = snapshot(dir.path());
    assert!(!snap.join("model.safetensors.part").exists());
    assert!(!snap.join(MODEL).exists());
    config_kept(dir.path());
}

#[test]
fn hostile_hub_partial_that_is_not_a_prefix_is_refetched_whole() {
    // A partial left by some earlier run with wrong bytes: the resumed file fails its
    // checksum, so it is dropped and fetched again from byte 0, once, without the user.
    let (hub, opts, dir) = hub_and_dir();
    let snap = snapshot(dir.path());
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("model.safetensors.part"), vec![0xAB; 5000]).unwrap();
    run(&opts, false).0.expect("recovers");
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!("HOSTILE hub stale partial that is not a prefix -> recovered")
        )
        .as_bytes(),
    );
    assert_eq!(std::fs::read(snap.join(MODEL)).unwrap(), fixture(MODEL));
    let gets: Vec<_> = model_requests(&hub)
        .into_iter()
        .filter(|r| r.method == "GET")
        .map(|r| r.range)
        .collect();
    let len = fixture(MODEL).len();
    assert_eq!(gets, [Some(format!("bytes=5000-{}", len - 1)), None]);
    // A partial longer than the file is no prefix either: dropped before any request.
    std::fs::remove_file(snap.join(MODEL)).unwrap();
    std::fs::write(snap.join("model.safetensors.part"), vec![0u8; len + 10]).unwrap();
    run(&opts, false).0.expect("starts over");
    assert_eq!(std::fs::read(snap.join(MODEL)).unwrap(), fixture(MODEL));
    assert_eq!(model_requests(&hub).pop().unwrap().range, None);
}

#[test]
fn hostile_hub_disk_too_small_is_refused_before_downloading() {
    let (hub, opts, dir) = hub_and_dir();
    // The listing claims a 1 PiB model: no disk here has room for it.
    *hub.listed_size.lock().unwrap() = Some(1 << 50);
    let err = run(&opts, false).0.unwrap_err();
    hostile(
        "hub download larger than the free disk",
        &err,
        ErrorCode::DiskFull,
    );
    let msg = err.to_string();
    assert!(
        msg.contains("1.00 PiB still to download") && msg.contains("free there"),
        "{msg}"
    );
    assert!(model_requests(&hub).is_empty(), "fetched anyway");
    // Nothing was written yet, and nothing the user had is touched.
    assert!(!snapshot(dir.path()).join("config.json").exists());
}

/// Environment of the child in [`hostile_hub_disk_full_mid_download`].
const CHILD_URL: &str = "KVLAB_TEST_HUB_URL";
const CHILD_DIR: &str = "KVLAB_TEST_HUB_DIR";
/// The child's file-size limit: the model's part file stops growing here.
const FSIZE_LIMIT: u64 = 200_000;

#[cfg(unix)]
#[test]
#[ignore = "the child process of hostile_hub_disk_full_mid_download"]
fn disk_full_child() {
    let (Ok(url), Ok(dir)) = (std::env::var(CHILD_URL), std::env::var(CHILD_DIR)) else {
        panic!("run by hostile_hub_disk_full_mid_download only");
    };
    // SAFETY: plain libc calls on this process: writes past FSIZE_LIMIT now fail with EFBIG
    // (instead of raising SIGXFSZ, which is ignored).
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit {
            rlim_cur: FSIZE_LIMIT as libc::rlim_t,
            rlim_max: FSIZE_LIMIT as libc::rlim_t,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    let err = run(&options(&url, Path::new(&dir)), false).0.unwrap_err();
    println!("CHILD_RESULT {}\t{err}", err.code());
}

#[cfg(unix)]
#[test]
fn hostile_hub_disk_full_mid_download() {
    let (hub, _opts, dir) = hub_and_dir();
    let url = hub.serve();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hub_download::disk_full_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL, &url)
        .env(CHILD_DIR, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CHILD_RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| {
            panic!(
                "no result from the child: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let (code, message) = line.split_once('\t').unwrap();
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!("HOSTILE hub disk full mid-download -> {code}")
        )
        .as_bytes(),
    );
    assert_eq!(code, "disk_full", "{message}");
    assert!(
        message.contains("model.safetensors.part") && message.contains("KVLAB_CACHE"),
        "{message}"
    );
    // The bytes written before the disk filled are a true prefix, kept for resume.
    assert_eq!(prefix_kept(dir.path()), FSIZE_LIMIT);
    config_kept(dir.path());
    // With room again, the download resumes from there and completes.
    run(&options(&url, dir.path()), false).0.expect("resumes");
    let last = model_requests(&hub).pop().unwrap();
    let len = fixture(MODEL).len();
    assert_eq!(last.range, Some(format!("bytes={FSIZE_LIMIT}-{}", len - 1)));
    assert_eq!(
        std::fs::read(snapshot(dir.path()).join(MODEL)).unwrap(),
        fixture(MODEL)
    );
}
