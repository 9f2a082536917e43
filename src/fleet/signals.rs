//! The signals that stop a member: the first SIGTERM or SIGINT drains it, a second ends
//! it at once.

use tokio_util::sync::CancellationToken;

use crate::telemetry;

/// Fires `shutdown` on the first SIGTERM or SIGINT. A second one ends the process at
/// once, without waiting for running work, with the exit status a shell gives a process
/// the signal killed (128 + its number): the leases it holds lapse after `worker.lease`
/// and other members take the tasks over.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    let (name, _) = next_signal(&mut term, &mut int).await;
    tracing::info!(
        signal = name,
        "shutdown requested; a second SIGTERM or SIGINT stops at once"
    );
    shutdown.cancel();
    let (name, number) = next_signal(&mut term, &mut int).await;
    tracing::warn!(
        signal = name,
        "second signal: stopping now, without waiting for running work (its leases lapse)"
    );
    telemetry::flush_logs();
    std::process::exit(128 + number);
}

/// The next of SIGTERM and SIGINT: its name and number.
async fn next_signal(
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> (&'static str, i32) {
    tokio::select! {
        _ = term.recv() => ("SIGTERM", libc::SIGTERM),
        _ = int.recv() => ("SIGINT", libc::SIGINT),
    }
}
