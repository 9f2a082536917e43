//! `redrive bench redrive-pace`: paced redrives of many given-up tasks into a downstream
//! that fails. For each it prints the calls made into the failing downstream before the
//! job paused itself, the time to the pause, and the drain after the downstream recovered
//! and the job was resumed. Two jobs ([`retry`], [`replay`]), each against two
//! downstreams: one failing from the start, one that fails halfway through (the job at
//! full pace by then).

mod replay;
mod retry;

use clap::Args;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::operations::{Actor, Operations, Runner};
use crate::output::outln;
use crate::pace::PaceRequest;
use crate::replay::Replayer;
use crate::store::{ReplayJob, Store};

/// Options of `redrive bench redrive-pace`.
#[derive(Debug, Clone, Args)]
pub struct PaceBenchOptions {
    /// Tasks each job selects.
    #[arg(long, default_value_t = 50_000)]
    pub tasks: usize,
    /// The jobs' full rate (tasks a second).
    #[arg(long, default_value_t = 2_000.0)]
    pub rate: f64,
    /// Their ramp.
    #[arg(long, default_value = "1%,5%,25%,100%")]
    pub ramp: String,
    /// Tasks per step before the last.
    #[arg(long, default_value_t = 500)]
    pub step: i64,
}

impl PaceBenchOptions {
    /// The pace of the jobs.
    fn pace(&self) -> PaceRequest {
        PaceRequest {
            rate: Some(self.rate),
            ramp: Some(self.ramp.clone()),
            step: Some(self.step),
            settle: Some("1s".into()),
            ..PaceRequest::default()
        }
    }
}

/// A downstream that fails while `failing`, counting calls (a handler's calls, or a
/// consumer's messages).
#[derive(Default)]
struct Downstream {
    failing: AtomicBool,
    calls: AtomicU64,
    failed_calls: AtomicU64,
    /// Fails from the call that finds this many calls made (0: never by itself).
    fail_after: AtomicU64,
    /// When it first failed.
    failing_since: Mutex<Option<Instant>>,
}

impl Downstream {
    /// Failing from the start, or from the call after `fail_after` calls.
    fn new(fail_after: Option<u64>) -> Arc<Downstream> {
        let downstream = Downstream::default();
        match fail_after {
            None => downstream.failing.store(true, Ordering::SeqCst),
            Some(after) => downstream.fail_after.store(after.max(1), Ordering::SeqCst),
        }
        Arc::new(downstream)
    }

    /// One call: whether it failed.
    fn call(&self) -> bool {
        let made = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let after = self.fail_after.load(Ordering::SeqCst);
        if after > 0 && made >= after {
            self.failing.store(true, Ordering::SeqCst);
        }
        if !self.failing.load(Ordering::SeqCst) {
            return false;
        }
        self.failed_calls.fetch_add(1, Ordering::SeqCst);
        let mut since = self.failing_since.lock().expect("a lock");
        since.get_or_insert_with(Instant::now);
        true
    }

    /// It recovers.
    fn recover(&self) {
        self.fail_after.store(0, Ordering::SeqCst);
        self.failing.store(false, Ordering::SeqCst);
    }
}

/// What one run measured.
struct Measured {
    /// Tasks the job sent before it paused.
    released: i64,
    /// Calls into the failing downstream (what the job sent before it paused, called).
    failing_calls: u64,
    /// From the first failing call to the pause.
    to_pause: Duration,
    /// Tasks the job sent after it was resumed.
    after_resume: i64,
    /// Of those, taken by the downstream per second.
    drain: f64,
}

/// Runs the benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &PaceBenchOptions) -> anyhow::Result<()> {
    outln!(
        "redrive bench redrive-pace: paced jobs of {} tasks at up to {}/s, ramp {}, {} per step",
        options.tasks,
        options.rate,
        options.ramp,
        options.step
    );
    outln!(
        "{:<30} {:>10} {:>14} {:>10} {:>13} {:>14}",
        "job, downstream",
        "released",
        "failing calls",
        "to pause",
        "after resume",
        "drain after/s"
    );
    for (name, fail_after) in [
        ("fails from the start", None),
        ("fails halfway", Some(options.tasks as u64 / 2)),
    ] {
        let retried = retry::scenario(settings, options, fail_after).await?;
        print(&format!("retry, {name}"), retried);
        let replayed = replay::scenario(settings, options, fail_after).await?;
        print(&format!("replay, {name}"), replayed);
    }
    Ok(())
}

fn print(name: &str, measured: Result<Measured, String>) {
    match measured {
        Ok(m) => outln!(
            "{name:<30} {:>10} {:>14} {:>9.1}s {:>13} {:>14.0}",
            m.released,
            m.failing_calls,
            m.to_pause.as_secs_f64(),
            m.after_resume,
            m.drain
        ),
        Err(why) => outln!("{name:<30} {why}"),
    }
}

/// Runs `job` until it pauses itself, lets the downstream recover, resumes the job and
/// runs it to its end, then waits until `taken(failing_calls)` says the downstream took
/// all it will. Answers what it measured, or why the job did not pause.
async fn pause_then_resume<F, Fut>(
    operations: &Operations,
    replayer: &Replayer,
    job: ReplayJob,
    downstream: &Downstream,
    taken: F,
) -> anyhow::Result<Result<Measured, String>>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let started = Instant::now();
    let paused = run_job(replayer, job).await?;
    let paused_at = Instant::now();
    if paused.status != "paused" {
        return Ok(Err(format!(
            "the job did not pause: {} ({} sent)",
            paused.status, paused.produced
        )));
    }
    // What the job sent before it paused reaches the downstream within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failing_calls = downstream.failed_calls.load(Ordering::SeqCst);
    let failing_since = (*downstream.failing_since.lock().expect("a lock")).unwrap_or(started);
    downstream.recover();
    let resumed = (operations.resume_replay(
        &Actor::shell(),
        paused.id,
        Runner::Here("bench"),
        None,
        None,
    ))
    .await?;
    let resumed_at = Instant::now();
    let done = run_job(replayer, resumed).await?;
    anyhow::ensure!(
        done.status == "done",
        "the resumed job ended {}",
        done.status
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    while !taken(failing_calls).await? {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the downstream did not take what the job sent within ten minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after_resume = done.produced - paused.produced;
    Ok(Ok(Measured {
        released: paused.produced,
        failing_calls,
        to_pause: paused_at.saturating_duration_since(failing_since),
        after_resume,
        drain: after_resume as f64 / resumed_at.elapsed().as_secs_f64(),
    }))
}

/// `count` given-up tasks of `handler`, each from `topic` (its original topic).
async fn seed(store: &Store, count: usize, handler: &str, topic: &str) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO recovery_task (handler, original_topic, msg_key, msg_value, status, \
             finished_at) \
         SELECT $2, $3, convert_to('k' || i, 'UTF8'), convert_to('{}', 'UTF8'), \
                'permanent_failure', now() \
         FROM generate_series(1, $1) i",
    )
    .bind(count as i64)
    .bind(handler)
    .bind(topic)
    .execute(store.pool())
    .await?;
    sqlx::query("ANALYZE recovery_task")
        .execute(store.pool())
        .await?;
    Ok(())
}

async fn run_job(replayer: &Replayer, job: ReplayJob) -> anyhow::Result<ReplayJob> {
    let stop = CancellationToken::new();
    let bound = Duration::from_secs(3600);
    Ok(
        tokio::time::timeout(bound, replayer.run(job, &|_, _| {}, &stop))
            .await
            .map_err(|_| anyhow::anyhow!("the job did not end within an hour"))??,
    )
}
