//! Why a task is not running now, or how it ended: what a person reads first about a
//! task (`tasks show`, `GET /api/v1/tasks/{id}`), as data and in words.
//!
//! Every fact comes from one statement ([`DETAIL`]) that reads the task with its
//! handler's breaker, its key's open tasks, the calls still stopping, the live members
//! and its compensation, all against PostgreSQL's `now()`: one clock, one snapshot. The
//! attempt budget, which the reader's configuration knows and the store does not, is
//! applied afterwards ([`Waiting::with_attempts_allowed`]).
//!
//! A person never reads a held task's far-future due time nor a final task's stale lease
//! deadline: they are not part of any state here.

mod words;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::members::MEMBER_LIVE_WITHIN;
use super::row::task_columns;
use super::{Attempt, Result};
use crate::task::{AttemptOutcome, Status, Task, TaskId};

/// A task read with every fact its [`Waiting`] needs; `$1` is the task id, `$2` how
/// recently a member must have been seen to count as live, in milliseconds.
pub(super) const DETAIL: &str = concat!(
    "SELECT ",
    task_columns!("t."),
    r#", now() AS as_of,
       b.state AS breaker_state, b.forced AS breaker_forced, b.hold_until AS breaker_until,
       b.reason AS breaker_reason,
       ahead.id AS ahead_id,
       CASE WHEN t.held THEN
           (SELECT count(*) FROM recovery_task o
            WHERE o.order_key = t.order_key AND o.status = 'failed' AND o.id <> t.id
              AND (o.id < t.id OR NOT o.held)) END AS ahead_count,
       stop.task_id AS stopping_task, stop.ends_by AS stopping_until,
       (SELECT count(*) FROM recovery_member m
        WHERE m.last_seen > now() - $2 * interval '1 millisecond' AND 'worker' = ANY(m.roles)
          AND (m.handlers = '{}' OR t.handler = ANY(m.handlers))) AS serving_members,
       c.state AS compensation_state, c.due_at AS compensation_due,
       c.attempts AS compensation_attempts, c.finished_at AS compensation_finished,
       c.last_error AS compensation_error,
       -- A claim bumps the version and a result or a release bumps it again: a claim
       -- runs while no history row has the version before the current one or later.
       (c.attempts > 0 AND c.version - 1 > coalesce(
           (SELECT max(h.version) FROM recovery_compensation_attempt h
            WHERE h.task_id = c.task_id), -1)) AS compensation_running
FROM recovery_task t
LEFT JOIN recovery_breaker b ON b.handler = t.handler AND b.state <> 'closed'
-- The open task of its key that goes first: the one not held, else the oldest.
LEFT JOIN LATERAL (
    SELECT o.id FROM recovery_task o
    WHERE t.held AND o.order_key = t.order_key AND o.status = 'failed' AND o.id <> t.id
    ORDER BY o.held, o.id LIMIT 1) ahead ON true
LEFT JOIN LATERAL (
    SELECT s.task_id, s.ends_by FROM recovery_stopping_call s
    WHERE t.status = 'failed' AND s.ends_by > now()
      AND (s.task_id = t.id OR (t.order_key IS NOT NULL AND s.order_key = t.order_key))
    ORDER BY s.ends_by DESC LIMIT 1) stop ON true
-- A compensation speaks for a task only while it is final after a permanent failure.
LEFT JOIN recovery_compensation c
    ON c.task_id = t.id AND t.status IN ('permanent_failure', 'discarded')
WHERE t.id = $1
"#
);

/// [`MEMBER_LIVE_WITHIN`] in milliseconds, [`DETAIL`]'s `$2`.
pub(super) fn live_within_ms() -> f64 {
    MEMBER_LIVE_WITHIN.as_millis() as f64
}

/// Why a task is not running now, or how it ended: the state, and a sentence saying it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Waiting {
    /// The state and its particulars.
    #[serde(flatten)]
    pub state: WaitingState,
    /// The same in words, its times in UTC and relative to `as_of`.
    pub words: String,
}

/// What a task waits for, or how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum WaitingState {
    /// An attempt runs now.
    Running {
        /// The member whose worker holds the lease.
        member: String,
        /// Which attempt.
        attempt: i32,
        /// When the lease was taken.
        since: Option<DateTime<Utc>>,
        /// When the lease lapses unless renewed.
        lease_until: DateTime<Utc>,
    },
    /// The running attempt's lease lapsed (its member died or stalled): the next claim
    /// takes the task over.
    LeaseLapsed {
        /// The member that held it.
        member: String,
        /// Which attempt.
        attempt: i32,
        /// When it lapsed.
        lapsed_at: DateTime<Utc>,
    },
    /// An operator fenced out a call of this task, or of a task of its key, that has
    /// not stopped yet: nothing of the key starts before it has.
    Stopping {
        /// The task whose call is stopping (this one, or one of its key).
        task: TaskId,
        /// When that call is stopped at the latest (its lease deadline).
        ends_by: DateTime<Utc>,
    },
    /// Behind an open task of its ordering key.
    Held {
        /// The key's open task that goes first (absent only for a moment).
        behind: Option<TaskId>,
        /// How many open tasks of the key go before it.
        ahead: i64,
    },
    /// Its handler's circuit breaker holds its tasks.
    BreakerOpen {
        /// The handler.
        handler: String,
        /// `open` or `half_open`.
        breaker: String,
        /// Whether an operator forced it open (it holds until released).
        forced: bool,
        /// When the hold ends; absent while forced open (it holds until released).
        #[serde(skip_serializing_if = "Option::is_none")]
        until: Option<DateTime<Utc>>,
        /// Why it opened.
        reason: Option<String>,
    },
    /// Waiting for its due time, or due and waiting for a worker.
    Due {
        /// When it is (or was) due.
        at: DateTime<Utc>,
        /// Live members whose workers serve its handler.
        serving_members: i64,
    },
    /// Its budget is used up: the next claim ends it as a permanent failure without
    /// calling the handler.
    NoAttemptsLeft {
        /// Attempts used.
        used: i32,
        /// Attempts it may make in all.
        allowed: i64,
        /// When that claim is due.
        due_at: DateTime<Utc>,
    },
    /// Final.
    Finished {
        /// The final status.
        status: Status,
        /// When it became final.
        at: Option<DateTime<Utc>>,
        /// What ended it, from its history (absent for a task stored final).
        ending: Option<Ending>,
        /// Its compensation, when it owes or owed one.
        compensation: Option<CompensationNow>,
    },
}

/// The history row that made a task final.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Ending {
    /// `resolved`, `permanent_failure`, `not_called`, `operator_resolve` or
    /// `operator_discard`.
    pub outcome: String,
    /// The member that ran the attempt, or the operator who acted.
    pub by: String,
    /// The attempt number.
    pub attempt: i32,
    /// The operator's reason, or the attempt's error.
    pub note: Option<String>,
}

/// Where a final task's compensation stands.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CompensationNow {
    /// Owed, not running.
    Owed {
        /// When its next attempt is due.
        due_at: DateTime<Utc>,
        /// Attempts made so far.
        attempts_made: i32,
    },
    /// An attempt runs (or ran until its claim lapsed).
    Running {
        /// Which attempt.
        attempt: i32,
        /// When the claim lapses unless renewed.
        claim_until: DateTime<Utc>,
    },
    /// The task's work is undone.
    Compensated {
        /// When.
        at: Option<DateTime<Utc>>,
    },
    /// Gave up.
    Failed {
        /// When.
        at: Option<DateTime<Utc>>,
        /// Its last error.
        error: Option<String>,
    },
    /// An operator retried or resolved the task before it ran.
    Cancelled {
        /// When.
        at: Option<DateTime<Utc>>,
    },
}

/// The history outcomes that make a task final, with the status each makes.
const ENDINGS: [(AttemptOutcome, Status); 5] = [
    (AttemptOutcome::Resolved, Status::Resolved),
    (AttemptOutcome::OperatorResolve, Status::Resolved),
    (AttemptOutcome::PermanentFailure, Status::PermanentFailure),
    (AttemptOutcome::NotCalled, Status::PermanentFailure),
    (AttemptOutcome::OperatorDiscard, Status::Discarded),
];

impl Waiting {
    /// The state of `task`, read by [`DETAIL`] as `row`, with its `history`; `key` is
    /// its message key as one line, `as_of` the database's now.
    pub(super) fn read(
        row: &PgRow,
        task: &Task,
        history: &[Attempt],
        key: Option<&str>,
    ) -> Result<Waiting> {
        let as_of: DateTime<Utc> = row.try_get("as_of")?;
        let state = state(row, task, history, as_of)?;
        Ok(Waiting {
            words: words::say(&state, &task.handler, key, as_of),
            state,
        })
    }

    /// This answer with `allowed` attempts known: a due task whose budget is used up
    /// ends at its next claim without a call.
    pub(super) fn with_attempts_allowed(
        self,
        used: i32,
        allowed: i64,
        handler: &str,
        as_of: DateTime<Utc>,
    ) -> Waiting {
        match self.state {
            WaitingState::Due { at, .. } if i64::from(used) >= allowed => {
                let state = WaitingState::NoAttemptsLeft {
                    used,
                    allowed,
                    due_at: at,
                };
                Waiting {
                    words: words::say(&state, handler, None, as_of),
                    state,
                }
            }
            _ => self,
        }
    }
}

fn state(
    row: &PgRow,
    task: &Task,
    history: &[Attempt],
    now: DateTime<Utc>,
) -> Result<WaitingState> {
    if task.status.is_final() {
        return Ok(WaitingState::Finished {
            status: task.status,
            at: task.finished_at,
            ending: ending(task.status, history),
            compensation: compensation(row)?,
        });
    }
    if let Some(member) = &task.lease_owner {
        let (member, attempt) = (member.clone(), task.attempts);
        return Ok(match task.next_attempt_at > now {
            true => WaitingState::Running {
                member,
                attempt,
                since: task.leased_at,
                lease_until: task.next_attempt_at,
            },
            false => WaitingState::LeaseLapsed {
                member,
                attempt,
                lapsed_at: task.next_attempt_at,
            },
        });
    }
    // A held task waits for the task ahead of it first, whatever that one waits for.
    if task.held {
        return Ok(WaitingState::Held {
            behind: row.try_get::<Option<i64>, _>("ahead_id")?.map(TaskId),
            ahead: row.try_get::<Option<i64>, _>("ahead_count")?.unwrap_or(0),
        });
    }
    if let Some(stopping) = row.try_get::<Option<i64>, _>("stopping_task")? {
        return Ok(WaitingState::Stopping {
            task: TaskId(stopping),
            ends_by: super::time::required(row, "stopping_until")?,
        });
    }
    let hold = super::time::optional(row, "breaker_until")?;
    let forced: Option<String> = row.try_get("breaker_forced")?;
    let forced_open = forced.as_deref() == Some("open");
    // A breaker forced open holds its tasks until released, whatever its renewed hold
    // says; another holds them until its hold ends.
    let until = hold.filter(|&until| until > now && task.next_attempt_at <= until);
    if forced_open || until.is_some() {
        return Ok(WaitingState::BreakerOpen {
            handler: task.handler.clone(),
            breaker: row.try_get("breaker_state")?,
            forced: forced_open,
            until: until.filter(|_| !forced_open),
            reason: row.try_get("breaker_reason")?,
        });
    }
    Ok(WaitingState::Due {
        at: task.next_attempt_at,
        serving_members: row.try_get("serving_members")?,
    })
}

/// The last history row that makes a task final, if it made it `status`.
fn ending(status: Status, history: &[Attempt]) -> Option<Ending> {
    let row = history.iter().rev().find(|a| {
        ENDINGS
            .iter()
            .any(|(outcome, _)| outcome.as_str() == a.outcome)
    })?;
    ENDINGS
        .iter()
        .any(|&(outcome, made)| outcome.as_str() == row.outcome && made == status)
        .then(|| Ending {
            outcome: row.outcome.clone(),
            by: row.worker.clone(),
            attempt: row.attempt,
            note: row.error.clone(),
        })
}

fn compensation(row: &PgRow) -> Result<Option<CompensationNow>> {
    let Some(state) = row.try_get::<Option<String>, _>("compensation_state")? else {
        return Ok(None);
    };
    let at = row.try_get("compensation_finished")?;
    let attempts: i32 = row.try_get("compensation_attempts")?;
    let due_at = row.try_get("compensation_due")?;
    Ok(Some(match state.as_str() {
        "compensated" => CompensationNow::Compensated { at },
        "failed" => CompensationNow::Failed {
            at,
            error: row.try_get("compensation_error")?,
        },
        "cancelled" => CompensationNow::Cancelled { at },
        _ if row.try_get("compensation_running")? => CompensationNow::Running {
            attempt: attempts,
            claim_until: due_at,
        },
        _ => CompensationNow::Owed {
            due_at,
            attempts_made: attempts,
        },
    }))
}
