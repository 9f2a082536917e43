//! A running member (`redrive run`, the real binary) against idle clients, repeated
//! signals and closed or stuck pipes: none of them keeps it from stopping, or stops it.

use secrecy::ExposeSecret;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::fresh_store;

/// How long a member may take to stop in these tests: far above what a bounded
/// shutdown needs (a few seconds here), far below "forever".
const STOP_WITHIN: Duration = Duration::from_secs(40);

/// A free loopback address.
fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `redrive run` on the test's schema with an admin and a metrics listener.
fn member(settings: &redrive::Settings, admin: SocketAddr, metrics: SocketAddr) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrive"));
    command
        .arg("run")
        .env(
            "REDRIVE__DATABASE__URL",
            settings.database.url.expose_secret(),
        )
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .env("REDRIVE__ADMIN__LISTEN", admin.to_string())
        .env("REDRIVE__METRICS__LISTEN", metrics.to_string())
        .env("REDRIVE__WORKER__POLL_INTERVAL", "100ms")
        .env("REDRIVE__LOG__FORMAT", "text")
        .env("RUST_LOG", "info")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// Waits until the member answers `/healthz`; panics if it exits first.
async fn wait_ready(child: &mut Child, metrics: SocketAddr) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the member exited with {status} before it was ready");
        }
        let answer = client
            .get(format!("http://{metrics}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if answer.is_ok_and(|a| a.status().is_success()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the member never answered /healthz"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The member's exit status once it exits within `limit`; `None` (and the member
/// killed) if it does not.
async fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().ok();
    child.wait().ok();
    None
}

fn signal(child: &Child, signal: i32) {
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// Sends a whole request on `stream` and reads its answer: its head.
fn exchange(stream: &mut TcpStream, path: &str) -> String {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).unwrap();
        assert!(n > 0, "the connection closed mid-answer");
        answer.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a content-length");
            if body.len() >= length {
                return head.to_owned();
            }
        }
    }
}

/// Regression: one client that sent half a request kept a member from stopping on
/// SIGTERM (no header-read timeout, graceful shutdown without a bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_on_either_listener_cannot_hold_a_stopping_member() {
    let (_store, settings) = fresh_store().await;
    let (admin, metrics) = (free_address(), free_address());
    let mut child = member(&settings, admin, metrics)
        .env("REDRIVE__WORKER__SHUTDOWN_TIMEOUT", "2s")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(&mut child, metrics).await;
    let mut idle = Vec::new();
    for (address, path) in [(admin, "/api/v1/members"), (metrics, "/healthz")] {
        // Half a request, then silence.
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .write_all(b"GET /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .unwrap();
        idle.push(stream);
        // A later connection answered: the listener accepted the idle one before it
        // (a listen queue is first in, first out).
        let head = exchange(&mut TcpStream::connect(address).unwrap(), path);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    signal(&child, libc::SIGTERM);
    let status = exit_within(&mut child, STOP_WITHIN).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the member did not stop cleanly within {STOP_WITHIN:?}: {status:?}"
    );
    drop(idle);
}

/// A second SIGTERM stops a member at once, while its first is still draining a
/// handler call that would take an hour; the lease it held is left to lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_a_draining_member_at_once() {
    let (store, settings) = fresh_store().await;
    // A downstream that accepts and never answers.
    let downstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", downstream.local_addr().unwrap());
    let task = store
        .enqueue_many(&[redrive::NewTask::new("hook", b"x".to_vec())])
        .await
        .unwrap()[0]
        .id();
    let (admin, metrics) = (free_address(), free_address());
    let mut child = member(&settings, admin, metrics)
        .env("REDRIVE__WEBHOOKS__HOOK__URL", url)
        .env("REDRIVE__WEBHOOKS__HOOK__TIMEOUT", "1h")
        .env("REDRIVE__RETRY__TIMEOUT", "1h")
        .env("REDRIVE__WORKER__SHUTDOWN_TIMEOUT", "1h")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let (_call, _) = tokio::task::spawn_blocking(move || downstream.accept().unwrap())
        .await
        .unwrap();
    signal(&child, libc::SIGTERM);
    // The second signal only once the first was taken as a request to stop.
    let start = Instant::now();
    loop {
        let line = seen
            .recv_timeout(Duration::from_secs(30))
            .expect("the member logs that it stops");
        if line.contains("shutdown requested") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    signal(&child, libc::SIGTERM);
    let status = exit_within(&mut child, STOP_WITHIN).await;
    let status = status.expect("a second signal stops the member at once");
    assert!(
        !status.success(),
        "a forced stop is not a clean one: {status}"
    );
    let lease: Option<String> =
        sqlx::query_scalar("SELECT lease_owner FROM recovery_task WHERE id = $1")
            .bind(task.0)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert!(
        lease.is_some(),
        "the lease was left to lapse, not given back"
    );
}

/// A pipe whose read end the test holds (or has closed), with room for one page.
fn small_pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    use std::os::fd::AsRawFd;
    let size = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    assert!(size > 0, "F_SETPIPE_SZ");
    (read, write)
}

/// Regression: `redrive run 2>&1 | head -3` ignored SIGTERM for ten minutes and
/// `| head -1` made it exit 101 (tracing-subscriber reports a failed write with
/// `eprintln!`, which panics on a closed stderr). A stderr whose reader is gone, or
/// whose reader never reads, neither stops the member nor keeps it from stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_or_stuck_stderr_neither_stops_nor_wedges_a_member() {
    let (store, settings) = fresh_store().await;
    for stuck in [false, true] {
        let (read, write) = small_pipe();
        let reader = if stuck {
            // Full before the member writes a byte: every write of its would block.
            let mut filling = std::fs::File::from(write.try_clone().unwrap());
            use std::os::fd::AsRawFd;
            let size = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
            filling.write_all(&vec![b'.'; size as usize]).unwrap();
            Some(read)
        } else {
            drop(read);
            None
        };
        let (admin, metrics) = (free_address(), free_address());
        let mut child = member(&settings, admin, metrics)
            .env("RUST_LOG", "debug")
            .stderr(Stdio::from(write))
            .spawn()
            .unwrap();
        wait_ready(&mut child, metrics).await;
        let id = store
            .enqueue_many(&[redrive::NewTask::new("log", b"x".to_vec())])
            .await
            .unwrap()[0]
            .id();
        crate::support::eventually(Duration::from_secs(30), "the task resolved", || async {
            store.get(id).await.unwrap().unwrap().status == redrive::Status::Resolved
        })
        .await;
        signal(&child, libc::SIGTERM);
        let status = exit_within(&mut child, STOP_WITHIN).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "stuck: {stuck}: the member did not stop cleanly: {status:?}"
        );
        drop(reader);
    }
}

/// A member that cannot listen for notifications again (its database out of reach)
/// says so once, not at every try, and says when it listens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_listener_that_cannot_reconnect_says_so_once() {
    let (_store, settings) = fresh_store().await;
    let proxy = crate::support::PgProxy::start().await;
    let member = crate::support::Spawn::binary(&proxy.route(&settings)).start();
    crate::support::eventually(Duration::from_secs(30), "the member started", || async {
        !member.log_lines("worker pool started").is_empty()
    })
    .await;
    proxy.cut();
    // About five tries to listen again, a second apart.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let failures = member.log_lines("cannot listen for");
    assert_eq!(failures.len(), 1, "{failures:#?}");
    proxy.restore();
    crate::support::eventually(Duration::from_secs(20), "it listens again", || async {
        !member
            .log_lines("listening for notifications again")
            .is_empty()
    })
    .await;
}
