//! `redrive bench webhook`: the worker pool draining through the webhook handler against
//! a local HTTP server that answers 200 at once, at several concurrencies, beside the
//! no-op drain at the same concurrency (the ceiling, measured in the same sitting); and
//! the drain of a healthy handler while another handler's breaker is open with a large
//! backlog held, against the same drain without that backlog.

use axum::http::StatusCode;
use clap::Args;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{drop_schema, fresh_store, median, NoopHandler};
use crate::cli::output::outln;
use crate::config::{BreakerSettings, HandlerSettings, Settings, WebhookSettings};
use crate::fleet::Fleet;
use crate::store::{BreakerCommand, Operator, Store};

/// Options of `redrive bench webhook`.
#[derive(Debug, Clone, Args)]
pub struct WebhookBenchOptions {
    /// Tasks drained per run.
    #[arg(long, default_value_t = 20_000)]
    pub tasks: usize,
    /// Worker concurrencies (calls in flight) to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    pub concurrency: Vec<u32>,
    /// Runs per figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// Figures of one drain.
#[derive(Debug, Clone, Copy)]
struct Drain {
    per_s: f64,
    p99_call_ms: f64,
}

/// Serves 200 with an empty body to every request, on a free loopback port.
async fn answering_server() -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let app = axum::Router::new().fallback(|| async { StatusCode::OK });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, server))
}

/// Inserts `count` unattempted tasks of `handler` by SQL.
async fn seed(store: &Store, handler: &str, count: usize) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_key, msg_value) \
         SELECT $1, convert_to('k' || i, 'UTF8'), convert_to(repeat('x', 256), 'UTF8') \
         FROM generate_series(1, $2) i",
    )
    .bind(handler)
    .bind(count as i64)
    .execute(store.pool())
    .await?;
    Ok(())
}

/// A fleet serving `hook` (the webhook at `addr`, with a breaker) and `noop`.
fn fleet(settings: &Settings, addr: SocketAddr, concurrency: u32) -> anyhow::Result<Fleet> {
    let mut settings = settings.clone();
    settings.worker.concurrency = concurrency;
    settings.worker.batch_size = (concurrency / 4).clamp(1, 500);
    settings.worker.handlers = Vec::new();
    settings.webhooks.insert(
        "hook".into(),
        WebhookSettings {
            url: Some(format!("http://{addr}/recover")),
            ..WebhookSettings::default()
        },
    );
    settings.handlers.insert(
        "hook".into(),
        HandlerSettings {
            breaker: Some(BreakerSettings::default()),
            ..HandlerSettings::default()
        },
    );
    Ok(Fleet::builder(settings)
        .with_builtin_handlers()
        .handler("noop", NoopHandler)
        .build()?)
}

/// Drains the `count` tasks of `handler` in a fresh store, with `held` more tasks of
/// `hook` behind its forced-open breaker when `held > 0`.
async fn drain(
    settings: &Settings,
    addr: SocketAddr,
    handler: &str,
    count: usize,
    concurrency: u32,
    held: usize,
) -> anyhow::Result<Drain> {
    let store = fresh_store(settings).await?;
    seed(&store, handler, count).await?;
    if held > 0 {
        seed(&store, "hook", held).await?;
        let operator = Operator {
            actor: "bench".into(),
            reason: Some("bench webhook: a downstream that is down".into()),
        };
        store
            .command_breaker(
                "hook",
                BreakerCommand::Open,
                &BreakerSettings::default(),
                &operator,
            )
            .await?;
    }
    let fleet = fleet(settings, addr, concurrency)?;
    let resolved = fleet
        .metrics()
        .attempts
        .with_label_values(&[handler, "resolved"]);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    while resolved.get() < count as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "drain took over 10 minutes"
        );
    }
    let per_s = count as f64 / started.elapsed().as_secs_f64();
    shutdown.cancel();
    running.await??;
    let p99_call_ms: f64 = sqlx::query_scalar(
        "SELECT coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY duration_ms), 0)::float8 \
         FROM recovery_attempt",
    )
    .fetch_one(store.pool())
    .await?;
    let attempted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM recovery_task WHERE handler = 'hook' AND attempts > 0",
    )
    .fetch_one(store.pool())
    .await?;
    anyhow::ensure!(
        held == 0 || attempted == 0,
        "{attempted} tasks were attempted behind an open breaker"
    );
    drop_schema(&store).await?;
    Ok(Drain { per_s, p99_call_ms })
}

/// Runs `what` `runs` times; the medians of its figures.
async fn medians<F, Fut>(runs: usize, mut what: F) -> anyhow::Result<Drain>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Drain>>,
{
    let mut all = Vec::new();
    for _ in 0..runs.max(1) {
        all.push(what().await?);
    }
    let per_s: Vec<f64> = all.iter().map(|d| d.per_s).collect();
    let p99: Vec<f64> = all.iter().map(|d| d.p99_call_ms).collect();
    Ok(Drain {
        per_s: median(&per_s),
        p99_call_ms: median(&p99),
    })
}

/// Runs the webhook benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &WebhookBenchOptions) -> anyhow::Result<()> {
    let (addr, server) = answering_server().await?;
    let n = options.tasks;
    outln!(
        "redrive bench webhook: {n} tasks per drain, local server answering 200 at once, \
         median of {} run(s)",
        options.runs
    );
    outln!(
        "{:>11} {:>16} {:>12} {:>13} {:>14}",
        "concurrency",
        "webhook calls/s",
        "p99 call ms",
        "no-op drain/s",
        "share of no-op"
    );
    for &concurrency in &options.concurrency {
        let hook = medians(options.runs, || {
            drain(settings, addr, "hook", n, concurrency, 0)
        })
        .await?;
        let noop = medians(options.runs, || {
            drain(settings, addr, "noop", n, concurrency, 0)
        })
        .await?;
        outln!(
            "{:>11} {:>16.0} {:>12.1} {:>13.0} {:>13.0}%",
            concurrency,
            hook.per_s,
            hook.p99_call_ms,
            noop.per_s,
            100.0 * hook.per_s / noop.per_s
        );
    }
    let concurrency = 256;
    let alone = medians(options.runs, || {
        drain(settings, addr, "noop", n, concurrency, 0)
    })
    .await?;
    let beside = medians(options.runs, || {
        drain(settings, addr, "noop", n, concurrency, n)
    })
    .await?;
    outln!(
        "breaker isolation at concurrency {concurrency}: no-op drain {:.0}/s alone, {:.0}/s beside \
         {n} webhook tasks held by its open breaker ({:.0}% of alone; none attempted)",
        alone.per_s,
        beside.per_s,
        100.0 * beside.per_s / alone.per_s
    );
    server.abort();
    Ok(())
}
