//! Replay jobs as rows: created with their audit entry, claimed by one runner at a time
//! (fenced by the runner's name), advanced batch by batch, cancelled by operators.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::time::Duration;

use super::filter::{bind_selection, Selection, TaskFilter, CONDITION};
use super::operate::Action;
use super::operate::Operator;
use super::row::{task_columns, task_from_row};
use super::{Result, Store, StoreError, ORDERED_WALK};
use crate::pace::Pace;
use crate::task::Task;

/// A runner that has not beaten for this long has stopped; another may take the job.
pub const REPLAY_STALE_AFTER: Duration = Duration::from_secs(30);

pub use crate::kafka::reader::Marks;

/// A replay job, as listed.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReplayJob {
    /// Job id.
    pub id: i64,
    /// `replay` (produce to a topic) or `retry` (make the tasks due again).
    pub kind: String,
    /// When it was started.
    pub created_at: DateTime<Utc>,
    /// Who started it.
    pub actor: String,
    /// The tasks it replays.
    pub filter: TaskFilter,
    /// Where to; absent: each task's original topic.
    pub target_topic: Option<String>,
    /// Whether each replayed task is marked resolved.
    pub mark_resolved: bool,
    /// Messages per second at most (an unpaced replay).
    pub rate: Option<f64>,
    /// Its pace: ramp, checkpoints, when it pauses itself; none: unpaced.
    pub pace: Option<Pace>,
    /// A retry job's action (its attempt budget, whether compensations are overridden).
    #[serde(skip)]
    pub retry: Option<Action>,
    /// The ramp step under way (0 for the first).
    pub step: i32,
    /// The cursor when that step began.
    pub step_cursor: i64,
    /// Produced and skipped when that step began.
    pub step_base: i64,
    /// When that step began (or the job was last resumed).
    pub step_started_at: Option<DateTime<Utc>>,
    /// Why it is paused (by itself, when what it redrove failed again, or by an
    /// operator).
    pub paused_reason: Option<String>,
    /// Whether it redrives tasks another job redrove too.
    pub force: bool,
    /// Bounded ([`NewReplay::bounded`]): the newest task id when it was recorded; it
    /// handles no more than `total`.
    pub upto_id: Option<i64>,
    /// The approval that started it, if one did (`operations.approval_over`).
    pub approval_id: Option<i64>,
    /// The rate it was approved at (per second; none: unlimited): a resume may not go
    /// faster.
    pub approved_rate: Option<f64>,
    /// A paced job's next checkpoint: the tasks handled (produced and skipped) at which
    /// its step ends; none in its last step.
    pub next_checkpoint: Option<i64>,
    /// Run by fleet members (true) or by the CLI that started it.
    pub detached: bool,
    /// `pending`, `running`, `paused`, `done`, `cancelled` or `failed`.
    pub status: String,
    /// Who runs it now.
    pub runner: Option<String>,
    /// When its runner last reported.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// Tasks up to this id are done.
    pub cursor: i64,
    /// Messages produced (a replay), or tasks made due again (a retry).
    pub produced: i64,
    /// Tasks skipped (no topic to replay to, or payload not stored).
    pub skipped: i64,
    /// Tasks the filter selected when it started.
    pub total: Option<i64>,
    /// Why it failed.
    pub error: Option<String>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// A batch being produced (tasks after `cursor` up to this id), if one is. On a job
    /// cancelled or failed meanwhile, its messages may have reached the topic uncounted
    /// ([`ReplayJob::uncounted`]).
    pub pending_upto: Option<i64>,
    /// Where target partitions ended before that batch.
    #[serde(skip)]
    pub pending_marks: Option<Marks>,
}

impl ReplayJob {
    /// What its count may leave out: a batch its runner was producing when the job was
    /// cancelled or stopped. A runner that lives records it; one that died never does,
    /// and only a resume (which reads the target's partitions) counts it.
    pub fn uncounted(&self) -> Option<String> {
        let upto = self.pending_upto?;
        Some(format!(
            "a batch in flight (tasks after id {} up to {upto}) may have reached the topic \
             in part, uncounted unless its runner records it",
            self.cursor
        ))
    }
}

/// What a new redrive job does.
#[derive(Debug, Clone)]
pub struct NewReplay {
    /// The tasks to redrive.
    pub filter: TaskFilter,
    /// A retry's action; none: a replay.
    pub retry: Option<Action>,
    /// Its pace; none: unpaced.
    pub pace: Option<Pace>,
    /// Redrive tasks another job redrove too.
    pub force: bool,
    /// Bounded: tasks stored later never join it, and it handles no more than it counts
    /// now (a paced job, a retry job, or any job where large actions need approval). An
    /// unpaced replay otherwise takes every task matching when its cursor reaches it.
    pub bounded: bool,
    /// Target topic; none: each task's original topic.
    pub target_topic: Option<String>,
    /// Mark each replayed task resolved.
    pub mark_resolved: bool,
    /// Messages per second at most.
    pub rate: Option<f64>,
    /// Leave it to fleet members.
    pub detached: bool,
    /// The approval that lets it run, if one does.
    pub approval: Option<i64>,
    /// Tasks it handles at most (what was approved), below what its filter counts now.
    pub most: Option<i64>,
}

/// A new rate for a job an operator resumes (slowing it down).
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    /// The paced job's pace at its new rate.
    pub pace: Option<Pace>,
    /// The unpaced replay's new rate.
    pub rate: Option<f64>,
}

/// A replay that went as far as it could.
#[derive(Debug, thiserror::Error)]
pub enum ReplayRowError {
    /// No such job.
    #[error("no job {0} (replays and paced retries)")]
    Unknown(i64),
    /// Another runner holds it, or it has ended.
    #[error("job {id} is {status}{runner}", runner = .runner.as_deref().map(|r| format!(" (run by {r})")).unwrap_or_default())]
    NotYours {
        /// The job.
        id: i64,
        /// Its status.
        status: String,
        /// Its runner.
        runner: Option<String>,
    },
}

pub(super) fn job_from_row(row: &PgRow) -> Result<ReplayJob> {
    let mut job = job_fields(row)?;
    job.next_checkpoint = (job.pace.as_ref())
        .filter(|pace| !pace.is_last(job.step))
        .map(|pace| job.step_base.saturating_add(pace.step_tasks));
    Ok(job)
}

fn job_fields(row: &PgRow) -> Result<ReplayJob> {
    let filter: serde_json::Value = row.try_get("filter")?;
    let marks: Option<serde_json::Value> = row.try_get("pending_marks")?;
    let id: i64 = row.try_get("id")?;
    let malformed = |column: &'static str| {
        move |e: serde_json::Error| {
            StoreError::MalformedRow(format!("replay job {id}: {column}: {e}"))
        }
    };
    let retry: Option<serde_json::Value> = row.try_get("retry")?;
    let pace: Option<serde_json::Value> = row.try_get("pace")?;
    let detached: bool = row.try_get("detached")?;
    let by_fleet: bool = row.try_get("by_fleet")?;
    Ok(ReplayJob {
        id,
        kind: row.try_get("kind")?,
        created_at: super::time::required(row, "created_at")?,
        actor: row.try_get("actor")?,
        filter: serde_json::from_value(filter).map_err(malformed("filter"))?,
        target_topic: row.try_get("target_topic")?,
        mark_resolved: row.try_get("mark_resolved")?,
        rate: row.try_get("rate")?,
        pace: pace
            .map(serde_json::from_value)
            .transpose()
            .map_err(malformed("pace"))?,
        retry: retry
            .map(serde_json::from_value)
            .transpose()
            .map_err(malformed("retry"))?,
        step: row.try_get("step")?,
        step_cursor: row.try_get("step_cursor")?,
        step_base: row.try_get("step_base")?,
        step_started_at: super::time::optional(row, "step_started_at")?,
        paused_reason: row.try_get("paused_reason")?,
        force: row.try_get("force")?,
        upto_id: row.try_get("upto_id")?,
        approval_id: row.try_get("approval_id")?,
        approved_rate: row.try_get("approved_rate")?,
        next_checkpoint: None,
        detached: detached || by_fleet,
        status: row.try_get("status")?,
        runner: row.try_get("runner")?,
        heartbeat_at: super::time::optional(row, "heartbeat_at")?,
        cursor: row.try_get("cursor")?,
        produced: row.try_get("produced")?,
        skipped: row.try_get("skipped")?,
        total: row.try_get("total")?,
        error: row.try_get("error")?,
        finished_at: super::time::optional(row, "finished_at")?,
        pending_upto: row.try_get("pending_upto")?,
        pending_marks: marks
            .map(serde_json::from_value)
            .transpose()
            .map_err(malformed("pending_marks"))?,
    })
}

/// One page of a replay's selection.
#[derive(Debug, Default)]
pub struct ReplayPage {
    /// Its tasks, in id order.
    pub tasks: Vec<Task>,
    /// Its rows that could not be read into tasks: skipped, not produced.
    pub unreadable: i64,
    /// The last task id it covers, readable or not; none: the selection is done.
    pub last: Option<i64>,
}

impl Store {
    /// Records a replay job and its audit row. A detached job waits for a fleet member;
    /// another is running from the start, run by `runner`.
    pub async fn create_replay(
        &self,
        operator: &Operator,
        replay: &NewReplay,
        runner: &str,
    ) -> Result<ReplayJob> {
        let selection = Selection::Filter(replay.filter.clone());
        let counted = self.count_selected(&selection).await?;
        let total = replay.most.map_or(counted, |most| counted.min(most.max(0)));
        let mut tx = self.pool.begin().await?;
        let pace = replay
            .pace
            .as_ref()
            .map(|p| serde_json::to_value(p).expect("a pace serializes"));
        let retry =
            (replay.retry.as_ref()).map(|r| serde_json::to_value(r).expect("an action serializes"));
        let kind = match replay.retry {
            Some(_) => "retry",
            None => "replay",
        };
        let details = serde_json::json!({
            "target_topic": replay.target_topic,
            "mark_resolved": replay.mark_resolved,
            "rate": replay.rate,
            "pace": pace,
            "detached": replay.detached,
        });
        let audit = self
            .insert_audit(&mut tx, operator, kind, Some(&selection), Some(details))
            .await?;
        // Jobs a member of an earlier release would run wrongly (a retry, or paced) are
        // left to the fleet by `by_fleet`, which only this release's members claim.
        let new_kind = replay.retry.is_some() || replay.pace.is_some();
        let row = sqlx::query(
            "INSERT INTO recovery_replay (actor, filter, target_topic, mark_resolved, rate, \
                 detached, by_fleet, kind, pace, retry, status, runner, heartbeat_at, total, \
                 step_started_at, force, upto_id, approval_id, approved_rate) \
             VALUES ($1, $2, $3, $4, $5, $6 AND NOT $9, $6 AND $9, $10, $11, $12, \
                 CASE WHEN $6 THEN 'pending' ELSE 'running' END, \
                 CASE WHEN $6 THEN NULL ELSE $7 END, now(), $8, now(), $13, \
                 CASE WHEN $14 THEN (SELECT coalesce(max(id), 0) FROM recovery_task) END, \
                 $15, CASE WHEN $15 IS NOT NULL THEN $16 END) \
             RETURNING *",
        )
        .bind(&operator.actor)
        .bind(serde_json::to_value(&replay.filter).expect("a filter serializes"))
        .bind(&replay.target_topic)
        .bind(replay.mark_resolved)
        .bind(replay.rate)
        .bind(replay.detached)
        .bind(runner)
        .bind(total)
        .bind(new_kind)
        .bind(kind)
        .bind(pace)
        .bind(retry)
        .bind(replay.force)
        .bind(replay.bounded)
        .bind(replay.approval)
        .bind(replay.pace.as_ref().map(|p| p.rate).or(replay.rate))
        .fetch_one(&mut *tx)
        .await?;
        let job = job_from_row(&row)?;
        sqlx::query("UPDATE recovery_audit SET details = details || jsonb_build_object('job', $1::bigint) WHERE id = $2")
            .bind(job.id)
            .bind(audit)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(job)
    }

    /// Up to `limit` replay jobs, newest first, older than job `after` if given.
    pub async fn replays(&self, limit: i64, after: Option<i64>) -> Result<Vec<ReplayJob>> {
        let rows = sqlx::query(
            "SELECT * FROM recovery_replay WHERE $2::bigint IS NULL OR id < $2 \
             ORDER BY id DESC LIMIT $1",
        )
        .bind(limit.clamp(1, 1000))
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// One replay job.
    pub async fn replay(&self, id: i64) -> Result<Option<ReplayJob>> {
        let row = sqlx::query("SELECT * FROM recovery_replay WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Cancels a job that has not ended (its runner stops at its next batch), audited.
    /// Answers the job as it is now.
    pub async fn cancel_replay(&self, operator: &Operator, id: i64) -> Result<ReplayJob> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "UPDATE recovery_replay SET status = 'cancelled', finished_at = now() \
             WHERE id = $1 AND status IN ('pending', 'running', 'paused', 'failed') RETURNING *",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            drop(tx);
            return match self.replay(id).await? {
                None => Err(StoreError::Replay(ReplayRowError::Unknown(id))),
                Some(job) => Err(StoreError::Replay(ReplayRowError::NotYours {
                    id,
                    status: job.status,
                    runner: None,
                })),
            };
        };
        // Read before the commit: a row that cannot be shown (a time set by hand beyond
        // what a time can hold) answers its error with nothing changed.
        let job = job_from_row(&row)?;
        self.insert_audit(
            &mut tx,
            operator,
            "replay_cancel",
            None,
            Some(serde_json::json!({ "job": id })),
        )
        .await?;
        tx.commit().await?;
        Ok(job)
    }

    /// Resumes job `id` for `operator`, audited (`replay_resume`): a paused job, or any
    /// job not ended whose runner stopped (its hold went stale, or it is `dead_runner`,
    /// known dead), is taken by `runner`, or with `detach` handed to the fleet's members.
    /// `slower` sets a new rate (of a paced job, its full pace). A paused job starts its
    /// step's count and judgement again from here. A job already waiting for the fleet's
    /// members is not resumed again for them (two resumes at once: one wins).
    pub async fn resume_replay(
        &self,
        operator: &Operator,
        id: i64,
        runner: &str,
        detach: bool,
        dead_runner: Option<&str>,
        slower: Option<&Resumed>,
    ) -> Result<ReplayJob> {
        let mut tx = self.pool.begin().await?;
        let pace = slower
            .and_then(|s| s.pace.as_ref())
            .map(|p| serde_json::to_value(p).expect("a pace serializes"));
        let row = sqlx::query(
            "UPDATE recovery_replay SET \
                 status = CASE WHEN $3 THEN 'pending' ELSE 'running' END, \
                 runner = CASE WHEN $3 THEN NULL ELSE $2 END, \
                 detached = detached OR ($3 AND kind = 'replay' AND pace IS NULL), \
                 by_fleet = by_fleet OR ($3 AND (kind = 'retry' OR pace IS NOT NULL)), \
                 heartbeat_at = now(), error = NULL, paused_reason = NULL, \
                 pace = coalesce($6, pace), rate = coalesce($7, rate), \
                 step_base = CASE WHEN status = 'paused' THEN produced + skipped ELSE step_base END, \
                 step_cursor = CASE WHEN status = 'paused' THEN cursor ELSE step_cursor END, \
                 step_started_at = CASE WHEN status = 'paused' THEN now() ELSE step_started_at END \
             WHERE id = $1 AND ( \
                 status = 'pending' AND (detached OR by_fleet) AND NOT $3 \
                 OR status = 'paused' \
                    AND (runner IS NULL OR heartbeat_at < now() - $4 * interval '1 second' \
                         OR runner = $5) \
                 OR status IN ('running', 'failed') \
                    AND (runner IS NULL OR heartbeat_at < now() - $4 * interval '1 second' \
                         OR status = 'failed' OR runner = $5)) \
             RETURNING *",
        )
        .bind(id)
        .bind(runner)
        .bind(detach)
        .bind(REPLAY_STALE_AFTER.as_secs_f64())
        .bind(dead_runner)
        .bind(pace)
        .bind(slower.and_then(|s| s.rate))
        .fetch_optional(&mut *tx)
        .await?;
        match row {
            Some(row) => {
                // Read before the commit, as in `cancel_replay`.
                let job = job_from_row(&row)?;
                let details = serde_json::json!({
                    "job": id,
                    "detached": detach,
                    "rate": slower.map(|s| s.rate.or(s.pace.as_ref().map(|p| p.rate))),
                });
                self.insert_audit(&mut tx, operator, "replay_resume", None, Some(details))
                    .await?;
                tx.commit().await?;
                Ok(job)
            }
            None => {
                drop(tx);
                match self.replay(id).await? {
                    None => Err(StoreError::Replay(ReplayRowError::Unknown(id))),
                    Some(job) => Err(StoreError::Replay(ReplayRowError::NotYours {
                        id,
                        status: job.status,
                        runner: job.runner,
                    })),
                }
            }
        }
    }

    /// Claims the oldest detached job that waits or whose runner stopped, for `runner`.
    pub async fn claim_detached_replay(&self, runner: &str) -> Result<Option<ReplayJob>> {
        let row = sqlx::query(
            "UPDATE recovery_replay SET status = 'running', runner = $1, heartbeat_at = now() \
             WHERE id = (SELECT id FROM recovery_replay \
                         WHERE (detached OR by_fleet) \
                               AND (status = 'pending' OR status = 'running' \
                               AND heartbeat_at < now() - $2 * interval '1 second') \
                         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING *",
        )
        .bind(runner)
        .bind(REPLAY_STALE_AFTER.as_secs_f64())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        match job_from_row(&row) {
            Ok(job) => Ok(Some(job)),
            Err(error) => {
                // A row that cannot be read (written by hand) fails its job rather than
                // being taken again by every member once its heartbeat lapses.
                let id: i64 = row.try_get("id")?;
                let reason = format!("the job's row cannot be read: {error}");
                self.finish_replay(id, runner, Some(&reason)).await?;
                Err(error)
            }
        }
    }

    /// Keeps `runner`'s hold on job `id`; false when the job was cancelled or taken over.
    pub async fn beat_replay(&self, id: i64, runner: &str) -> Result<bool> {
        let beat = sqlx::query(
            "UPDATE recovery_replay SET heartbeat_at = now() \
             WHERE id = $1 AND runner = $2 AND status = 'running'",
        )
        .bind(id)
        .bind(runner)
        .execute(&self.pool)
        .await?;
        Ok(beat.rows_affected() == 1)
    }

    /// Lets go of job `id` when `runner` stops before it ends: a detached job waits for
    /// the next member, a foreground one for `replays resume`, a paused one (paused by
    /// an operator while `runner` ran it) for a resume, which waits for this.
    pub async fn release_replay(&self, id: i64, runner: &str) -> Result<()> {
        sqlx::query(
            "UPDATE recovery_replay SET runner = NULL, \
                 status = CASE WHEN detached AND status = 'running' THEN 'pending' \
                               ELSE status END \
             WHERE id = $1 AND runner = $2 AND status IN ('running', 'paused')",
        )
        .bind(id)
        .bind(runner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records that the batch up to task `upto` is about to be produced, and where the
    /// target partitions end. False when the job is no longer `runner`'s.
    pub async fn begin_replay_batch(
        &self,
        id: i64,
        runner: &str,
        upto: i64,
        marks: &Marks,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE recovery_replay SET pending_upto = $3, pending_marks = $4, heartbeat_at = now() \
             WHERE id = $1 AND runner = $2 AND status = 'running'",
        )
        .bind(id)
        .bind(runner)
        .bind(upto)
        .bind(serde_json::to_value(marks).expect("marks serialize"))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// In `conn`'s transaction: the batch up to `upto` is produced. With
    /// `still_pending`, `upto` is a page inside the pending batch, whose end and marks
    /// are kept. A job cancelled meanwhile still counts what its runner produced before
    /// it stopped. Returns false when the job is no longer `runner`'s (the caller rolls
    /// back).
    pub(crate) async fn end_replay_batch(
        conn: &mut PgConnection,
        id: i64,
        runner: &str,
        upto: i64,
        produced: i64,
        skipped: i64,
        still_pending: bool,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE recovery_replay SET cursor = $3, produced = produced + $4, \
                 skipped = skipped + $5, \
                 pending_upto = CASE WHEN $6 THEN pending_upto END, \
                 pending_marks = CASE WHEN $6 THEN pending_marks END, \
                 heartbeat_at = now() \
             WHERE id = $1 AND runner = $2 AND status IN ('running', 'cancelled')",
        )
        .bind(id)
        .bind(runner)
        .bind(upto)
        .bind(produced)
        .bind(skipped)
        .bind(still_pending)
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 1 {
            sqlx::query(
                "UPDATE recovery_audit SET count = count + $2 \
                 WHERE action IN ('replay', 'retry') AND (details->>'job')::bigint = $1",
            )
            .bind(id)
            .bind(produced)
            .execute(&mut *conn)
            .await?;
        }
        Ok(done.rows_affected() == 1)
    }

    /// Ends job `id` as `done` or `failed` (with the error), if `runner` still holds it.
    pub async fn finish_replay(&self, id: i64, runner: &str, error: Option<&str>) -> Result<()> {
        sqlx::query(
            "UPDATE recovery_replay SET \
                 status = CASE WHEN $3::text IS NULL THEN 'done' ELSE 'failed' END, \
                 error = $3, finished_at = CASE WHEN $3::text IS NULL THEN now() END \
             WHERE id = $1 AND runner = $2 AND status = 'running'",
        )
        .bind(id)
        .bind(runner)
        .bind(error)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The next tasks of `filter` after task id `after` and up to `upto`, in id order:
    /// at most `limit`, and no more than `max_bytes` of payload unless the first alone is.
    pub async fn replay_batch(
        &self,
        filter: &TaskFilter,
        after: i64,
        upto: Option<i64>,
        limit: i64,
        max_bytes: i64,
    ) -> Result<ReplayPage> {
        let selection = Selection::Filter(filter.clone());
        let statement = format!(
            "SELECT {columns} FROM (SELECT *, row_number() OVER w AS rn, sum(coalesce(octet_length(msg_key), 0) \
                 + coalesce(octet_length(msg_value), 0) + octet_length(msg_headers)) OVER w AS running \
             FROM (SELECT * FROM recovery_task WHERE {CONDITION} AND id > $20 \
                   AND ($21::bigint IS NULL OR id <= $21) ORDER BY id LIMIT $22) t \
             WINDOW w AS (ORDER BY id)) b \
             WHERE rn = 1 OR running <= $23 ORDER BY id",
            columns = task_columns!()
        );
        let mut tx = self.pool.begin_with(ORDERED_WALK).await?;
        let rows = bind_selection(sqlx::query(&statement), &selection)
            .bind(after)
            .bind(upto)
            .bind(limit)
            .bind(max_bytes)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut page = ReplayPage::default();
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            page.last = Some(id);
            match task_from_row(row) {
                Ok(task) => page.tasks.push(task),
                Err(error) => {
                    tracing::warn!(task_id = id, %error, "a task that cannot be read is skipped");
                    page.unreadable += 1;
                }
            }
        }
        Ok(page)
    }

    /// The distinct topics the tasks of `filter` would be replayed to by default (their
    /// original topics).
    pub async fn original_topics(&self, filter: &TaskFilter) -> Result<Vec<String>> {
        let selection = Selection::Filter(filter.clone());
        let statement = format!(
            "SELECT DISTINCT original_topic FROM recovery_task \
             WHERE {CONDITION} AND original_topic IS NOT NULL ORDER BY 1"
        );
        let rows = bind_selection(sqlx::query(&statement), &selection)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// How many tasks `selection` selects.
    pub async fn count_selected(&self, selection: &Selection) -> Result<i64> {
        let statement = format!("SELECT count(*) FROM recovery_task WHERE {CONDITION}");
        let row = bind_selection(sqlx::query(&statement), selection)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }
}
