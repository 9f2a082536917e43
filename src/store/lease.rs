//! Leases: claim due tasks, keep them alive, give them back.
//!
//! While a task is leased its `next_attempt_at` is the lease deadline, so a task whose
//! worker died is claimed again by the ordinary claim once the deadline passes.

use chrono::{DateTime, Utc};
use sqlx::Row;
use std::time::Duration;

use super::row::tasks_from_rows;
use super::{Result, Store};
use crate::task::{Lease, Task, TaskId};

const CLAIM: &str = r#"
WITH due AS MATERIALIZED (
    SELECT id FROM recovery_task
    WHERE status = 'failed' AND next_attempt_at <= now() AND handler = ANY($1)
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE recovery_task t
SET lease_version = t.lease_version + 1,
    lease_owner = $3,
    leased_at = now(),
    next_attempt_at = now() + $4 * interval '1 millisecond',
    attempts = t.attempts + 1,
    updated_at = now()
FROM due
WHERE t.id = due.id
RETURNING t.*
"#;

const HEARTBEAT: &str = r#"
UPDATE recovery_task t
SET next_attempt_at = now() + $3 * interval '1 millisecond', updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS l(id, version)
WHERE t.id = l.id AND t.lease_version = l.version
  AND t.status = 'failed' AND t.lease_owner IS NOT NULL
RETURNING t.id, t.lease_version
"#;

const RELEASE: &str = r#"
WITH released AS (
    UPDATE recovery_task t
    SET lease_version = t.lease_version + 1,
        lease_owner = NULL,
        leased_at = NULL,
        next_attempt_at = now(),
        attempts = greatest(t.attempts - 1, 0),
        updated_at = now()
    FROM (SELECT l.id, l.version, o.leased_at
          FROM unnest($1::bigint[], $2::bigint[]) AS l(id, version)
          JOIN recovery_task o ON o.id = l.id) AS l
    WHERE t.id = l.id AND t.lease_version = l.version AND t.status = 'failed'
      AND t.lease_owner IS NOT NULL
    RETURNING t.id, t.attempts + 1 AS attempt, l.version, coalesce(l.leased_at, now()) AS leased_at),
history AS (
    INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, version, attempt, $3, leased_at,
           (extract(epoch FROM now() - leased_at) * 1000)::int,
           'released', 'lease given back on shutdown before the handler finished'
    FROM released)
SELECT id FROM released
"#;

impl Store {
    /// Claims up to `limit` due tasks of `handlers` for `owner`, bumping each fencing
    /// token and leasing the task for `lease`. One statement, committed before returning.
    pub async fn claim(
        &self,
        handlers: &[String],
        limit: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let rows = sqlx::query(CLAIM)
            .bind(handlers)
            .bind(i64::from(limit))
            .bind(owner)
            .bind(millis(lease))
            .fetch_all(&self.pool)
            .await?;
        tasks_from_rows(&rows)
    }

    /// Extends the leases still held; returns the leases that were extended. A lease
    /// missing from the answer was taken over (or its task finished by someone else).
    pub async fn heartbeat(&self, leases: &[Lease], lease: Duration) -> Result<Vec<Lease>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, versions) = split(leases);
        let rows = sqlx::query(HEARTBEAT)
            .bind(ids)
            .bind(versions)
            .bind(millis(lease))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Lease {
                    id: TaskId(r.try_get("id")?),
                    version: r.try_get("lease_version")?,
                })
            })
            .collect()
    }

    /// Gives leases back so another worker can take the tasks at once. The interrupted
    /// attempt does not count against the task's max attempts but is kept in the history.
    pub async fn release(&self, worker: &str, leases: &[Lease]) -> Result<Vec<TaskId>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, versions) = split(leases);
        let rows = sqlx::query(RELEASE)
            .bind(ids)
            .bind(versions)
            .bind(worker)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok(TaskId(r.try_get("id")?))).collect()
    }

    /// When the earliest unfinished task of `handlers` is due (leased tasks count with
    /// their lease deadline), or `None` when there is none.
    pub async fn next_due(&self, handlers: &[String]) -> Result<Option<DateTime<Utc>>> {
        let due = sqlx::query_scalar(
            "SELECT min(next_attempt_at) FROM recovery_task \
             WHERE status = 'failed' AND handler = ANY($1)",
        )
        .bind(handlers)
        .fetch_one(&self.pool)
        .await?;
        Ok(due)
    }
}

/// Ids and versions in id order: every multi-row write locks rows in that order, so a
/// heartbeat and a finish on overlapping tasks cannot deadlock.
fn split(leases: &[Lease]) -> (Vec<i64>, Vec<i64>) {
    let mut pairs: Vec<(i64, i64)> = leases.iter().map(|l| (l.id.0, l.version)).collect();
    pairs.sort_unstable();
    pairs.into_iter().unzip()
}

/// A duration in whole milliseconds for SQL interval arithmetic.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
