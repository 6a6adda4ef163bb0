//! KV Lab's local OpenAI-compatible server: a thin HTTP face on the engine thread
//! ([`kvlab_engine::EngineHandle`]), which owns every request from queue to end. It speaks
//! `GET /v1/models`, `POST /v1/chat/completions` and `POST /v1/completions` (streamed as
//! server-sent events or not), plus what no peer has: a request's `kv_cache` (any cache SPEC),
//! the cache's bytes in every `usage`, `GET /v1/kv` (the live memory timeline) and
//! `GET /metrics` (Prometheus). Safe by default: loopback only unless the user binds wider
//! (then an API key is required), `Host` checked against DNS rebinding, and every request
//! bounded: its body, its connection's time, its answer's tokens and context (see
//! [`ServerConfig`]).

pub mod answer;
pub mod api;
pub mod body;
pub mod client;
pub mod error;
pub mod guard;
mod listen;
pub mod metrics;
mod routes;
pub mod tools;

use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use kvlab_engine::contract::MemorySample;
use kvlab_engine::host::{unix_ms, RssProbe};
use kvlab_engine::EngineHandle;
use tokio::sync::watch;

pub use api::{Limits, DEFAULT_SERVER_MAX_TOKENS};
pub use error::ApiError;

/// Largest request body accepted (a long document pasted into a prompt fits; a runaway
/// client does not).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// Bytes of request bodies read at once across all connections.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 64 << 20;
/// Connections open at once; one more is answered 503 and closed.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Time a connection has to send a request's head (and an idle connection to send the
/// next one).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence allowed between the pieces of a request's body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Time one write to a client may wait for it to read before its connection is closed.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Time open streams and connections get to end once the server is told to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How often the memory timeline served at `/v1/kv` is sampled, and how much of it is kept.
pub const KV_SAMPLE_PERIOD: Duration = Duration::from_millis(500);
pub const KV_SAMPLES_KEPT: usize = 1200;

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen.
    pub addr: SocketAddr,
    /// Required as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Host names accepted in `Host` besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Bytes of request bodies read at once, all connections together.
    pub max_buffered_bytes: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to send a request's head.
    pub header_timeout: Duration,
    /// Silence allowed within a request's body.
    pub body_timeout: Duration,
    /// Time a write may wait for a client that stops reading (then its connection closes,
    /// and its request is cancelled).
    pub write_timeout: Duration,
    /// What every request may ask (`--max-tokens`, `--ctx`).
    pub limits: Limits,
    /// The cache new conversations get (`kvlab serve --kv`), as shown by `/v1/models`;
    /// `None`: the engine's default for new conversations (the app's: the user's choice).
    pub default_kv: Option<String>,
}

impl ServerConfig {
    /// Loopback on `port`, no key, the default limits.
    pub fn local(port: u16) -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            api_key: None,
            allowed_hosts: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            limits: Limits::default(),
            default_kv: None,
        }
    }

    /// Refuses a set-up that would expose the model: an address beyond loopback without a
    /// key. The bound address's own name is accepted in `Host`.
    pub fn checked(mut self) -> Result<Self, ServerError> {
        let ip = self.addr.ip();
        if !ip.is_loopback() {
            if self.api_key.as_deref().is_none_or(str::is_empty) {
                return Err(ServerError::KeyRequired(ip));
            }
            if !ip.is_unspecified() {
                self.allowed_hosts.push(ip.to_string());
            }
        }
        Ok(self)
    }
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listening on {0}, beyond this machine, needs an API key (--api-key)")]
    KeyRequired(IpAddr),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the server stopped: {0}")]
    Serve(std::io::Error),
}

/// What the handlers share.
pub struct AppState {
    pub engine: EngineHandle,
    pub config: ServerConfig,
    pub counters: metrics::Counters,
    /// The memory timeline, newest last.
    pub timeline: Mutex<VecDeque<MemorySample>>,
    /// The bytes of request bodies being read.
    pub bodies: body::BodyBudget,
    /// Turns true when the server is told to stop: open streams end on it.
    closing: watch::Receiver<bool>,
    probe: Mutex<RssProbe>,
}

impl AppState {
    /// A memory sample now (every conversation's bytes, no text).
    pub fn sample_now(&self) -> MemorySample {
        let mut probe = self.probe.lock().unwrap_or_else(|p| p.into_inner());
        self.engine.memory_sample(unix_ms(), &mut probe, None)
    }

    /// A memory sample now, kept in the timeline (the sampler's tick) without its list of
    /// conversations: a kept sample is the same size however many there are, and names
    /// none (the list is served to each client for its own conversations, now).
    pub fn sample(&self) -> MemorySample {
        let mut s = self.sample_now();
        s.conversations = Vec::new();
        let mut t = self.timeline.lock().unwrap_or_else(|p| p.into_inner());
        if t.len() == KV_SAMPLES_KEPT {
            t.pop_front();
        }
        t.push_back(s.clone());
        s
    }

    /// Resolves once the server is told to stop.
    pub async fn closing(&self) {
        let mut rx = self.closing.clone();
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// The routes on `engine`, guarded as `config` says; the sender stops them (open streams
/// end with `finish_reason: "cancelled"`).
pub fn router(
    engine: EngineHandle,
    config: ServerConfig,
) -> (Router, Arc<AppState>, watch::Sender<bool>) {
    let (close, closing) = watch::channel(false);
    let state = Arc::new(AppState {
        engine,
        counters: metrics::Counters::default(),
        timeline: Mutex::new(VecDeque::new()),
        bodies: body::BodyBudget::new(config.max_buffered_bytes, config.max_body_bytes),
        closing,
        probe: Mutex::new(RssProbe::new()),
        config,
    });
    let router = Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/kv", get(routes::kv))
        .route("/metrics", get(routes::metrics))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::guard,
        ))
        .with_state(Arc::clone(&state));
    (router, state, close)
}

/// Binds `config.addr`; the returned listener's address has the real port (for port 0).
pub async fn bind(config: &ServerConfig) -> Result<tokio::net::TcpListener, ServerError> {
    tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.addr,
            source,
        })
}

/// Serves until `shutdown` resolves, sampling the memory timeline meanwhile; then every open
/// stream ends (`finish_reason: "cancelled"`) and the connections close, all within
/// [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: EngineHandle,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let (router, state, close) = router(engine, config);
    let sampler_state = Arc::clone(&state);
    let sampler = tokio::spawn(async move {
        let mut tick = tokio::time::interval(KV_SAMPLE_PERIOD);
        loop {
            tick.tick().await;
            sampler_state.sample();
        }
    });
    let served = listen::accept_until(listener, router, &state.config, shutdown, close).await;
    sampler.abort();
    served
}
