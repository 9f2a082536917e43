//! `redrive bench horizon`: the drain while PostgreSQL's MVCC horizon is pinned. A
//! continuous stream of failures arrives; one member at its default worker settings
//! drains it; after a while another session holds a REPEATABLE READ snapshot (an
//! analytics query, a forgotten transaction), so no dead row version can be removed,
//! then lets it go. Prints, per window, what arrived and what was drained, the backlog,
//! the dead row versions and the index sizes; then the drain during the pin as a share
//! of the drain before it, and how long the fleet took to catch up after the release.
//!
//! It runs on a private PostgreSQL server (`initdb` into a temporary directory, with
//! PostgreSQL's defaults: autovacuum on) unless told to use the configured one, and says
//! which settings the server ran with. It ends by checking that every task it created
//! was resolved exactly once.

use anyhow::{ensure, Context};
use clap::Args;
use secrecy::SecretString;
use sqlx::Connection;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{drop_schema, fresh_store, median, NoopHandler};
use crate::config::Settings;
use crate::fleet::Fleet;
use crate::output::outln;
use crate::private_cluster::PrivateCluster;
use crate::store::Store;
use crate::task::NewTask;

/// How often the stream enqueues its next slice of arrivals.
const ARRIVAL_TICK: Duration = Duration::from_millis(50);

/// How long the rest of the backlog may take to drain after the stream stops.
const FINAL_DRAIN_LIMIT: Duration = Duration::from_secs(900);

/// Options of `redrive bench horizon`.
#[derive(Debug, Clone, Args)]
pub struct HorizonBenchOptions {
    /// Failures arriving per second, all through the run.
    #[arg(long, default_value_t = 3800, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rate: u32,
    /// How long the stream runs before the snapshot is taken.
    #[arg(long, default_value = "60s", value_parser = super::length_of_time)]
    pub before: Duration,
    /// How long the snapshot is held.
    #[arg(long, default_value = "120s", value_parser = super::length_of_time)]
    pub pin: Duration,
    /// How long the stream goes on after the snapshot is released.
    #[arg(long, default_value = "60s", value_parser = super::length_of_time)]
    pub after: Duration,
    /// Length of one reported window.
    #[arg(long, default_value = "10s", value_parser = super::length_of_time)]
    pub window: Duration,
    /// Bytes of each task's value.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub value_bytes: u32,
    /// Run on the configured PostgreSQL instead of a private server (its settings as they
    /// are: say which in the report).
    #[arg(long)]
    pub configured_server: bool,
    /// A setting of the private server, `name=value` (repeatable), on top of
    /// PostgreSQL's defaults: `--pg-set autovacuum=off` reproduces a server without it.
    #[arg(long = "pg-set", value_name = "NAME=VALUE")]
    pub pg_settings: Vec<String>,
    /// The folder of the private server's `initdb` and `pg_ctl` (default: the newest
    /// under /usr/lib/postgresql).
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
}

/// Which part of the run a window belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Before,
    Pinned,
    After,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::Pinned => "pinned",
            Phase::After => "after",
        }
    }
}

/// The server's view of the task table at one moment.
#[derive(Debug, Clone, Copy)]
struct TableState {
    dead: i64,
    live: i64,
    vacuums: i64,
    due_index_bytes: i64,
    index_bytes: i64,
}

impl TableState {
    async fn read(store: &Store) -> anyhow::Result<TableState> {
        let (dead, live, vacuums, due_index_bytes, index_bytes) = sqlx::query_as(
            "SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), \
                    coalesce(autovacuum_count, 0) + coalesce(vacuum_count, 0), \
                    pg_relation_size('recovery_task_due_by_handler'), pg_indexes_size('recovery_task') \
             FROM pg_stat_user_tables WHERE relid = 'recovery_task'::regclass",
        )
        .fetch_one(store.pool())
        .await?;
        Ok(TableState {
            dead,
            live,
            vacuums,
            due_index_bytes,
            index_bytes,
        })
    }
}

/// One reported window.
#[derive(Debug, Clone, Copy)]
struct Window {
    phase: Phase,
    ends_at: Duration,
    drained_per_s: f64,
    backlog: i64,
}

/// Runs the benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &HorizonBenchOptions) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    let _cluster = if options.configured_server {
        None
    } else {
        let cluster = PrivateCluster::start(options.pg_bin.as_deref(), &options.pg_settings)
            .context("starting a private PostgreSQL server (or give --configured-server)")?;
        settings.database.url = SecretString::from(cluster.url());
        Some(cluster)
    };
    settings.database.max_connections = settings.database.max_connections.max(4);
    let store = fresh_store(&settings).await?;
    print_server(&store, options).await?;

    let fleet = Fleet::builder({
        let mut settings = settings.clone();
        settings.worker.handlers = Vec::new();
        settings
    })
    .handler("noop", NoopHandler)
    .build()?;
    outln!(
        "one member at its worker defaults (batch {}, concurrency {}); {} failures/s arriving; {}s before, {}s pinned, {}s after, windows of {}s",
        settings.worker.batch_size,
        settings.worker.concurrency,
        options.rate,
        options.before.as_secs(),
        options.pin.as_secs(),
        options.after.as_secs(),
        options.window.as_secs()
    );
    let resolved = fleet
        .metrics()
        .attempts
        .with_label_values(&["noop", "resolved"]);
    let shutdown = CancellationToken::new();
    let member = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    let arrived = Arc::new(AtomicU64::new(0));
    let stream_stop = CancellationToken::new();
    let stream = tokio::spawn(arrivals(
        store.clone(),
        options.rate,
        options.value_bytes as usize,
        arrived.clone(),
        stream_stop.clone(),
    ));

    outln!(
        "{:>6} {:>7} {:>10} {:>10} {:>9} {:>11} {:>11} {:>13} {:>13} {:>8}",
        "t s",
        "phase",
        "arrived/s",
        "drained/s",
        "backlog",
        "dead rows",
        "live rows",
        "due index KB",
        "indexes KB",
        "vacuums"
    );
    let started = Instant::now();
    let pin_at = options.before;
    let release_at = options.before + options.pin;
    let end_at = release_at + options.after;
    let mut pin: Option<sqlx::PgConnection> = None;
    let (mut pinned, mut released) = (false, false);
    let mut windows = Vec::new();
    let (mut last_arrived, mut last_resolved) = (0, 0);
    let mut next_window = options.window;
    while next_window <= end_at {
        let wake = match (pinned, released) {
            (false, _) if pin_at <= next_window => pin_at,
            (true, false) if release_at <= next_window => release_at,
            _ => next_window,
        };
        tokio::time::sleep(wake.saturating_sub(started.elapsed())).await;
        ensure!(!member.is_finished(), "the member stopped during the run");
        ensure!(!stream.is_finished(), "the stream of arrivals stopped");
        if !pinned && wake == pin_at {
            pin = Some(hold_snapshot(&settings, &store).await?);
            pinned = true;
            continue;
        }
        if pinned && !released && wake == release_at {
            if let Some(mut held) = pin.take() {
                sqlx::query("COMMIT").execute(&mut held).await?;
            }
            released = true;
            outln!("-- snapshot released at {}s", release_at.as_secs());
            continue;
        }
        let (now_arrived, now_resolved) = (arrived.load(Ordering::Relaxed), resolved.get());
        let seconds = options.window.as_secs_f64();
        let table = TableState::read(&store).await?;
        let phase = match next_window {
            t if t <= pin_at => Phase::Before,
            t if t <= release_at => Phase::Pinned,
            _ => Phase::After,
        };
        let window = Window {
            phase,
            ends_at: next_window,
            drained_per_s: (now_resolved - last_resolved) as f64 / seconds,
            backlog: now_arrived as i64 - now_resolved as i64,
        };
        outln!(
            "{:>6} {:>7} {:>10.0} {:>10.0} {:>9} {:>11} {:>11} {:>13} {:>13} {:>8}",
            next_window.as_secs(),
            phase.name(),
            (now_arrived - last_arrived) as f64 / seconds,
            window.drained_per_s,
            window.backlog,
            table.dead,
            table.live,
            table.due_index_bytes / 1024,
            table.index_bytes / 1024,
            table.vacuums
        );
        windows.push(window);
        (last_arrived, last_resolved) = (now_arrived, now_resolved);
        next_window += options.window;
    }
    stream_stop.cancel();
    stream.await??;
    drop(pin);
    let total = arrived.load(Ordering::Relaxed);
    let drain_started = Instant::now();
    while resolved.get() < total {
        ensure!(
            drain_started.elapsed() < FINAL_DRAIN_LIMIT && !member.is_finished(),
            "the backlog did not drain within {FINAL_DRAIN_LIMIT:?} after the stream stopped ({} of {total} resolved)",
            resolved.get()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    member.await??;
    summarize(&windows, options);
    every_task_resolved_once(&store, total).await?;
    drop_schema(&store).await?;
    Ok(())
}

/// Enqueues `rate` tasks a second, a slice every [`ARRIVAL_TICK`], until `stop`.
async fn arrivals(
    store: Store,
    rate: u32,
    value_bytes: usize,
    arrived: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let value = vec![b'x'; value_bytes];
    let started = Instant::now();
    let mut ticks = tokio::time::interval(ARRIVAL_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
        }
        // Whatever is due by now: a slow enqueue is caught up by the next slice.
        let due = (started.elapsed().as_secs_f64() * f64::from(rate)) as u64;
        let missing = due.saturating_sub(arrived.load(Ordering::Relaxed));
        if missing == 0 {
            continue;
        }
        let slice: Vec<NewTask> = (0..missing)
            .map(|_| NewTask::new("noop", value.clone()))
            .collect();
        for chunk in slice.chunks(1000) {
            store.enqueue_many(chunk).await?;
            arrived.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
}

/// Opens a session of its own and takes a REPEATABLE READ snapshot in it: until that
/// transaction ends, no row version that died after it can be removed.
async fn hold_snapshot(settings: &Settings, store: &Store) -> anyhow::Result<sqlx::PgConnection> {
    use secrecy::ExposeSecret;
    let mut held = sqlx::PgConnection::connect(settings.database.url.expose_secret()).await?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut held)
        .await?;
    let (tasks,): (i64,) = sqlx::query_as(&format!(
        "SELECT count(*) FROM {}.recovery_task",
        store.schema()
    ))
    .fetch_one(&mut held)
    .await?;
    let pinned: Option<String> = sqlx::query_scalar(
        "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    )
    .fetch_one(&mut held)
    .await?;
    ensure!(pinned.is_some(), "the snapshot holds no horizon");
    outln!(
        "-- snapshot taken (it saw {tasks} tasks; its xmin {} holds the horizon)",
        pinned.unwrap_or_default()
    );
    Ok(held)
}

/// Prints the server's settings that decide the outcome.
async fn print_server(store: &Store, options: &HorizonBenchOptions) -> anyhow::Result<()> {
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, current_setting(name) FROM pg_settings \
         WHERE name IN ('server_version', 'autovacuum', 'autovacuum_naptime', \
                        'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_insert_scale_factor', \
                        'shared_buffers', 'fsync', 'synchronous_commit') ORDER BY name",
    )
    .fetch_all(store.pool())
    .await?;
    let which = if options.configured_server {
        "the configured PostgreSQL server"
    } else {
        "a private PostgreSQL server (initdb, PostgreSQL's defaults and --pg-set)"
    };
    let listed: Vec<String> = settings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    outln!("redrive bench horizon on {which}: {}", listed.join(" "));
    Ok(())
}

/// Prints the drain during the pin against before it, and the catch-up after it.
fn summarize(windows: &[Window], options: &HorizonBenchOptions) {
    let rates = |phase: Phase, skip: usize| -> Vec<f64> {
        let of_phase = windows.iter().filter(|w| w.phase == phase);
        let rates: Vec<f64> = of_phase
            .clone()
            .skip(skip)
            .map(|w| w.drained_per_s)
            .collect();
        if rates.is_empty() {
            of_phase.map(|w| w.drained_per_s).collect()
        } else {
            rates
        }
    };
    // The first window warms the member up.
    let before = rates(Phase::Before, 1);
    let pinned = rates(Phase::Pinned, 0);
    if before.is_empty() || pinned.is_empty() {
        outln!("(too few windows for a summary: make --before and --pin longer than --window)");
        return;
    }
    let normal = median(&before);
    let during = median(&pinned);
    let worst = pinned.iter().copied().fold(f64::INFINITY, f64::min);
    outln!(
        "drain before the pin {normal:.0}/s; during it {during:.0}/s median ({:.2} of before), {worst:.0}/s at worst ({:.2})",
        during / normal.max(1e-9),
        worst / normal.max(1e-9)
    );
    let at_pin = windows
        .iter()
        .filter(|w| w.phase == Phase::Before)
        .map(|w| w.backlog)
        .next_back()
        .unwrap_or(0);
    let peak = windows.iter().map(|w| w.backlog).max().unwrap_or(0);
    let release_at = options.before + options.pin;
    // Back to normal: the backlog no larger than at the pin, give or take a window's
    // arrivals.
    let slack = (f64::from(options.rate) * options.window.as_secs_f64()) as i64;
    let caught_up = windows
        .iter()
        .filter(|w| w.phase == Phase::After && w.backlog <= at_pin + slack)
        .map(|w| w.ends_at - release_at)
        .next();
    match caught_up {
        Some(after) => outln!(
            "backlog {at_pin} at the pin, {peak} at its peak; back to normal within {}s of the release",
            after.as_secs()
        ),
        None => outln!(
            "backlog {at_pin} at the pin, {peak} at its peak; NOT back to normal within the {}s after the release",
            options.after.as_secs()
        ),
    }
}

/// Every task the stream created was resolved, once: fails loudly otherwise.
async fn every_task_resolved_once(store: &Store, created: u64) -> anyhow::Result<()> {
    let counts = store.status_counts().await?;
    let (resolutions, twice): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) - count(DISTINCT task_id) FROM recovery_attempt WHERE outcome = 'resolved'",
    )
    .fetch_one(store.pool())
    .await?;
    ensure!(
        counts.resolved == created as i64 && counts.total() == created as i64,
        "created {created} tasks, but the store holds {counts:?}"
    );
    ensure!(
        resolutions == created as i64 && twice == 0,
        "created {created} tasks: {resolutions} resolved attempts, {twice} of them a second resolution"
    );
    outln!("checked: each of the {created} tasks created was resolved exactly once");
    Ok(())
}
