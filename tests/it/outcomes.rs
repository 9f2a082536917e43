//! The vocabulary of attempt outcomes: the history's `CHECK` lists exactly the values
//! of `AttemptOutcome`, an upgraded history is mapped onto it, and an attempt that ends
//! its task without a call is told apart by its outcome, not by its error text.

use async_trait::async_trait;
use redrive::task::AttemptOutcome;
use redrive::{Fleet, Handler, HandlerContext, HandlerError, NewTask, Status, Store, Task};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::fresh_store;

/// The attempt-outcome migration, run again by the upgrade tests.
const MIGRATION: &str = include_str!("../../migrations/20261129000100_attempt_outcomes.sql");

/// The values the history's outcome `CHECK` allows, read from its definition.
async fn allowed_outcomes(store: &Store) -> BTreeSet<String> {
    let definition: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE conname = 'recovery_attempt_outcome_known' \
           AND conrelid = 'recovery_attempt'::regclass",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    // CHECK ((outcome = ANY (ARRAY['resolved'::text, 'retry'::text, ...])))
    definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_history_check_lists_exactly_the_attempt_outcomes() {
    let (store, _) = fresh_store().await;
    let known: BTreeSet<String> = AttemptOutcome::ALL
        .iter()
        .map(|o| o.as_str().to_owned())
        .collect();
    assert_eq!(allowed_outcomes(&store).await, known);
}

async fn insert_attempt(store: &Store, outcome: &str, error: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO recovery_attempt \
         VALUES (1, (SELECT count(*) FROM recovery_attempt), 1, 'w', now(), 1, $1, $2)",
    )
    .bind(outcome)
    .bind(error)
    .execute(store.pool())
    .await
    .map(drop)
}

#[tokio::test]
async fn the_history_refuses_an_unknown_outcome() {
    let (store, _) = fresh_store().await;
    let refused = insert_attempt(&store, "operator_", "x").await.unwrap_err();
    let code = refused.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("23514"), "{refused}");
    for outcome in AttemptOutcome::ALL {
        insert_attempt(&store, outcome.as_str(), "x").await.unwrap();
    }
}

/// A history written before the vocabulary: an unrun end ("no attempts left", written
/// `permanent_failure`) becomes `not_called`; an outcome no version wrote stops the
/// migration, named.
#[tokio::test]
async fn an_upgraded_history_is_mapped_onto_the_vocabulary() {
    let (store, _) = fresh_store().await;
    let drop_check = "ALTER TABLE recovery_attempt DROP CONSTRAINT recovery_attempt_outcome_known";
    sqlx::raw_sql(drop_check)
        .execute(store.pool())
        .await
        .unwrap();
    let unrun = "no attempts left: attempt 4 exceeds max attempts 3";
    insert_attempt(&store, "permanent_failure", unrun)
        .await
        .unwrap();
    insert_attempt(&store, "permanent_failure", "bad request")
        .await
        .unwrap();
    insert_attempt(&store, "operator_retry", "").await.unwrap();
    sqlx::raw_sql(MIGRATION)
        .execute(store.pool())
        .await
        .unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT outcome, error FROM recovery_attempt ORDER BY lease_version")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            ("not_called".to_owned(), unrun.to_owned()),
            ("permanent_failure".to_owned(), "bad request".to_owned()),
            ("operator_retry".to_owned(), String::new()),
        ]
    );

    sqlx::raw_sql(drop_check)
        .execute(store.pool())
        .await
        .unwrap();
    insert_attempt(&store, "handwritten", "").await.unwrap();
    let refused = sqlx::raw_sql(MIGRATION)
        .execute(store.pool())
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("'handwritten'"), "{refused}");
}

/// Counts its calls and fails each; a budget of one attempt.
struct OneShot(Arc<AtomicUsize>);

#[async_trait]
impl Handler for OneShot {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::transient("down"))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(1)
    }
}

/// An attempt past the budget ends its task unrun, recorded `not_called` with its
/// reason, and the check accepts it; a call past the budget is found whatever its error
/// says (the check no longer reads error texts).
#[tokio::test]
async fn an_unrun_end_is_not_called_and_the_check_tells_it_by_its_outcome() {
    let (store, settings) = fresh_store().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let fleet = Fleet::builder(settings)
        .handler("one", OneShot(calls.clone()))
        .build()
        .unwrap();
    let unrun = store
        .enqueue(&NewTask::new("one", "unrun"))
        .await
        .unwrap()
        .id();
    // The only attempt's member dies: its lease lapses at once.
    let handlers = ["one".to_owned()];
    let lost = store
        .claim(&handlers, 1, "dead", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(lost.iter().map(|t| t.id).collect::<Vec<_>>(), [unrun]);
    let pool = fleet.worker_pool(store.clone());
    let processed = pool.process_next().await.unwrap().unwrap();
    assert_eq!(processed.id, unrun);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler was not called"
    );
    let task = store.get(unrun).await.unwrap().unwrap();
    assert_eq!(task.status, Status::PermanentFailure);
    assert!(
        (task.last_error.as_deref()).is_some_and(|e| e.starts_with("no attempts left")),
        "{:?}",
        task.last_error
    );
    let history: Vec<(i32, String)> = sqlx::query_as(
        "SELECT attempt, outcome FROM recovery_attempt WHERE task_id = $1 ORDER BY attempt",
    )
    .bind(unrun.0)
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        history,
        [
            (1, "lease_expired".to_owned()),
            (2, "not_called".to_owned())
        ]
    );

    // A call past the budget, its error made to read like an unrun end.
    let forged = store
        .enqueue(&NewTask::new("one", "forged"))
        .await
        .unwrap()
        .id();
    sqlx::raw_sql(&format!(
        "UPDATE recovery_task SET status = 'permanent_failure', attempts = 2, \
             finished_at = now() WHERE id = {id}; \
         INSERT INTO recovery_attempt VALUES \
             ({id}, 1, 1, 'w', now(), 1, 'retry', 'down'), \
             ({id}, 2, 2, 'w', now(), 1, 'permanent_failure', 'no attempts left: forged')",
        id = forged.0
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let found: Vec<_> = (store.check(&fleet.budgets()).await.unwrap().violations)
        .into_iter()
        .map(|v| (v.kind, v.task_id, v.detail))
        .collect();
    assert_eq!(
        found,
        [(
            "attempts_over_budget".to_owned(),
            forged,
            "handler called on attempt 2 of 1 allowed".to_owned()
        )]
    );
}

/// A handler whose outcome follows its task's value: resolved, retry or given up.
struct Mixed;

#[async_trait]
impl Handler for Mixed {
    async fn handle(&self, _: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        match task.failure.value.as_deref().map(|v| v.len() % 3) {
            Some(0) => Ok(()),
            Some(1) => Err(HandlerError::transient("down")),
            _ => Err(HandlerError::permanent("bad")),
        }
    }
}

/// The history rows per minute of their start and outcome, counted from the rows.
async fn history_by_minute(store: &Store) -> BTreeSet<(String, String, i64)> {
    sqlx::query_as(
        "SELECT date_trunc('minute', started_at)::text, outcome, count(*) \
         FROM recovery_attempt GROUP BY 1, 2",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// The same as the trigger counted them.
async fn counted_by_minute(store: &Store) -> BTreeSet<(String, String, i64)> {
    sqlx::query_as(
        "SELECT minute::text, outcome, sum(attempts)::bigint FROM recovery_outcome_minute \
         GROUP BY 1, 2",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// The console's chart and the last hour's outcomes read per-minute counts the history's
/// trigger keeps. Every way a history row is written counts, exactly once: an attempt's
/// finish, a lease that lapsed found by a claim, an operator's action, and rows written
/// by hand from eight connections at once, with start times hours back, ahead of the
/// clock and infinite; a rolled-back write counts nothing. The chart equals a count of
/// the rows, and the sample's turn keeps two hours.
#[tokio::test]
async fn the_minute_counts_equal_every_history_row_however_it_was_written() {
    let (store, settings) = fresh_store().await;
    let fleet = Fleet::builder(settings)
        .handler("mixed", Mixed)
        .build()
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..60 {
        let task = store
            .enqueue(&NewTask::new("mixed", "v".repeat(1 + i % 7)))
            .await
            .unwrap();
        ids.push(task.id());
    }
    // Five leases lapse at once: the next claim writes them `lease_expired`.
    let handlers = ["mixed".to_owned()];
    store
        .claim(&handlers, 5, "dead", Duration::ZERO)
        .await
        .unwrap();
    let pool = fleet.worker_pool(store.clone());
    while pool.process_next().await.unwrap().is_some() {}
    let operator = redrive::store::Operator {
        actor: "ops".into(),
        reason: None,
    };
    let unfinished = redrive::store::Selection::Ids(ids.clone());
    let retry = redrive::store::Action::Retry {
        at: None,
        budget: redrive::store::Budget::Fresh,
        force: false,
    };
    for action in [retry, redrive::store::Action::Discard] {
        store.act(&operator, &action, &unfinished).await.unwrap();
    }

    let mut writers = Vec::new();
    for writer in 0..8i64 {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            for batch in 0..15i64 {
                let mut tx = store.pool().begin().await.unwrap();
                sqlx::query(
                    "INSERT INTO recovery_attempt \
                     SELECT 1000000 + $1, $1 * 10000 + $2 * 100 + i, 1, 'w', \
                            CASE i % 5 WHEN 0 THEN now() - i * interval '7 minutes' \
                                       WHEN 1 THEN now() + interval '10 minutes' \
                                       WHEN 2 THEN 'infinity' \
                                       ELSE now() - interval '3 hours' END, \
                            1, (ARRAY['resolved','retry','fenced'])[1 + i % 3], NULL \
                     FROM generate_series(1, 1 + ($1 + $2) % 40) i",
                )
                .bind(writer)
                .bind(batch)
                .execute(&mut *tx)
                .await
                .unwrap();
                if batch % 3 == 2 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let outcomes: BTreeSet<String> = history_by_minute(&store)
        .await
        .into_iter()
        .map(|(_, outcome, _)| outcome)
        .collect();
    for written in [
        "resolved",
        "retry",
        "permanent_failure",
        "lease_expired",
        "fenced",
    ] {
        assert!(
            outcomes.contains(written),
            "no {written} row among {outcomes:?}"
        );
    }
    assert!(
        outcomes.iter().any(|o| o.starts_with("operator_")),
        "{outcomes:?}"
    );
    assert_eq!(
        counted_by_minute(&store).await,
        history_by_minute(&store).await
    );

    // The chart and the last hour, against the rows.
    let chart: BTreeSet<(i32, String, i64)> = (store.outcome_minutes().await.unwrap())
        .into_iter()
        .map(|m| (m.minutes_ago, m.outcome, m.count))
        .collect();
    let rows: BTreeSet<(i32, String, i64)> = sqlx::query_as(
        "SELECT greatest(floor(extract(epoch FROM date_trunc('minute', now()) \
                                 - date_trunc('minute', started_at)) / 60), 0)::int, \
                outcome, count(*) \
         FROM recovery_attempt \
         WHERE date_trunc('minute', started_at) > now() - interval '1 hour' \
           AND started_at < now() + interval '1 hour' \
         GROUP BY 1, 2",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(chart, rows);
    let mut by_outcome = std::collections::BTreeMap::<String, i64>::new();
    for (_, outcome, count) in &rows {
        *by_outcome.entry(outcome.clone()).or_default() += count;
    }
    let last_hour: std::collections::BTreeMap<String, i64> = (store.stats().await.unwrap())
        .last_hour
        .into_iter()
        .map(|o| (o.outcome, o.count))
        .collect();
    assert_eq!(last_hour, by_outcome);

    // A sampling turn keeps the last two hours, and no infinite minute.
    store.sample_figures(Duration::ZERO).await.unwrap();
    let kept: Vec<(String, String, i64)> = counted_by_minute(&store).await.into_iter().collect();
    let expected: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT date_trunc('minute', started_at)::text, outcome, count(*) FROM recovery_attempt \
         WHERE isfinite(started_at) \
           AND date_trunc('minute', started_at) >= now() - interval '2 hours' \
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(kept, expected_sorted);
}

/// Found by an attack: the counting trigger named its table without a schema, so a row
/// written by a session of another search_path (psql, a data-only restore, which empties
/// it) was refused, or counted in another install's table. It counts in its own.
#[tokio::test]
async fn a_row_written_under_another_search_path_counts_in_its_own_schema() {
    let (store, settings) = fresh_store().await;
    let schema = settings.database.schema.clone();
    let mut connection = store.pool().acquire().await.unwrap();
    let own: String = sqlx::query_scalar("SHOW search_path")
        .fetch_one(&mut *connection)
        .await
        .unwrap();
    for path in ["''", "public", "pg_catalog"] {
        sqlx::query(&format!("SET search_path = {path}"))
            .execute(&mut *connection)
            .await
            .unwrap();
        sqlx::query(&format!(
            "INSERT INTO \"{schema}\".recovery_attempt \
             VALUES (7, (SELECT count(*) FROM \"{schema}\".recovery_attempt), 1, 'hand', \
                     now(), 1, 'resolved', NULL)"
        ))
        .execute(&mut *connection)
        .await
        .unwrap_or_else(|e| panic!("search_path {path}: {e}"));
    }
    sqlx::query(&format!("SET search_path = {own}"))
        .execute(&mut *connection)
        .await
        .unwrap();
    drop(connection);
    assert_eq!(
        counted_by_minute(&store).await,
        history_by_minute(&store).await
    );
    assert_eq!(
        crate::support::scalar(
            &store,
            "SELECT sum(attempts)::bigint FROM recovery_outcome_minute"
        )
        .await,
        3
    );
}
