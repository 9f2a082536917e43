//! The drain figure of `redrive bench console`, on its seeded store: a fleet's drain
//! beside the console in use over HTTP (its overview open, an operator grouping and
//! searching), against the same drain alone (one drain, windows alone and beside the
//! console in turn). The groups and search latency is timed with the list's
//! (`super::console`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::median;
use super::served::Browser;
use crate::config::Settings;
use crate::output::outln;
use crate::store::Store;

/// How an operator uses the console beside the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    /// No console.
    None,
    /// As at 3 a.m.: the console's overview open (its figures, What broke among them,
    /// refreshed every 5 s, as its page does) and an operator opening all causes by
    /// class or searching the task list every 2 s.
    Paced,
    /// The worst case: those pages back to back, one after another.
    BackToBack,
}

/// One fleet drains noop tasks for `2 + 4 × rounds + 1` windows of `window`, an inserter
/// keeping `backlog` of them due; the console is used in every other window (paced and
/// back to back in turn) and left alone in those between. Each window with the console
/// is judged against the mean of the two alone beside it, so that the slow drift of a
/// long run (autovacuum of the store, checkpoints, caches) touches both sides alike.
/// Prints every window, each round's ratios and their medians; answers how many drained
/// tasks the fleet resolved, for the check at the end.
pub(super) async fn drain_beside_console(
    settings: &Settings,
    store: &Store,
    browser: &Browser,
    backlog: usize,
    rounds: usize,
    window: Duration,
) -> anyhow::Result<u64> {
    outln!(
        "drain beside a console: one fleet (batch 100, concurrency 400) drains noop tasks, \
         {backlog} kept due by inserts, for windows of {} s: 2 alone to warm up, then \
         {rounds} round(s) of (alone, beside a console in use, alone, beside its pages \
         back to back) and one alone; a console in use is its overview open (figures \
         every 5 s) and all causes by class or a search every 2 s, over HTTP. Each window \
         beside the console is judged against the mean of the two alone around it:",
        window.as_secs_f64()
    );
    let fleet = super::bench_fleet(settings, 100, 400)?;
    let resolved = fleet
        .metrics()
        .attempts
        .with_label_values(&["noop", "resolved"]);
    let shutdown = CancellationToken::new();
    let feeding = tokio::spawn(keep_due(
        store.clone(),
        backlog,
        resolved.clone(),
        shutdown.clone(),
    ));
    let running = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    let mut schedule = vec![Use::None, Use::None];
    for _ in 0..rounds {
        schedule.extend([Use::None, Use::Paced, Use::None, Use::BackToBack]);
    }
    schedule.push(Use::None);
    let measured = measure_windows(store, browser, &schedule, window, || resolved.get()).await;
    shutdown.cancel();
    let fed = feeding.await?;
    running.await??;
    let windows = measured?;
    fed?;
    report(&windows[2..]);
    Ok(resolved.get())
}

/// One window of the drain: what the console did, the drain's rate, and whether the task
/// table was vacuumed meanwhile.
struct Window {
    usage: Use,
    rate: f64,
    vacuumed: bool,
}

/// Runs `schedule`, a window of `length` each, using the console as each says; reads the
/// drain's resolved count from `resolved` at each window's ends.
async fn measure_windows(
    store: &Store,
    browser: &Browser,
    schedule: &[Use],
    length: Duration,
    resolved: impl Fn() -> u64,
) -> anyhow::Result<Vec<Window>> {
    let whole_seconds = length.as_secs().max(1);
    let mut windows = Vec::with_capacity(schedule.len());
    for (index, &usage) in schedule.iter().enumerate() {
        let vacuums_before = vacuums(store).await?;
        let (started, before) = (Instant::now(), resolved());
        let stop = Arc::new(AtomicBool::new(false));
        let first_turn = index as u64 * whole_seconds;
        let operator = use_console(browser, usage, started, first_turn, stop.clone());
        let timer = async {
            tokio::time::sleep(length).await;
            stop.store(true, Ordering::SeqCst);
        };
        let (used, ()) = tokio::join!(operator, timer);
        used?;
        let rate = (resolved() - before) as f64 / started.elapsed().as_secs_f64();
        let vacuumed = vacuums_before.2 || vacuums(store).await? != vacuums_before;
        windows.push(Window {
            usage,
            rate,
            vacuumed,
        });
    }
    Ok(windows)
}

/// Prints `windows` (warm-up left out) in rounds, each beside-the-console window's ratio
/// to the mean of its neighbours alone, and the medians of those ratios.
fn report(windows: &[Window]) {
    let mut ratios: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for (index, window) in windows.iter().enumerate() {
        let flag = if window.vacuumed { ", vacuumed" } else { "" };
        let name = match window.usage {
            Use::None => "alone",
            Use::Paced => "beside a console in use",
            Use::BackToBack => "beside back-to-back requests",
        };
        let judged = match window.usage {
            Use::None => None,
            Use::Paced => Some(0),
            Use::BackToBack => Some(1),
        };
        let ratio = judged.and_then(|side| {
            let (before, after) = (windows.get(index.checked_sub(1)?)?, windows.get(index + 1)?);
            let ratio = window.rate / ((before.rate + after.rate) / 2.0);
            ratios[side].push(ratio);
            Some(ratio)
        });
        match ratio {
            Some(ratio) => outln!(
                "  window {:>2}: {name:<29} {:>8.0} tasks/s{flag}, {ratio:.2} of the alone beside it",
                index + 1,
                window.rate
            ),
            None => outln!("  window {:>2}: {name:<29} {:>8.0} tasks/s{flag}", index + 1, window.rate),
        }
    }
    let alone: Vec<f64> = windows
        .iter()
        .filter(|window| window.usage == Use::None)
        .map(|window| window.rate)
        .collect();
    outln!(
        "  drain alone (median):                 {:>8.0} tasks/s",
        median(&alone)
    );
    outln!(
        "  beside a console in use: {:.2} of the drain alone beside it (median of {}; the goal is at least 0.90)",
        median(&ratios[0]),
        ratios[0].len()
    );
    outln!(
        "  beside back-to-back requests: {:.2} of the drain alone beside it (median of {}; no goal: the worst case)",
        median(&ratios[1]),
        ratios[1].len()
    );
    let vacuumed = windows.iter().filter(|window| window.vacuumed).count();
    outln!(
        "  the task table was vacuumed during {vacuumed} of the {} windows",
        windows.len()
    );
}

/// Keeps about `backlog` drained tasks due until `shutdown`: inserts a quarter of it each
/// time fewer are left than `backlog` (inserted so far less `resolved`).
async fn keep_due(
    store: Store,
    backlog: usize,
    resolved: prometheus::IntCounter,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let chunk = backlog.div_ceil(4);
    let mut inserted = 0u64;
    while !shutdown.is_cancelled() {
        if inserted.saturating_sub(resolved.get()) < backlog as u64 {
            seed_noop(&store, chunk).await?;
            inserted += chunk as u64;
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(())
}

/// What PostgreSQL has done to the task table's upkeep so far: vacuums and analyzes
/// ended (by autovacuum or by hand), and whether a vacuum runs now. Two readings differ,
/// or the first finds one running, when the table was vacuumed or analyzed between them.
async fn vacuums(store: &Store) -> anyhow::Result<(i64, i64, bool)> {
    let (ended, analyzed, running) = sqlx::query_as(
        "SELECT coalesce(s.vacuum_count + s.autovacuum_count, 0), \
                coalesce(s.analyze_count + s.autoanalyze_count, 0), \
                EXISTS (SELECT 1 FROM pg_stat_progress_vacuum p \
                        WHERE p.relid = 'recovery_task'::regclass) \
         FROM pg_stat_user_tables s WHERE s.relid = 'recovery_task'::regclass",
    )
    .fetch_one(store.pool())
    .await?;
    Ok((ended, analyzed, running))
}

/// Uses the console over HTTP as `usage` says until `stop`, counting from `started`.
/// Paced, turn `n` of the run is the second `n - first_turn` after `started`: the
/// overview's figures every 5th (what its page's script asks for while it is open), the
/// operator every 2nd (all causes by class, and a search of the task list, in turn).
async fn use_console(
    browser: &Browser,
    usage: Use,
    started: Instant,
    first_turn: u64,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut turn = first_turn;
    while usage != Use::None && !stop.load(Ordering::SeqCst) {
        let overview = usage == Use::BackToBack || turn % 5 == 0;
        let operator = usage == Use::BackToBack || turn % 2 == 0;
        if overview {
            browser.open("/console/live/overview").await?;
        }
        if operator {
            match turn % 4 {
                0 | 1 => browser.open("/console/causes?by=class&since=all").await?,
                _ => (browser.open("/console/tasks?search=customer-4242%3Aorder-")).await?,
            }
        }
        turn += 1;
        if usage == Use::Paced {
            let seconds = u32::try_from(turn - first_turn).unwrap_or(u32::MAX);
            wait_until(started + Duration::from_secs(1) * seconds, &stop).await;
        }
    }
    Ok(())
}

/// Sleeps until `until`, or until `stop` is set.
async fn wait_until(until: Instant, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fails unless every noop task stored after `last_seeded` was either resolved by one
/// attempt (`resolved` of them, as the fleet counted) or never attempted (the backlog
/// left due when the drain stopped).
pub(super) async fn check_drained(
    store: &Store,
    last_seeded: i64,
    resolved: u64,
) -> anyhow::Result<()> {
    let (total, resolved_once, untouched): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE status = 'resolved' AND attempts = 1
                    AND (SELECT count(*) FROM recovery_attempt a WHERE a.task_id = t.id) = 1
                    AND EXISTS (SELECT 1 FROM recovery_attempt a
                                WHERE a.task_id = t.id AND a.outcome = 'resolved')),
                count(*) FILTER (WHERE status = 'failed' AND attempts = 0
                    AND NOT EXISTS (SELECT 1 FROM recovery_attempt a WHERE a.task_id = t.id))
         FROM recovery_task t WHERE id > $1 AND handler = 'noop'",
    )
    .bind(last_seeded)
    .fetch_one(store.pool())
    .await?;
    anyhow::ensure!(
        resolved_once == resolved as i64 && resolved_once + untouched == total,
        "of {total} drained tasks {resolved_once} were resolved by exactly one attempt \
         (the fleet counted {resolved}) and {untouched} never attempted"
    );
    outln!(
        "  checked: {resolved} drained tasks resolved exactly once, {untouched} left due \
         untouched"
    );
    Ok(())
}

/// Inserts `count` unattempted noop tasks due now, by SQL.
async fn seed_noop(store: &Store, count: usize) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_key, msg_value) \
         SELECT 'noop', convert_to('k' || i, 'UTF8'), convert_to(repeat('x', 256), 'UTF8') \
         FROM generate_series(1, $1) i",
    )
    .bind(count as i64)
    .execute(store.pool())
    .await?;
    Ok(())
}
