//! `redrive bench`: enqueue and drain throughput, and pick-up latency, on the configured
//! PostgreSQL; `redrive bench ingest`: Kafka to PostgreSQL; `redrive bench rebalance`:
//! the ingest pause when a fleet member dies; `redrive bench ops`: operator bulk actions;
//! `redrive bench webhook`: the webhook handler and breaker isolation; `redrive bench console`:
//! the console's list latency on a large store, and a bulk action by filter beside a
//! drain; `redrive bench horizon`: the drain while the MVCC horizon is pinned, on a
//! private server; `redrive bench scale`: the drain against the store's size and the
//! number of members. Each run uses a fresh schema
//! (`<schema>_bench`), dropped afterwards.

mod broke;
pub mod bulk;
pub mod console;
mod cpu;
pub mod horizon;
pub mod ingest;
pub mod ops;
pub mod pace;
pub mod rebalance;
pub mod scale;
mod served;
mod server;
mod statements;
mod stream;
pub mod webhook;

use anyhow::Context;
use async_trait::async_trait;
use clap::Args;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::fleet::Fleet;
use crate::handlers::{Handler, HandlerContext, HandlerError};
use crate::output::outln;
use crate::store::Store;
use crate::task::{NewTask, Task};

/// `redrive bench [ingest]`.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// Which benchmark; without one, the queue (enqueue and drain).
    #[command(subcommand)]
    pub which: Option<BenchKind>,
    /// Options of the queue benchmark.
    #[command(flatten)]
    pub queue: BenchOptions,
}

/// The benchmarks besides the queue one.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchKind {
    /// Kafka to PostgreSQL: messages persisted per second through the mock cluster.
    Ingest(ingest::IngestBenchOptions),
    /// Fleet members killed with SIGKILL: how long ingest pauses, and when the dead
    /// member's partitions are consumed again.
    Rebalance(rebalance::RebalanceBenchOptions),
    /// Operator bulk actions: discard and retry rates on large stores, and the drain
    /// rate of a working fleet while a bulk discard runs.
    Ops(ops::OpsBenchOptions),
    /// The webhook handler against a local server at several concurrencies, as a share
    /// of the no-op drain; a healthy handler's drain beside an open breaker's backlog.
    Webhook(webhook::WebhookBenchOptions),
    /// The console's figures: task list latency (console page and API, several filters)
    /// on a large store, and a bulk action by filter with its progress beside a fleet's
    /// drain, against the drain alone.
    Console(console::ConsoleBenchOptions),
    /// The drain while another session pins PostgreSQL's MVCC horizon (a snapshot held),
    /// before, during and after, on a private server with autovacuum on: throughput,
    /// backlog, dead row versions and index sizes.
    Horizon(horizon::HorizonBenchOptions),
    /// The drain against the store's size (10k, 1M, 10M due tasks; 10M final ones) and
    /// against the number of members on one PostgreSQL, with what limits it.
    Scale(scale::ScaleBenchOptions),
    /// A paced retry against a downstream that fails (from the start, or halfway): calls
    /// into it before the job paused itself, the time to pause, the drain after resume.
    RedrivePace(pace::PaceBenchOptions),
}

/// A length of time given to a benchmark: at least a second, at most a day.
fn length_of_time(text: &str) -> Result<Duration, String> {
    let length = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&length) {
        return Err(format!("must be between 1s and 1day (got {text})"));
    }
    Ok(length)
}

/// A count of at least one.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// Options of the queue benchmark.
#[derive(Debug, Clone, Args)]
pub struct BenchOptions {
    /// Tasks enqueued, then drained, per run.
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one())]
    pub tasks: usize,
    /// Claim (and finish) batch sizes to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,500",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::config::MAX_BATCH)))]
    pub batch_sizes: Vec<u32>,
    /// Worker concurrency (tasks in flight); default: four times the batch size.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::config::MAX_CONCURRENCY)))]
    pub concurrency: Option<u32>,
    /// Runs per batch size; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = at_least_one())]
    pub runs: usize,
    /// Tasks per enqueue statement.
    #[arg(long, default_value_t = 1000)]
    pub enqueue_batch: usize,
    /// Concurrent enqueue connections.
    #[arg(long, default_value_t = 4)]
    pub enqueue_connections: usize,
    /// Bytes of each task's value.
    #[arg(long, default_value_t = 256)]
    pub value_bytes: usize,
    /// Single tasks enqueued one by one into an idle pool to measure pick-up latency.
    #[arg(long, default_value_t = 200)]
    pub pickup_samples: usize,
    /// Tasks offered per second while one member drains, on a store never analysed.
    #[arg(long, default_value_t = 3800, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub stream_rate: u32,
    /// Seconds of that stream (0: not run).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub stream_seconds: u64,
}

/// Resolves every task at once.
struct NoopHandler;

#[async_trait]
impl Handler for NoopHandler {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Figures of one run.
#[derive(Debug, Clone, Copy)]
struct RunFigures {
    enqueue_per_s: f64,
    drain_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// What the server wrote per task during the drain.
    drain_server: server::PerTask,
}

/// Runs the chosen benchmark.
pub async fn run(settings: &Settings, args: &BenchArgs) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    settings.database.schema = format!("{}_bench", settings.database.schema);
    match &args.which {
        Some(BenchKind::Ingest(options)) => ingest::run(&settings, options).await,
        Some(BenchKind::Rebalance(options)) => rebalance::run(&settings, options).await,
        Some(BenchKind::Ops(options)) => ops::run(&settings, options).await,
        Some(BenchKind::Webhook(options)) => webhook::run(&settings, options).await,
        Some(BenchKind::Console(options)) => console::run(&settings, options).await,
        Some(BenchKind::Horizon(options)) => horizon::run(&settings, options).await,
        Some(BenchKind::Scale(options)) => scale::run(&settings, options).await,
        Some(BenchKind::RedrivePace(options)) => pace::run(&settings, options).await,
        None => run_queue(&settings, &args.queue).await,
    }
}

/// The middle value (the upper one of an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Runs the queue benchmark and prints its figures.
async fn run_queue(settings: &Settings, options: &BenchOptions) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    settings.database.max_connections = settings
        .database
        .max_connections
        .max(options.enqueue_connections as u32 + 8);
    outln!(
        "redrive bench: {} tasks of {} bytes, attempt history kept, {} run(s) per batch size, median shown",
        options.tasks, options.value_bytes, options.runs
    );
    outln!(
        "{:>6} {:>11} {:>12} {:>12} {:>10} {:>10} {:>12} {:>13}",
        "batch",
        "concurrency",
        "enqueue/s",
        "drain/s",
        "p50 ms",
        "p99 ms",
        "WAL B/task",
        "commits/task"
    );
    for &batch in &options.batch_sizes {
        let concurrency = options.concurrency.unwrap_or(batch * 4).max(1);
        let mut runs = Vec::new();
        for _ in 0..options.runs.max(1) {
            runs.push(one_run(&settings, options, batch, concurrency).await?);
        }
        let median = |f: fn(&RunFigures) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        outln!(
            "{:>6} {:>11} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>12.0} {:>13.3}",
            batch,
            concurrency,
            median(|r| r.enqueue_per_s),
            median(|r| r.drain_per_s),
            median(|r| r.p50_ms),
            median(|r| r.p99_ms),
            median(|r| r.drain_server.wal_bytes),
            median(|r| r.drain_server.commits),
        );
    }
    if options.pickup_samples > 0 {
        let (p50, p99) = pickup_latency(&settings, options.pickup_samples).await?;
        outln!("idle pick-up latency (enqueue committed -> resolved), {} samples: p50 {p50:.1} ms, p99 {p99:.1} ms", options.pickup_samples);
    }
    if options.stream_seconds > 0 {
        let batch = options.batch_sizes.iter().copied().max().unwrap_or(100);
        stream::run(
            &settings,
            options.stream_rate,
            options.stream_seconds,
            batch,
        )
        .await?;
    }
    Ok(())
}

async fn fresh_store(settings: &Settings) -> anyhow::Result<Store> {
    let store = Store::connect(&settings.database)
        .await
        .context("connecting")?;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", store.schema()))
        .execute(store.pool())
        .await?;
    store.migrate().await?;
    Ok(store)
}

fn bench_fleet(settings: &Settings, batch: u32, concurrency: u32) -> anyhow::Result<Fleet> {
    let mut settings = settings.clone();
    settings.worker.batch_size = batch;
    settings.worker.concurrency = concurrency;
    settings.worker.handlers = Vec::new();
    // A benchmark's store is seeded with old final tasks: retention would delete them
    // beside the drain it measures.
    settings.retention.enabled = false;
    Ok(Fleet::builder(settings)
        .handler("noop", NoopHandler)
        .build()?)
}

/// Drains `tasks` noop tasks, due in `store`, with a fresh fleet claiming `batch` at a
/// time and running `concurrency` at once, then stops it; answers tasks per second from
/// the fleet's start to the last one resolved.
async fn drain_noop(
    settings: &Settings,
    store: &Store,
    tasks: usize,
    batch: u32,
    concurrency: u32,
) -> anyhow::Result<f64> {
    let fleet = bench_fleet(settings, batch, concurrency)?;
    let resolved = fleet
        .metrics()
        .attempts
        .with_label_values(&["noop", "resolved"]);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    while resolved.get() < tasks as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "drain took over 10 minutes"
        );
    }
    let rate = tasks as f64 / started.elapsed().as_secs_f64();
    shutdown.cancel();
    running.await??;
    Ok(rate)
}

async fn one_run(
    settings: &Settings,
    options: &BenchOptions,
    batch: u32,
    concurrency: u32,
) -> anyhow::Result<RunFigures> {
    let store = fresh_store(settings).await?;
    let value = vec![b'x'; options.value_bytes];
    let tasks: Vec<NewTask> = (0..options.tasks)
        .map(|_| NewTask::new("noop", value.clone()))
        .collect();

    let started = Instant::now();
    let chunks: Vec<Vec<NewTask>> = tasks
        .chunks(options.enqueue_batch.max(1))
        .map(<[_]>::to_vec)
        .collect();
    let per_connection = chunks.len().div_ceil(options.enqueue_connections.max(1));
    let mut writers = tokio::task::JoinSet::new();
    for share in chunks.chunks(per_connection.max(1)) {
        let store = store.clone();
        let share = share.to_vec();
        writers.spawn(async move {
            for chunk in share {
                store.enqueue_many(&chunk).await?;
            }
            Ok::<_, crate::store::StoreError>(())
        });
    }
    while let Some(result) = writers.join_next().await {
        result??;
    }
    let enqueue_per_s = options.tasks as f64 / started.elapsed().as_secs_f64();
    // No ANALYZE here: the drain starts on a burst the planner has no statistics for,
    // as a fleet does after an outage.

    let before = server::ServerCounters::read(&store).await?;
    let drain_start = chrono::Utc::now();
    let drain_per_s = drain_noop(settings, &store, options.tasks, batch, concurrency).await?;
    let drain_server = server::ServerCounters::read(&store)
        .await?
        .per_task_since(&before, options.tasks);

    let (p50_ms, p99_ms): (f64, f64) = sqlx::query_as(
        "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY ms), percentile_disc(0.99) WITHIN GROUP (ORDER BY ms) \
         FROM (SELECT (extract(epoch FROM finished_at - greatest(created_at, $1)) * 1000)::float8 AS ms \
               FROM recovery_task WHERE status = 'resolved') s",
    )
    .bind(drain_start)
    .fetch_one(store.pool())
    .await?;
    let counts = store.status_counts().await?;
    anyhow::ensure!(
        counts.resolved == options.tasks as i64,
        "not every task resolved: {counts:?}"
    );
    drop_schema(&store).await?;
    Ok(RunFigures {
        enqueue_per_s,
        drain_per_s,
        p50_ms,
        p99_ms,
        drain_server,
    })
}

/// Enqueues single tasks into an idle running pool and measures commit-to-resolved.
async fn pickup_latency(settings: &Settings, samples: usize) -> anyhow::Result<(f64, f64)> {
    let store = fresh_store(settings).await?;
    let fleet = bench_fleet(settings, 10, 20)?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..samples {
        store
            .enqueue(&NewTask::new("noop", format!("sample {i}")))
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiting = Instant::now();
    while store.status_counts().await?.resolved < samples as i64 {
        anyhow::ensure!(
            waiting.elapsed() < Duration::from_secs(120),
            "the pick-up samples were not resolved within two minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await??;
    let figures: (f64, f64) = sqlx::query_as(
        "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY ms), percentile_disc(0.99) WITHIN GROUP (ORDER BY ms) \
         FROM (SELECT (extract(epoch FROM finished_at - created_at) * 1000)::float8 AS ms FROM recovery_task) s",
    )
    .fetch_one(store.pool())
    .await?;
    drop_schema(&store).await?;
    Ok(figures)
}

async fn drop_schema(store: &Store) -> anyhow::Result<()> {
    sqlx::query(&format!("DROP SCHEMA {} CASCADE", store.schema()))
        .execute(store.pool())
        .await?;
    Ok(())
}
