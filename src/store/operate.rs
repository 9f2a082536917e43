//! Operator actions: retry, discard and resolve, by ids or by filter.
//!
//! An action walks its tasks in id order, a few hundred per transaction, so it runs in
//! bounded memory on any number of tasks and never holds locks for long. Every change
//! bumps the fencing token and gives up the lease, so an attempt running at that moment
//! cannot overwrite the operator's decision (its result is fenced out); that attempt gets
//! its history row (`fenced`), the action its own (`operator_<action>`). The audit row is
//! written with the first batch and its count grows in each batch's transaction. Between
//! batches it pauses ([`YIELD_FACTOR`] times the last batch's time), so that a bulk action
//! leaves the fleet most of the database: whichever face started it gets the same pace.
//!
//! A retry or resolve leaves alone, unless forced, a task whose compensation has started
//! for its current failure (running, waiting to retry, compensated or failed): the
//! compensation may have undone work the task's checkpoint says is done. A forced retry
//! starts such a task over from no checkpoint; forcing either verb cancels a compensation
//! still pending (a running call's claim is lost: it is told to stop, its result dropped).

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{PgConnection, Row};

use super::budgets::Budgets;
use super::due::Due;
use super::filter::{bind_selection, Selection, CONDITION};
use super::{Result, Store, StoreError, ORDERED_WALK};
use crate::task::{AttemptOutcome, Status, TaskId};

/// Tasks changed per transaction.
pub const ACTION_BATCH: i64 = 500;

/// How long an action pauses after each batch, as a multiple of the time that batch took:
/// an action by filter over a million tasks yields the database to the fleet's drain (on
/// the benchmark's two cores the drain kept 0.67 of its rate beside an action that never
/// paused; see docs/benchmarks.md). With 2 it runs a third of the time.
pub(crate) const YIELD_FACTOR: u32 = 2;

/// Longest wait for a row lock held by a worker before the batch is tried again.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// Who acts, and why: written to the audit log.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The actor: an admin token's name, or `cli:<user>`.
    pub actor: String,
    /// Why, in the operator's words.
    pub reason: Option<String>,
}

/// How many attempts a retried task gets, counted from where it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Its whole attempt budget again.
    #[default]
    Fresh,
    /// `attempts` more than it has left: a task that used its budget up gets exactly
    /// this many, even when its last attempts never called the handler (a lapsed lease,
    /// then "no attempts left").
    More {
        /// How many more.
        attempts: i32,
        /// The fleet's budgets ([`crate::Fleet::budgets`]), by which what a task has
        /// left is counted.
        budgets: Budgets,
    },
}

/// What an operator does to tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Back to `failed`, due at `at` (now by default; never before its handler's
    /// breaker hold), with a new attempt budget.
    Retry {
        /// When the next attempt is due; now when absent.
        at: Option<Due>,
        /// The attempts it gets.
        budget: Budget,
        /// Also retry tasks whose compensation has started: they start over from no
        /// checkpoint, and a compensation still pending is cancelled.
        #[serde(default)]
        force: bool,
    },
    /// Give up on it: `discarded`.
    Discard,
    /// Declare it handled: `resolved`.
    Resolve {
        /// Also resolve tasks whose compensation has started (a compensation still
        /// pending is cancelled).
        #[serde(default)]
        force: bool,
    },
}

impl Action {
    /// The verb, as written in the audit log.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Retry { .. } => "retry",
            Action::Discard => "discard",
            Action::Resolve { .. } => "resolve",
        }
    }

    /// The outcome of the history row it writes for each task it changes.
    pub fn history(&self) -> AttemptOutcome {
        match self {
            Action::Retry { .. } => AttemptOutcome::OperatorRetry,
            Action::Discard => AttemptOutcome::OperatorDiscard,
            Action::Resolve { .. } => AttemptOutcome::OperatorResolve,
        }
    }

    /// Whether it leaves alone tasks whose compensation has started (a retry or resolve
    /// not forced).
    pub fn spares_compensations(&self) -> bool {
        matches!(
            self,
            Action::Retry { force: false, .. } | Action::Resolve { force: false }
        )
    }

    /// Whether it was forced over compensations (written to the audit row).
    fn forced(&self) -> bool {
        matches!(
            self,
            Action::Retry { force: true, .. } | Action::Resolve { force: true }
        )
    }

    /// The statuses it changes; tasks in other statuses are left alone. A resolved task
    /// is never retried (that is what replay is for).
    pub fn applies_to(&self) -> &'static [Status] {
        match self {
            Action::Retry { .. } => &[Status::Failed, Status::PermanentFailure, Status::Discarded],
            Action::Discard | Action::Resolve { .. } => &[Status::Failed, Status::PermanentFailure],
        }
    }

    /// What the audit row records beyond the verb: a retry's time and budget (`null`:
    /// now, a whole budget).
    fn details(&self) -> Option<serde_json::Value> {
        match self {
            Action::Retry { at, budget, .. } => Some(serde_json::json!({
                "at": at,
                "more_attempts": match budget {
                    Budget::Fresh => None,
                    Budget::More { attempts, .. } => Some(attempts),
                },
            })),
            Action::Discard | Action::Resolve { .. } => None,
        }
    }

    fn new_status(&self) -> Status {
        match self {
            Action::Retry { .. } => Status::Failed,
            Action::Discard => Status::Discarded,
            Action::Resolve { .. } => Status::Resolved,
        }
    }
}

/// What an action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ActionReport {
    /// Its row in the audit log.
    pub audit_id: i64,
    /// Tasks changed.
    pub changed: i64,
    /// Tasks left alone because their compensation has started (a retry or resolve
    /// changes them only when forced).
    pub refused: i64,
}

/// What an action would do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applicable {
    /// Tasks it would change.
    pub changes: i64,
    /// Tasks in a status it applies to that it would leave alone because their
    /// compensation has started (see [`Action::spares_compensations`]).
    pub refused: i64,
}

/// Whether compensation `c` of task `t` has started for the task's current failure: a
/// compensation is owed only while the task is a permanent failure (or discarded after
/// one); a task an operator retried since is failed, and its old compensation no longer
/// speaks for it.
pub(super) const STARTED: &str = "(t.status IN ('permanent_failure', 'discarded') \
    AND c.attempts > 0 AND c.state <> 'cancelled')";

// The history rows' outcomes are `$37` (`fenced`, for an attempt running meanwhile) and
// `$38` (the action's own, [`Action::history`]).
const BATCH: &str = r#"
WITH target AS (
    SELECT id, status, lease_owner, lease_version, attempts, leased_at, next_attempt_at, order_key
    FROM recovery_task
    WHERE {CONDITION} AND id > $20 AND status = ANY($21)
    ORDER BY id
    LIMIT $22
    FOR UPDATE),
-- Their compensations, locked (after the tasks, as a worker's finish locks them): a claim
-- starting now skips them until this commits, and one that committed meanwhile is seen.
owed AS MATERIALIZED (
    SELECT c.task_id, c.attempts, c.state
    FROM recovery_compensation c JOIN target ON c.task_id = target.id
    FOR UPDATE OF c),
started AS (
    SELECT t.id FROM target t JOIN owed c ON c.task_id = t.id WHERE {STARTED}),
chosen AS (
    SELECT * FROM target WHERE NOT $36 OR id NOT IN (SELECT id FROM started)),
interrupted AS (
    INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, lease_version, attempts, lease_owner, recovery_clamp_time(coalesce(leased_at, now())),
           recovery_elapsed_ms(leased_at, now()),
           $37::text, 'an operator acted (' || $23 || ') while this attempt ran; its result was dropped'
    FROM chosen
    WHERE lease_owner IS NOT NULL
    ON CONFLICT DO NOTHING),
-- That attempt's call runs on until its member hears of the action: nothing of the task,
-- nor of its key, starts before it has stopped (see `recovery_stopping_call`).
-- Rows past their deadline hold nothing back (their members died or never said so):
-- each action clears them, so the table holds no more than the calls fenced since.
expired_stops AS (
    DELETE FROM recovery_stopping_call WHERE ends_by < now()),
stopping AS (
    INSERT INTO recovery_stopping_call (task_id, lease_version, order_key, ends_by)
    SELECT id, lease_version, order_key, next_attempt_at
    FROM chosen
    WHERE lease_owner IS NOT NULL AND next_attempt_at > now()
    ON CONFLICT DO NOTHING),
changed AS (
    UPDATE recovery_task t
    SET status = $24,
        lease_owner = NULL,
        leased_at = NULL,
        lease_version = t.lease_version + 1,
        -- A held task stays behind its key's open task; the others wait for their
        -- handler's breaker hold, if any.
        next_attempt_at = CASE WHEN $24 = 'failed' AND NOT t.held
            THEN (SELECT due_at FROM recovery_due_at(t.handler,
                      coalesce($25, now() + make_interval(secs => $30), now())))
            ELSE t.next_attempt_at END,
        finished_at = CASE WHEN $24 = 'failed' THEN NULL ELSE now() END,
        -- From where the task stands: a whole budget after the attempts it made, or N
        -- more than it has left (attempts counted beyond its budget are not left).
        attempt_grants = CASE
            WHEN $24 <> 'failed' THEN t.attempt_grants
            WHEN $26::int IS NULL THEN t.attempts
            ELSE least(t.attempt_grants::bigint + $26 + greatest(
                     t.attempts - recovery_attempts_allowed(t, $31, $32, $33, $34, $35), 0),
                 2147483647)::int END,
        -- A forced retry over a compensation starts over: the checkpoint says done what
        -- the compensation may have undone.
        checkpoint = CASE WHEN $24 = 'failed' AND t.id IN (SELECT id FROM started) THEN NULL
                          ELSE t.checkpoint END,
        -- Whatever is due now is due by this action, not by a job's earlier release (a
        -- job's own batch marks its tasks again after it).
        redrive_job = NULL,
        updated_at = now()
    FROM chosen
    WHERE t.id = chosen.id
    RETURNING t.id, t.lease_version, t.attempts),
-- A retried or resolved task no longer owes its compensation (a new permanent failure
-- owes a new one); a discarded one still does. Cancelling moves the version on: a running
-- call's claim is lost, and its member stops it.
cancelled AS (
    UPDATE recovery_compensation c
    SET state = 'cancelled', finished_at = now(), version = c.version + 1
    FROM changed
    WHERE c.task_id = changed.id AND c.state = 'pending' AND $24 IN ('failed', 'resolved')
    RETURNING c.task_id),
-- Members check their leases and claims at once when told (on commit) that some were
-- fenced, instead of at their next heartbeat.
told AS (
    SELECT pg_notify(current_schema() || '_fenced', '')
    WHERE EXISTS (SELECT 1 FROM chosen WHERE lease_owner IS NOT NULL)
       OR EXISTS (SELECT 1 FROM cancelled)),
recorded AS (
    INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, lease_version, attempts, $27, now(), 0, $38::text, $28 FROM changed),
counted AS (
    UPDATE recovery_audit SET count = count + (SELECT count(*) FROM changed) WHERE id = $29)
SELECT (SELECT max(id) FROM target) AS scanned_to, (SELECT count(*) FROM changed) AS changed,
       (SELECT count(*) FROM target) - (SELECT count(*) FROM chosen) AS refused,
       (SELECT count(*) FROM told) AS told
"#;

const COUNT: &str = r#"
SELECT count(*) AS applies,
       count(*) FILTER (WHERE EXISTS (
           SELECT 1 FROM recovery_compensation c WHERE c.task_id = t.id AND {STARTED})) AS started
FROM recovery_task t WHERE {CONDITION} AND status = ANY($20)
"#;

/// `statement` with its fragments filled in.
fn statement(template: &str) -> String {
    template
        .replace("{CONDITION}", CONDITION)
        .replace("{STARTED}", STARTED)
}

impl Store {
    /// Applies `action` to the tasks of `selection` (those in a status it applies to),
    /// with its audit row. Listed ids that do not exist are an error before anything
    /// changes.
    pub async fn act(
        &self,
        operator: &Operator,
        action: &Action,
        selection: &Selection,
    ) -> Result<ActionReport> {
        self.act_reporting(operator, action, selection, None, |_| {})
            .await
    }

    /// [`Store::act`], changing no more than `most` tasks if given (an approved
    /// action), telling `progress` what was done so far (its audit row, tasks changed
    /// and left alone) after every batch it committed.
    pub async fn act_reporting(
        &self,
        operator: &Operator,
        action: &Action,
        selection: &Selection,
        most: Option<i64>,
        mut progress: impl FnMut(ActionReport) + Send,
    ) -> Result<ActionReport> {
        if let Selection::Ids(ids) = selection {
            self.ensure_exist(ids).await?;
        }
        let mut audit_id = None;
        let mut cursor = 0_i64;
        let mut changed = 0_i64;
        let mut refused = 0_i64;
        loop {
            let limit = most.map_or(ACTION_BATCH, |most| (most - changed).min(ACTION_BATCH));
            if limit <= 0 {
                break;
            }
            let mut tries = 0;
            let batch_started = std::time::Instant::now();
            let batch = loop {
                let mut tx = self.pool.begin_with(ORDERED_WALK).await?;
                let audit = match audit_id {
                    Some(id) => id,
                    None => {
                        let mut details = action.details();
                        if action.forced() {
                            let forced = json!({ "force": true });
                            details = Some(match details {
                                Some(serde_json::Value::Object(mut fields)) => {
                                    fields.insert("force".into(), true.into());
                                    serde_json::Value::Object(fields)
                                }
                                _ => forced,
                            });
                        }
                        self.insert_audit(
                            &mut tx,
                            operator,
                            action.name(),
                            Some(selection),
                            details,
                        )
                        .await?
                    }
                };
                let walk = Walk { cursor, limit };
                match apply_batch(&mut tx, operator, action, selection, walk, Some(audit)).await {
                    Ok(batch) => {
                        tx.commit().await?;
                        audit_id = Some(audit);
                        break batch;
                    }
                    Err(StoreError::Database(error)) if tries < 5 && is_contention(&error) => {
                        tries += 1;
                        tracing::debug!(%error, "operator batch met a lock; trying again");
                    }
                    Err(error) => return Err(error),
                }
            };
            changed += batch.changed;
            refused += batch.refused;
            progress(ActionReport {
                audit_id: audit_id.expect("the batch wrote the audit row"),
                changed,
                refused,
            });
            match batch.scanned_to {
                Some(last) => cursor = last,
                None => break,
            }
            tokio::time::sleep(batch_started.elapsed() * YIELD_FACTOR).await;
        }
        Ok(ActionReport {
            audit_id: audit_id.expect("the first batch wrote the audit row"),
            changed,
            refused,
        })
    }

    /// How many tasks of `selection` `action` would change now, and how many it would
    /// leave alone because their compensation has started.
    pub async fn count_applicable(
        &self,
        action: &Action,
        selection: &Selection,
    ) -> Result<Applicable> {
        let applies: Vec<&str> = action.applies_to().iter().map(|s| s.as_str()).collect();
        let statement = statement(COUNT);
        let row = bind_selection(sqlx::query(&statement), selection)
            .bind(applies)
            .fetch_one(&self.pool)
            .await?;
        let (applies, started): (i64, i64) = (row.try_get("applies")?, row.try_get("started")?);
        Ok(match action.spares_compensations() {
            true => Applicable {
                changes: applies - started,
                refused: started,
            },
            false => Applicable {
                changes: applies,
                refused: 0,
            },
        })
    }

    /// Fails with [`StoreError::UnknownTasks`] when any of `ids` is not a task.
    pub async fn ensure_exist(&self, ids: &[TaskId]) -> Result<()> {
        let raw: Vec<i64> = ids.iter().map(|id| id.0).collect();
        let missing: Vec<i64> = sqlx::query_scalar(
            "SELECT i FROM unnest($1::bigint[]) AS i \
             WHERE NOT EXISTS (SELECT 1 FROM recovery_task WHERE id = i) ORDER BY i",
        )
        .bind(raw)
        .fetch_all(&self.pool)
        .await?;
        if missing.is_empty() {
            Ok(())
        } else {
            Err(StoreError::UnknownTasks(
                missing.into_iter().map(TaskId).collect(),
            ))
        }
    }
}

/// What one batch of an action did.
pub(crate) struct Batch {
    /// The last task id it looked at; none: nothing was left.
    pub(crate) scanned_to: Option<i64>,
    /// Tasks it changed.
    pub(crate) changed: i64,
    /// Tasks it left alone because their compensation has started.
    pub(crate) refused: i64,
}

/// Where the next batch of an action starts, and how many tasks it takes at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walk {
    /// The batch takes tasks after this id.
    pub(crate) cursor: i64,
    /// Tasks it takes at most.
    pub(crate) limit: i64,
}

impl Walk {
    /// A whole batch from the start (a selection of ids).
    pub(crate) const WHOLE: Walk = Walk {
        cursor: 0,
        limit: ACTION_BATCH,
    };
}

/// Applies `action` to the next batch of `selection` (`walk`), in the caller's
/// transaction (begun with [`ORDERED_WALK`]), adding the count to audit row `audit` if
/// given.
pub(crate) async fn apply_batch(
    conn: &mut PgConnection,
    operator: &Operator,
    action: &Action,
    selection: &Selection,
    walk: Walk,
    audit: Option<i64>,
) -> Result<Batch> {
    let statement = statement(BATCH);
    let applies: Vec<&str> = action.applies_to().iter().map(|s| s.as_str()).collect();
    let (at, delay) = match action {
        Action::Retry {
            at: Some(Due::At(time)),
            ..
        } => (Some(*time), None),
        Action::Retry {
            at: Some(Due::In(delay)),
            ..
        } => (None, Some(delay.as_secs_f64())),
        _ => (None, None),
    };
    let no_budgets = Budgets::default();
    let (more, budgets) = match action {
        Action::Retry {
            budget: Budget::More { attempts, budgets },
            ..
        } => (Some(*attempts), budgets),
        _ => (None, &no_budgets),
    };
    sqlx::query(LOCK_TIMEOUT).execute(&mut *conn).await?;
    let query = bind_selection(sqlx::query(&statement), selection)
        .bind(walk.cursor)
        .bind(&applies)
        .bind(walk.limit)
        .bind(action.name())
        .bind(action.new_status().as_str())
        .bind(at)
        .bind(more)
        .bind(&operator.actor)
        .bind(&operator.reason)
        .bind(audit)
        .bind(delay);
    let row = budgets
        .bind(query)
        .bind(action.spares_compensations())
        .bind(AttemptOutcome::Fenced.as_str())
        .bind(action.history().as_str())
        .fetch_one(&mut *conn)
        .await?;
    Ok(Batch {
        scanned_to: row.try_get("scanned_to")?,
        changed: row.try_get("changed")?,
        refused: row.try_get("refused")?,
    })
}

/// A lock wait that timed out or a deadlock the database broke: worth another try.
fn is_contention(error: &sqlx::Error) -> bool {
    let code = error.as_database_error().and_then(|e| e.code());
    matches!(code.as_deref(), Some("55P03" | "40P01" | "40001"))
}
