//! GGUF repositories on the Hub, against a tiny in-test server answering hf-hub's requests:
//! the quantizations are listed with their sizes before anything downloads, projectors
//! (`mmproj-*`) are never fetched, one chosen quant is downloaded and loads (its file is
//! one of llama.cpp's own conversions, tests/fixtures/gguf), and a quant the repository
//! lacks is a `model_not_found` error naming those it has.
#![cfg(feature = "hub")]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::common;
use kvlab_engine::contract::ErrorCode;
use kvlab_engine::hub::{download_model, list_gguf_quants, HubOptions};
use kvlab_engine::hub::{find_tokenizer, SourceError};
use kvlab_engine::lab::Model;
use kvlab_engine::LoadOptions;
use sha2::{Digest, Sha256};

const REPO: &str = "tiny/gemma-4-tiny-it-GGUF";
const COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";
const F16: &str = "gemma-4-tiny-it-F16.gguf";
const F32: &str = "gemma-4-tiny-it-F32.gguf";
const MMPROJ: &str = "mmproj-gemma-4-tiny-it-f16.gguf";

fn converted(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf");
    std::fs::read(p.join(name)).expect("a converted fixture")
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fake Hub serving one GGUF repository at one commit; records the paths requested.
struct FakeHub {
    files: Vec<(&'static str, Vec<u8>)>,
    requests: Mutex<Vec<(String, String)>>,
}

impl FakeHub {
    fn new() -> Arc<Self> {
        Arc::new(FakeHub {
            files: vec![
                ("README.md", b"# GGUF\n".to_vec()),
                (MMPROJ, vec![7u8; 4096]),
                (F32, converted("tiny_e.f32.gguf")),
                (F16, converted("tiny_e.f16.gguf")),
            ],
            requests: Mutex::new(Vec::new()),
        })
    }

    fn serve(self: &Arc<Self>) -> String {
        let hub = Arc::clone(self);
        common::serve_http(move |conn| hub.answer(conn))
    }

    fn gets(&self) -> Vec<String> {
        let requests = self.requests.lock().expect("lock");
        let prefix = format!("/{REPO}/resolve/{COMMIT}/");
        requests
            .iter()
            .filter(|(m, _)| m == "GET")
            .filter_map(|(_, p)| p.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    }

    fn tree(&self) -> String {
        let entries: Vec<_> = self
            .files
            .iter()
            .map(|(path, bytes)| {
                let mut e = serde_json::json!({
                    "type": "file", "oid": "0000", "size": bytes.len(), "path": path,
                });
                if path.ends_with(".gguf") {
                    e["lfs"] = serde_json::json!({"size": bytes.len(), "sha256": sha_hex(bytes)});
                }
                e
            })
            .collect();
        serde_json::Value::Array(entries).to_string()
    }

    fn answer(&self, mut conn: TcpStream) {
        let Ok(clone) = conn.try_clone() else { return };
        let mut reader = BufReader::new(clone);
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = match (parts.next(), parts.next()) {
            (Some(m), Some(t)) => (m.to_owned(), t.to_owned()),
            _ => return,
        };
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
        }
        let path = target.split('?').next().unwrap_or("").to_owned();
        self.requests
            .lock()
            .expect("lock")
            .push((method.clone(), path.clone()));
        let api = format!("/api/models/{REPO}");
        if path == format!("{api}/revision/main") {
            let body = serde_json::json!({"id": REPO, "sha": COMMIT}).to_string();
            return reply(&mut conn, "200 OK", &[], body.as_bytes(), &method);
        }
        if path == format!("{api}/tree/{COMMIT}") {
            return reply(&mut conn, "200 OK", &[], self.tree().as_bytes(), &method);
        }
        let resolve = format!("/{REPO}/resolve/{COMMIT}/");
        let file = path
            .strip_prefix(&resolve)
            .and_then(|f| self.files.iter().find(|(n, _)| *n == f));
        let Some((_, bytes)) = file else {
            let body = br#"{"error":"Repository not found"}"#;
            return reply(&mut conn, "404 Not Found", &[], body, &method);
        };
        let headers = [
            ("X-Repo-Commit", COMMIT.to_owned()),
            ("ETag", format!("\"{}\"", sha_hex(bytes))),
        ];
        reply(&mut conn, "200 OK", &headers, bytes, &method);
    }
}

fn reply(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], m: &str) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\nContent-Type: application/json\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
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
        ..HubOptions::default()
    }
}

#[test]
fn quants_are_listed_with_sizes_and_projectors_are_never_fetched() {
    let hub = FakeHub::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = options(&hub.serve(), dir.path());
    let never = AtomicBool::new(false);

    let quants = list_gguf_quants(REPO, None, &opts, &never).expect("listing");
    let listed: Vec<_> = quants
        .iter()
        .map(|q| (q.name.as_str(), q.bytes, q.files.clone()))
        .collect();
    assert_eq!(
        listed,
        vec![
            (
                "F16",
                converted("tiny_e.f16.gguf").len() as u64,
                vec![F16.to_string()]
            ),
            (
                "F32",
                converted("tiny_e.f32.gguf").len() as u64,
                vec![F32.to_string()]
            ),
        ]
    );
    assert!(hub.gets().is_empty(), "listing downloaded {:?}", hub.gets());

    // The chosen quant only: its file, never the projector nor the other quant.
    let file =
        download_model(REPO, None, Some("f32"), &opts, &mut |_| {}, &never).expect("download F32");
    assert_eq!(file.file_name().and_then(|f| f.to_str()), Some(F32));
    assert_eq!(
        std::fs::read(&file).expect("read"),
        converted("tiny_e.f32.gguf")
    );
    assert_eq!(hub.gets(), vec![F32.to_string()]);
    // It loads, with the file's own vocabulary as its tokenizer.
    let model = Model::load(&file, &LoadOptions::default()).expect("load");
    assert_eq!(model.config().vocab_size, 512);
    assert_eq!(find_tokenizer(&file, None).expect("tokenizer"), file);

    // No quant asked and no Q4_K_M offered: the smallest.
    let small = download_model(REPO, None, None, &opts, &mut |_| {}, &never).expect("default");
    assert_eq!(small.file_name().and_then(|f| f.to_str()), Some(F16));
    assert!(!hub.gets().iter().any(|g| g == MMPROJ));
}

#[test]
fn a_quant_the_repository_lacks_names_those_it_has() {
    let hub = FakeHub::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let never = AtomicBool::new(false);
    let err = download_model(
        REPO,
        None,
        Some("Q4_K_M"),
        &options(&hub.serve(), dir.path()),
        &mut |_| {},
        &never,
    )
    .expect_err("no Q4_K_M");
    assert!(matches!(err, SourceError::HubNotFound { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::ModelNotFound);
    let msg = err.to_string();
    assert!(msg.contains("Q4_K_M") && msg.contains("F16, F32"), "{msg}");
    assert!(hub.gets().is_empty());
}
