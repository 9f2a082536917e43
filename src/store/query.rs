//! Read-only queries for operators, tests and the benchmark.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::row::{task_columns, task_from_row};
use super::{Result, Store};
use crate::task::{Task, TaskId};

/// Number of tasks in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusCounts {
    /// Waiting for or in an attempt.
    pub failed: i64,
    /// Finished successfully.
    pub resolved: i64,
    /// Gave up.
    pub permanent_failure: i64,
    /// Discarded by an operator.
    pub discarded: i64,
}

impl StatusCounts {
    /// All tasks.
    pub fn total(&self) -> i64 {
        self.failed + self.resolved + self.permanent_failure + self.discarded
    }
}

/// One row of a task's attempt history.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct Attempt {
    /// Attempt number (1 = first).
    pub attempt: i32,
    /// Fencing token the attempt ran under.
    pub lease_version: i64,
    /// Worker that ran it.
    pub worker: String,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// How long it ran, in milliseconds.
    pub duration_ms: i32,
    /// `resolved`, `retry`, `permanent_failure`, `released` (lease given back),
    /// `lease_expired` (the lease lapsed and another claim took the task over), `fenced`
    /// (an operator acted while it ran) or `operator_<action>` (an operator's action, by
    /// `worker`, for the reason in `error`).
    pub outcome: String,
    /// The attempt's error, if any.
    pub error: Option<String>,
}

impl Store {
    /// One task by id.
    pub async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            task_columns!(),
            " FROM recovery_task WHERE id = $1"
        ))
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(task_from_row).transpose()
    }

    /// A task's attempts, oldest first.
    pub async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let rows = sqlx::query(
            "SELECT attempt, lease_version, worker, started_at, duration_ms, outcome, error \
             FROM recovery_attempt WHERE task_id = $1 ORDER BY lease_version",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await?;
        attempts_from_rows(&rows)
    }

    /// Task counts per status (a full count: for operators and tests, not for scrapes).
    pub async fn status_counts(&self) -> Result<StatusCounts> {
        let rows = sqlx::query("SELECT status, count(*) AS n FROM recovery_task GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        let mut counts = StatusCounts::default();
        for row in rows {
            let n: i64 = row.try_get("n")?;
            match row.try_get::<String, _>("status")?.as_str() {
                "failed" => counts.failed = n,
                "resolved" => counts.resolved = n,
                "permanent_failure" => counts.permanent_failure = n,
                _ => counts.discarded += n,
            }
        }
        Ok(counts)
    }
}

/// History rows (`attempt, lease_version, worker, started_at, duration_ms, outcome, error`).
pub(crate) fn attempts_from_rows(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<Attempt>> {
    rows.iter()
        .map(|r| {
            Ok(Attempt {
                attempt: r.try_get("attempt")?,
                lease_version: r.try_get("lease_version")?,
                worker: r.try_get("worker")?,
                started_at: super::time::required(r, "started_at")?,
                duration_ms: r.try_get("duration_ms")?,
                outcome: r.try_get("outcome")?,
                error: r.try_get("error")?,
            })
        })
        .collect()
}
