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
