//! Compensations: owed by tasks of compensating handlers once they end in
//! PERMANENT_FAILURE (written by the statement that ends them), claimed by members like
//! tasks, kept alive by heartbeats while they run, given back when interrupted at
//! shutdown, each result fenced by the claim's version and recorded in its own history.
//! Operator actions over a started compensation: `operate.rs`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use std::time::Duration;

use super::query::attempts_from_rows;
use super::row::{decode_one, task_columns, Unreadable};
use super::{Attempt, Result, Store};
use crate::task::{Lease, Task, TaskId};

/// A claimed compensation: the task it undoes, and the claim's fencing token.
#[derive(Debug, Clone)]
pub struct Compensating {
    /// The task, as it ended.
    pub task: Task,
    /// Fencing token of this claim.
    pub version: i64,
    /// Compensation attempt number, 1 for the first.
    pub attempt: i32,
}

impl Compensating {
    /// The claim as a lease on the task's compensation: its writes match
    /// `(task id, version)`.
    pub fn claim(&self) -> Lease {
        Lease {
            id: self.task.id,
            version: self.version,
        }
    }
}

/// What a compensation attempt decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompensationOutcome {
    /// Done: the task's work is undone.
    Compensated,
    /// Try again at the given time.
    Retry {
        /// When the next attempt is due.
        at: DateTime<Utc>,
    },
    /// A permanent error, or no attempts left.
    Failed,
}

impl CompensationOutcome {
    /// The state written to the compensation row.
    fn state(self) -> &'static str {
        match self {
            CompensationOutcome::Compensated => "compensated",
            CompensationOutcome::Retry { .. } => "pending",
            CompensationOutcome::Failed => "failed",
        }
    }

    /// The outcome as written to the compensation history and in metrics.
    pub fn label(self) -> &'static str {
        match self {
            CompensationOutcome::Compensated => "compensated",
            CompensationOutcome::Retry { .. } => "retry",
            CompensationOutcome::Failed => "failed",
        }
    }
}

/// A task's compensation as `tasks show` presents it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CompensationView {
    /// `pending`, `compensated`, `failed`, or `cancelled` (an operator retried or
    /// resolved the task before it ran).
    pub state: String,
    /// Attempts made.
    pub attempts: i32,
    /// When the next attempt is due (while running, its claim's deadline); absent once it
    /// ended, when the stored time means nothing.
    pub due_at: Option<DateTime<Utc>>,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// Its attempts, oldest first (`lease_version` is the claim's version).
    pub history: Vec<Attempt>,
}

// Claims push `due_at` a lease ahead: a member that dies mid-call leaves the row to be
// claimed again then, under a new version that fences the dead member's result.
const CLAIM: &str = concat!(
    r#"
WITH due AS (
    SELECT c.task_id FROM recovery_compensation c JOIN recovery_task t ON t.id = c.task_id
    WHERE c.state = 'pending' AND c.due_at <= now() AND t.handler = ANY($1)
    ORDER BY c.due_at
    LIMIT $2
    FOR UPDATE OF c SKIP LOCKED),
claimed AS (
    UPDATE recovery_compensation c
    SET version = c.version + 1, attempts = c.attempts + 1,
        due_at = now() + $3 * interval '1 millisecond'
    FROM due WHERE c.task_id = due.task_id
    RETURNING c.task_id, c.version, c.attempts)
SELECT "#,
    task_columns!("t."),
    r#", claimed.version AS compensation_version, claimed.attempts AS compensation_attempt
FROM claimed JOIN recovery_task t ON t.id = claimed.task_id
"#
);

// Writing a result ends the claim (the version moves on), so a heartbeat that raced
// with it cannot push a retry's due time a lease ahead.
const FINISH: &str = r#"
WITH done AS (
    UPDATE recovery_compensation
    SET state = $3, due_at = coalesce($4, due_at), last_error = $5,
        finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END,
        version = version + 1
    WHERE task_id = $1 AND version = $2 AND state = 'pending'
    RETURNING task_id, attempts)
INSERT INTO recovery_compensation_attempt
    (task_id, version, attempt, worker, started_at, duration_ms, outcome, error)
SELECT task_id, $2, attempts, $6, $7, $8, $9, $5 FROM done
RETURNING task_id
"#;

// A running call's claim is kept alive like an attempt's lease: each heartbeat pushes
// `due_at` a lease ahead. A claim missing from the answer was lost (an operator retried
// or resolved the task, or the claim lapsed and another member took it).
const EXTEND: &str = r#"
UPDATE recovery_compensation c
SET due_at = now() + $3 * interval '1 millisecond'
FROM unnest($1::bigint[], $2::bigint[]) AS l(task_id, version)
WHERE c.task_id = l.task_id AND c.version = l.version AND c.state = 'pending'
RETURNING c.task_id AS id, c.version
"#;

// A call interrupted at shutdown gives its claim back: due now, under a new version. The
// attempt still counts (it may have undone part of the work) and gets its history row.
const RELEASE: &str = r#"
WITH released AS (
    UPDATE recovery_compensation
    SET version = version + 1, due_at = now()
    WHERE task_id = $1 AND version = $2 AND state = 'pending'
    RETURNING task_id, attempts)
INSERT INTO recovery_compensation_attempt
    (task_id, version, attempt, worker, started_at, duration_ms, outcome, error)
SELECT task_id, $2, attempts, $3, $4, $5, 'released',
       'interrupted at shutdown before it finished; the claim was given back'
FROM released
RETURNING task_id
"#;

/// The result of one compensation attempt, to be written under its claim.
#[derive(Debug, Clone)]
pub struct CompensationResult {
    /// The task.
    pub task_id: TaskId,
    /// The claim's fencing token.
    pub version: i64,
    /// What happens next.
    pub outcome: CompensationOutcome,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// How long it ran.
    pub duration: Duration,
    /// The attempt's error, if it failed.
    pub error: Option<String>,
}

impl Store {
    /// Claims up to `limit` due compensations of `handlers` for `worker`, for `lease`.
    ///
    /// A claimed compensation whose task's row cannot be read (say, malformed stored
    /// headers) is not returned: it ends `failed` under its claim, with the reason as its
    /// error and its history row, so it neither holds up the rest of its batch nor comes
    /// back.
    pub async fn claim_compensations(
        &self,
        handlers: &[String],
        limit: i64,
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Compensating>> {
        let rows = sqlx::query(CLAIM)
            .bind(handlers)
            .bind(limit)
            .bind(lease.as_millis() as f64)
            .fetch_all(&self.pool)
            .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut unreadable = Vec::new();
        for row in &rows {
            match decode_one(row, "compensation_version")? {
                Ok(task) => claimed.push(Compensating {
                    task,
                    version: row.try_get("compensation_version")?,
                    attempt: row.try_get("compensation_attempt")?,
                }),
                Err(row) => unreadable.push(row),
            }
        }
        for row in &unreadable {
            self.end_unreadable_compensation(worker, row).await;
        }
        Ok(claimed)
    }

    /// Ends a claimed compensation whose task cannot be read as `failed`: nothing can be
    /// called to undo a task that cannot be read. Should the write fail, the
    /// compensation comes back when its claim lapses and is ended then.
    async fn end_unreadable_compensation(&self, worker: &str, row: &Unreadable) {
        tracing::error!(task = %row.lease.id, reason = %row.reason,
            "claimed compensation's task cannot be read; ending the compensation as failed");
        let result = CompensationResult {
            task_id: row.lease.id,
            version: row.lease.version,
            outcome: CompensationOutcome::Failed,
            started_at: Utc::now(),
            duration: Duration::ZERO,
            error: Some(format!(
                "not compensated: the task's row cannot be read ({})",
                row.reason
            )),
        };
        if let Err(error) = self.finish_compensation(worker, &result).await {
            tracing::warn!(task = %row.lease.id, %error,
                "could not end a compensation whose task cannot be read; it comes back after its claim");
        }
    }

    /// Writes a compensation attempt's result; false when its claim is stale (another
    /// member claimed it since, or an operator cancelled it) and nothing was written.
    pub async fn finish_compensation(
        &self,
        worker: &str,
        result: &CompensationResult,
    ) -> Result<bool> {
        let written = sqlx::query(FINISH)
            .bind(result.task_id.0)
            .bind(result.version)
            .bind(result.outcome.state())
            .bind(match result.outcome {
                CompensationOutcome::Retry { at } => Some(at),
                _ => None,
            })
            .bind(result.error.as_deref())
            .bind(worker)
            .bind(result.started_at)
            .bind(i32::try_from(result.duration.as_millis()).unwrap_or(i32::MAX))
            .bind(result.outcome.label())
            .fetch_optional(&self.pool)
            .await?;
        Ok(written.is_some())
    }

    /// Extends the claims of running compensations (`id` is the task, `version` the
    /// claim's) by `lease`; returns the claims extended. A claim missing from the answer
    /// was lost: its call is to stop, its result would be refused.
    pub async fn extend_compensations(
        &self,
        claims: &[Lease],
        lease: Duration,
    ) -> Result<Vec<Lease>> {
        self.extend_leases(EXTEND, claims, lease).await
    }

    /// Gives back the claim of a compensation interrupted (at shutdown) after running
    /// `duration` from `started_at`: due again now, with a `released` history row. False
    /// when the claim was no longer held.
    pub async fn release_compensation(
        &self,
        worker: &str,
        claim: Lease,
        started_at: DateTime<Utc>,
        duration: Duration,
    ) -> Result<bool> {
        let released = sqlx::query(RELEASE)
            .bind(claim.id.0)
            .bind(claim.version)
            .bind(worker)
            .bind(started_at)
            .bind(i32::try_from(duration.as_millis()).unwrap_or(i32::MAX))
            .fetch_optional(&self.pool)
            .await?;
        Ok(released.is_some())
    }

    /// Task `id`'s compensation, if it owes or owed one.
    pub async fn compensation(&self, id: TaskId) -> Result<Option<CompensationView>> {
        let Some(row) = sqlx::query("SELECT * FROM recovery_compensation WHERE task_id = $1")
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let history = sqlx::query(
            "SELECT attempt, version AS lease_version, worker, started_at, duration_ms, \
                    outcome, error \
             FROM recovery_compensation_attempt WHERE task_id = $1 ORDER BY version",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await?;
        let state: String = row.try_get("state")?;
        Ok(Some(CompensationView {
            due_at: (state == "pending")
                .then(|| super::time::required(&row, "due_at"))
                .transpose()?,
            state,
            attempts: row.try_get("attempts")?,
            last_error: row.try_get("last_error")?,
            finished_at: super::time::optional(&row, "finished_at")?,
            history: attempts_from_rows(&history)?,
        }))
    }
}
