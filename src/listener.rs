//! The serve loop of the HTTP listeners (the admin API, metrics and health): HTTP/1.1
//! with a bound on every wait a client decides and on what one client may hold, so
//! that no client can keep a member from stopping or from serving others.
//!
//! - A request's head must arrive within [`HEADER_READ_TIMEOUT`] (a kept-alive
//!   connection waiting for its next request counts), else the connection is closed.
//! - Its whole body, at most [`MAX_BODY`], within [`BODY_READ_TIMEOUT`]: else the answer
//!   is 408 (or 413 for a larger body) and the connection closes. Every body the
//!   handlers read is small, so it is read before the handler runs.
//! - A client must take what it is sent: a response that makes no progress for
//!   [`WRITE_STALL_TIMEOUT`] (a client that stopped reading) closes the connection.
//! - One client address holds at most [`MAX_CONNECTIONS_PER_PEER`] connections (one more
//!   is closed at once), and the listener [`MAX_CONNECTIONS`] (past them it accepts no
//!   more until one closes; the kernel queues the rest): slow clients cannot use up the
//!   member's file handles, nor one client every connection.
//! - On shutdown the listener closes, idle connections close at once, and requests in
//!   progress get the drain time given to finish; then every connection is dropped.

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Longest a client may take to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a client may take to send a request's body, once its head arrived.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest request body read (the largest the API takes, 10,000 task ids, is ~100 KiB):
/// 512 connections sending their largest bodies hold at most 128 MiB.
pub const MAX_BODY: usize = 256 * 1024;

/// Longest a response may wait for its client to read it.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Most connections one client address may hold open at once.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Most connections a listener holds open at once.
pub const MAX_CONNECTIONS: usize = 512;

/// Pause after a failed accept (out of file descriptors, say) before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// How long a listener waits for clients, and how many it holds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// [`HEADER_READ_TIMEOUT`].
    pub header_read: Duration,
    /// [`BODY_READ_TIMEOUT`].
    pub body_read: Duration,
    /// [`WRITE_STALL_TIMEOUT`].
    pub write_stall: Duration,
    /// [`MAX_CONNECTIONS_PER_PEER`].
    pub per_peer: usize,
    /// [`MAX_CONNECTIONS`].
    pub total: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read: HEADER_READ_TIMEOUT,
            body_read: BODY_READ_TIMEOUT,
            write_stall: WRITE_STALL_TIMEOUT,
            per_peer: MAX_CONNECTIONS_PER_PEER,
            total: MAX_CONNECTIONS,
        }
    }
}

/// Serves `app` on `listener` until `stop` fires, then lets requests in progress finish
/// for up to `drain` and drops the connections still open.
pub async fn serve(listener: TcpListener, app: Router, stop: CancellationToken, drain: Duration) {
    serve_within(listener, app, stop, drain, Limits::default()).await
}

/// [`serve`] with `limits` of its own.
pub async fn serve_within(
    listener: TcpListener,
    app: Router,
    stop: CancellationToken,
    drain: Duration,
    limits: Limits,
) {
    let body_read = limits.body_read;
    let app = app.layer(axum::middleware::from_fn(move |request, next| {
        whole_body_within(body_read, request, next)
    }));
    let mut connections = JoinSet::new();
    let mut held: HashMap<IpAddr, usize> = HashMap::new();
    loop {
        let may_accept = connections.len() < limits.total;
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if let Ok(ip) = ended {
                    if let Some(count) = held.get_mut(&ip) {
                        *count -= 1;
                        if *count == 0 {
                            held.remove(&ip);
                        }
                    }
                }
            }
            accepted = listener.accept(), if may_accept => match accepted {
                Ok((stream, peer)) => {
                    let count = held.entry(peer.ip()).or_default();
                    if *count >= limits.per_peer {
                        tracing::debug!(%peer, "closing a connection over the client's limit");
                        drop(stream);
                        continue;
                    }
                    *count += 1;
                    let (app, stop) = (app.clone(), stop.clone());
                    connections.spawn(connection(stream, peer, app, stop, limits));
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

/// Reads the request's whole body (at most [`MAX_BODY`]) within `wait` before the
/// handler runs: 413 for a larger body, 408 for one that does not arrive in time.
async fn whole_body_within(wait: Duration, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY as u64) {
        return too_large();
    }
    match tokio::time::timeout(wait, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(error)) if is_too_large(&error) => too_large(),
        Ok(Err(error)) => (
            StatusCode::BAD_REQUEST,
            format!("the request body could not be read: {error}"),
        )
            .into_response(),
        Err(_) => {
            let mut answer = (
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {wait:?}"),
            )
                .into_response();
            answer.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            answer
        }
    }
}

fn is_too_large(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = error.source();
    }
    false
}

fn too_large() -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is over {MAX_BODY} bytes"),
    )
        .into_response()
}

/// Serves one connection; on `stop`, finishes the request in progress (an idle
/// connection closes at once). Its requests carry the peer's address
/// (`ConnectInfo<SocketAddr>`).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    stop: CancellationToken,
    limits: Limits,
) -> IpAddr {
    let app = app.layer(Extension(ConnectInfo(peer)));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let stream = StallGuard::new(stream, limits.write_stall);
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
    peer.ip()
}

/// A connection whose writes fail once they made no progress for `limit`: a client
/// that stops reading would otherwise hold its connection (and the response in the
/// member's memory) for ever.
struct StallGuard {
    stream: TcpStream,
    limit: Duration,
    /// When the pending write gives up; armed while writes make no progress.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl StallGuard {
    fn new(stream: TcpStream, limit: Duration) -> StallGuard {
        StallGuard {
            stream,
            limit,
            deadline: None,
        }
    }

    /// Passes on a write's progress; a write pending past the limit fails.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.deadline = None;
            return polled;
        }
        let limit = self.limit;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of the response in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.watch(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.watch(cx, polled)
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

    /// What the server answers to `request` before it closes the connection (nothing
    /// when it closed it unanswered).
    async fn answer(address: SocketAddr, request: &[u8]) -> String {
        let mut client = TcpStream::connect(address).await.unwrap();
        // A connection closed at once may refuse the request (a reset): no answer.
        let _ = client.write_all(request).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer));
        match read.await.expect("answered and closed") {
            Ok(_) => String::from_utf8_lossy(&answer).into_owned(),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => String::new(),
            Err(error) => panic!("{error}"),
        }
    }

    /// The size of the answer to `GET /big`: more than socket buffers hold.
    const BIG: usize = 32 * 1024 * 1024;

    /// A server answering a POST with its body and `GET /big` with [`BIG`] bytes, within
    /// `limits`: its address, its stop
    /// and its task.
    async fn echo_within(
        limits: Limits,
    ) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let echo = Router::new()
            .route("/", axum::routing::post(|body: String| async move { body }))
            .route("/big", axum::routing::get(|| async { vec![b'x'; BIG] }));
        let stop = CancellationToken::new();
        let server = serve_within(listener, echo, stop.clone(), Duration::ZERO, limits);
        (address, stop, tokio::spawn(server))
    }

    /// Found by the issue 16 attack: a client sending a body a byte at a time held its
    /// connection for ever, and 20,000 of them used up the member's file handles.
    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_a_large_one_413() {
        let (address, stop, server) = echo_within(Limits {
            body_read: Duration::from_millis(300),
            ..Limits::default()
        })
        .await;
        let slow = answer(
            address,
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\ntoken=",
        )
        .await;
        assert!(slow.starts_with("HTTP/1.1 408"), "{slow}");
        let large = answer(
            address,
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\nx",
        )
        .await;
        assert!(large.starts_with("HTTP/1.1 413"), "{large}");
        let whole = answer(
            address,
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        )
        .await;
        assert!(
            whole.starts_with("HTTP/1.1 200") && whole.ends_with("ok"),
            "{whole}"
        );
        stop.cancel();
        server.await.unwrap();
    }

    /// One client holds at most its share of connections: one more is closed at once,
    /// and once one of its connections closes it is served again.
    #[tokio::test]
    async fn a_client_over_its_connection_limit_is_closed_until_one_of_its_own_closes() {
        let (address, stop, server) = echo_within(Limits {
            per_peer: 2,
            ..Limits::default()
        })
        .await;
        let first = TcpStream::connect(address).await.unwrap();
        let _second = TcpStream::connect(address).await.unwrap();
        let request =
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";
        // The listener counts a connection once it accepts it: give it the two.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(answer(address, request).await, "", "closed unanswered");
        drop(first);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let served = answer(address, request).await;
        assert!(served.starts_with("HTTP/1.1 200"), "{served}");
        stop.cancel();
        server.await.unwrap();
    }

    /// Found by the second issue 16 attack: clients that pipelined requests and never
    /// read the answers held their connections for ever, and 512 of them shut everyone
    /// else out.
    #[tokio::test]
    async fn a_client_that_stops_reading_is_disconnected() {
        let (address, stop, server) = echo_within(Limits {
            write_stall: Duration::from_millis(300),
            ..Limits::default()
        })
        .await;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut reader = socket.connect(address).await.unwrap();
        reader
            .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut answer));
        let _ = read.await.expect("the server closed the connection");
        assert!(
            answer.len() < BIG,
            "the stalled answer was dropped before it was all written: {} bytes",
            answer.len()
        );
        stop.cancel();
        server.await.unwrap();
    }
}
