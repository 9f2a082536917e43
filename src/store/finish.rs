//! Finishing attempts: many results in one statement, each guarded by its fencing token,
//! with one attempt-history row per result that landed.

use chrono::{DateTime, Utc};
use sqlx::Row;
use std::time::Duration;

use super::causes::cause_ids;
use super::{Result, Store, KEYED_PROBES};
use crate::task::{Cause, FinishOutcome, Lease, TaskId};

/// The result of one attempt, to be written under its lease.
#[derive(Debug, Clone)]
pub struct Finish {
    /// The lease the attempt ran under.
    pub lease: Lease,
    /// What happens to the task next.
    pub outcome: FinishOutcome,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// How long the handler ran.
    pub duration: Duration,
    /// The attempt's error, if it failed.
    pub error: Option<String>,
    /// What broke, if it failed: the task's cause from now on.
    pub cause: Option<Cause>,
    /// Whether a permanent failure is to be compensated ([`crate::Handler::compensates`]).
    pub compensate: bool,
}

// The join is driven by the input rows, one primary-key probe each. Do not add
// `t.id = ANY($1)`: with stale statistics the planner would scan the table first and
// rescan the input for every row (quadratic in the batch size). Nor `t.status = 'failed'`
// (a lease implies it, by a table constraint): statistics taken while no task was
// unfinished make the planner scan the whole partial due index, believed empty, as the
// build side of a hash join.
const FINISH: &str = r#"
WITH r AS (
    -- A retry is due as long after PostgreSQL's now as the worker asked after its own
    -- ($11, read as this statement was sent): a member whose clock is off still waits
    -- the backoff, no more, no less. The statement's start, not the transaction's,
    -- which began a round trip earlier (KEYED_PROBES).
    SELECT id, version, status, statement_timestamp() + (next_at - $11::timestamptz) AS next_at, error,
           outcome, started_at, duration_ms, compensate, cause_id
    FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::timestamptz[],
                $5::text[], $6::text[], $7::timestamptz[], $8::int[], $10::bool[], $12::bigint[])
        AS u(id, version, status, next_at, error, outcome, started_at, duration_ms, compensate,
             cause_id)),
done AS (
    UPDATE recovery_task t
    SET status = r.status,
        -- A retry waits for the handler's breaker hold, if any.
        next_attempt_at = CASE WHEN r.next_at IS NULL THEN t.next_attempt_at
            ELSE (SELECT due_at FROM recovery_due_at(t.handler, r.next_at)) END,
        last_error = coalesce(r.error, t.last_error),
        cause_id = coalesce(r.cause_id, t.cause_id),
        cause_at = CASE WHEN r.cause_id IS NULL THEN t.cause_at ELSE now() END,
        lease_owner = NULL,
        leased_at = NULL,
        finished_at = CASE WHEN r.status = 'failed' THEN NULL ELSE now() END,
        updated_at = now()
    FROM r
    WHERE t.id = r.id AND t.lease_version = r.version AND t.lease_owner IS NOT NULL
    RETURNING t.id, t.attempts, r.version, r.started_at, r.duration_ms, r.outcome, r.error,
              r.status, r.compensate),
history AS (
    INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, version, attempts, $9, started_at, duration_ms, outcome, error FROM done),
compensation AS (
    INSERT INTO recovery_compensation AS c (task_id)
    SELECT id FROM done WHERE status = 'permanent_failure' AND compensate
    -- A task retried by an operator and failed again is compensated again.
    ON CONFLICT (task_id) DO UPDATE
    SET state = 'pending', attempts = 0, due_at = now(), last_error = NULL, finished_at = NULL,
        version = c.version + 1)
SELECT id, version FROM done
"#;

impl Store {
    /// Saves an attempt's recovery point under its lease; false when the lease is no
    /// longer the task's (the checkpoint is refused).
    pub async fn save_checkpoint(
        &self,
        lease: Lease,
        checkpoint: &serde_json::Value,
    ) -> Result<bool> {
        let saved = sqlx::query(
            "UPDATE recovery_task SET checkpoint = $3, updated_at = now() \
             WHERE id = $1 AND lease_version = $2 AND lease_owner IS NOT NULL",
        )
        .bind(lease.id.0)
        .bind(lease.version)
        .bind(checkpoint)
        .execute(&self.pool)
        .await?;
        Ok(saved.rows_affected() == 1)
    }

    /// Writes many attempt results at once. Returns the leases whose results were
    /// written; a result whose fencing token is stale (the task was taken over,
    /// discarded or finished) changes nothing and is absent from the answer.
    pub async fn finish(&self, worker: &str, results: &[Finish]) -> Result<Vec<Lease>> {
        if results.is_empty() {
            return Ok(Vec::new());
        }
        // Rows are locked in id order, as by heartbeats and releases: no deadlocks.
        let mut results: Vec<&Finish> = results.iter().collect();
        results.sort_unstable_by_key(|r| r.lease.id);
        let causes: Vec<Option<&Cause>> = results.iter().map(|r| r.cause.as_ref()).collect();
        let cause_ids = match causes.iter().any(Option::is_some) {
            // Committed on their own, before the finish takes its row locks.
            true => cause_ids(&mut *self.pool.acquire().await?, &causes).await?,
            false => vec![None; causes.len()],
        };
        let mut tx = self.pool.begin_with(KEYED_PROBES).await?;
        let rows = sqlx::query(FINISH)
            .bind(results.iter().map(|r| r.lease.id.0).collect::<Vec<_>>())
            .bind(results.iter().map(|r| r.lease.version).collect::<Vec<_>>())
            .bind(
                results
                    .iter()
                    .map(|r| r.outcome.status().as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                results
                    .iter()
                    .map(|r| match r.outcome {
                        FinishOutcome::Retry { at } => Some(at),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )
            .bind(
                results
                    .iter()
                    .map(|r| r.error.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                results
                    .iter()
                    .map(|r| r.outcome.history().as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(results.iter().map(|r| r.started_at).collect::<Vec<_>>())
            .bind(
                results
                    .iter()
                    .map(|r| i32::try_from(r.duration.as_millis()).unwrap_or(i32::MAX))
                    .collect::<Vec<_>>(),
            )
            .bind(worker)
            .bind(results.iter().map(|r| r.compensate).collect::<Vec<_>>())
            .bind(Utc::now())
            .bind(cause_ids)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(Lease {
                    id: TaskId(r.try_get("id")?),
                    version: r.try_get("version")?,
                })
            })
            .collect()
    }
}
