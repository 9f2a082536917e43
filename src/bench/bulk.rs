//! The second figure of `redrive bench console`: a bulk action by filter over a large
//! selection, through the operations layer (as the API, the CLI and the console run it)
//! with its progress printed, while a fleet drains a backlog of its own; against the same
//! drain with no bulk action, in interleaved rounds.

use clap::Args;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{bench_fleet, drop_schema, fresh_store, median};
use crate::admin;
use crate::config::{Role, Settings};
use crate::operations::{ActRequest, Actor, FilterParams, Operations, Verb};
use crate::output::outln;
use crate::store::{ActionReport, Store};

/// Options of the bulk action beside a drain.
#[derive(Debug, Clone, Args)]
pub struct BulkBenchOptions {
    /// Tasks the bulk action selects by filter (one handler no member serves).
    #[arg(long, default_value_t = 1_000_000, value_parser = super::at_least_one())]
    pub bulk_tasks: usize,
    /// Tasks the fleet drains per measurement (enqueued before each); in `console`'s drain
    /// beside the console, the backlog kept due while it drains.
    #[arg(long, default_value_t = 50_000, value_parser = super::at_least_one())]
    pub drain_tasks: usize,
    /// Rounds of (drain alone, drain beside the bulk action); the medians are reported.
    #[arg(long, default_value_t = 3, value_parser = super::at_least_one())]
    pub rounds: usize,
}

/// The handler of the tasks the bulk action works on.
const BULK_HANDLER: &str = "idle";

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
    Ok(())
}

/// Runs the measurement and prints its figures.
pub async fn run(settings: &Settings, options: &BulkBenchOptions) -> anyhow::Result<()> {
    let store = fresh_store(settings).await?;
    // Due tomorrow, as the bulk retries keep them: due tasks of a handler no member
    // serves would lie in every claim's path (see docs/operating.md).
    seed(&store, BULK_HANDLER, options.bulk_tasks, 1).await?;
    sqlx::query("ANALYZE recovery_task")
        .execute(store.pool())
        .await?;
    // The operations over the API's own pool, as `redrive run` builds them.
    let operations = bench_fleet(settings, 100, 400)?
        .operations(admin::api_store(&settings.database, &settings.admin)?);
    outln!(
        "bulk action by filter (handler={BULK_HANDLER}) over {} tasks through the operations \
         layer, beside a fleet (batch 100, concurrency 400) draining {} tasks; {} interleaved \
         round(s), medians shown:",
        options.bulk_tasks,
        options.drain_tasks,
        options.rounds
    );
    let (mut alone, mut beside, mut bulk_rates) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..options.rounds {
        // Alternate which goes first, so neither always meets the other's leftovers.
        let verb = if round % 2 == 0 {
            Verb::Discard
        } else {
            Verb::Retry
        };
        for with_bulk in [round % 2 == 1, round % 2 == 0] {
            if with_bulk {
                let (drain_rate, bulk_rate) =
                    drain_beside_bulk(settings, &store, &operations, options, verb).await?;
                outln!(
                    "  round {}: drain beside the bulk {}: {drain_rate:>8.0} tasks/s (bulk {bulk_rate:.0} tasks/s)",
                    round + 1,
                    verb_name(verb)
                );
                beside.push(drain_rate);
                bulk_rates.push(bulk_rate);
            } else {
                let rate = drain(settings, &store, options).await?;
                outln!("  round {}: drain alone:  {rate:>8.0} tasks/s", round + 1);
                alone.push(rate);
            }
        }
    }
    let (alone, beside) = (median(&alone), median(&beside));
    outln!("  drain alone (median):        {alone:>8.0} tasks/s");
    outln!("  drain beside bulk (median):  {beside:>8.0} tasks/s");
    outln!(
        "  bulk action (median):        {:>8.0} tasks/s",
        median(&bulk_rates)
    );
    outln!("  ratio {:.2} (the goal is at least 0.80)", beside / alone);
    verify(&store, options).await?;
    drop_schema(&store).await?;
    Ok(())
}

fn verb_name(verb: Verb) -> &'static str {
    match verb {
        Verb::Retry => "retry",
        Verb::Discard => "discard",
        Verb::Resolve => "resolve",
    }
}

/// Enqueues `drain_tasks` noop tasks due now and drains them with a fresh fleet;
/// answers tasks per second from the fleet's start to the last one resolved.
async fn drain(
    settings: &Settings,
    store: &Store,
    options: &BulkBenchOptions,
) -> anyhow::Result<f64> {
    seed(store, "noop", options.drain_tasks, 0).await?;
    super::drain_noop(settings, store, options.drain_tasks, 100, 400).await
}

/// Starts `verb` on every task of [`BULK_HANDLER`] through `operations`, printing its
/// progress about once a second; once its first batch has committed, measures [`drain`]
/// beside it. Fails if the bulk action ended before the drain did (the drain would not
/// have been measured beside it). Answers the drain's rate and the bulk action's.
async fn drain_beside_bulk(
    settings: &Settings,
    store: &Store,
    operations: &Operations,
    options: &BulkBenchOptions,
    verb: Verb,
) -> anyhow::Result<(f64, f64)> {
    let actor = Actor {
        name: "bench".into(),
        role: Role::Operate,
    };
    let request = ActRequest {
        filter: Some(FilterParams {
            handler: Some(BULK_HANDLER.into()),
            ..FilterParams::default()
        }),
        reason: Some("bench console: bulk action beside a drain".into()),
        at: (verb == Verb::Retry).then(|| "1d".to_owned()),
        ..ActRequest::default()
    };
    let selected = options.bulk_tasks as i64;
    let started_batches = Arc::new(tokio::sync::Notify::new());
    let ended = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let (mut last_line, mut changed_then) = (Instant::now(), 0);
    let first_batch = started_batches.clone();
    let progress = move |report: ActionReport| {
        first_batch.notify_one();
        if last_line.elapsed() >= Duration::from_secs(1) || report.changed == selected {
            let rate = (report.changed - changed_then) as f64 / last_line.elapsed().as_secs_f64();
            (last_line, changed_then) = (Instant::now(), report.changed);
            outln!(
                "    {} progress: {} of {selected} changed, {} left alone, {rate:.0} tasks/s \
                 since the last line",
                verb_name(verb),
                report.changed,
                report.refused
            );
        }
    };
    let bulk = async {
        let answer = operations.act(&actor, verb, &request, progress).await;
        ended.store(true, Ordering::SeqCst);
        // Wakes a drain still waiting for the first batch: an action that failed before
        // it (the database refusing connections) would otherwise leave it waiting for ever.
        started_batches.notify_one();
        answer
    };
    let measured = async {
        started_batches.notified().await;
        anyhow::ensure!(
            !ended.load(Ordering::SeqCst),
            "the bulk action ended before the drain began"
        );
        let rate = drain(settings, store, options).await?;
        anyhow::ensure!(
            !ended.load(Ordering::SeqCst),
            "the bulk action ended before the drain did: give it more tasks (--bulk-tasks) \
             or the drain fewer (--drain-tasks)"
        );
        Ok(rate)
    };
    let (answer, rate) = tokio::join!(bulk, measured);
    let answer = answer?;
    let bulk_rate = answer.changed as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(
        answer.matched == selected && answer.changed == selected && answer.refused == 0,
        "the bulk {} matched {}, changed {} and left {} alone of {selected}",
        verb_name(verb),
        answer.matched,
        answer.changed,
        answer.refused
    );
    Ok((rate?, bulk_rate))
}

/// Fails unless every drained task was resolved exactly once and every bulk task is in
/// the status the last bulk action left, with one history row per bulk action.
async fn verify(store: &Store, options: &BulkBenchOptions) -> anyhow::Result<()> {
    let drained = (2 * options.rounds * options.drain_tasks) as i64;
    let (resolved, resolved_once, other): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'resolved'),
                count(*) FILTER (WHERE status = 'resolved' AND (SELECT count(*)
                    FROM recovery_attempt a WHERE a.task_id = t.id) = 1
                    AND EXISTS (SELECT 1 FROM recovery_attempt a
                                WHERE a.task_id = t.id AND a.outcome = 'resolved')),
                count(*) FILTER (WHERE status <> 'resolved')
         FROM recovery_task t WHERE handler = 'noop'",
    )
    .fetch_one(store.pool())
    .await?;
    anyhow::ensure!(
        resolved == drained && resolved_once == drained && other == 0,
        "of {drained} drained tasks {resolved} resolved, {resolved_once} with exactly one \
         attempt, {other} not resolved"
    );
    let last = if (options.rounds - 1) % 2 == 0 {
        "discarded"
    } else {
        "failed"
    };
    let (in_status, with_history, total): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = $2),
                count(*) FILTER (WHERE (SELECT count(*) FROM recovery_attempt a
                    WHERE a.task_id = t.id AND a.outcome LIKE 'operator_%') = $3
                    AND NOT EXISTS (SELECT 1 FROM recovery_attempt a
                    WHERE a.task_id = t.id AND a.outcome NOT LIKE 'operator_%')),
                count(*)
         FROM recovery_task t WHERE handler = $1",
    )
    .bind(BULK_HANDLER)
    .bind(last)
    .bind(options.rounds as i64)
    .fetch_one(store.pool())
    .await?;
    let bulk = options.bulk_tasks as i64;
    anyhow::ensure!(
        in_status == bulk && with_history == bulk && total == bulk,
        "of {bulk} bulk tasks ({total} found) {in_status} are {last} and {with_history} have \
         exactly {} operator history rows and no other",
        options.rounds
    );
    outln!(
        "  checked: {drained} drained tasks resolved exactly once; {bulk} bulk tasks {last}, \
         one history row per bulk action"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: after PostgreSQL refused connections for a while, `bench console`
    /// waited for ever after "drain alone": its bulk action failed before its first
    /// batch, and the drain beside it waited for that batch.
    #[tokio::test]
    async fn a_bulk_action_that_fails_before_its_first_batch_ends_the_round_with_its_error() {
        let settings = Settings::default();
        let store = Store::unreachable_for_test();
        let fleet = crate::Fleet::builder(settings.clone())
            .with_builtin_handlers()
            .without_parking()
            .build()
            .unwrap();
        let operations = fleet.operations(store.clone());
        let options = BulkBenchOptions {
            bulk_tasks: 10,
            drain_tasks: 10,
            rounds: 1,
        };
        let round = drain_beside_bulk(&settings, &store, &operations, &options, Verb::Discard);
        let outcome = tokio::time::timeout(Duration::from_secs(120), round)
            .await
            .expect("the round ends once its bulk action failed");
        assert!(outcome.is_err(), "{outcome:?}");
    }
}
