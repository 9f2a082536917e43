//! `redrive bench scale`: the drain against the store's size and against the number of
//! members on one PostgreSQL.
//!
//! - **Size**: one member drains the same number of tasks from stores holding 10k, 1M
//!   and 10M due tasks, and from a small backlog beside 10M final tasks. The store is
//!   filled by SQL and never analyzed, as after a burst or a restore. One fleet sample is
//!   taken before the drain, as in a running fleet, and its time printed apart. The drain
//!   rates, counted from the first task resolved (a member's start is no part of them),
//!   should stay within 1.5× of each other.
//! - **Members**: 1, 2 and 3 members (each its own connection pool) drain one backlog
//!   together: the total rate, and what limits it: connections, backends waiting on
//!   locks, lightweight locks or IO (sampled), CPU of PostgreSQL and of the members.
//!
//! With `pg_stat_statements` loaded, each figure is followed by its costliest statements
//! per task. Each figure ends by checking that every task resolved was resolved once.

use anyhow::ensure;
use clap::Args;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::cpu::CpuTimes;
use super::{bench_fleet, drop_schema, fresh_store, server, statements};
use crate::config::Settings;
use crate::output::outln;
use crate::store::{next_turn_after, Store};

/// Rows written by one filling statement.
const FILL_CHUNK: u64 = 1_000_000;

/// How long one drain may take.
const DRAIN_LIMIT: Duration = Duration::from_secs(900);

/// How often `pg_stat_activity` is sampled during a drain.
const ACTIVITY_SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Options of `redrive bench scale`.
#[derive(Debug, Clone, Args)]
pub struct ScaleBenchOptions {
    /// Due tasks in the store when a size figure's drain starts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10000,1000000,10000000",
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub backlogs: Vec<u64>,
    /// Final (resolved) tasks beside a backlog of `--drain` tasks, for the last size
    /// figure; 0 leaves it out.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub final_rows: u64,
    /// Tasks drained for each size figure (at most the backlog).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub drain: u64,
    /// Member counts to compare on one PostgreSQL, comma-separated; `--members` with no
    /// count leaves the member figures out.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3", num_args = 0..,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub members: Vec<u32>,
    /// Due tasks the members drain together, for each member count.
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub members_backlog: u64,
    /// Claim batch of each member; its concurrency is four times that.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
    /// Bytes of each task's value.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub value_bytes: u32,
}

/// What one drain did.
struct Drained {
    tasks: u64,
    per_s: f64,
    /// Backends of the database, at most, during the drain.
    connections: i64,
    /// Backends waiting on a heavyweight lock, a lightweight lock, IO, on average.
    waiting: [f64; 3],
    /// CPU seconds per second of PostgreSQL's processes and of the members.
    cpu: Option<CpuTimes>,
    server: server::PerTask,
    statements: Option<Vec<statements::StatementFigures>>,
}

/// Runs the size and member figures and prints them.
pub async fn run(settings: &Settings, options: &ScaleBenchOptions) -> anyhow::Result<()> {
    let probe = fresh_store(settings).await?;
    let (autovacuum, shared_buffers): (String, String) =
        sqlx::query_as("SELECT current_setting('autovacuum'), current_setting('shared_buffers')")
            .fetch_one(probe.pool())
            .await?;
    let profiled = statements::Profile::reset(&probe).await.is_some();
    drop_schema(&probe).await?;
    outln!(
        "redrive bench scale: batch {}, concurrency {} per member, values of {} bytes; server: autovacuum {autovacuum}, shared_buffers {shared_buffers}; stores filled by SQL, never analyzed{}",
        options.batch,
        options.batch * 4,
        options.value_bytes,
        if profiled { "" } else { "; pg_stat_statements is not loaded: no statement figures" }
    );

    // Tasks resolved by all drains, each checked to have been resolved once.
    let mut checked = 0;
    let mut sizes = Vec::new();
    for &backlog in &options.backlogs {
        let drain = options.drain.min(backlog);
        let label = format!("{} due", count(backlog));
        sizes.push(size_figure(settings, options, &label, backlog, 0, drain, &mut checked).await?);
    }
    if options.final_rows > 0 {
        let label = format!(
            "{} due + {} final",
            count(options.drain),
            count(options.final_rows)
        );
        sizes.push(
            size_figure(
                settings,
                options,
                &label,
                options.drain,
                options.final_rows,
                options.drain,
                &mut checked,
            )
            .await?,
        );
    }
    if sizes.len() > 1 {
        let fastest = sizes.iter().copied().fold(f64::MIN, f64::max);
        let slowest = sizes.iter().copied().fold(f64::MAX, f64::min);
        outln!(
            "spread of the drain over the store sizes: fastest / slowest = {:.2} (goal: at most 1.5)",
            fastest / slowest
        );
    }

    if !options.members.is_empty() {
        outln!(
            "\n-- members on one PostgreSQL, each its own pool, draining {} due tasks together",
            count(options.members_backlog)
        );
        outln!(
            "{:>7} {:>9} {:>11} {:>11}  {:>6} {:>7} {:>6}  {:>11} {:>11}",
            "members",
            "drain/s",
            "per member",
            "connections",
            "lock",
            "lwlock",
            "io",
            "server CPU",
            "members CPU"
        );
        for &members in &options.members {
            member_figure(settings, options, members, &mut checked).await?;
        }
        outln!("(lock, lwlock, io: backends waiting on each, on average; CPU: cores busy, PostgreSQL counts every process named postgres on this machine)");
    }
    outln!("checked: each of the {checked} tasks the drains resolved was resolved exactly once");
    Ok(())
}

/// Fills a fresh store with `due` due and `finals` resolved tasks, drains `drain` of the
/// due ones with one member, prints the figure and answers its rate.
async fn size_figure(
    settings: &Settings,
    options: &ScaleBenchOptions,
    label: &str,
    due: u64,
    finals: u64,
    drain: u64,
    checked: &mut i64,
) -> anyhow::Result<f64> {
    let store = fresh_store(settings).await?;
    let filling = Instant::now();
    fill(&store, finals, true, options.value_bytes).await?;
    fill(&store, due, false, options.value_bytes).await?;
    // The member joins a fleet whose sample of the store is current, as in a running
    // fleet; the sample's own cost is printed apart.
    let sampling = Instant::now();
    let figures = store.sample_figures(Duration::ZERO).await?;
    outln!(
        "\n-- {label}: filled in {:.0} s; a fleet sample took {:.2} s (the next waits {:.0} s); one member drains {}",
        filling.elapsed().as_secs_f64(),
        sampling.elapsed().as_secs_f64(),
        next_turn_after(crate::store::SAMPLE_EVERY, figures.count_ms).as_secs_f64(),
        count(drain)
    );
    let drained = drain_with(settings, &store, options, 1, drain).await?;
    *checked += every_resolution_once(&store, finals).await?;
    outln!(
        "{label}: {:.0} tasks/s, WAL {:.0} B/task, {:.3} commits/task",
        drained.per_s,
        drained.server.wal_bytes,
        drained.server.commits
    );
    if let Some(statements) = &drained.statements {
        statements::print(statements, drained.tasks);
    }
    drop_schema(&store).await?;
    Ok(drained.per_s)
}

/// Drains a backlog with `members` members and prints the row.
async fn member_figure(
    settings: &Settings,
    options: &ScaleBenchOptions,
    members: u32,
    checked: &mut i64,
) -> anyhow::Result<()> {
    let store = fresh_store(settings).await?;
    fill(&store, options.members_backlog, false, options.value_bytes).await?;
    let drained = drain_with(settings, &store, options, members, options.members_backlog).await?;
    *checked += every_resolution_once(&store, 0).await?;
    let cores = |pick: fn(&CpuTimes) -> f64| {
        drained
            .cpu
            .as_ref()
            .map_or("-".to_string(), |cpu| format!("{:.2}", pick(cpu)))
    };
    outln!(
        "{:>7} {:>9.0} {:>11.0} {:>11}  {:>6.2} {:>7.2} {:>6.2}  {:>11} {:>11}",
        members,
        drained.per_s,
        drained.per_s / f64::from(members),
        drained.connections,
        drained.waiting[0],
        drained.waiting[1],
        drained.waiting[2],
        cores(|c| c.postgres),
        cores(|c| c.this_process),
    );
    if let Some(statements) = &drained.statements {
        statements::print(statements, drained.tasks);
    }
    drop_schema(&store).await?;
    Ok(())
}

/// Writes `rows` noop tasks by SQL, in statements of [`FILL_CHUNK`] rows: due now, or
/// resolved once (`finals`).
async fn fill(store: &Store, rows: u64, finals: bool, value_bytes: u32) -> anyhow::Result<()> {
    let first: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM recovery_task")
        .fetch_one(store.pool())
        .await?;
    let mut written = 0;
    while written < rows {
        let chunk = (rows - written).min(FILL_CHUNK);
        let from = first + written as i64 + 1;
        sqlx::query(
            "INSERT INTO recovery_task (dedup_key, handler, msg_value, status, attempts, finished_at) \
             SELECT 'bench:' || g, 'noop', convert_to(repeat('x', $3), 'UTF8'), \
                    CASE WHEN $4 THEN 'resolved' ELSE 'failed' END, \
                    CASE WHEN $4 THEN 1 ELSE 0 END, CASE WHEN $4 THEN now() END \
             FROM generate_series($1::bigint, $2::bigint) g",
        )
        .bind(from)
        .bind(from + chunk as i64 - 1)
        .bind(value_bytes as i32)
        .bind(finals)
        .execute(store.pool())
        .await?;
        written += chunk;
    }
    Ok(())
}

/// Drains `tasks` due tasks with `members` fleets, each with its own pool, sampling the
/// server as it goes; stops them once that many were resolved.
async fn drain_with(
    settings: &Settings,
    store: &Store,
    options: &ScaleBenchOptions,
    members: u32,
    tasks: u64,
) -> anyhow::Result<Drained> {
    let mut fleets = Vec::new();
    for _ in 0..members {
        let member_store = Store::connect(&settings.database).await?;
        fleets.push((
            bench_fleet(settings, options.batch, options.batch * 4)?,
            member_store,
        ));
    }
    let resolved: Vec<_> = fleets
        .iter()
        .map(|(fleet, _)| {
            fleet
                .metrics()
                .attempts
                .with_label_values(&["noop", "resolved"])
        })
        .collect();
    let profile = statements::Profile::reset(store).await;
    let before = server::ServerCounters::read(store).await?;
    let cpu_before = CpuTimes::now();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running: Vec<_> = fleets
        .into_iter()
        .map(|(fleet, member_store)| {
            tokio::spawn(fleet.run_with_store(member_store, shutdown.clone()))
        })
        .collect();
    let sampling = CancellationToken::new();
    let sampler = tokio::spawn(sample_activity(store.clone(), sampling.clone()));
    let done = || resolved.iter().map(|c| c.get()).sum::<u64>();
    // The rate counts from the first task resolved: a member's start (its pools, its
    // listener, its first claim) is no part of what a drain costs at this size, and on a
    // small backlog it would be most of the time measured.
    let mut first_resolved: Option<(Instant, u64)> = None;
    while done() < tasks {
        ensure!(
            started.elapsed() < DRAIN_LIMIT,
            "the drain took over {DRAIN_LIMIT:?} ({} of {tasks} resolved)",
            done()
        );
        if first_resolved.is_none() && done() > 0 {
            first_resolved = Some((Instant::now(), done()));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (from, resolved_before) = first_resolved.unwrap_or((started, 0));
    let per_s = (tasks - resolved_before) as f64 / from.elapsed().as_secs_f64();
    let cpu = CpuTimes::now().zip(cpu_before).map(|(after, before)| {
        let used = after.since(before);
        CpuTimes {
            this_process: used.this_process / elapsed,
            postgres: used.postgres / elapsed,
        }
    });
    sampling.cancel();
    let activity = sampler.await??;
    shutdown.cancel();
    for member in running {
        member.await??;
    }
    let server = server::ServerCounters::read(store)
        .await?
        .per_task_since(&before, tasks as usize);
    let statements = match profile {
        Some(profile) => Some(profile.read(store, 4).await?),
        None => None,
    };
    Ok(Drained {
        tasks,
        per_s,
        connections: activity.connections,
        waiting: activity.waiting(),
        cpu,
        server,
        statements,
    })
}

/// Backends of the database sampled during a drain.
#[derive(Default)]
struct Activity {
    samples: u32,
    connections: i64,
    waiting_sum: [i64; 3],
}

impl Activity {
    fn waiting(&self) -> [f64; 3] {
        let n = f64::from(self.samples.max(1));
        self.waiting_sum.map(|sum| sum as f64 / n)
    }
}

/// Samples `pg_stat_activity` every [`ACTIVITY_SAMPLE_EVERY`] until `stop`.
async fn sample_activity(store: Store, stop: CancellationToken) -> anyhow::Result<Activity> {
    let mut activity = Activity::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(activity),
            _ = tokio::time::sleep(ACTIVITY_SAMPLE_EVERY) => {}
        }
        let (connections, lock, lwlock, io): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock'), \
                    count(*) FILTER (WHERE wait_event_type = 'LWLock'), \
                    count(*) FILTER (WHERE wait_event_type = 'IO') \
             FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(store.pool())
        .await?;
        activity.samples += 1;
        activity.connections = activity.connections.max(connections);
        for (sum, value) in activity.waiting_sum.iter_mut().zip([lock, lwlock, io]) {
            *sum += value;
        }
    }
}

/// Every task resolved during the drain has exactly one resolved attempt (the `finals`
/// filled as resolved have none): fails loudly otherwise. Answers how many there are.
async fn every_resolution_once(store: &Store, finals: u64) -> anyhow::Result<i64> {
    let resolved = store.status_counts().await?.resolved - finals as i64;
    let (resolutions, twice): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) - count(DISTINCT task_id) FROM recovery_attempt WHERE outcome = 'resolved'",
    )
    .fetch_one(store.pool())
    .await?;
    ensure!(
        resolutions == resolved && twice == 0,
        "{resolved} tasks resolved by the drain, but {resolutions} resolved attempts, {twice} of them a second resolution"
    );
    Ok(resolved)
}

/// A count as people write it: 10k, 1M, 2.5M.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 100_000 == 0 => trim(n as f64 / 1e6, "M"),
        n if n >= 1_000 && n % 100 == 0 => trim(n as f64 / 1e3, "k"),
        n => n.to_string(),
    }
}

fn trim(value: f64, unit: &str) -> String {
    let text = format!("{value:.1}");
    format!("{}{unit}", text.strip_suffix(".0").unwrap_or(&text))
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_are_written_as_people_write_them() {
        assert_eq!(count(10_000), "10k");
        assert_eq!(count(1_000_000), "1M");
        assert_eq!(count(2_500_000), "2.5M");
        assert_eq!(count(12_345), "12345");
        assert_eq!(count(999), "999");
    }
}
