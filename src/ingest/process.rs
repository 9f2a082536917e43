//! Process mode: a process-mode route's handler runs inline on each consumed message,
//! through the same invocation as the worker pool, and only a failure becomes a task.
//! Here live its rules: one order key's messages run in sequence and wait behind an open
//! task of their key, a redelivered message that has a task is not run again, a handler
//! whose circuit breaker is not closed is not called, and a batch's inline attempts
//! share one time budget. Flushing hands a batch's mapped messages to
//! [`ProcessMode::tasks`] and stores what comes back.

use futures::stream::{self, StreamExt};
use rdkafka::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::brake::Brakes;
use super::lives::{Life, Lives};
use super::mapping::{append_note, collision, with_payload};
use crate::config::{IngestSettings, RouteMode, RouteSettings};
use crate::handlers::breakers::BreakerFollower;
use crate::handlers::invoke::invoke;
use crate::handlers::{HandlerContext, KeptCheckpoint, RecoveryPoints, Registered};
use crate::kafka::message::Consumed;
use crate::resilience::window::brake_vote;
use crate::store::{KeyPartition, NewestOrdered, Store};
use crate::task::{FinishOutcome, InlineAttempt, NewTask, Status, Task};
use crate::telemetry::{log_attempt, AttemptLine, Metrics};

/// What running process-mode handlers inline needs.
pub(crate) struct ProcessMode {
    pub(crate) store: Store,
    pub(crate) brakes: Arc<Brakes>,
    pub(crate) breakers: Arc<BreakerFollower>,
    pub(crate) handlers: Arc<BTreeMap<String, Registered>>,
    pub(crate) limits: IngestSettings,
    pub(crate) metrics: Metrics,
    pub(crate) worker_id: String,
    /// Whether an ordered key's newest task is from its topic's present life.
    pub(crate) lives: Lives,
}

/// A consumed message with its route and the task that records it.
pub(crate) struct Mapped {
    /// The message, whole (what a process-mode handler sees).
    pub(crate) message: Consumed,
    /// The route that claims its topic.
    pub(crate) route: Arc<RouteSettings>,
    /// Its task, before any inline attempt.
    pub(crate) task: NewTask,
}

/// A mapped message on its way to becoming a task, with its place in the batch.
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

impl ProcessMode {
    /// The tasks of a batch, in the order consumed: a capture-mode message's task as
    /// mapped, a process-mode message's only if its handler fails. Inline attempts
    /// share the batch's time budget. The process-mode messages of one order key
    /// (`ordering = "key"`) run one after another: after one fails, or while the key has
    /// an open task, the rest are stored unattempted, to wait their turn.
    pub(crate) async fn tasks(&self, batch: Vec<Mapped>) -> Vec<NewTask> {
        let mut units: Vec<Vec<Pending>> = Vec::new();
        let mut unit_of_key: HashMap<Vec<u8>, usize> = HashMap::new();
        for (index, mapped) in batch.into_iter().enumerate() {
            let ordered_key = match mapped.route.mode {
                RouteMode::Process => mapped.task.order_key.clone(),
                RouteMode::Capture => None,
            };
            let pending = Pending {
                index,
                message: mapped.message,
                route: mapped.route,
                task: mapped.task,
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
        outcomes.into_iter().map(|(_, task)| task).collect()
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
    /// that would have nowhere to go. So are ordered messages a newer message of their
    /// key has a task for ([`passed`]). Should the database not answer, none is known
    /// to be new: they are stored unattempted, for the pool.
    ///
    /// Alongside, reserves a task id for each new one, in the order consumed (a key's
    /// tasks queue by id): its inline attempt runs with it (`task.id`, the webhook's
    /// `X-Redrive-Task-Id`) and its failure is stored under it. One statement per batch.
    /// A message whose coordinates another message's task holds gets its content digest
    /// in its dedup key now, before its attempt, as the flush would give it.
    async fn mark_recorded(&self, units: &mut [Vec<Pending>]) {
        let mut process: Vec<&mut Pending> = (units.iter_mut().flatten())
            .filter(|p| p.route.mode == RouteMode::Process)
            .collect();
        if process.is_empty() {
            return;
        }
        process.sort_unstable_by_key(|p| p.index);
        let tasks: Vec<&NewTask> = process.iter().map(|p| &p.task).collect();
        let mut ordered: Vec<KeyPartition> = process
            .iter()
            .filter_map(|p| ordered_coordinates(p))
            .collect();
        ordered.sort_unstable();
        ordered.dedup();
        let (recorded, newest, ids) = tokio::join!(
            self.store.recorded(&tasks),
            self.store.newest_ordered_tasks(&ordered),
            self.store.reserve_ids(tasks.len()),
        );
        match recorded.and_then(|recorded| Ok((recorded, newest?, ids?))) {
            Ok((recorded, newest, ids)) => {
                let passed = self.passed(&process, &newest).await;
                for (i, ((pending, id), passed)) in
                    process.iter_mut().zip(ids).zip(passed).enumerate()
                {
                    pending.recorded = match (recorded.repeats.contains(&i), passed) {
                        (true, _) => Some(true),
                        (false, Some(passed)) => Some(passed),
                        // Its key's newer task cannot be placed in the topic's lives: not
                        // run inline, nor dropped; stored for the pool.
                        (false, None) => None,
                    };
                    pending.task.id = Some(id);
                    // Its attempt runs under the dedup key its failure will be stored
                    // under (`task.idempotency_key()`), not under another message's.
                    if let Some(&existing) = recorded.collisions.get(&i) {
                        pending.task = collision(std::mem::take(&mut pending.task), existing);
                    }
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
                        "not attempted inline: whether it was handled already could not be told (the \
                         database did not answer, or the record of its key's newer task could not \
                         be read back)",
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
                    self.run_inline(&message, &route, task, deadline).await
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
    async fn run_inline(
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
        let checkpoint = KeptCheckpoint::default();
        let ctx = HandlerContext::new(self.worker_id.clone(), 1, CancellationToken::new())
            .with_recovery(RecoveryPoints::Kept(checkpoint.clone()));
        let span = tracing::info_span!(
            "attempt",
            task_id = preview.id.0,
            handler = %route.handler,
            attempt = 1,
            route = %route.name,
            correlation_id = task.failure.correlation_id.as_deref(),
        );
        let attempted = invoke(&registered, &ctx, &preview).instrument(span).await;
        log_attempt(&AttemptLine {
            task_id: task.id.map(|id| id.0),
            handler: &route.handler,
            attempt: 1,
            route: Some(&route.name),
            correlation_id: task.failure.correlation_id.as_deref(),
            outcome: attempted.outcome,
            error: attempted.error.as_deref(),
        });
        task.attempts = 1;
        let resolved = attempted.outcome == FinishOutcome::Resolved;
        self.breakers
            .count_answer(&route.handler, attempted.verdict);
        let breaker = self.breakers.configured(&route.handler);
        if let Some(failed) = brake_vote(attempted.verdict, resolved, breaker) {
            self.brakes.record(&route.name, failed).await;
        }
        match attempted.outcome {
            FinishOutcome::Resolved => {
                self.count(route, "processed");
                return None;
            }
            FinishOutcome::Retry { at } => task.next_attempt_at = Some(at),
            FinishOutcome::PermanentFailure | FinishOutcome::NotCalled => {
                task.status = Status::PermanentFailure
            }
        }
        task.checkpoint = checkpoint.last();
        task.failure.error_message = attempted.error.clone();
        task.cause = attempted.cause;
        task.inline_attempt = Some(InlineAttempt {
            worker: self.worker_id.clone(),
            started_at: attempted.started_at,
            duration_ms: i32::try_from(attempted.duration.as_millis()).unwrap_or(i32::MAX),
            outcome: attempted.outcome.history(),
            error: attempted.error,
            compensate: registered.handler.compensates(),
        });
        Some(task)
    }

    /// For each of `process`, whether a newer message of its key, from its partition,
    /// has a task (`newest`, per key, topic and partition) in the topic's present life.
    /// Ordered batches are stored one after another, so that newer message's batch came
    /// after this one was handled: without a task of its own, this one succeeded inline,
    /// and running it again would apply it after the newer one. A newer task of an
    /// earlier life (the topic recreated, another cluster) says nothing of this
    /// message; `None` when which life cannot be read.
    async fn passed(&self, process: &[&mut Pending], newest: &NewestOrdered) -> Vec<Option<bool>> {
        let newer: Vec<Option<&(i64, Option<Task>)>> = (process.iter())
            .map(|p| {
                let found = ordered_coordinates(p).and_then(|key| newest.get(&key))?;
                (found.0 > p.message.message.offset()).then_some(found)
            })
            .collect();
        let tasks: Vec<Option<&Task>> = (newer.iter().flatten())
            .map(|(_, task)| task.as_ref())
            .collect();
        let batch: Vec<&Consumed> = process.iter().map(|p| &p.message).collect();
        let mut lives = self.lives.of(&tasks, &batch).await.into_iter();
        (newer.iter())
            .map(|newer| match newer {
                None => Some(false),
                Some(_) => match lives.next().unwrap_or(Life::Unknown) {
                    Life::Present => Some(true),
                    Life::Past => Some(false),
                    Life::Unknown => None,
                },
            })
            .collect()
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

/// An ordered message's order key, topic and partition; `None` when not ordered.
fn ordered_coordinates(p: &Pending) -> Option<KeyPartition> {
    let key = p.task.order_key.clone()?;
    let m = &p.message.message;
    Some((key, m.topic().to_owned(), m.partition()))
}
