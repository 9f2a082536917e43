//! The drain figure of `redrive bench console --what-broke-only`, on its seeded store: a
//! fleet's drain beside an operator who groups and searches, against the same drain
//! alone (rotating rounds). The groups and search latency is timed with the list's
//! (`super::console`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::median;
use crate::config::Settings;
use crate::operations::{FilterParams, GroupParams, Operations, PageRequest};
use crate::output::outln;
use crate::store::Store;

/// How an operator uses the console beside the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    /// No console.
    None,
    /// As at 3 a.m.: the overview open (its "What broke" refreshed every 5 s, as the
    /// console does) and an operator grouping by class or searching every 2 s, on one
    /// clock for the whole benchmark: a drain starts at whatever point of that cycle the
    /// console is, as beside a console open all along (not with both at once).
    Paced,
    /// The worst case: groups and searches back to back, one after another.
    BackToBack,
}

/// Drains `drain_tasks` noop tasks alone, beside a paced console and beside back-to-back
/// requests, `rounds` times each (the order rotating); prints each drain (and whether the
/// task table was vacuumed meanwhile), each round's own ratio, the medians and ratios.
pub(super) async fn drain_beside_console(
    settings: &Settings,
    store: &Store,
    operations: &Operations,
    drain_tasks: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    outln!(
        "drain of {drain_tasks} tasks (batch 100, concurrency 400) alone, beside a console in \
         use (What broke refreshed every 5 s, a grouping or search every 2 s, on one clock \
         for the whole run) and beside groupings and searches back to back; {rounds} \
         round(s), medians shown:"
    );
    // One drain first, not counted: the first after seeding and vacuuming ran at a
    // quarter of the rest in every round measured (cold caches, autovacuum at work),
    // whichever use it was beside.
    seed_noop(store, drain_tasks).await?;
    let warm = super::drain_noop(settings, store, drain_tasks, 100, 400).await?;
    outln!("  warm-up drain (not counted):           {warm:>8.0} tasks/s");
    let uses = [Use::None, Use::Paced, Use::BackToBack];
    // The paced console's clock: its turns are seconds since this instant.
    let console_clock = std::time::Instant::now();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); uses.len()];
    // Each round's drain beside a console in use against its drain alone, minutes apart
    // at most: a pair that the drift of a long run (autovacuum of the store, the
    // server's caches) touches alike.
    let mut paired = Vec::new();
    for round in 0..rounds {
        for turn in 0..uses.len() {
            let which = (turn + round) % uses.len();
            let usage = uses[which];
            seed_noop(store, drain_tasks).await?;
            let vacuums_before = vacuums(store).await?;
            let stop = Arc::new(AtomicBool::new(false));
            let answered = Arc::new(AtomicU64::new(0));
            let operator = use_console(
                operations,
                usage,
                console_clock,
                stop.clone(),
                answered.clone(),
            );
            let drain = async {
                let rate = super::drain_noop(settings, store, drain_tasks, 100, 400).await;
                stop.store(true, Ordering::SeqCst);
                rate
            };
            let (rate, used) = tokio::join!(drain, operator);
            let (rate, seconds) = (rate?, used?);
            let per_second = answered.load(Ordering::SeqCst) as f64 / seconds.max(1e-3);
            let vacuums_after = vacuums(store).await?;
            let vacuumed = match vacuums_before.2 || vacuums_after != vacuums_before {
                true => ", the task table vacuumed meanwhile",
                false => "",
            };
            outln!(
                "  round {}: {:<30} {rate:>8.0} tasks/s ({per_second:.1} groupings/searches per \
                 s{vacuumed})",
                round + 1,
                match usage {
                    Use::None => "drain alone:",
                    Use::Paced => "beside a console in use:",
                    Use::BackToBack => "beside back-to-back requests:",
                }
            );
            rates[which].push(rate);
        }
        let ratio = rates[1][round] / rates[0][round];
        outln!(
            "  round {}: beside a console in use / alone: {ratio:.2}",
            round + 1
        );
        paired.push(ratio);
    }
    let alone = median(&rates[0]);
    let (paced, busy) = (median(&rates[1]), median(&rates[2]));
    outln!("  drain alone (median):                 {alone:>8.0} tasks/s");
    outln!(
        "  beside a console in use (median):     {paced:>8.0} tasks/s, ratio {:.2} (the goal is at least 0.90)",
        paced / alone
    );
    outln!(
        "  beside back-to-back requests (median): {busy:>7.0} tasks/s, ratio {:.2} (no goal: the worst case)",
        busy / alone
    );
    outln!(
        "  the rounds' own ratios, beside a console in use / alone (median): {:.2}",
        median(&paired)
    );
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

/// Uses the console as `usage` says until `stop`; answers how long it ran, counting each
/// grouping or search in `answered`. Paced, turn `n` is the second `n` after `clock`:
/// the first taken is the next to come.
async fn use_console(
    operations: &Operations,
    usage: Use,
    clock: std::time::Instant,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
) -> anyhow::Result<f64> {
    let started = std::time::Instant::now();
    let second = std::time::Duration::from_secs(1);
    let search = FilterParams {
        search: Some("customer-4242:order-".into()),
        ..FilterParams::default()
    };
    let by_class = GroupParams {
        by: Some("class".into()),
        ..GroupParams::default()
    };
    let mut turn = 0u64;
    if usage == Use::Paced {
        turn = (started.duration_since(clock).as_secs()) + 1;
        wait_until(
            clock + second * u32::try_from(turn).unwrap_or(u32::MAX),
            &stop,
        )
        .await;
    }
    while usage != Use::None && !stop.load(Ordering::SeqCst) {
        // Every turn is a second when paced: the overview every 5th, the operator every 2nd.
        let overview = usage == Use::BackToBack || turn % 5 == 0;
        let operator = usage == Use::BackToBack || turn % 2 == 0;
        if overview {
            operations
                .groups(&FilterParams::default(), &GroupParams::default())
                .await?;
            answered.fetch_add(1, Ordering::SeqCst);
        }
        if operator {
            match turn % 4 {
                0 | 1 => drop(
                    operations
                        .groups(&FilterParams::default(), &by_class)
                        .await?,
                ),
                _ => drop(operations.list(&search, &PageRequest::default()).await?),
            }
            answered.fetch_add(1, Ordering::SeqCst);
        }
        turn += 1;
        if usage == Use::Paced {
            wait_until(
                clock + second * u32::try_from(turn).unwrap_or(u32::MAX),
                &stop,
            )
            .await;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Sleeps until `until`, or until `stop` is set.
async fn wait_until(until: std::time::Instant, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
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
