//! Writes attempt results in batches: one finish statement for many tasks.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::admission::Admission;
use super::inflight::{say_calls_stopped, InFlight};
use crate::backoff::Pause;
use crate::finals::Finals;
use crate::store::{Finish, Store};
use crate::task::{FinishOutcome, Lease, Task, Verdict};
use crate::telemetry::{log_attempt, AttemptLine, DatabaseFailed, DbOp, Metrics};

/// Finish statements in flight at once: enough to overlap one batch's commit with the
/// next batch's round trip.
const CONCURRENT_FLUSHES: usize = 3;

/// A finished attempt on its way to the database. The permit keeps the task's slot in
/// the pool taken until the result is written.
pub(crate) struct Completion {
    pub(crate) finish: Finish,
    /// How the handler answered, for its breaker.
    pub(crate) verdict: Verdict,
    pub(crate) handler: Arc<str>,
    /// What the attempt's log line names besides the handler.
    pub(crate) context: AttemptContext,
    /// The task, kept when it became a permanent failure and someone wants to know.
    pub(crate) task: Option<Arc<Task>>,
    pub(crate) _slot: OwnedSemaphorePermit,
    /// The handler's bulkhead slot, if it has a bulkhead.
    pub(crate) _bulkhead: Option<OwnedSemaphorePermit>,
}

/// The fields of an attempt's log line that its result does not carry.
pub(crate) struct AttemptContext {
    pub(crate) attempt: i32,
    pub(crate) route: Option<String>,
    pub(crate) correlation_id: Option<String>,
}

/// What the finisher needs besides its input channel.
#[derive(Clone)]
pub(crate) struct Finisher {
    pub(crate) store: Store,
    pub(crate) worker_id: Arc<str>,
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) metrics: Metrics,
    pub(crate) batch_size: usize,
    /// How long to keep retrying a write while the database is failing: after that the
    /// lease has lapsed and the task will be claimed again.
    pub(crate) give_up_after: Duration,
    /// Poked after a retry is scheduled, so the claim loop recomputes its next wake-up.
    pub(crate) wake: Arc<Notify>,
    /// Told about permanent failures once they are written.
    pub(crate) finals: Finals,
    /// Told how each written attempt's handler answered.
    pub(crate) admission: Arc<Admission>,
}

impl Finisher {
    /// Drains `completions` until every sender is gone, writing batches as they come.
    pub(crate) async fn run(self, mut completions: mpsc::UnboundedReceiver<Completion>) {
        let mut flushes = JoinSet::new();
        loop {
            while flushes.len() >= CONCURRENT_FLUSHES {
                flushes.join_next().await;
            }
            let mut batch = Vec::with_capacity(self.batch_size);
            if completions.recv_many(&mut batch, self.batch_size).await == 0 {
                break;
            }
            flushes.spawn(self.clone().flush(batch));
        }
        while flushes.join_next().await.is_some() {}
    }

    async fn flush(self, batch: Vec<Completion>) {
        let results: Vec<Finish> = batch.iter().map(|c| c.finish.clone()).collect();
        let deadline = Instant::now() + self.give_up_after;
        let mut pause = Pause::database();
        let written = loop {
            match self.store.finish(&self.worker_id, &results).await {
                Ok(written) => {
                    self.metrics.health.database_ok();
                    break Some(written);
                }
                Err(error) => {
                    if Instant::now() + pause.peek() > deadline {
                        self.metrics.count_database_error(DbOp::Finish);
                        tracing::error!(%error, tasks = results.len(),
                            "could not write results; the tasks will be retried after their leases lapse");
                        break None;
                    }
                    DatabaseFailed {
                        op: DbOp::Finish,
                        error: &error,
                    }
                    .emit(&self.metrics);
                    tokio::time::sleep(pause.next_pause()).await;
                }
            }
        };
        self.in_flight.remove(results.iter().map(|r| r.lease));
        self.metrics.in_flight.sub(results.len() as i64);
        let Some(written) = written else { return };
        let written: HashSet<Lease> = written.into_iter().collect();
        self.account(&batch, &written);
        let fenced: Vec<Lease> = (results.iter().map(|r| r.lease))
            .filter(|lease| !written.contains(lease))
            .collect();
        if !fenced.is_empty() {
            // Their calls ended before an operator's action: the tasks may run again.
            // Apart from the batch, which a retry must not hold up.
            let store = self.store.clone();
            tokio::spawn(async move { say_calls_stopped(&store, &fenced).await });
        }
    }

    fn account(&self, batch: &[Completion], written: &HashSet<Lease>) {
        let mut retry_scheduled = false;
        for completion in batch {
            let finish = &completion.finish;
            if written.contains(&finish.lease) {
                self.admission
                    .count(&completion.handler, completion.verdict);
                self.metrics
                    .attempt_finished(&completion.handler, finish.outcome);
                let context = &completion.context;
                log_attempt(&AttemptLine {
                    task_id: Some(finish.lease.id.0),
                    handler: &completion.handler,
                    attempt: context.attempt,
                    route: context.route.as_deref(),
                    correlation_id: context.correlation_id.as_deref(),
                    outcome: finish.outcome,
                    error: finish.error.as_deref(),
                });
                retry_scheduled |= matches!(finish.outcome, FinishOutcome::Retry { .. });
                if let Some(task) = &completion.task {
                    self.finals
                        .permanent_failure(task.clone(), finish.error.clone());
                }
            } else {
                self.metrics
                    .fenced_writes
                    .with_label_values(&["finish"])
                    .inc();
                tracing::warn!(task_id = finish.lease.id.0, handler = &*completion.handler,
                    attempt = completion.context.attempt, lease_version = finish.lease.version,
                    outcome = finish.outcome.history().as_str(),
                    "result dropped (fenced): the lease was taken over or an operator acted meanwhile");
            }
        }
        if retry_scheduled {
            self.wake.notify_one();
        }
    }
}
