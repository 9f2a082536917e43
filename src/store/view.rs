//! One task as `tasks show` and `GET /api/v1/tasks/{id}` present it: what matters first
//! (status, why it waits or how it ended, attempts used of allowed), then every field,
//! the payload readable, the history and the compensation.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::budgets::Budgets;
use super::row::task_to_show;
use super::waiting::{live_within_ms, Waiting, DETAIL};
use super::{Result, Store};
use crate::config::{AppliedTargets, Targets};
use crate::readable::Readable;
use crate::task::{Task, TaskId};

/// One header, readable.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HeaderView {
    /// Its name.
    pub name: Readable,
    /// Its value; absent for a header without one.
    pub value: Option<Readable>,
}

/// Every field of a task, payload readable, with its attempt history: `tasks show`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TaskDetail {
    /// The task without its payload (key, value and headers are below, readable).
    /// `next_attempt_at` is `null` where it means nothing to a reader: on a final task
    /// (a stale lease deadline) and on a held one (the far future).
    #[schema(value_type = Object)]
    pub task: serde_json::Value,
    /// PostgreSQL's clock when the task was read: what `waiting` is relative to.
    pub as_of: DateTime<Utc>,
    /// Why it is not running now, or how it ended.
    pub waiting: Waiting,
    /// Attempts it may make in all, under the reader's configured budgets (absent when
    /// the reader gave none).
    pub attempts_allowed: Option<i64>,
    /// Message key.
    pub key: Option<Readable>,
    /// Message value (the newest version, when a transform changed it).
    pub value: Option<Readable>,
    /// The version of the value: 1 as it came, one more for each transform that
    /// changed it.
    pub payload_version: i32,
    /// The value as it came, when a transform changed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_value: Option<Readable>,
    /// Message headers, in order.
    pub headers: Vec<HeaderView>,
    /// The attempt history, oldest first.
    pub history: Vec<super::Attempt>,
    /// Its compensation, if its handler compensates and it ended in permanent failure.
    pub compensation: Option<super::CompensationView>,
    /// The cause of its last failure (`--cause`, `?cause=`); absent before one is set
    /// (a task stored by an earlier release, until the backfill reaches it).
    pub cause: Option<super::CauseView>,
    /// Why the stored row cannot be read whole (its headers cannot be decoded, so none
    /// are shown); absent when it can.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// Where the task is republished and parked under the reader's configuration (the
    /// store does not know it: the CLI and the API fill it in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub targets: Option<AppliedTargets>,
    /// The task read, for [`TaskDetail::with_targets`] and [`TaskDetail::with_budgets`].
    #[serde(skip)]
    record: Task,
}

impl TaskDetail {
    /// This detail with the targets `targets` give its task.
    pub fn with_targets(mut self, targets: &Targets) -> TaskDetail {
        self.targets = Some(targets.applied(&self.record));
        self
    }

    /// This detail with the attempts its task may make under `budgets` (as the SQL
    /// function `recovery_attempts_allowed` counts them): an unfinished task whose
    /// budget is used up says that its next claim ends it.
    pub fn with_budgets(mut self, budgets: &Budgets) -> TaskDetail {
        let task = &self.record;
        let budget = task
            .max_attempts
            .or_else(|| {
                let route = task.failure.route.as_deref()?;
                budgets.routes.iter().find(|(r, _)| r == route).map(|r| r.1)
            })
            .or_else(|| {
                (budgets.handlers.iter())
                    .find(|(h, _)| *h == task.handler)
                    .map(|h| h.1)
            })
            .unwrap_or(budgets.default);
        let allowed = i64::from(task.attempt_grants) + i64::from(budget);
        self.attempts_allowed = Some(allowed);
        self.waiting =
            self.waiting
                .with_attempts_allowed(task.attempts, allowed, &task.handler, self.as_of);
        self
    }

    /// The task as read.
    pub fn record(&self) -> &Task {
        &self.record
    }
}

impl Store {
    /// Every field of task `id`, why it waits or how it ended, and its history; `None`
    /// when there is no such task. A task whose stored headers cannot be decoded is
    /// shown without them, saying why.
    pub async fn detail(&self, id: TaskId) -> Result<Option<TaskDetail>> {
        let Some(row) = sqlx::query(DETAIL)
            .bind(id.0)
            .bind(live_within_ms())
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let (task, unreadable) = task_to_show(&row)?;
        let history = self.attempts(id).await?;
        let compensation = self.compensation(id).await?;
        let cause = self.cause_of_task(id).await?;
        let (original, payload_version) = self.payload_version(id).await?;
        let key = task.failure.key.as_deref().map(Readable::new);
        let value = task.failure.value.as_deref().map(Readable::new);
        let headers = task
            .failure
            .headers
            .iter()
            .map(|h| HeaderView {
                name: Readable::new(&h.name),
                value: h.value.as_deref().map(Readable::new),
            })
            .collect();
        let waiting = Waiting::read(
            &row,
            &task,
            &history,
            key.as_ref().map(|k| k.line()).as_deref(),
        )?;
        let mut fields = serde_json::to_value(&task).expect("a task serializes");
        if let Some(object) = fields.as_object_mut() {
            for raw in ["key", "value", "headers"] {
                object.remove(raw);
            }
            if task.status.is_final() || task.held {
                object.insert("next_attempt_at".into(), serde_json::Value::Null);
            }
        }
        Ok(Some(TaskDetail {
            task: fields,
            as_of: sqlx::Row::try_get(&row, "as_of")?,
            waiting,
            attempts_allowed: None,
            key,
            value,
            payload_version,
            original_value: original.as_deref().map(Readable::new),
            headers,
            history,
            compensation,
            cause,
            unreadable,
            targets: None,
            record: task,
        }))
    }
}
