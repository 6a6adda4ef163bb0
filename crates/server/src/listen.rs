//! The accept loop: each connection is served by hyper's HTTP/1 with a timer, so a request's
//! head must arrive within the header timeout (an idle keep-alive connection is closed
//! after the same time); at most `max_connections` are open at once, and one more is told
//! `503 too_many_connections` and closed. On stop, listening ends, open streams are told to
//! end, and whatever connection is still open after [`crate::SHUTDOWN_GRACE`] is dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::error::{ApiError, HttpCode};
use crate::{ServerConfig, ServerError, SHUTDOWN_GRACE};

/// Serves `router` on `listener` until `shutdown`, then stops as the module doc says.
pub(crate) async fn accept_until(
    listener: TcpListener,
    router: Router,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    close: watch::Sender<bool>,
) -> Result<(), ServerError> {
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    let service = TowerToHyperService::new(router);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
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
        while connections.try_join_next().is_some() {}
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            connections.spawn(refuse(stream, config.max_connections));
            continue;
        };
        // Streamed tokens go out as they come.
        let _ = stream.set_nodelay(true);
        let connection =
            graceful.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
        connections.spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = close.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    connections.abort_all();
    Ok(())
}

/// Answers a connection over the limit with a 503 and closes it (within a second: a client
/// that does not read gets nothing).
async fn refuse(mut stream: TcpStream, limit: usize) {
    let body = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        HttpCode::TooManyConnections.as_str(),
        format!("{limit} connections are open already; try again when one has closed"),
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
