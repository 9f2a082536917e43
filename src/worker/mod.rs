//! The worker pool: claims due tasks in batches, runs their handlers concurrently,
//! writes results in batches, keeps leases alive, and shuts down cleanly.

mod attempt;
mod finisher;
mod inflight;
mod wakeup;

use chrono::Utc;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerSettings;
use crate::handlers::Registered;
use crate::store::{FinishOutcome, Result, Store};
use crate::task::TaskId;
use crate::telemetry::Metrics;
use finisher::{Completion, Finisher};
use inflight::InFlight;

/// What [`WorkerPool::process_next`] did with one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Processed {
    /// The task.
    pub id: TaskId,
    /// What the attempt decided.
    pub outcome: FinishOutcome,
    /// Whether the result was written (false: the lease had been taken over).
    pub written: bool,
}

/// A pool of workers serving a set of handlers.
#[derive(Clone)]
pub struct WorkerPool {
    store: Store,
    worker_id: Arc<str>,
    handlers: Arc<BTreeMap<String, Registered>>,
    handler_names: Arc<[String]>,
    settings: WorkerSettings,
    metrics: Metrics,
}

impl WorkerPool {
    /// A pool for `handlers` (already selected and validated).
    pub fn new(
        store: Store,
        handlers: BTreeMap<String, Registered>,
        settings: WorkerSettings,
        metrics: Metrics,
    ) -> WorkerPool {
        let handler_names: Arc<[String]> = handlers.keys().cloned().collect();
        WorkerPool {
            store,
            worker_id: worker_id().into(),
            handlers: Arc::new(handlers),
            handler_names,
            settings,
            metrics,
        }
    }

    /// This worker's identity as written in leases and the attempt history.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Claims one due task, runs it and writes the result: the pool's step, for tests
    /// and tools that want to drive work one task at a time. `None` when nothing is due.
    pub async fn process_next(&self) -> Result<Option<Processed>> {
        let lease = self.settings.lease;
        let claimed = self
            .store
            .claim(&self.handler_names, 1, &self.worker_id, lease)
            .await?;
        let Some(task) = claimed.into_iter().next() else {
            return Ok(None);
        };
        let registered = &self.handlers[&task.handler];
        let never_lost = CancellationToken::new();
        let finish = attempt::run_attempt(registered, &task, &self.worker_id, never_lost).await;
        let written = self
            .store
            .finish(&self.worker_id, std::slice::from_ref(&finish))
            .await?;
        Ok(Some(Processed {
            id: task.id,
            outcome: finish.outcome,
            written: !written.is_empty(),
        }))
    }

    /// Runs until `shutdown` fires, then stops claiming, lets running handlers finish for
    /// up to `shutdown_timeout`, writes their results and releases the leases of the rest.
    pub async fn run(self, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.settings.concurrency as usize));
        let in_flight = Arc::new(InFlight::default());
        let wake = Arc::new(Notify::new());
        let background_stop = CancellationToken::new();
        let (completions_tx, completions_rx) = mpsc::unbounded_channel();

        let finisher = tokio::spawn(
            Finisher {
                store: self.store.clone(),
                worker_id: self.worker_id.clone(),
                in_flight: in_flight.clone(),
                metrics: self.metrics.clone(),
                batch_size: self.settings.batch_size as usize,
                give_up_after: self.settings.lease,
                wake: wake.clone(),
            }
            .run(completions_rx),
        );
        let heartbeat = tokio::spawn(inflight::heartbeat_loop(
            self.store.clone(),
            in_flight.clone(),
            self.metrics.clone(),
            self.settings.heartbeat,
            self.settings.lease,
            background_stop.clone(),
        ));
        let listener = tokio::spawn(wakeup::listen(
            self.store.clone(),
            wake.clone(),
            background_stop.clone(),
        ));
        tracing::info!(worker = %self.worker_id, handlers = ?self.handler_names,
            concurrency = self.settings.concurrency, batch_size = self.settings.batch_size,
            "worker pool started");

        let mut attempts = JoinSet::new();
        let mut pause = Duration::ZERO;
        loop {
            while attempts.try_join_next().is_some() {}
            let wanted = slots
                .available_permits()
                .clamp(1, self.settings.batch_size as usize);
            let mut permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                permit = slots.clone().acquire_many_owned(wanted as u32) => {
                    permit.expect("the semaphore is never closed")
                }
            };
            let claimed = self
                .store
                .claim(
                    &self.handler_names,
                    wanted as u32,
                    &self.worker_id,
                    self.settings.lease,
                )
                .await;
            let tasks = match claimed {
                Ok(tasks) => {
                    pause = Duration::ZERO;
                    tasks
                }
                Err(error) => {
                    drop(permit);
                    self.metrics
                        .database_errors
                        .with_label_values(&["claim"])
                        .inc();
                    pause = (pause * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
                    tracing::warn!(%error, retry_in = ?pause, "claim failed");
                    if sleep_or_shutdown(pause, &shutdown).await {
                        break;
                    }
                    continue;
                }
            };
            let drained = tasks.len() < wanted;
            self.metrics.claimed.inc_by(tasks.len() as u64);
            self.metrics.in_flight.add(tasks.len() as i64);
            for task in tasks {
                let slot = permit.split(1).expect("one permit per claimed task");
                let lease_lost = in_flight.insert(task.lease());
                let registered = self.handlers[&task.handler].clone();
                let worker_id = self.worker_id.clone();
                let completions = completions_tx.clone();
                let metrics = self.metrics.clone();
                attempts.spawn(async move {
                    let handler: Arc<str> = task.handler.as_str().into();
                    let finish =
                        attempt::run_attempt(&registered, &task, &worker_id, lease_lost.clone())
                            .await;
                    if lease_lost.is_cancelled() {
                        // Taken over meanwhile: the write would be fenced out anyway.
                        metrics.in_flight.dec();
                        return;
                    }
                    metrics
                        .handler_seconds
                        .with_label_values(&[&*handler])
                        .observe(finish.duration.as_secs_f64());
                    let completion = Completion {
                        finish,
                        handler,
                        _slot: slot,
                    };
                    // The finisher outlives every attempt; a send cannot fail.
                    let _ = completions.send(completion);
                });
            }
            drop(permit);
            if drained && self.idle(&wake, &shutdown).await {
                break;
            }
        }

        self.shut_down(attempts, completions_tx, finisher, in_flight)
            .await;
        background_stop.cancel();
        let _ = heartbeat.await;
        let _ = listener.await;
    }

    /// Waits for a notification, the next due task or the poll interval, whichever comes
    /// first. Returns true if shutdown was asked for meanwhile.
    async fn idle(&self, wake: &Notify, shutdown: &CancellationToken) -> bool {
        let poll = self.settings.poll_interval;
        let wait = match self.store.next_due(&self.handler_names).await {
            Ok(Some(due)) => (due - Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .min(poll),
            Ok(None) => poll,
            Err(error) => {
                self.metrics
                    .database_errors
                    .with_label_values(&["next_due"])
                    .inc();
                tracing::warn!(%error, "cannot read the next due time");
                poll
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = wake.notified() => false,
            _ = tokio::time::sleep(wait) => false,
        }
    }

    async fn shut_down(
        &self,
        mut attempts: JoinSet<()>,
        completions: mpsc::UnboundedSender<Completion>,
        mut finisher: tokio::task::JoinHandle<()>,
        in_flight: Arc<InFlight>,
    ) {
        let running = attempts.len();
        tracing::info!(running, deadline = ?self.settings.shutdown_timeout,
            "shutting down: no more claims, waiting for running handlers");
        let deadline = tokio::time::Instant::now() + self.settings.shutdown_timeout;
        let all_done = async { while attempts.join_next().await.is_some() {} };
        if tokio::time::timeout_at(deadline, all_done).await.is_err() {
            tracing::warn!(
                left = attempts.len(),
                "shutdown deadline passed; interrupting handlers"
            );
            attempts.shutdown().await;
        }
        drop(completions);
        let give_up = tokio::time::Instant::now() + self.settings.shutdown_timeout;
        if tokio::time::timeout_at(give_up, &mut finisher)
            .await
            .is_err()
        {
            finisher.abort();
            tracing::error!(
                "results could not be written before the deadline; their leases will lapse"
            );
        }
        let unfinished = in_flight.drain();
        if unfinished.is_empty() {
            return;
        }
        match self.store.release(&self.worker_id, &unfinished).await {
            Ok(released) => tracing::info!(released = released.len(), "leases released"),
            Err(error) => tracing::warn!(%error, leases = unfinished.len(),
                "could not release leases; the tasks come back when the leases lapse"),
        }
    }
}

/// Sleeps for `pause`; returns true if shutdown fired first.
async fn sleep_or_shutdown(pause: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(pause) => false,
    }
}

/// `host-pid-random`: unique per process, readable in the attempt history.
fn worker_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let suffix: u16 = rand::random();
    format!("{host}-{}-{suffix:04x}", std::process::id())
}
