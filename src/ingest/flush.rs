//! Persisting one batch of consumed messages: map each to its route's task, fetch the
//! originals that dead letters left out ([`Originals`]), link re-failures
//! ([`lineage`]), end each captured task's note with what happens to it
//! ([`outcome`]), let process mode run its handlers inline ([`ProcessMode`]), insert the
//! tasks, and only then report the offsets that may be committed.

use rdkafka::message::Message;
use std::future::Future;
use std::sync::Arc;
use tracing::Instrument;

use super::brake::Brakes;
use super::lineage;
use super::mapping::{append_note, collision, minimal_form, to_task};
use super::offsets::Offsets;
use super::originals::Originals;
use super::outage::StoreOutage;
use super::outcome;
use super::process::{Mapped, ProcessMode};
use super::routes::RouteTable;
use crate::backoff::Pause;
use crate::config::{IngestSettings, RouteMode, Targets};
use crate::finals::Finals;
use crate::kafka::message::Consumed;
use crate::store::{Enqueued, Store, StoreError};
use crate::task::{NewTask, Status, TaskId};
use crate::telemetry::{DatabaseFailed, DbOp, Metrics};

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

/// What a flush needs; cheap to clone into a spawned task.
#[derive(Clone)]
pub(crate) struct Flusher {
    pub(crate) store: Store,
    pub(crate) brakes: Arc<Brakes>,
    pub(crate) routes: Arc<RouteTable>,
    pub(crate) limits: IngestSettings,
    pub(crate) metrics: Metrics,
    pub(crate) finals: Finals,
    pub(crate) process: Arc<ProcessMode>,
    pub(crate) originals: Originals,
    /// Where tasks go next, for the ingest note.
    pub(crate) targets: Targets,
    /// Since when the database has not answered ingest.
    pub(crate) outage: Arc<StoreOutage>,
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
        let mut mapped = self.map(messages)?;
        self.originals.fill(&self.store, &mut mapped).await;
        self.link_refailures(&mut mapped).await;
        for m in (mapped.iter_mut()).filter(|m| m.route.mode == RouteMode::Capture) {
            outcome::settle_note(&mut m.task, &m.route, &self.targets);
        }
        let tasks = self.process.tasks(mapped).await;
        if !tasks.is_empty() {
            self.insert(tasks).await?;
        }
        Ok(offsets)
    }

    /// Each message with its route and its task; a message no route claims fails the
    /// batch.
    fn map(&self, messages: Vec<Consumed>) -> Result<Vec<Mapped>, FlushError> {
        messages
            .into_iter()
            .map(|message| {
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
                Ok(Mapped {
                    message,
                    route,
                    task,
                })
            })
            .collect()
    }

    /// Links each captured re-failure to the task its `redrive-task-id` names (see
    /// [`lineage`]); asks the database until it answers. The header is read from the
    /// task's headers first: a share group's dead letter carries none of the original's,
    /// which come with the original record fetched before this; then from the message's
    /// (a message too large to store keeps no headers).
    async fn link_refailures(&self, mapped: &mut [Mapped]) {
        let named: Vec<(usize, lineage::Named)> = mapped
            .iter()
            .enumerate()
            .filter(|(_, m)| m.route.mode == RouteMode::Capture)
            .filter_map(|(i, m)| {
                let named = lineage::named_task(&m.task.failure.headers)
                    .or_else(|| lineage::named_task(&m.message.headers));
                named.map(|n| (i, n))
            })
            .collect();
        if named.is_empty() {
            return;
        }
        let ids: Vec<TaskId> = named
            .iter()
            .filter_map(|(_, n)| n.task.clone().ok())
            .collect();
        let ancestors = self.until_answered(|| self.store.ancestors(&ids)).await;
        let newest = match ids.iter().all(|id| ancestors.contains_key(id)) {
            true => None,
            false => self.until_answered(|| self.store.newest_task_id()).await,
        };
        for (index, named) in named {
            let Mapped { route, task, .. } = &mut mapped[index];
            if let Some(disagreement) = named.disagreement {
                let note = append_note(task.failure.ingest_note.take(), &disagreement);
                task.failure.ingest_note = Some(note);
            }
            match named.task {
                Ok(id) => lineage::link(task, route, id, ancestors.get(&id), newest),
                Err(reason) => {
                    let note = append_note(task.failure.ingest_note.take(), &reason);
                    task.failure.ingest_note = Some(note);
                }
            }
        }
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
        self.until_answered(|| async {
            match self.store.enqueue_many(tasks).await {
                Err(error) if is_data_error(&error) => self.insert_one_by_one(tasks).await,
                other => other,
            }
        })
        .await
    }

    /// Runs `work` until the database answers it: the batch's offsets stay uncommitted
    /// meanwhile.
    async fn until_answered<T, F, Fut>(&self, mut work: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut pause = Pause::database();
        loop {
            match work().await {
                Ok(answer) => {
                    self.outage.answered();
                    self.metrics.health.database_ok();
                    return answer;
                }
                Err(error) => {
                    if error.is_unavailable() {
                        self.outage.failed();
                    }
                    DatabaseFailed {
                        op: DbOp::Ingest,
                        error: &error,
                    }
                    .emit(&self.metrics);
                    tracing::debug!(retry_in = ?pause.peek(),
                        "consumed failures not stored yet; their offsets stay uncommitted");
                }
            }
            tokio::time::sleep(pause.next_pause()).await;
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
            if task.failure.previous_task.is_some() {
                let lineage = match lineage::loop_stopped(&task) {
                    true => "loop_stopped",
                    false => "linked",
                };
                self.metrics
                    .refailures
                    .with_label_values(&[route, lineage])
                    .inc();
            }
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
                let error = (task.final_error.clone()).or(task.failure.error_message.clone());
                let mut stored = task.unsaved();
                stored.id = id;
                stored.attempts = task.attempts;
                self.finals.permanent_failure(Arc::new(stored), error);
            }
        }
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
    use crate::config::{RouteMode, RouteSettings};
    use crate::handlers::breakers::BreakerFollower;

    /// Regression: a message on a topic that no route claimed was logged and dropped,
    /// and its offset committed. It is an error now, and the batch reports no offsets.
    #[tokio::test]
    async fn a_message_no_route_claims_fails_the_batch() {
        let mut route = RouteSettings::new(&[], RouteMode::Capture, "log");
        route.name = "orders".into();
        route.pattern = Some("orders".into());
        let store = Store::unreachable_for_test();
        let brakes = Arc::new(Brakes::new(
            store.clone(),
            Metrics::new(),
            "test".into(),
            &[],
        ));
        let flusher = Flusher {
            store: store.clone(),
            brakes: brakes.clone(),
            routes: Arc::new(RouteTable::new(vec![route])),
            limits: IngestSettings::default(),
            metrics: Metrics::new(),
            finals: Finals::default(),
            process: Arc::new(ProcessMode {
                store,
                brakes,
                breakers: Arc::new(BreakerFollower::new(
                    Store::unreachable_for_test(),
                    Metrics::new(),
                    &std::collections::BTreeMap::new(),
                    &[],
                )),
                handlers: Arc::default(),
                limits: IngestSettings::default(),
                metrics: Metrics::new(),
                worker_id: "test".into(),
                lives: crate::ingest::lives::Lives::new(
                    crate::config::KafkaSettings::default(),
                    IngestSettings::default(),
                ),
            }),
            originals: Originals {
                kafka: Default::default(),
                limits: IngestSettings::default(),
                routes: Arc::new([]),
            },
            targets: Targets::default(),
            outage: Arc::default(),
        };
        let stray = Consumed::for_test(10); // on topic "test"
        let outcome = flusher.flush(vec![stray]).await;
        assert!(
            matches!(&outcome, Err(FlushError::Unrouted { topic, .. }) if topic == "test"),
            "{outcome:?}"
        );
    }
}
