//! The service's connections: accepting them under a cap, the time a
//! client has to send a request's headers (also the time an idle
//! keep-alive connection is kept), and a bounded graceful shutdown.
//!
//! A slow or hostile client can hold a connection only as long as these
//! bounds allow: a connection that has not sent its headers within
//! `header_timeout` is closed, one past `max_connections` is answered 503
//! in the error shape and closed, and at shutdown connections still open
//! after `shutdown_grace` are dropped. It must not know the routes.

use crate::error::ErrorBody;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// How long a client may hold a connection without progress, and how many
/// it may hold (`opledger serve`'s `--header-timeout`, `--max-connections`
/// and `--shutdown-grace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The time to send a request's headers, from the connection's start
    /// or the end of its previous response (so also the idle keep-alive
    /// time); a client that takes longer has its connection closed.
    pub header_timeout: Duration,
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// How long shutdown waits for requests in flight before it drops them.
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets
/// requests in flight finish for at most `shutdown_grace`.
pub(crate) async fn run(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors, or a connection reset before it was
                    // taken: the listener itself is fine; pause a moment.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(grace = ?limits.shutdown_grace, "requests still in flight at shutdown were dropped");
        }
    }
    Ok(())
}

/// Answers a connection past the cap with 503 in the error shape, then
/// closes it, without reading its request.
async fn refuse(mut stream: TcpStream, cap: usize) {
    tracing::warn!(cap, "a connection past the connection cap was refused");
    let body = serde_json::to_string(&ErrorBody::of(
        "unavailable",
        &format!("the service holds its {cap} connections; try again shortly"),
    ))
    .unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
