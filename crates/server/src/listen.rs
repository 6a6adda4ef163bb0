//! The accept loop: each connection is served by hyper's HTTP/1 with a timer, so a request's
//! head must arrive within the header timeout (an idle keep-alive connection is closed
//! after the same time), and each write must make progress within the write timeout (a
//! client that stops reading loses its connection and its request, not the server's
//! memory). At most
//! `max_connections` are open at once: at the cap, a newcomer takes the place of the
//! connection idle longest (between requests: no request in flight), and only when none is
//! idle is it told `503 too_many_connections` and closed; a peer beyond loopback holds at
//! most a quarter of the places. On stop, listening ends, open streams are told to end, and
//! whatever connection is still open after [`crate::SHUTDOWN_GRACE`] is dropped.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::client::Peer;
use crate::error::{ApiError, HttpCode};
use crate::{ServerConfig, ServerError, SHUTDOWN_GRACE};

/// The most a connection reads ahead into its own buffer (hyper's default is ~400 KiB: 64
/// connections would hold 25 MiB outside the body budget).
const READ_BUFFER: usize = 64 << 10;

/// Time a shed connection gets to close before it is dropped.
const SHED_GRACE: Duration = Duration::from_secs(1);

/// One open connection, as the accept loop sees it.
struct Open {
    peer: IpAddr,
    /// Requests in flight on it (a streamed answer counts until its last byte).
    in_flight: Arc<AtomicUsize>,
    /// When it last started or ended a request (or opened).
    idle_since: Arc<Mutex<Instant>>,
    /// Told to close (between requests).
    shed: Arc<Notify>,
    /// It was told: it no longer counts, and is not chosen again, while it closes.
    shedding: bool,
}

/// The open connections, by number.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<u64, Open>>,
}

impl Connections {
    /// Makes room for a connection from `peer`: true when there is a place, after shedding
    /// the connection idle longest if it had to (see the module doc).
    fn admit(&self, peer: IpAddr, max: usize) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        // Connections being shed close within SHED_GRACE: they hold no place, so at most
        // `max` more than the cap are open at once, for that long.
        let live = || open.values().filter(|c| !c.shedding);
        let per_peer = (max / 4).max(1);
        let theirs = live().filter(|c| c.peer == peer).count();
        let capped_peer = !peer.is_loopback() && theirs >= per_peer;
        if live().count() < max && !capped_peer {
            return true;
        }
        // The one idle longest, of this peer's when it is the peer that is over its share.
        let idle = open
            .iter_mut()
            .filter(|(_, c)| !c.shedding && (!capped_peer || c.peer == peer))
            .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|(_, c)| *c.idle_since.lock().unwrap_or_else(|p| p.into_inner()));
        match idle {
            Some((_, c)) => {
                c.shedding = true;
                c.shed.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counts a request in flight on its connection until its answer's last byte (or drop).
struct InFlight {
    count: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
}

impl InFlight {
    fn new(count: &Arc<AtomicUsize>, idle_since: &Arc<Mutex<Instant>>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self {
            count: Arc::clone(count),
            idle_since: Arc::clone(idle_since),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's stream whose writes fail after `timeout` without progress.
struct TimedWrites {
    io: TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TimedWrites {
    /// `result` of a write-side poll: pending arms the clock (an error once it runs out),
    /// ready disarms it.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match result {
            Poll::Pending => {
                let timeout = self.timeout;
                let clock = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match clock.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl AsyncRead for TimedWrites {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TimedWrites {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.timed(cx, r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.timed(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.timed(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.timed(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Serves `router` on `listener` until `shutdown`, then stops as the module doc says.
pub(crate) async fn accept_until(
    listener: TcpListener,
    router: Router,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    close: watch::Sender<bool>,
) -> Result<(), ServerError> {
    let connections = Arc::new(Connections::default());
    let mut tasks = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        // A connection buffers at most this much of what it reads ahead of its request's
        // body reader: what a body holds is counted in the body budget, not here.
        .max_buf_size(READ_BUFFER);
    let stopping = close.subscribe();
    let mut next = 0u64;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // the listener itself is fine.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        while tasks.try_join_next().is_some() {}
        if !connections.admit(peer.ip(), config.max_connections.max(1)) {
            tasks.spawn(refuse(stream, config.max_connections));
            continue;
        }
        // Streamed tokens go out as they come.
        let _ = stream.set_nodelay(true);
        next += 1;
        let number = next;
        let open = Open {
            peer: peer.ip(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            idle_since: Arc::new(Mutex::new(Instant::now())),
            shed: Arc::new(Notify::new()),
            shedding: false,
        };
        let (in_flight, idle_since, shed) = (
            Arc::clone(&open.in_flight),
            Arc::clone(&open.idle_since),
            Arc::clone(&open.shed),
        );
        connections
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(number, open);
        // Each request knows its connection's peer (a client is its address and its key),
        // and counts as in flight until its answer's last byte.
        let router = router.clone();
        let peer_ip = peer.ip();
        let service = TowerToHyperService::new(tower::service_fn(
            move |mut request: Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(Peer(peer_ip));
                let guard = InFlight::new(&in_flight, &idle_since);
                let answered = router.clone().oneshot(request.map(Body::new));
                async move {
                    let response = answered.await?;
                    Ok::<_, std::convert::Infallible>(response.map(move |body| {
                        Body::new(body.map_frame(move |frame| {
                            let _in_flight = &guard;
                            frame
                        }))
                    }))
                }
            },
        ));
        let io = TokioIo::new(TimedWrites {
            io: stream,
            timeout: config.write_timeout,
            stalled: None,
        });
        let connection = http.serve_connection(io, service);
        let registry = Arc::clone(&connections);
        let mut stop = stopping.clone();
        tasks.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = shed.notified() => {
                    // Idle, or half a head that the header timeout would close anyway.
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHED_GRACE, connection.as_mut()).await;
                }
                true = async { stop.wait_for(|c| *c).await.is_ok() } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.as_mut().await;
                }
            }
            registry
                .open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&number);
        });
    }
    drop(listener);
    let _ = close.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    Ok(())
}

/// Answers a connection over the limit with a 503 and closes it (within a second: a client
/// that does not read gets nothing).
async fn refuse(mut stream: TcpStream, limit: usize) {
    let body = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        HttpCode::TooManyConnections.as_str(),
        format!("{limit} connections are open already, none of them idle; try again when one has closed"),
    )
    .body()
    .to_string();
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
