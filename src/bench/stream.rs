//! The last figure of `redrive bench`: tasks arriving at a steady rate while one member
//! drains, on a store PostgreSQL never analysed (its autovacuum off for the task table,
//! as on a server whose autovacuum is off). The drain must keep up from the first
//! second: a plan that depends on statistics shows as a drain that falls while the
//! backlog runs away (before the fix: 3.1k to 0.9k tasks/s within 50 s).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{bench_fleet, drop_schema, fresh_store};
use crate::config::Settings;
use crate::output::outln;
use crate::task::NewTask;

/// How often the figures are printed (more often in a shorter stream).
const WINDOW: Duration = Duration::from_secs(10);

/// How often a slice of the offered tasks is enqueued.
const TICK: Duration = Duration::from_millis(100);

/// Longest wait for the backlog left at the end of the stream to drain.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// Offers `rate` tasks a second for `seconds` to a member draining with claim batches
/// of `batch`, on a store never analysed; prints the drain and the backlog per window.
pub(crate) async fn run(
    settings: &Settings,
    rate: u32,
    seconds: u64,
    batch: u32,
) -> anyhow::Result<()> {
    let store = fresh_store(settings).await?;
    sqlx::query("ALTER TABLE recovery_task SET (autovacuum_enabled = false)")
        .execute(store.pool())
        .await?;
    outln!(
        "steady stream on a store never analysed: {rate} tasks/s offered for {seconds} s, \
         one member draining (batch {batch}, concurrency {})",
        batch * 4
    );
    let fleet = bench_fleet(settings, batch, batch * 4)?;
    let resolved = fleet
        .metrics()
        .attempts
        .with_label_values(&["noop", "resolved"]);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    let streaming = Arc::new(AtomicBool::new(true));
    let per_tick = (rate as usize * TICK.as_millis() as usize / 1000).max(1);
    let offer = {
        let (store, streaming) = (store.clone(), streaming.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(TICK);
            let mut offered = 0_u64;
            while streaming.load(Ordering::Relaxed) {
                ticks.tick().await;
                let tasks: Vec<NewTask> = (0..per_tick)
                    .map(|i| NewTask::new("noop", format!("stream {offered} {i}")))
                    .collect();
                store.enqueue_many(&tasks).await?;
                offered += per_tick as u64;
            }
            Ok::<_, crate::store::StoreError>(offered)
        })
    };
    let started = Instant::now();
    let mut last = (0_u64, Instant::now());
    let window = WINDOW.min(Duration::from_secs(seconds.max(1)));
    let mut windows = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    while started.elapsed() < Duration::from_secs(seconds) {
        windows.tick().await;
        let done = resolved.get();
        let drained = (done - last.0) as f64 / last.1.elapsed().as_secs_f64();
        last = (done, Instant::now());
        let backlog = store.status_counts().await?.failed;
        outln!(
            "  {:>4.0} s: drain {drained:>8.0} tasks/s, backlog {backlog:>8}",
            started.elapsed().as_secs_f64()
        );
    }
    streaming.store(false, Ordering::Relaxed);
    let offered = offer.await??;
    let left_at = Instant::now();
    while resolved.get() < offered {
        anyhow::ensure!(
            left_at.elapsed() < DRAIN_LIMIT,
            "the backlog did not drain within {DRAIN_LIMIT:?} of the stream's end \
             ({} of {offered} resolved)",
            resolved.get()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outln!(
        "  stream's end: {offered} offered, the backlog drained {:.1} s later",
        left_at.elapsed().as_secs_f64()
    );
    shutdown.cancel();
    running.await??;
    let counts = store.status_counts().await?;
    anyhow::ensure!(
        counts.resolved == offered as i64 && counts.failed == 0,
        "not every streamed task resolved once: {counts:?} of {offered}"
    );
    drop_schema(&store).await?;
    Ok(())
}
