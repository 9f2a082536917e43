//! Persisting one batch of consumed messages: run process-mode handlers, insert the
//! tasks, and only then report the offsets that may be committed.

use futures::stream::{self, StreamExt};
use rdkafka::message::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::routes::RouteTable;
use crate::config::{IngestSettings, RouteMode, RouteSettings};
use crate::handlers::{HandlerContext, Registered};
use crate::kafka::message::{minimal_form, to_task, Consumed};
use crate::store::{Enqueued, Store, StoreError};
use crate::task::NewTask;
use crate::telemetry::Metrics;

/// Next offset to commit per (topic, partition).
pub(crate) type Offsets = BTreeMap<(String, i32), i64>;

/// What a flush needs; cheap to clone into a spawned task.
#[derive(Clone)]
pub(crate) struct Flusher {
    pub(crate) store: Store,
    pub(crate) routes: Arc<RouteTable>,
    pub(crate) handlers: Arc<BTreeMap<String, Registered>>,
    pub(crate) limits: IngestSettings,
    pub(crate) metrics: Metrics,
    pub(crate) worker_id: String,
}

impl Flusher {
    /// Persists `messages`; returns the offsets now safe to commit, or `None` if shutdown
    /// came while the database was unreachable (nothing committed, nothing lost).
    pub(crate) async fn flush(
        self,
        messages: Vec<Consumed>,
        shutdown: CancellationToken,
    ) -> Option<Offsets> {
        let mut offsets = Offsets::new();
        for m in messages.iter().map(|c| &c.message) {
            let next = offsets
                .entry((m.topic().to_owned(), m.partition()))
                .or_insert(0);
            *next = (*next).max(m.offset() + 1);
        }
        let tasks = self.to_tasks(messages).await;
        if !tasks.is_empty() && !self.insert(&tasks, &shutdown).await {
            return None;
        }
        Some(offsets)
    }

    /// Capture-mode messages become tasks; process-mode ones only if their handler fails.
    async fn to_tasks(&self, messages: Vec<Consumed>) -> Vec<NewTask> {
        let concurrency = self.limits.process_concurrency as usize;
        let outcomes: Vec<Option<NewTask>> = stream::iter(messages)
            .map(|message| async move {
                let Some(route) = self.routes.route_for(message.message.topic()) else {
                    tracing::error!(
                        topic = message.message.topic(),
                        "message on a topic no route claims; not stored"
                    );
                    return None;
                };
                match route.mode {
                    RouteMode::Capture => Some(to_task(&message, route, &self.limits, None)),
                    RouteMode::Process => self.process(&message, route).await,
                }
            })
            .buffered(concurrency)
            .collect()
            .await;
        outcomes.into_iter().flatten().collect()
    }

    /// Runs the route's handler on a message; a failure becomes a task at attempt 1.
    async fn process(&self, message: &Consumed, route: &RouteSettings) -> Option<NewTask> {
        let registered = &self.handlers[&route.handler];
        let preview = to_task(message, route, &self.limits, None).unsaved();
        let ctx = HandlerContext {
            worker_id: self.worker_id.clone(),
            attempt: 1,
            cancellation: CancellationToken::new(),
        };
        let timeout = route.timeout.unwrap_or(registered.policy.timeout);
        let call = registered.handler.handle(&ctx, &preview);
        let error = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(())) => {
                self.metrics
                    .ingested
                    .with_label_values(&[&route.name, "processed"])
                    .inc();
                return None;
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!(
                "handler timed out after {}",
                humantime::format_duration(timeout)
            ),
        };
        Some(to_task(message, route, &self.limits, Some(error)))
    }

    /// Inserts until it works. Rows the database refuses as data go in one by one, and
    /// a row refused alone is stored in its minimal form. Returns false on shutdown.
    async fn insert(&self, tasks: &[NewTask], shutdown: &CancellationToken) -> bool {
        let mut pause = Duration::from_millis(100);
        loop {
            let result = match self.store.enqueue_many(tasks).await {
                Err(error) if is_data_error(&error) => self.insert_one_by_one(tasks).await,
                other => other.map(|outcomes| self.count(tasks, &outcomes)),
            };
            match result {
                Ok(()) => return true,
                Err(error) => {
                    self.metrics
                        .database_errors
                        .with_label_values(&["ingest"])
                        .inc();
                    tracing::warn!(%error, tasks = tasks.len(), retry_in = ?pause,
                        "cannot store consumed failures; offsets stay uncommitted");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    async fn insert_one_by_one(&self, tasks: &[NewTask]) -> Result<(), StoreError> {
        for task in tasks {
            let outcome = match self.store.enqueue_many(std::slice::from_ref(task)).await {
                Err(error) if is_data_error(&error) => {
                    tracing::warn!(%error, source = ?task.source, "message refused by the database; storing its minimal form");
                    self.store
                        .enqueue_many(&[minimal_form(task, &error.to_string())])
                        .await?
                }
                other => other?,
            };
            self.count(std::slice::from_ref(task), &outcome);
        }
        Ok(())
    }

    fn count(&self, tasks: &[NewTask], outcomes: &[Enqueued]) {
        for (task, outcome) in tasks.iter().zip(outcomes) {
            let route = task.route.as_deref().unwrap_or("");
            let label = match outcome {
                Enqueued::Created(_) => "stored",
                Enqueued::Existing(_) => "redelivered",
                Enqueued::Conflict(id) => {
                    tracing::warn!(task = %id, source = ?task.source,
                        "a task already records these coordinates with other content; kept the first");
                    "redelivered"
                }
            };
            self.metrics
                .ingested
                .with_label_values(&[route, label])
                .inc();
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
