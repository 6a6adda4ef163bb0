//! `kvlab serve` itself, on the tiny Gemma 3 GGUF over loopback: its `--max-tokens` and
//! `--ctx` bound every request (a billion tokens asked is the server's bound; a prompt over
//! the context is refused before any work), and Ctrl-C (SIGINT) ends it within seconds.
//! Each attack in detail is the server's own test (crates/server/tests/hostile_http.rs),
//! on the same `kvlab_server::serve`; this one proves the command's wiring.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn tiny_gguf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/gguf/tiny_gemma3.f32.gguf")
}

/// `kvlab serve` started, and the address it printed.
fn serve(spill: &std::path::Path, extra: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["--threads", "2", "serve", "--port", "0", "--model"])
        .arg(tiny_gguf())
        .arg("--spill-dir")
        .arg(spill)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run kvlab serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the serving line");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

/// POSTs `body`; the status and the JSON body.
fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, serde_json::from_str(body).expect("a JSON body"))
}

#[test]
fn serve_bounds_every_request_by_its_flags_and_stops_on_ctrl_c() {
    let spill = tempfile::tempdir().expect("tempdir");
    let (mut child, addr) = serve(spill.path(), &["--max-tokens", "4", "--ctx", "64"]);
    let (status, v) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "123", "max_tokens": 1_000_000_000u64}),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64() <= Some(4), "{v}");
    let (status, v) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "1234567890".repeat(12)}),
    );
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("context_overflow")),
        "{v}"
    );
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(interrupted.success());
    let t = Instant::now();
    let exited = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = exited.unwrap_or_else(|| panic!("still running {:?} after Ctrl-C", t.elapsed()));
    assert!(status.success(), "{status}");
    eprintln!("kvlab serve exited {:?} after Ctrl-C", t.elapsed());
}
