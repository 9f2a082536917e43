//! Persisting one batch of consumed messages: run process-mode handlers, insert the
//! tasks, and only then report the offsets that may be committed.

use futures::stream::{self, StreamExt};
use rdkafka::message::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::brake::Brakes;
use super::breakers::InlineBreakers;
use super::routes::RouteTable;
use crate::config::{IngestSettings, RouteMode, RouteSettings};
use crate::finals::Finals;
use crate::handlers::invoke::invoke;
use crate::handlers::{HandlerContext, Registered};
use crate::kafka::message::{minimal_form, to_task, with_payload, Consumed};
use crate::store::{Enqueued, FinishOutcome, Store, StoreError};
use crate::task::{InlineAttempt, NewTask, Status, TaskId};
use crate::telemetry::{log_attempt, AttemptLine, Metrics};
use tracing::Instrument;

/// Next offset to commit per (topic, partition).
pub(crate) type Offsets = BTreeMap<(String, i32), i64>;

/// Why a batch cannot be persisted; its offsets and every later batch's stay uncommitted.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// The subscription delivered a topic that no route claims (a routing bug).
    #[error("no route claims topic {topic:?} (partition {partition}, offset {offset}); the subscription and the route table disagree")]
    Unrouted {
        /// The topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The message's offset.
        offset: i64,
    },
    /// Two different messages claimed the same coordinates and the same content digest.
    #[error("dedup key {0:?} is taken by a task with other content even with its content digest")]
    DigestCollision(String),
}

/// A consumed message on its way to becoming a task, with its place in the batch.
struct Pending {
    index: usize,
    message: Consumed,
    route: Arc<RouteSettings>,
    task: NewTask,
    /// Whether a task records this message already (a redelivery), if known.
    recorded: Option<bool>,
}

/// The order keys with an open task.
enum OpenKeys {
    /// These.
    Some(HashSet<Vec<u8>>),
    /// Unknown (the database did not answer): all of them, to be safe.
    All,
}

impl OpenKeys {
    fn contains(&self, key: &[u8]) -> bool {
        match self {
            OpenKeys::Some(keys) => keys.contains(key),
            OpenKeys::All => true,
        }
    }
}

/// What a flush needs; cheap to clone into a spawned task.
#[derive(Clone)]
pub(crate) struct Flusher {
    pub(crate) store: Store,
    pub(crate) brakes: Arc<Brakes>,
    pub(crate) breakers: Arc<InlineBreakers>,
    pub(crate) routes: Arc<RouteTable>,
    pub(crate) handlers: Arc<BTreeMap<String, Registered>>,
    pub(crate) limits: IngestSettings,
    pub(crate) metrics: Metrics,
    pub(crate) worker_id: String,
    pub(crate) finals: Finals,
}

impl Flusher {
    /// Persists `messages` and returns the offsets now safe to commit. Retries the
    /// insert while the database is unreachable; the caller decides how long to wait.
    pub(crate) async fn flush(self, messages: Vec<Consumed>) -> Result<Offsets, FlushError> {
        let span = tracing::info_span!("ingest_batch", messages = messages.len());
        self.flush_batch(messages).instrument(span).await
    }

    async fn flush_batch(self, messages: Vec<Consumed>) -> Result<Offsets, FlushError> {
        let mut offsets = Offsets::new();
        for m in messages.iter().map(|c| &c.message) {
            let next = offsets
                .entry((m.topic().to_owned(), m.partition()))
                .or_insert(0);
            *next = (*next).max(m.offset() + 1);
        }
        let tasks = self.to_tasks(messages).await?;
        if !tasks.is_empty() {
            self.insert(tasks).await?;
        }
        Ok(offsets)
    }

    /// Capture-mode messages become tasks; process-mode ones only if their handler
    /// fails. Inline attempts share the batch's time budget. The process-mode messages
    /// of one order key (`ordering = "key"`) run one after another: after one fails, or
    /// while the key has an open task, the rest are stored unattempted, to wait their turn.
    async fn to_tasks(&self, messages: Vec<Consumed>) -> Result<Vec<NewTask>, FlushError> {
        let mut units: Vec<Vec<Pending>> = Vec::new();
        let mut unit_of_key: HashMap<Vec<u8>, usize> = HashMap::new();
        for (index, message) in messages.into_iter().enumerate() {
            let m = &message.message;
            let Some(route) = self.routes.route_for(m.topic()) else {
                return Err(FlushError::Unrouted {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                });
            };
            let route = route.clone();
            let task = to_task(&message, &route, &self.limits);
            let ordered_key = match route.mode {
                RouteMode::Process => task.order_key.clone(),
                RouteMode::Capture => None,
            };
            let pending = Pending {
                index,
                message,
                route,
                task,
                recorded: Some(false),
            };
            match ordered_key {
                Some(key) => {
                    let unit = *unit_of_key.entry(key).or_insert_with(|| {
                        units.push(Vec::new());
                        units.len() - 1
                    });
                    units[unit].push(pending);
                }
                None => units.push(vec![pending]),
            }
        }
        let (open, ()) = tokio::join!(
            self.open_order_keys(unit_of_key.into_keys().collect()),
            self.mark_recorded(&mut units),
        );
        let deadline = Instant::now() + self.limits.process_budget;
        let concurrency = self.limits.process_concurrency as usize;
        let mut outcomes: Vec<(usize, NewTask)> = stream::iter(units)
            .map(|unit| self.unit_to_tasks(unit, &open, deadline))
            .buffered(concurrency)
            .flat_map(stream::iter)
            .collect()
            .await;
        // Stored in the order consumed: a key's tasks queue by id.
        outcomes.sort_unstable_by_key(|(index, _)| *index);
        Ok(outcomes.into_iter().map(|(_, task)| task).collect())
    }

    /// The order keys among `keys` that have an open task: their messages must not run
    /// inline. Should the database not answer, every key counts as open (the messages
    /// are stored, and held only if a task is open indeed).
    async fn open_order_keys(&self, keys: Vec<Vec<u8>>) -> OpenKeys {
        if keys.is_empty() {
            return OpenKeys::Some(HashSet::new());
        }
        match self.store.open_order_keys(&keys).await {
            Ok(open) => OpenKeys::Some(open.into_iter().collect()),
            Err(error) => {
                tracing::warn!(%error, "could not read the open tasks of ordered keys; \
                    storing their messages without an inline attempt");
                OpenKeys::All
            }
        }
    }

    /// Marks the process-mode messages that a task records already: redelivered after
    /// a crash, a rebalance or an offset reset. They were handled (their task says how)
    /// and must not run inline again, after newer messages of their key, with a failure
    /// that would have nowhere to go. Should the database not answer, none is known to
    /// be new: they are stored unattempted, for the pool.
    async fn mark_recorded(&self, units: &mut [Vec<Pending>]) {
        let mut process: Vec<&mut Pending> = (units.iter_mut().flatten())
            .filter(|p| p.route.mode == RouteMode::Process)
            .collect();
        if process.is_empty() {
            return;
        }
        let tasks: Vec<&NewTask> = process.iter().map(|p| &p.task).collect();
        match self.store.recorded(&tasks).await {
            Ok(recorded) => {
                for (i, pending) in process.iter_mut().enumerate() {
                    pending.recorded = Some(recorded.contains(&i));
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not tell redelivered process-mode messages \
                    from new ones; storing them without an inline attempt");
                for pending in process {
                    pending.recorded = None;
                }
            }
        }
    }

    /// The tasks of one unit (one message, or the process-mode messages of one order
    /// key, in offset order), each with its index in the batch.
    async fn unit_to_tasks(
        &self,
        unit: Vec<Pending>,
        open: &OpenKeys,
        deadline: Instant,
    ) -> Vec<(usize, NewTask)> {
        let mut waiting = unit
            .first()
            .and_then(|p| p.task.order_key.as_ref())
            .is_some_and(|key| open.contains(key));
        let mut tasks = Vec::new();
        for Pending {
            index,
            message,
            route,
            mut task,
            recorded,
        } in unit
        {
            let stored = match (route.mode, recorded) {
                (RouteMode::Capture, _) => Some(task),
                (RouteMode::Process, Some(true)) => {
                    // Its task decides what happens to it, and to its key's next ones.
                    self.count(&route, "redelivered");
                    None
                }
                (RouteMode::Process, None) => {
                    task.failure.ingest_note = Some(append_note(
                        task.failure.ingest_note.take(),
                        "not attempted inline: whether it was already recorded could not be read",
                    ));
                    self.count(&route, "deferred");
                    Some(task)
                }
                (RouteMode::Process, Some(false)) if waiting => {
                    task.failure.ingest_note = Some(append_note(
                        task.failure.ingest_note.take(),
                        "not attempted inline: an earlier failure of its key is open (ordering = \"key\")",
                    ));
                    self.count(&route, "deferred");
                    Some(task)
                }
                (RouteMode::Process, Some(false)) => {
                    self.process(&message, &route, task, deadline).await
                }
            };
            if let Some(task) = stored {
                waiting |= task.status == Status::Failed;
                tasks.push((index, task));
            }
        }
        tasks
    }

    /// Runs the route's handler on a message (the whole message, even one too large to
    /// store) through the same invocation as the worker pool. Success stores nothing; a
    /// failure becomes a task with the verdict kept: retry at the time it says, or a
    /// permanent failure at once. A message the budget left no time for is stored
    /// unattempted, for the pool.
    async fn process(
        &self,
        message: &Consumed,
        route: &RouteSettings,
        mut task: NewTask,
        deadline: Instant,
    ) -> Option<NewTask> {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            task.failure.ingest_note = Some(append_note(
                task.failure.ingest_note.take(),
                "not attempted inline: the batch's time budget (ingest.process_budget) ran out",
            ));
            self.count(route, "deferred");
            return Some(task);
        };
        if !self.breakers.allows(&route.handler) {
            task.failure.ingest_note = Some(append_note(
                task.failure.ingest_note.take(),
                "not attempted inline: the handler's circuit breaker is open",
            ));
            self.count(route, "deferred");
            return Some(task);
        }
        let mut registered = self.handlers[&route.handler].clone();
        registered.policy = registered.policy.for_route(route);
        registered.policy.timeout = registered.policy.timeout.min(left.max(MIN_INLINE_TIME));
        let preview = with_payload(&task, message).unsaved();
        let ctx = HandlerContext::new(self.worker_id.clone(), 1, CancellationToken::new());
        let span = tracing::info_span!(
            "attempt",
            task_id = tracing::field::Empty,
            handler = %route.handler,
            attempt = 1,
            route = %route.name,
            correlation_id = task.failure.correlation_id.as_deref(),
        );
        let attempted = invoke(&registered, &ctx, &preview).instrument(span).await;
        log_attempt(&AttemptLine {
            task_id: None,
            handler: &route.handler,
            attempt: 1,
            route: Some(&route.name),
            correlation_id: task.failure.correlation_id.as_deref(),
            outcome: attempted.outcome,
            error: attempted.error.as_deref(),
        });
        task.attempts = 1;
        let outcome = match attempted.outcome {
            FinishOutcome::Resolved => {
                self.count(route, "processed");
                self.brakes.record(&route.name, false).await;
                return None;
            }
            FinishOutcome::Retry { at } => {
                task.next_attempt_at = Some(at);
                "retry"
            }
            FinishOutcome::PermanentFailure => {
                task.status = Status::PermanentFailure;
                "permanent_failure"
            }
        };
        self.brakes.record(&route.name, true).await;
        task.failure.error_message = attempted.error.clone();
        task.inline_attempt = Some(InlineAttempt {
            worker: self.worker_id.clone(),
            started_at: attempted.started_at,
            duration_ms: i32::try_from(attempted.duration.as_millis()).unwrap_or(i32::MAX),
            outcome: outcome.to_owned(),
            error: attempted.error,
            compensate: registered.handler.compensates(),
        });
        Some(task)
    }

    /// Inserts until it works. Rows the database refuses as data go in one by one, and
    /// a row refused alone is stored in its minimal form. A new message at coordinates
    /// that already hold another message's task is stored as a task of its own.
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<(), FlushError> {
        let outcomes = self.insert_retrying(&tasks).await;
        let mut collided = Vec::new();
        for (task, outcome) in tasks.into_iter().zip(outcomes) {
            match outcome {
                Enqueued::Conflict(existing) => collided.push(collision(task, existing)),
                outcome => self.stored(task, outcome, "stored"),
            }
        }
        if collided.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            count = collided.len(),
            "messages at coordinates already recorded with other content (topic recreated, \
             or two clusters share this database); each is stored as a task of its own"
        );
        let outcomes = self.insert_retrying(&collided).await;
        for (task, outcome) in collided.into_iter().zip(outcomes) {
            if let Enqueued::Conflict(_) = outcome {
                return Err(FlushError::DigestCollision(
                    task.dedup_key.unwrap_or_default(),
                ));
            }
            self.stored(task, outcome, "collision");
        }
        Ok(())
    }

    /// One outcome per task, retrying while the database is unreachable.
    async fn insert_retrying(&self, tasks: &[NewTask]) -> Vec<Enqueued> {
        let mut pause = Duration::from_millis(100);
        loop {
            let result = match self.store.enqueue_many(tasks).await {
                Err(error) if is_data_error(&error) => self.insert_one_by_one(tasks).await,
                other => other,
            };
            match result {
                Ok(outcomes) => {
                    self.metrics.health.database_ok();
                    return outcomes;
                }
                Err(error) => {
                    self.metrics
                        .database_errors
                        .with_label_values(&["ingest"])
                        .inc();
                    self.metrics.health.database_failed("ingest", &error);
                    tracing::debug!(tasks = tasks.len(), retry_in = ?pause,
                        "consumed failures not stored yet; their offsets stay uncommitted");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    async fn insert_one_by_one(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        let mut outcomes = Vec::with_capacity(tasks.len());
        for task in tasks {
            let outcome = match self.store.enqueue_many(std::slice::from_ref(task)).await {
                Err(error) if is_data_error(&error) => {
                    tracing::warn!(%error, source = ?task.failure.source, "message refused by the database; storing its minimal form");
                    self.store
                        .enqueue_many(&[minimal_form(task, &error.to_string())])
                        .await?
                }
                other => other?,
            };
            outcomes.extend(outcome);
        }
        Ok(outcomes)
    }

    /// Counts a stored (or redelivered) task and reports a new permanent failure.
    fn stored(&self, task: NewTask, outcome: Enqueued, label: &str) {
        let route = task.failure.route.as_deref().unwrap_or("");
        let label = match outcome {
            Enqueued::Existing(_) => "redelivered",
            _ => label,
        };
        self.metrics
            .ingested
            .with_label_values(&[route, label])
            .inc();
        if let Enqueued::Created(id) = outcome {
            if task.status == Status::PermanentFailure {
                self.metrics
                    .permanent_failures
                    .with_label_values(&[&task.handler])
                    .inc();
            } else if task.inline_attempt.is_some() {
                self.metrics
                    .retries_scheduled
                    .with_label_values(&[&task.handler])
                    .inc();
            }
            if task.status == Status::PermanentFailure && self.finals.wanted() {
                let error = task.failure.error_message.clone();
                let mut stored = task.unsaved();
                stored.id = id;
                self.finals.permanent_failure(Arc::new(stored), error);
            }
        }
    }

    fn count(&self, route: &RouteSettings, outcome: &str) {
        self.metrics
            .ingested
            .with_label_values(&[&route.name, outcome])
            .inc();
    }
}

/// The shortest time an inline attempt gets, even when the budget is nearly spent.
const MIN_INLINE_TIME: Duration = Duration::from_millis(100);

/// `task`, whose coordinates already belong to task `existing` with other content, under
/// a dedup key that also carries its content digest: its redelivery still finds it.
fn collision(mut task: NewTask, existing: TaskId) -> NewTask {
    let key = task.effective_dedup_key().unwrap_or_default();
    task.dedup_key = Some(format!("{key}#{}", task.failure.content_digest()));
    let note = format!(
        "task {existing} already records these coordinates with other content \
         (topic recreated, or another cluster); stored under the content digest"
    );
    task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), &note));
    task
}

fn append_note(note: Option<String>, more: &str) -> String {
    match note {
        Some(note) => format!("{note}; {more}"),
        None => more.to_owned(),
    }
}

/// A refusal of the data itself (SQLSTATE class 22 or 54), as opposed to an outage.
fn is_data_error(error: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = error else {
        return false;
    };
    db.code()
        .is_some_and(|c| c.starts_with("22") || c.starts_with("54"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteSettings;

    /// Regression: a message on a topic that no route claimed was logged and dropped,
    /// and its offset committed. It is an error now, and the batch reports no offsets.
    #[tokio::test]
    async fn a_message_no_route_claims_fails_the_batch() {
        let mut route = RouteSettings::new(&[], RouteMode::Capture, "log");
        route.name = "orders".into();
        route.pattern = Some("orders".into());
        let store = Store::unreachable_for_test();
        let brakes = Brakes::new(store.clone(), Metrics::new(), "test".into(), &[]);
        let flusher = Flusher {
            store,
            brakes: Arc::new(brakes),
            breakers: Arc::default(),
            routes: Arc::new(RouteTable::new(vec![route])),
            handlers: Arc::default(),
            limits: IngestSettings::default(),
            metrics: Metrics::new(),
            worker_id: "test".into(),
            finals: Finals::default(),
        };
        let stray = Consumed::for_test(10); // on topic "test"
        let outcome = flusher.flush(vec![stray]).await;
        assert!(
            matches!(&outcome, Err(FlushError::Unrouted { topic, .. }) if topic == "test"),
            "{outcome:?}"
        );
    }
}
