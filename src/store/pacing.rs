//! What a paced redrive job reads and writes beside its batches: which tasks an earlier
//! job redrove, the tasks it redrives now (`redrive_job`), a step's outcomes, its steps,
//! and pausing it (by itself or by an operator).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, Row};

use super::filter::{bind_selection, Selection, TaskFilter, CONDITION};
use super::operate::Operator;
use super::replays::{ReplayJob, ReplayRowError};
use super::{Result, Store, StoreError};
use crate::pace::Outcomes;
use crate::task::TaskId;

/// Causes named in a pause's reason at most.
const CAUSES_NAMED: i64 = 3;

/// What a job's tasks of a step did so far.
#[derive(Debug, Clone, Default)]
pub struct StepOutcomes {
    /// Their outcomes.
    pub outcomes: Outcomes,
    /// The handlers among them whose breaker is not closed: `billing is half-open
    /// (why)`.
    pub open_breakers: Vec<String>,
    /// Those a worker would take now and none has (a retry's released tasks waiting for
    /// their call: due, unleased or their lease lapsed).
    pub waiting: i64,
}

/// Selected tasks that an earlier job already redrove.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Redriven {
    /// How many.
    pub count: i64,
    /// The jobs that redrove them last (a few, newest first).
    pub jobs: Vec<i64>,
}

impl Redriven {
    /// The refusal an operator reads when these would be redriven again without
    /// `force`; none when there are none.
    pub fn refusal(&self) -> Option<String> {
        (self.count > 0).then(|| {
            let jobs: Vec<String> = self.jobs.iter().map(|j| j.to_string()).collect();
            format!(
                "{} of the selected tasks were already redriven by job {}; redriving them \
                 again needs force (`--force`), or narrow the filter",
                self.count,
                jobs.join(", ")
            )
        })
    }
}

impl Store {
    /// The tasks of `filter` that a job already redrove.
    pub async fn redriven_before(&self, filter: &TaskFilter) -> Result<Redriven> {
        let selection = Selection::Filter(filter.clone());
        let statement = format!(
            "SELECT count(*) AS count, \
                 (array_agg(DISTINCT redriven_by ORDER BY redriven_by DESC))[1:5] AS jobs \
             FROM recovery_task WHERE {CONDITION} AND redriven_by IS NOT NULL"
        );
        let row = bind_selection(sqlx::query(&statement), &selection)
            .fetch_one(&self.pool)
            .await?;
        Ok(Redriven {
            count: row.try_get("count")?,
            jobs: row
                .try_get::<Option<Vec<i64>>, _>("jobs")?
                .unwrap_or_default(),
        })
    }

    /// Begins step `step` of job `id` at `cursor`, with `base` produced and skipped so
    /// far: when it began (the database's clock, which the attempts' times are on), or
    /// none when the job is no longer `runner`'s.
    pub async fn begin_step(
        &self,
        id: i64,
        runner: &str,
        step: i32,
        cursor: i64,
        base: i64,
    ) -> Result<Option<DateTime<Utc>>> {
        let began = sqlx::query_scalar(
            "UPDATE recovery_replay SET step = $3, step_cursor = $4, step_base = $5, \
                 step_started_at = now(), heartbeat_at = now() \
             WHERE id = $1 AND runner = $2 AND status = 'running' RETURNING step_started_at",
        )
        .bind(id)
        .bind(runner)
        .bind(step)
        .bind(cursor)
        .bind(base)
        .fetch_optional(&self.pool)
        .await?;
        Ok(began)
    }

    /// Pauses job `id`, which `runner` runs, for `reason`: it waits for an operator to
    /// resume, slow down or cancel it. False when the job was no longer `runner`'s.
    pub async fn pause_job(&self, id: i64, runner: &str, reason: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE recovery_replay SET status = 'paused', paused_reason = $3, runner = NULL, \
                 heartbeat_at = now() \
             WHERE id = $1 AND runner = $2 AND status = 'running'",
        )
        .bind(id)
        .bind(runner)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        let operator = Operator {
            actor: format!("job {id}"),
            reason: Some(reason.to_owned()),
        };
        let details = serde_json::json!({ "job": id, "by": "itself" });
        self.insert_audit(&mut tx, &operator, "replay_pause", None, Some(details))
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Pauses job `id` for an operator, audited: its runner stops within about a second
    /// (what it has in flight delivered first) and then lets go of it; until it has, and
    /// after, no one takes the job until it is resumed.
    pub async fn pause_by_operator(&self, operator: &Operator, id: i64) -> Result<ReplayJob> {
        let mut tx = self.pool.begin().await?;
        let reason = format!(
            "paused by {}{}",
            operator.actor,
            operator
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        let row = sqlx::query(
            "UPDATE recovery_replay SET status = 'paused', paused_reason = $2, \
                 runner = CASE WHEN status = 'running' THEN runner END \
             WHERE id = $1 AND status IN ('pending', 'running', 'failed') RETURNING *",
        )
        .bind(id)
        .bind(&reason)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            drop(tx);
            return Err(match self.replay(id).await? {
                None => StoreError::Replay(ReplayRowError::Unknown(id)),
                Some(job) => StoreError::Replay(ReplayRowError::NotYours {
                    id,
                    status: job.status,
                    runner: None,
                }),
            });
        };
        let job = super::replays::job_from_row(&row)?;
        let details = serde_json::json!({ "job": id, "by": "operator" });
        self.insert_audit(&mut tx, operator, "replay_pause", None, Some(details))
            .await?;
        tx.commit().await?;
        Ok(job)
    }

    /// The outcomes of job `id`'s tasks after task id `after` since `since`: with
    /// `attempts` (a retry), their attempts (resolved, or failed again); and the
    /// re-failures that came back from what it sent. With the handlers among them whose
    /// breaker is open, and how many of all its tasks wait for their call (released in
    /// this step or before).
    pub async fn step_outcomes(
        &self,
        id: i64,
        after: i64,
        since: DateTime<Utc>,
        attempts: bool,
    ) -> Result<StepOutcomes> {
        let row = sqlx::query(
            "WITH mine AS (SELECT id, handler, cause_id FROM recovery_task \
                           WHERE redrive_job = $1 AND id > $2), \
             attempts AS (SELECT a.outcome, m.cause_id FROM mine m \
                          JOIN recovery_attempt a ON a.task_id = m.id \
                          WHERE $5 AND a.started_at >= $3 \
                            AND a.outcome IN ('resolved', 'retry', 'permanent_failure')), \
             again AS (SELECT r.cause_id FROM mine m \
                       JOIN recovery_task r ON r.previous_task_id = m.id \
                       WHERE r.created_at >= $3), \
             failures AS (SELECT cause_id FROM attempts WHERE outcome <> 'resolved' \
                          UNION ALL SELECT cause_id FROM again) \
             SELECT (SELECT count(*) FROM attempts) + (SELECT count(*) FROM again) AS total, \
                    (SELECT count(*) FROM failures) AS failed, \
                    (SELECT array_agg(words) FROM ( \
                        SELECT coalesce(c.class || ': ' || left(c.example, 120), 'unknown cause') \
                               || ' (' || count(*) || ')' AS words \
                        FROM failures f LEFT JOIN recovery_cause c ON c.id = f.cause_id \
                        GROUP BY c.class, c.example ORDER BY count(*) DESC LIMIT $4) top) \
                        AS causes, \
                    (SELECT array_agg(b.handler || ' is ' \
                                      || CASE WHEN b.forced = 'open' THEN 'forced open' \
                                              ELSE replace(b.state, '_', '-') END \
                                      || coalesce(' (' || b.reason || ')', '') \
                                      ORDER BY b.handler) \
                     FROM recovery_breaker b \
                     WHERE (b.forced = 'open' \
                            OR b.state IN ('open', 'half_open') AND b.hold_until > now()) \
                       AND b.handler IN (SELECT DISTINCT handler FROM mine)) AS open, \
                    (SELECT count(*) FROM recovery_task \
                     WHERE redrive_job = $1 AND status = 'failed' \
                       AND next_attempt_at <= now()) AS waiting",
        )
        .bind(id)
        .bind(after)
        .bind(since)
        .bind(CAUSES_NAMED)
        .bind(attempts)
        .fetch_one(&self.pool)
        .await?;
        let outcomes = Outcomes {
            total: row.try_get("total")?,
            failed: row.try_get("failed")?,
            causes: (row.try_get::<Option<Vec<String>>, _>("causes")?).unwrap_or_default(),
        };
        let open_breakers = row
            .try_get::<Option<Vec<String>>, _>("open")?
            .unwrap_or_default();
        Ok(StepOutcomes {
            outcomes,
            open_breakers,
            waiting: row.try_get("waiting")?,
        })
    }

    /// In `conn`'s transaction: those of `tasks` job `id` may redrive, locked until it
    /// commits: unless `force`, not one another job redrove (two jobs over the same
    /// tasks, started together or overlapping, never both redrive one).
    pub(crate) async fn redrivable(
        conn: &mut PgConnection,
        id: i64,
        tasks: &[TaskId],
        force: bool,
    ) -> Result<Vec<TaskId>> {
        let ids: Vec<i64> = tasks.iter().map(|t| t.0).collect();
        let mine: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM recovery_task \
             WHERE id = ANY($1) AND ($3 OR redriven_by IS NULL OR redriven_by = $2) \
             ORDER BY id FOR UPDATE",
        )
        .bind(ids)
        .bind(id)
        .bind(force)
        .fetch_all(&mut *conn)
        .await?;
        Ok(mine.into_iter().map(TaskId).collect())
    }

    /// Claims `tasks` for replay job `id` before it produces them: those it may redrive
    /// (see [`Store::redrivable`]) are marked as redriven by it, in one transaction, so
    /// that another job (a replay or a retry) leaves them out from then on.
    pub async fn claim_for_replay(
        &self,
        id: i64,
        tasks: &[TaskId],
        force: bool,
    ) -> Result<Vec<TaskId>> {
        let mut tx = self.pool.begin().await?;
        let mine = Store::redrivable(&mut tx, id, tasks, force).await?;
        let ids: Vec<i64> = mine.iter().map(|t| t.0).collect();
        sqlx::query("UPDATE recovery_task SET redriven_by = $1 WHERE id = ANY($2)")
            .bind(id)
            .bind(ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(mine)
    }

    /// In `conn`'s transaction: wakes the members' idle claim loops when it commits
    /// (`<schema>_due`), for tasks it made due.
    pub(crate) async fn notify_due(conn: &mut PgConnection) -> Result<()> {
        sqlx::query("SELECT pg_notify(current_schema() || '_due', '')")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// In `conn`'s transaction: job `id` redrove `tasks` (a retry: those it made due
    /// again, still failed).
    pub(crate) async fn mark_redriven(
        conn: &mut PgConnection,
        id: i64,
        tasks: &[TaskId],
        only_failed: bool,
    ) -> Result<()> {
        let ids: Vec<i64> = tasks.iter().map(|t| t.0).collect();
        sqlx::query(
            "UPDATE recovery_task SET redrive_job = $1, redriven_by = $1 \
             WHERE id = ANY($2) AND (NOT $3 OR status = 'failed')",
        )
        .bind(id)
        .bind(ids)
        .bind(only_failed)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}
