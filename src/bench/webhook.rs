//! `redrive bench webhook`: the worker pool draining through the webhook handler against
//! a local HTTP server that answers 200 at once, at several concurrencies, beside the
//! no-op drain at the same concurrency (the ceiling, measured in the same sitting); and
//! the drain of a healthy handler while another handler's breaker is open with a large
//! backlog held, against the same drain without that backlog.
//!
//! The answering server runs on a thread of its own, so that the CPU time it takes from
//! this machine's two cores (a real target would run elsewhere) is printed apart from
//! the member's.

use clap::Args;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::cpu::{self, CpuTimes};
use super::{drop_schema, fresh_store, median, NoopHandler};
use crate::config::{BreakerSettings, HandlerSettings, Settings, WebhookSettings};
use crate::fleet::Fleet;
use crate::output::outln;
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
#[derive(Debug, Clone, Copy, Default)]
struct Drain {
    per_s: f64,
    p99_call_ms: f64,
    /// CPU microseconds per task: the member (this process without the answering
    /// server's thread), the answering server, and PostgreSQL.
    member_us: f64,
    target_us: f64,
    postgres_us: f64,
}

/// The webhook's target: answers 200 with an empty body to every request, on a free
/// loopback port, from a thread of its own (HTTP/1.1 by hyper, keep-alive).
struct AnsweringServer {
    addr: SocketAddr,
    /// The kernel's id of its thread, whose CPU time is the target's.
    thread_id: i32,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnsweringServer {
    fn start() -> anyhow::Result<AnsweringServer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        let (started, thread_id) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("bench-target".into())
            .spawn(move || {
                let _ = started.send(cpu::this_thread_id());
                runtime.block_on(answer(listener, stopping));
            })?;
        Ok(AnsweringServer {
            addr,
            thread_id: thread_id.recv()?,
            stop,
            thread: Some(thread),
        })
    }

    /// CPU seconds its thread used so far (0 where `/proc` cannot tell).
    fn cpu_seconds(&self) -> f64 {
        cpu::thread_seconds(self.thread_id).unwrap_or(0.0)
    }
}

impl Drop for AnsweringServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections on `listener` and answers every request 200, until `stop`.
async fn answer(listener: std::net::TcpListener, stop: CancellationToken) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let _ = stream.set_nodelay(true);
        let service = hyper::service::service_fn(|_request| async {
            Ok::<_, Infallible>(hyper::Response::new(http_body_util::Empty::<
                hyper::body::Bytes,
            >::new()))
        });
        connections.spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        while connections.try_join_next().is_some() {}
    }
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
    target: &AnsweringServer,
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
    let fleet = fleet(settings, target.addr, concurrency)?;
    let resolved = fleet
        .metrics()
        .attempts
        .with_label_values(&[handler, "resolved"]);
    let shutdown = CancellationToken::new();
    let cpu_before = CpuTimes::now();
    let target_before = target.cpu_seconds();
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
    let target_s = target.cpu_seconds() - target_before;
    let used = CpuTimes::now()
        .zip(cpu_before)
        .map(|(after, before)| after.since(before))
        .unwrap_or_default();
    let per_task_us = |seconds: f64| seconds * 1e6 / count as f64;
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
    let (resolved, resolved_once): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'resolved'), \
                count(*) FILTER (WHERE (SELECT count(*) FROM recovery_attempt a \
                    WHERE a.task_id = t.id AND a.outcome = 'resolved') = 1) \
         FROM recovery_task t WHERE handler = $1",
    )
    .bind(handler)
    .fetch_one(store.pool())
    .await?;
    anyhow::ensure!(
        resolved == count as i64 && resolved_once == count as i64,
        "of {count} {handler} tasks {resolved} were resolved and {resolved_once} resolved \
         exactly once"
    );
    drop_schema(&store).await?;
    Ok(Drain {
        per_s,
        p99_call_ms,
        member_us: per_task_us(used.this_process - target_s),
        target_us: per_task_us(target_s),
        postgres_us: per_task_us(used.postgres),
    })
}

/// The medians of the figures of `drains`.
fn medians(drains: &[Drain]) -> Drain {
    let median_of =
        |figure: fn(&Drain) -> f64| median(&drains.iter().map(figure).collect::<Vec<_>>());
    Drain {
        per_s: median_of(|d| d.per_s),
        p99_call_ms: median_of(|d| d.p99_call_ms),
        member_us: median_of(|d| d.member_us),
        target_us: median_of(|d| d.target_us),
        postgres_us: median_of(|d| d.postgres_us),
    }
}

/// `runs` rounds, each draining `handler_a` then `handler_b` at `concurrency` (with
/// `held` webhook tasks behind an open breaker in `a`'s): the medians of each, and the
/// median of the rounds' ratios of `a`'s rate to `b`'s. Interleaved, so that a slower
/// stretch of a shared machine falls on both.
async fn compare(
    settings: &Settings,
    target: &AnsweringServer,
    options: &WebhookBenchOptions,
    (handler_a, handler_b): (&str, &str),
    concurrency: u32,
    held: usize,
) -> anyhow::Result<(Drain, Drain, f64)> {
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..options.runs.max(1) {
        let first = drain(
            settings,
            target,
            handler_a,
            options.tasks,
            concurrency,
            held,
        )
        .await?;
        let second = drain(settings, target, handler_b, options.tasks, concurrency, 0).await?;
        ratios.push(first.per_s / second.per_s);
        a.push(first);
        b.push(second);
    }
    Ok((medians(&a), medians(&b), median(&ratios)))
}

/// Runs the webhook benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &WebhookBenchOptions) -> anyhow::Result<()> {
    let target = AnsweringServer::start()?;
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
    let mut cpu_lines = Vec::new();
    for &concurrency in &options.concurrency {
        let (hook, noop, share) =
            compare(settings, &target, options, ("hook", "noop"), concurrency, 0).await?;
        outln!(
            "{:>11} {:>16.0} {:>12.1} {:>13.0} {:>13.0}%",
            concurrency,
            hook.per_s,
            hook.p99_call_ms,
            noop.per_s,
            100.0 * share
        );
        cpu_lines.push(format!(
            "{:>11} {:>15.1} {:>13.1} {:>15.1} {:>17.1} {:>15.1}",
            concurrency,
            hook.member_us,
            noop.member_us,
            hook.target_us,
            hook.postgres_us,
            noop.postgres_us
        ));
    }
    outln!("CPU microseconds per task (the member: this process without the answering server's thread):");
    outln!(
        "{:>11} {:>15} {:>13} {:>15} {:>17} {:>15}",
        "concurrency",
        "member webhook",
        "member no-op",
        "answering server",
        "postgres webhook",
        "postgres no-op"
    );
    for line in cpu_lines {
        outln!("{line}");
    }
    let concurrency = 256;
    let (beside, alone, share) =
        compare(settings, &target, options, ("noop", "noop"), concurrency, n).await?;
    outln!(
        "breaker isolation at concurrency {concurrency}: no-op drain {:.0}/s alone, {:.0}/s beside \
         {n} webhook tasks held by its open breaker ({:.0}% of alone; none attempted)",
        alone.per_s,
        beside.per_s,
        100.0 * share
    );
    drop(target);
    outln!("checked: each task of every drain was resolved exactly once");
    Ok(())
}
