//! `redrive bench redrive-pace`: a paced retry of many given-up tasks against a
//! downstream that fails. It prints the calls made into the failing downstream before the
//! job paused itself, the time to the pause, and the drain after the downstream recovered
//! and the job was resumed. Two downstreams: one failing from the start, one that fails
//! halfway through (the job at full pace by then).
//!
//! The handler's failed calls wait an hour before their next attempt, so every call
//! counted is one the job let through, not a retry of the handler's own.

use async_trait::async_trait;
use clap::Args;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::fresh_store;
use crate::backoff::{Backoff, Jitter};
use crate::config::Settings;
use crate::fleet::Fleet;
use crate::handlers::{Handler, HandlerContext, HandlerError};
use crate::operations::{ActRequest, Actor, FilterParams, Runner, Verb};
use crate::output::outln;
use crate::pace::PaceRequest;
use crate::replay::Replayer;
use crate::store::{ReplayJob, Store};
use crate::task::Task;

/// Options of `redrive bench redrive-pace`.
#[derive(Debug, Clone, Args)]
pub struct PaceBenchOptions {
    /// Tasks the retry selects.
    #[arg(long, default_value_t = 50_000)]
    pub tasks: usize,
    /// The retry's full rate (tasks a second).
    #[arg(long, default_value_t = 2_000.0)]
    pub rate: f64,
    /// Its ramp.
    #[arg(long, default_value = "1%,5%,25%,100%")]
    pub ramp: String,
    /// Tasks per step before the last.
    #[arg(long, default_value_t = 500)]
    pub step: i64,
}

/// A downstream that fails while `failing`, counting calls.
#[derive(Default)]
struct Downstream {
    failing: AtomicBool,
    calls: AtomicU64,
    failed_calls: AtomicU64,
    /// Fails from the call that finds this many calls made (0: never by itself).
    fail_after: AtomicU64,
}

struct Calls(Arc<Downstream>);

#[async_trait]
impl Handler for Calls {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        let made = self.0.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let after = self.0.fail_after.load(Ordering::SeqCst);
        if after > 0 && made >= after {
            self.0.failing.store(true, Ordering::SeqCst);
        }
        if self.0.failing.load(Ordering::SeqCst) {
            self.0.failed_calls.fetch_add(1, Ordering::SeqCst);
            return Err(HandlerError::transient("HTTP 503 from the downstream"));
        }
        Ok(())
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(5)
    }

    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff {
            base: Duration::from_secs(3600),
            factor: 2.0,
            cap: Duration::from_secs(3600),
            jitter: Jitter::None,
        })
    }
}

/// Runs the benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &PaceBenchOptions) -> anyhow::Result<()> {
    outln!(
        "redrive bench redrive-pace: a paced retry of {} tasks at up to {}/s, ramp {}, {} per step",
        options.tasks,
        options.rate,
        options.ramp,
        options.step
    );
    outln!(
        "{:<26} {:>14} {:>14} {:>10} {:>14} {:>16}",
        "downstream",
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
        scenario(settings, options, name, fail_after).await?;
    }
    Ok(())
}

async fn scenario(
    settings: &Settings,
    options: &PaceBenchOptions,
    name: &str,
    fail_after: Option<u64>,
) -> anyhow::Result<()> {
    let store = fresh_store(settings).await?;
    seed(&store, options.tasks).await?;
    let downstream = Arc::new(Downstream::default());
    match fail_after {
        None => downstream.failing.store(true, Ordering::SeqCst),
        Some(after) => downstream.fail_after.store(after.max(1), Ordering::SeqCst),
    }
    let fleet = Fleet::builder(settings.clone())
        .handler("downstream", Calls(downstream.clone()))
        .build()?;
    let stop_workers = CancellationToken::new();
    let pool = fleet.worker_pool(store.clone());
    let workers = tokio::spawn({
        let stop = stop_workers.clone();
        async move { pool.run(stop).await }
    });
    let request = ActRequest {
        filter: Some(FilterParams {
            handler: Some("downstream".into()),
            ..FilterParams::default()
        }),
        reason: Some("bench".into()),
        pace: Some(PaceRequest {
            rate: Some(options.rate),
            ramp: Some(options.ramp.clone()),
            step: Some(options.step),
            settle: Some("1s".into()),
            ..PaceRequest::default()
        }),
        ..ActRequest::default()
    };
    let operations = fleet.operations(store.clone());
    let actor = Actor::shell();
    let answer =
        (operations.act_by(&actor, Verb::Retry, &request, Runner::Here("bench"), |_| {})).await?;
    let job = answer
        .job
        .ok_or_else(|| anyhow::anyhow!("no job recorded"))?;
    let replayer = Replayer::new(
        store.clone(),
        settings.kafka.clone(),
        settings.ingest.max_message_bytes,
        "bench".into(),
        Vec::new(),
    );
    let started = Instant::now();
    let first_failure_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let watch = tokio::spawn({
        let (downstream, at) = (downstream.clone(), first_failure_at.clone());
        async move {
            while !downstream.failing.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            *at.lock().expect("a lock") = Some(Instant::now());
        }
    });
    let paused = run_job(&replayer, job).await?;
    let paused_at = Instant::now();
    watch.abort();
    // What the job released before it paused is called within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failing_calls = downstream.failed_calls.load(Ordering::SeqCst);
    let failing_since = (*first_failure_at.lock().expect("a lock")).unwrap_or(started);
    let to_pause = paused_at.saturating_duration_since(failing_since);
    if paused.status != "paused" {
        outln!(
            "{name:<26} the job did not pause: {} ({} released)",
            paused.status,
            paused.produced
        );
        stop_workers.cancel();
        workers.await??;
        return Ok(());
    }
    // The downstream recovers; the job resumes at full pace.
    downstream.fail_after.store(0, Ordering::SeqCst);
    downstream.failing.store(false, Ordering::SeqCst);
    let released = paused.produced;
    let resumed =
        (operations.resume_replay(&actor, paused.id, Runner::Here("bench"), None, None)).await?;
    let resumed_at = Instant::now();
    let done = run_job(&replayer, resumed).await?;
    let left = done.produced - released;
    let target = i64::try_from(options.tasks)? - i64::try_from(failing_calls)?;
    wait_resolved(&store, target).await?;
    let drain = left as f64 / resumed_at.elapsed().as_secs_f64();
    stop_workers.cancel();
    workers.await??;
    outln!(
        "{name:<26} {released:>14} {failing_calls:>14} {:>9.1}s {left:>14} {drain:>16.0}",
        to_pause.as_secs_f64()
    );
    Ok(())
}

/// `count` given-up tasks of handler `downstream`.
async fn seed(store: &Store, count: usize) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_key, msg_value, status, finished_at) \
         SELECT 'downstream', convert_to('k' || i, 'UTF8'), convert_to('{}', 'UTF8'), \
                'permanent_failure', now() \
         FROM generate_series(1, $1) i",
    )
    .bind(count as i64)
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

/// Waits (at most ten minutes) until `count` tasks are resolved.
async fn wait_resolved(store: &Store, count: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let resolved: i64 =
            sqlx::query_scalar("SELECT count(*) FROM recovery_task WHERE status = 'resolved'")
                .fetch_one(store.pool())
                .await?;
        if resolved >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{resolved} of {count} tasks resolved after ten minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
