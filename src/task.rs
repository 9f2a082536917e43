//! The recovery task model: what a failure looks like once it is stored.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::headers::Header;

pub mod cause;
mod outcome;
pub mod transform;

pub use cause::{AttemptKind, Cause};
pub use outcome::{AttemptOutcome, FinishOutcome, UnknownOutcome, Verdict};

/// Identifier of a recovery task (the table's primary key).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(transparent)]
#[schema(value_type = i64)]
pub struct TaskId(pub i64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The business outcome of a task. `Failed` is the only state in which work happens;
/// the other three are final.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for (or in) an attempt.
    #[default]
    Failed,
    /// A handler succeeded.
    Resolved,
    /// Retries used up, or the handler said the error is permanent.
    PermanentFailure,
    /// An operator gave up on it.
    Discarded,
}

impl Status {
    /// The value stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Failed => "failed",
            Status::Resolved => "resolved",
            Status::PermanentFailure => "permanent_failure",
            Status::Discarded => "discarded",
        }
    }

    /// Whether no further attempt will be made.
    pub fn is_final(self) -> bool {
        self != Status::Failed
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is not one of the four known ones.
#[derive(Debug, thiserror::Error)]
#[error("unknown task status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "failed" => Ok(Status::Failed),
            "resolved" => Ok(Status::Resolved),
            "permanent_failure" => Ok(Status::PermanentFailure),
            "discarded" => Ok(Status::Discarded),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// Where a failed message came from in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCoordinates {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
}

impl SourceCoordinates {
    /// The dedup key derived from the coordinates: one task per message, ever.
    pub fn dedup_key(&self) -> String {
        format!("kafka:{}:{}:{}", self.topic, self.partition, self.offset)
    }
}

/// Where a dead-lettered message lived before, as far as its headers tell: the topic,
/// and the partition and offset when they were readable (hand-made dead letters often
/// carry the topic alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginalCoordinates {
    /// Topic name.
    pub topic: String,
    /// Partition number, when known.
    pub partition: Option<i32>,
    /// Offset within the partition, when known.
    pub offset: Option<i64>,
}

impl OriginalCoordinates {
    /// The full coordinates, when partition and offset are both known.
    pub fn complete(&self) -> Option<SourceCoordinates> {
        Some(SourceCoordinates {
            topic: self.topic.clone(),
            partition: self.partition?,
            offset: self.offset?,
        })
    }
}

impl From<SourceCoordinates> for OriginalCoordinates {
    fn from(at: SourceCoordinates) -> Self {
        OriginalCoordinates {
            topic: at.topic,
            partition: Some(at.partition),
            offset: Some(at.offset),
        }
    }
}

impl std::fmt::Display for OriginalCoordinates {
    /// `topic[partition]@offset`, with `?` for what is not known.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unknown = || "?".to_owned();
        write!(
            f,
            "{}[{}]@{}",
            self.topic,
            self.partition.map_or_else(unknown, |p| p.to_string()),
            self.offset.map_or_else(unknown, |o| o.to_string())
        )
    }
}

/// A failed message and what is known about its failure: the part of a task that is
/// recorded once, when the failure is stored, and never changes afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Application-defined type of the event.
    pub event_type: Option<String>,
    /// Correlation id to follow the failure across systems.
    pub correlation_id: Option<String>,
    /// Kafka coordinates of the consumed message (the dead letter in capture mode).
    pub source: Option<SourceCoordinates>,
    /// Timestamp of the consumed message.
    pub source_timestamp: Option<DateTime<Utc>>,
    /// Kafka timestamp type (`create_time` or `log_append_time`).
    pub source_timestamp_type: Option<String>,
    /// Message key as it came; `None` when the message had none (or see `payload_stored`).
    pub key: Option<Vec<u8>>,
    /// Message value as it came; `None` for a tombstone (or see `payload_stored`).
    pub value: Option<Vec<u8>>,
    /// Message headers, order, duplicates and absent values kept.
    pub headers: Vec<Header>,
    /// Whether key, value and headers are stored; false for a message kept in minimal
    /// form (over the size limit, or refused by the database): then they are absent
    /// because they were left out, not because the message had none.
    pub payload_stored: bool,
    /// Size of the message value as it came, in bytes.
    pub value_size: Option<i32>,
    /// Where the message lived before it was dead-lettered, from its headers.
    pub original: Option<OriginalCoordinates>,
    /// Class of the error that caused the failure.
    pub error_class: Option<String>,
    /// Message of the error that caused the failure.
    pub error_message: Option<String>,
    /// Stack trace of the error, cut at ingest.
    pub error_stacktrace: Option<String>,
    /// The ingest route whose policy applies.
    pub route: Option<String>,
    /// What ingest could not read or left out, in words.
    pub ingest_note: Option<String>,
    /// 1 for a first failure; for a message redrive produced (republish, replay) that
    /// failed again, the previous task's generation + 1.
    pub generation: i32,
    /// The task whose produced message failed again into this one.
    pub previous_task: Option<TaskId>,
    /// The previous task's error when this one was linked to it (kept after retention
    /// deletes the previous task).
    pub previous_error: Option<String>,
    /// How its dead letter was given up, where the dialect says: a Kafka share group's
    /// `rejected` (by the consumer), `delivery_count_exceeded` or `unknown`
    /// ([`crate::kafka::dlt::Disposition`]); `None` for every other dialect.
    pub disposition: Option<String>,
}

impl Default for Failure {
    fn default() -> Self {
        Failure {
            event_type: None,
            correlation_id: None,
            source: None,
            source_timestamp: None,
            source_timestamp_type: None,
            key: None,
            value: None,
            headers: Vec::new(),
            payload_stored: true,
            value_size: None,
            original: None,
            error_class: None,
            error_message: None,
            error_stacktrace: None,
            route: None,
            ingest_note: None,
            generation: 1,
            previous_task: None,
            previous_error: None,
            disposition: None,
        }
    }
}

impl Failure {
    /// A failure whose message has only `value`.
    pub fn with_value(value: impl Into<Vec<u8>>) -> Self {
        Failure {
            value: Some(value.into()),
            ..Failure::default()
        }
    }

    /// Whether `other` records the same message (bytes, size, timestamp, coordinates)
    /// with the same event type and correlation id.
    pub fn same_message_as(&self, other: &Failure) -> bool {
        if self.disposition.is_some() && other.disposition.is_some() {
            return self.same_share_group_dead_letter_as(other);
        }
        self.event_type == other.event_type
            && self.correlation_id == other.correlation_id
            && self.source == other.source
            && self.source_timestamp == other.source_timestamp
            && self.key == other.key
            && self.value == other.value
            && self.headers == other.headers
            && self.value_size == other.value_size
            && self.payload_stored == other.payload_stored
    }

    /// [`Failure::same_message_as`] for two dead letters of a Kafka share group: the
    /// broker may write one record twice (a produce retried after a timeout), at two
    /// offsets of its dead-letter topic, with two timestamps; their dedup key names the
    /// group and the original coordinates. They are the same when those agree with the
    /// record itself (its key and value, copied or fetched).
    fn same_share_group_dead_letter_as(&self, other: &Failure) -> bool {
        self.event_type == other.event_type
            && self.correlation_id == other.correlation_id
            && self.original == other.original
            && self.key == other.key
            && self.value == other.value
            && self.payload_stored == other.payload_stored
    }

    /// A digest of the message's content (key, value, headers, size, timestamp): tells
    /// two messages apart that claim the same coordinates.
    pub fn content_digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for part in [self.key.as_deref(), self.value.as_deref()] {
            match part {
                Some(bytes) => {
                    hasher.update((bytes.len() as u64).to_be_bytes());
                    hasher.update(bytes);
                }
                None => hasher.update(u64::MAX.to_be_bytes()),
            }
        }
        hasher.update(crate::headers::encode(&self.headers));
        hasher.update(self.value_size.unwrap_or(-1).to_be_bytes());
        let millis = self
            .source_timestamp
            .map_or(i64::MIN, |t| t.timestamp_millis());
        hasher.update(millis.to_be_bytes());
        let digest = hasher.finalize();
        crate::readable::hex(&digest[..16])
    }
}

/// A failure to record: everything known about it when it is enqueued.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewTask {
    /// Name of the handler that will retry it.
    pub handler: String,
    /// Idempotency key; when `None` and `failure.source` is set, the source
    /// coordinates are used.
    pub dedup_key: Option<String>,
    /// The failed message and its context.
    pub failure: Failure,
    /// Attempts already made before the task was stored (process mode counts one).
    pub attempts: i32,
    /// Overrides the handler's max attempts for this task.
    pub max_attempts: Option<i32>,
    /// When the first attempt is due; `None` means now.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// `Failed` (the default), or `PermanentFailure` when the inline attempt already
    /// said retrying cannot help.
    pub status: Status,
    /// The attempt made before the task was stored (process mode), for the history.
    pub inline_attempt: Option<InlineAttempt>,
    /// Set by a route with `ordering = "key"` on a message with a key ([`order_key`]):
    /// the task waits behind the open tasks with the same order key.
    pub order_key: Option<Vec<u8>>,
    /// Why a task stored final without an attempt ended (a re-failure beyond its
    /// route's `max_generations`): its last error.
    pub final_error: Option<String>,
    /// The id taken for it before it was stored: process mode reserves one for each
    /// message it runs inline, so the inline attempt and the stored failure share it.
    /// `None` (the default): the next id when it is stored.
    #[serde(skip)]
    pub id: Option<TaskId>,
    /// The recovery point the inline attempt saved ([`crate::HandlerContext::save_checkpoint`]),
    /// stored with the failure: its retry starts from it.
    #[serde(skip)]
    pub checkpoint: Option<serde_json::Value>,
    /// What broke, when it is known better than the report says (process mode: how
    /// the inline attempt failed); `None`: the cause the failure was reported with
    /// ([`NewTask::cause`]).
    #[serde(skip)]
    pub cause: Option<Cause>,
}

/// The order key of a message with `key` ingested by `route` (`ordering = "key"`): a
/// digest of both, so a key of any size fits the index.
pub fn order_key(route: &str, key: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    digest.update(route.as_bytes());
    digest.update([0]);
    digest.update(key);
    digest.finalize().to_vec()
}

/// An attempt made before its task was stored: process mode's inline handler call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InlineAttempt {
    /// The member that made it.
    pub worker: String,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// How long it ran, in milliseconds.
    pub duration_ms: i32,
    /// What the attempt decided, as in the attempt history.
    pub outcome: AttemptOutcome,
    /// What went wrong.
    pub error: Option<String>,
    /// Whether a permanent failure is to be compensated ([`crate::Handler::compensates`]).
    #[serde(default)]
    pub compensate: bool,
}

impl NewTask {
    /// What broke: the cause given, or the one the failure was reported with (its dead
    /// letter's class or disposition, and the error it shows).
    pub fn cause(&self) -> Cause {
        if let Some(cause) = &self.cause {
            return cause.clone();
        }
        let failure = &self.failure;
        let message = self
            .final_error
            .as_deref()
            .or(failure.error_message.as_deref());
        Cause::reported(
            failure.error_class.as_deref(),
            failure.disposition.as_deref(),
            message,
        )
    }

    /// A task for `handler` with the given value and nothing else.
    pub fn new(handler: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        NewTask {
            handler: handler.into(),
            failure: Failure::with_value(value),
            ..NewTask::default()
        }
    }

    /// The dedup key that will be stored: the explicit one, else the source coordinates.
    pub fn effective_dedup_key(&self) -> Option<String> {
        self.dedup_key.clone().or_else(|| {
            self.failure
                .source
                .as_ref()
                .map(SourceCoordinates::dedup_key)
        })
    }

    /// The task as a handler sees it before it is stored (process mode): its reserved
    /// id (0 when none was reserved), attempt 1, not leased.
    pub fn unsaved(&self) -> Task {
        let now = Utc::now();
        Task {
            id: self.id.unwrap_or(TaskId(0)),
            dedup_key: self.effective_dedup_key(),
            handler: self.handler.clone(),
            failure: self.failure.clone(),
            status: self.status,
            attempts: 1,
            max_attempts: self.max_attempts,
            attempt_grants: 0,
            next_attempt_at: now,
            held: false,
            last_error: None,
            lease_owner: None,
            lease_version: 0,
            leased_at: None,
            checkpoint: self.checkpoint.clone(),
            created_at: now,
            updated_at: now,
            finished_at: None,
            redrive_job: None,
            redriven_by: None,
        }
    }

    /// Whether `task` records the same failure (used to tell a repeat from a conflict):
    /// the same message for the same handler, with the same caller-chosen policy.
    pub fn same_content_as(&self, task: &Task) -> bool {
        self.handler == task.handler
            && self.max_attempts == task.max_attempts
            && self.failure.same_message_as(&task.failure)
    }
}

/// A stored recovery task, as handlers and operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    /// Primary key.
    pub id: TaskId,
    /// Idempotency key: `kafka:topic:partition:offset` for ingested messages (with
    /// `#digest` when another message already held those coordinates), or a caller's key.
    pub dedup_key: Option<String>,
    /// Name of the handler that retries it.
    pub handler: String,
    /// The failed message and its context.
    #[serde(flatten)]
    pub failure: Failure,
    /// The business outcome; `Failed` until it is final.
    pub status: Status,
    /// Attempts started so far, including the current one while leased.
    pub attempts: i32,
    /// Overrides the handler's max attempts for this task.
    pub max_attempts: Option<i32>,
    /// Attempts granted by operators on top of the budget (`tasks retry`).
    pub attempt_grants: i32,
    /// When the next attempt is due; while leased, the lease deadline; while held, the
    /// far future.
    pub next_attempt_at: DateTime<Utc>,
    /// Waiting behind an open task with the same route and key (`ordering = "key"`).
    pub held: bool,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// The worker holding the lease, if any.
    pub lease_owner: Option<String>,
    /// Fencing token: bumped by every claim and every operator action.
    pub lease_version: i64,
    /// When the current lease was taken.
    pub leased_at: Option<DateTime<Utc>>,
    /// The handler's recovery point (JSON), if it saved one.
    pub checkpoint: Option<serde_json::Value>,
    /// When the failure was recorded.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it became final.
    pub finished_at: Option<DateTime<Utc>>,
    /// The redrive job (a paced retry) whose release made it due now, or that replayed
    /// it: its calls say so (`x-redrive-job`). Cleared by any other operator action.
    pub redrive_job: Option<i64>,
    /// The last redrive job that redrove it, kept: another job redrives it again only
    /// with `force`.
    pub redriven_by: Option<i64>,
}

impl Task {
    /// The handle for a side effect that must happen once: the dedup key, or `task:ID`
    /// for a task stored without one. It is the same on every attempt of the task and
    /// on every delivery of its message, process mode's inline attempt included (whose
    /// `id` is reserved per delivery: a message delivered again after its member died
    /// mid-call runs under a new id, with the same key). Key a payment, an insert or a
    /// call on it; the webhook's `Idempotency-Key` is derived from the same dedup key.
    pub fn idempotency_key(&self) -> String {
        match &self.dedup_key {
            Some(key) => key.clone(),
            None => format!("task:{}", self.id),
        }
    }

    /// The fencing token of the lease this copy of the task was read under.
    pub fn lease(&self) -> Lease {
        Lease {
            id: self.id,
            version: self.lease_version,
        }
    }
}

/// A claim on a task: every write made under it matches `(id, version)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The leased task.
    pub id: TaskId,
    /// The fencing token handed out by the claim.
    pub version: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_its_column_value() {
        for s in [
            Status::Failed,
            Status::Resolved,
            Status::PermanentFailure,
            Status::Discarded,
        ] {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
        }
        assert!("running".parse::<Status>().is_err());
        assert!(!Status::Failed.is_final());
        assert!(Status::Discarded.is_final());
    }

    #[test]
    fn the_idempotency_key_is_the_dedup_key_else_the_task_id() {
        let mut task = NewTask::new("h", "v").unsaved();
        task.id = TaskId(7);
        assert_eq!(task.idempotency_key(), "task:7");
        task.dedup_key = Some("kafka:orders:3:42".into());
        assert_eq!(task.idempotency_key(), "kafka:orders:3:42");
    }

    #[test]
    fn dedup_key_falls_back_to_source_coordinates() {
        let mut t = NewTask::new("log", b"x".to_vec());
        assert_eq!(t.effective_dedup_key(), None);
        t.failure.source = Some(SourceCoordinates {
            topic: "orders.dlt".into(),
            partition: 3,
            offset: 42,
        });
        assert_eq!(t.effective_dedup_key().unwrap(), "kafka:orders.dlt:3:42");
        t.dedup_key = Some("order-7".into());
        assert_eq!(t.effective_dedup_key().unwrap(), "order-7");
    }
}
