//! `redrive bench ops`: operator bulk actions — discard and retry rates by filter on
//! large stores, and a working fleet's drain rate while a bulk discard runs beside it
//! (against the same fleet with the bulk action idle, measured in the same sitting).

use clap::Args;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{drop_schema, fresh_store, median};
use crate::config::Settings;
use crate::output::outln;
use crate::store::{Action, Budget, Due, Operator, Selection, Store, TaskFilter};
use crate::task::Status;

/// Options of `redrive bench ops`.
#[derive(Debug, Clone, Args)]
pub struct OpsBenchOptions {
    /// Store sizes (tasks) to time bulk discard and retry on, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    pub sizes: Vec<usize>,
    /// Runs per figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Tasks the fleet drains while the bulk action runs beside it.
    #[arg(long, default_value_t = 50_000)]
    pub drain_tasks: usize,
    /// Tasks the bulk action works on during the drain.
    #[arg(long, default_value_t = 200_000)]
    pub bulk_tasks: usize,
}

fn operator() -> Operator {
    Operator {
        actor: "bench".into(),
        reason: Some("bench ops".into()),
    }
}

fn of_handler(handler: &str, status: Option<Status>) -> Selection {
    Selection::Filter(TaskFilter {
        handler: Some(handler.into()),
        status: status.into_iter().collect(),
        ..TaskFilter::default()
    })
}

/// Inserts `count` unattempted tasks of `handler` with 256-byte values, due in
/// `due_in_days`, by SQL.
async fn seed(store: &Store, handler: &str, count: usize, due_in_days: i32) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_key, msg_value, next_attempt_at) \
         SELECT $1, convert_to('k' || i, 'UTF8'), convert_to(repeat('x', 256), 'UTF8'), \
                now() + $3 * interval '1 day' \
         FROM generate_series(1, $2) i",
    )
    .bind(handler)
    .bind(count as i64)
    .bind(due_in_days)
    .execute(store.pool())
    .await?;
    sqlx::query("ANALYZE recovery_task")
        .execute(store.pool())
        .await?;
    Ok(())
}

/// Runs the benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &OpsBenchOptions) -> anyhow::Result<()> {
    outln!(
        "redrive bench ops: bulk actions by filter, {} run(s) per figure, median shown",
        options.runs
    );
    outln!("{:>10} {:>14} {:>14}", "tasks", "discard/s", "retry/s");
    for &size in &options.sizes {
        let store = fresh_store(settings).await?;
        seed(&store, "idle", size, 0).await?;
        let (mut discards, mut retries) = (Vec::new(), Vec::new());
        for _ in 0..options.runs.max(1) {
            let started = Instant::now();
            let done = store
                .act(&operator(), &Action::Discard, &of_handler("idle", None))
                .await?;
            anyhow::ensure!(done.changed == size as i64, "discarded {}", done.changed);
            discards.push(size as f64 / started.elapsed().as_secs_f64());
            let started = Instant::now();
            let retry = Action::Retry {
                at: None,
                budget: Budget::Fresh,
                force: false,
            };
            let done = store
                .act(
                    &operator(),
                    &retry,
                    &of_handler("idle", Some(Status::Discarded)),
                )
                .await?;
            anyhow::ensure!(done.changed == size as i64, "retried {}", done.changed);
            retries.push(size as f64 / started.elapsed().as_secs_f64());
        }
        outln!(
            "{:>10} {:>14.0} {:>14.0}",
            size,
            median(&discards),
            median(&retries)
        );
        drop_schema(&store).await?;
    }

    outln!(
        "drain of {} tasks (batch 100) beside {} tasks of another handler:",
        options.drain_tasks,
        options.bulk_tasks
    );
    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    for _ in 0..options.runs.max(1) {
        alone.push(drain(settings, options, false).await?);
        beside.push(drain(settings, options, true).await?);
    }
    let (alone, beside) = (median(&alone), median(&beside));
    outln!("  bulk action idle:            {alone:>10.0} tasks/s");
    outln!("  bulk discard/retry running:  {beside:>10.0} tasks/s");
    outln!(
        "  ratio {:.2} (the target is at least 0.50)",
        beside / alone
    );
    Ok(())
}

/// Drains `drain_tasks` noop tasks with a fleet; with `bulk`, discards and retries the
/// other handler's tasks over and over meanwhile. Answers the drain rate.
async fn drain(settings: &Settings, options: &OpsBenchOptions, bulk: bool) -> anyhow::Result<f64> {
    let store = fresh_store(settings).await?;
    // The other handler's tasks are due tomorrow, as its retries keep them: due tasks
    // of a handler no member serves would lie in every claim's path (see docs/operating.md).
    seed(&store, "idle", options.bulk_tasks, 1).await?;
    seed(&store, "noop", options.drain_tasks, 0).await?;
    let stop_bulk = CancellationToken::new();
    let bulk_loop = {
        let (store, stop) = (store.clone(), stop_bulk.clone());
        tokio::spawn(async move {
            let retry = Action::Retry {
                force: false,
                at: Some(Due::In(Duration::from_secs(24 * 3600))),
                budget: Budget::Fresh,
            };
            while bulk && !stop.is_cancelled() {
                store
                    .act(&operator(), &Action::Discard, &of_handler("idle", None))
                    .await?;
                store
                    .act(
                        &operator(),
                        &retry,
                        &of_handler("idle", Some(Status::Discarded)),
                    )
                    .await?;
            }
            Ok::<_, crate::store::StoreError>(())
        })
    };
    let rate = super::drain_noop(settings, &store, options.drain_tasks, 100, 400).await?;
    stop_bulk.cancel();
    bulk_loop.await??;
    drop_schema(&store).await?;
    Ok(rate)
}
