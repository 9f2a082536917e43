//! The serve loop of the HTTP listeners (the admin API, metrics and health): HTTP/1.1
//! with a bound on every wait a client decides, so that no client can keep a member
//! from stopping.
//!
//! - A request's head must arrive within [`HEADER_READ_TIMEOUT`] (a kept-alive
//!   connection waiting for its next request counts), else the connection is closed.
//! - On shutdown the listener closes, idle connections close at once, and requests in
//!   progress get the drain time given to finish; then every connection is dropped.

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Longest a client may take to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed accept (out of file descriptors, say) before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` fires, then lets requests in progress finish
/// for up to `drain` and drops the connections still open.
pub async fn serve(listener: TcpListener, app: Router, stop: CancellationToken, drain: Duration) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(connection(stream, peer, app.clone(), stop.clone()));
                }
                Err(error) => {
                    tracing::debug!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
            },
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            open = connections.len(),
            ?drain,
            "closing HTTP connections still open after the drain"
        );
    }
}

/// Serves one connection; on `stop`, finishes the request in progress (an idle
/// connection closes at once). Its requests carry the peer's address
/// (`ConnectInfo<SocketAddr>`).
async fn connection(stream: TcpStream, peer: SocketAddr, app: Router, stop: CancellationToken) {
    let app = app.layer(Extension(ConnectInfo(peer)));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let served = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(served);
    let outcome = tokio::select! {
        outcome = served.as_mut() => outcome,
        _ = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(error) = outcome {
        tracing::debug!(%error, "HTTP connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client that never finishes a request's head is disconnected after
    /// [`HEADER_READ_TIMEOUT`], while the server runs on.
    #[tokio::test]
    async fn a_client_that_never_sends_a_whole_head_is_disconnected() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, stop.clone(), Duration::from_secs(1)));
        let mut idle = TcpStream::connect(address).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(HEADER_READ_TIMEOUT * 3, idle.read_to_end(&mut rest))
            .await
            .expect("disconnected once the head is overdue");
        assert!(closed.is_ok(), "{closed:?}");
        let mut client = TcpStream::connect(address).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
            "{answer}"
        );
        stop.cancel();
        server.await.unwrap();
    }
}
