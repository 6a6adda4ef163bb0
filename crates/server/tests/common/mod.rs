//! The server over real HTTP on loopback, on the tiny Gemma 3 GGUF: a started server (the
//! same `kvlab_server::serve` that `kvlab serve` and the app's Local API run) and a client
//! that writes raw HTTP/1.1, so a test can send what no well-behaved client would.
#![allow(dead_code)] // each test file uses its part

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use kvlab_engine::contract::Event;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::GenerateRequest;
use kvlab_engine::{Engine, EngineHandle, ModelSource};
use kvlab_engine::{LoadRequest, Ticket};
use kvlab_server::ServerConfig;
use serde_json::{json, Value};
use std::sync::mpsc;
use tokio::sync::oneshot;

pub fn tiny_gguf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/gguf/tiny_gemma3.f32.gguf")
}

/// A server on its own runtime, serving until [`Server::stop`] or drop.
pub struct Server {
    pub addr: SocketAddr,
    pub engine: EngineHandle,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<Result<(), kvlab_server::ServerError>>>,
    pub runtime: tokio::runtime::Runtime,
}

/// A server on the tiny model with `config` (its address is replaced by a free loopback
/// port).
pub fn start(config: ServerConfig) -> Server {
    start_with(
        config,
        LoadRequest {
            cache: kvlab_engine::contract::CacheSelection::Spec("f16".into()),
            ..LoadRequest::new(ModelSource::Local { path: tiny_gguf() })
        },
    )
}

/// The tiny E-style Gemma 4 with its vision tower (the engine's fixtures/vision/e), in a
/// temporary folder with the image vocabulary and the Jul 14 template, its context
/// lengthened to 2048 (random weights do not mind the positions): what to load.
pub fn vision_model() -> (tempfile::TempDir, LoadRequest) {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures");
    let dir = tempfile::tempdir().expect("tempdir");
    let src = fixtures.join("vision/e");
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .expect("weights");
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("config json");
    config["text_config"]["max_position_embeddings"] = json!(2048);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    std::fs::copy(
        fixtures.join("templates/g4_e2b_jul14.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .expect("template");
    let load = LoadRequest {
        tokenizer: Some(fixtures.join("vision/tokenizer.json")),
        cache: kvlab_engine::contract::CacheSelection::Spec("f16".into()),
        ..LoadRequest::new(ModelSource::Local {
            path: dir.path().join("model.safetensors"),
        })
    };
    (dir, load)
}

/// A server on the model `load` names, with `config`.
pub fn start_with(config: ServerConfig, load: LoadRequest) -> Server {
    let engine = Engine::spawn().expect("engine");
    engine
        .submit(load)
        .and_then(|t| t.wait(|_| true))
        .expect("load the model");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let config = ServerConfig {
        default_kv: config.default_kv.or(Some("f16".into())),
        ..config
    };
    let listener = runtime.block_on(kvlab_server::bind(&config)).expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    let served = runtime.spawn(kvlab_server::serve(
        listener,
        engine.clone(),
        config,
        async move {
            let _ = stopped.await;
        },
    ));
    Server {
        addr,
        engine,
        stop: Some(stop),
        served: Some(served),
        runtime,
    }
}

impl Server {
    /// Tells the server to stop (as Ctrl-C does) and waits for `serve` to return.
    pub fn stop(&mut self) -> Result<(), kvlab_server::ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = self.served.take().expect("serving");
        self.runtime.block_on(served).expect("serve did not panic")
    }

    /// A normal chat request is answered in full.
    pub fn still_answers(&self) {
        let reply = post(self.addr, "/v1/chat/completions", chat(json!({})));
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(reply.json()["usage"]["completion_tokens"].as_u64() > Some(0));
    }
}

/// A response: status, lower-cased head, body (de-chunked).
pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
    /// The error's code, or "" when there is none.
    pub fn code(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            out.push_str(&rest[..n.min(rest.len())]);
            break;
        }
        out.push_str(&rest[..n]);
        raw = rest.get(n + 2..).unwrap_or("");
    }
    out
}

/// Reads a whole response (to the connection's close) and parses it.
pub fn read_reply(s: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    parse(&raw)
}

pub fn parse(raw: &[u8]) -> Reply {
    let raw = String::from_utf8_lossy(raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply {
        status,
        headers,
        body,
    }
}

/// A request's head, `Connection: close`, with `length` as its Content-Length.
pub fn head(method: &str, path: &str, host: &str, length: usize) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    )
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s
}

pub fn request(addr: SocketAddr, method: &str, path: &str, host: &str, body: &str) -> Reply {
    let mut s = connect(addr);
    s.write_all(head(method, path, host, body.len()).as_bytes())
        .expect("write");
    s.write_all(body.as_bytes()).expect("write");
    read_reply(&mut s)
}

/// A request with `Authorization: Bearer <token>`: the client that token (and this
/// machine's address) is.
pub fn post_as(addr: SocketAddr, path: &str, body: Value, token: &str) -> Reply {
    let body = body.to_string();
    let mut s = connect(addr);
    let head = head("POST", path, "127.0.0.1", body.len()).replace(
        "\r\n\r\n",
        &format!("\r\nAuthorization: Bearer {token}\r\n\r\n"),
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body.as_bytes()).expect("write");
    read_reply(&mut s)
}

/// A GET as the client `token` is.
pub fn get_as(addr: SocketAddr, path: &str, token: &str) -> Reply {
    let mut s = connect(addr);
    let head = head("GET", path, "127.0.0.1", 0).replace(
        "\r\n\r\n",
        &format!("\r\nAuthorization: Bearer {token}\r\n\r\n"),
    );
    s.write_all(head.as_bytes()).expect("write");
    read_reply(&mut s)
}

pub fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    request(addr, "POST", path, "127.0.0.1", &body.to_string())
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, "127.0.0.1", "")
}

/// A short chat request to the tiny model, with `extra`'s fields set over it.
pub fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny_gemma3.f32.gguf",
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "temperature": 0, "max_tokens": 12,
    });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

/// The engine held: a request of the test's own whose callback (on the engine thread) waits
/// at each of its tokens numbered in `at` (from 1) until released. Nothing else steps
/// meanwhile.
pub struct Hold {
    holding: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
    _ticket: Ticket<GenerateRequest>,
}

impl Hold {
    pub fn new(server: &Server, at: &'static [usize]) -> Self {
        let (holding_tx, holding) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let mut tokens = 0;
        let ticket = server
            .engine
            .submit_with(
                GenerateRequest {
                    sampling: SamplingParams::greedy(),
                    max_tokens: 240,
                    ..GenerateRequest::new(Prompt::Ids {
                        ids: vec![2, 10, 11, 12],
                    })
                },
                move |ev| {
                    if matches!(ev, Event::Token { .. }) {
                        tokens += 1;
                        if at.contains(&tokens) {
                            let _ = holding_tx.send(());
                            // A dropped Hold releases every later stop too.
                            let _ = released.recv();
                        }
                    }
                    true
                },
            )
            .expect("the holding request");
        Self {
            holding,
            release,
            _ticket: ticket,
        }
    }

    /// Blocks until the engine thread is held.
    pub fn held(&self) {
        self.holding
            .recv_timeout(Duration::from_secs(30))
            .expect("the engine thread is held");
    }

    /// Lets the engine thread go on, to the next stop.
    pub fn release(&self) {
        let _ = self.release.send(());
    }
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The tests of one file run one at a time: one test's memory and timings are not another's.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes a `HOSTILE <attack> -> <outcome>` line for `scripts/hostile.sh`.
pub fn hostile(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("HOSTILE {line}\n").as_bytes());
}

/// Waits (up to `limit`) for `f` to hold.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// A field of `/proc/self/status`, in bytes.
pub fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// The process's peak resident memory from now on: resets the kernel's high-water mark
/// (`/proc/self/clear_refs`, value 5), and returns the resident bytes now.
pub fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    status_bytes("VmRSS")
}

/// How far the peak rose above `base` since [`reset_peak`], in MiB.
pub fn peak_rise_mib(base: u64) -> f64 {
    status_bytes("VmHWM").saturating_sub(base) as f64 / (1 << 20) as f64
}

/// Sends `body` as the client `token` is, on a new connection in a thread.
pub fn send_as_in_thread(
    addr: std::net::SocketAddr,
    body: Value,
    token: &str,
) -> std::thread::JoinHandle<(Reply, Duration)> {
    let token = token.to_owned();
    std::thread::spawn(move || {
        let t = std::time::Instant::now();
        let r = post_as(addr, "/v1/chat/completions", body, &token);
        (r, t.elapsed())
    })
}
