//! The worker pool: claims due tasks in batches, runs their handlers concurrently,
//! writes results in batches, keeps leases alive, and shuts down cleanly.

mod admission;
mod attempt;
mod claimer;
mod compensator;
mod due_floor;
use due_floor::DueFloors;
mod finisher;
mod inflight;
mod served;
mod wakeup;

use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{HandlerSettings, RouteSettings, WorkerSettings, CLAIM_LOOPS};
use crate::finals::Finals;
use crate::handlers::breakers::BreakerFollower;
use crate::handlers::Registered;
use crate::parts::Watch;
use crate::store::{Result, Store};
use crate::task::{FinishOutcome, Lease, Status, TaskId};
use crate::telemetry::Metrics;
use admission::Admission;
use claimer::Claimer;
use compensator::Compensator;
use finisher::Finisher;
use inflight::{Beat, InFlight};
use served::Served;
use wakeup::Signals;

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

/// A background part of the pool panicked (a bug); the pool drained and stopped.
#[derive(Debug, thiserror::Error)]
#[error("a part of the worker pool panicked: {0}")]
pub struct PartDied(pub String);

/// A pool of workers serving a set of handlers.
#[derive(Clone)]
pub struct WorkerPool {
    store: Store,
    worker_id: Arc<str>,
    served: Arc<Served>,
    settings: WorkerSettings,
    metrics: Metrics,
    finals: Finals,
    limits: BTreeMap<String, HandlerSettings>,
    /// The member's follower of the breakers; without one, [`WorkerPool::run`] starts
    /// its own.
    breakers: Option<Arc<BreakerFollower>>,
}

impl WorkerPool {
    /// A pool for `handlers` (already selected and validated).
    pub fn new(
        store: Store,
        handlers: BTreeMap<String, Registered>,
        settings: WorkerSettings,
        metrics: Metrics,
    ) -> WorkerPool {
        WorkerPool {
            store,
            worker_id: worker_id().into(),
            served: Arc::new(Served::new(handlers)),
            settings,
            metrics,
            finals: Finals::default(),
            limits: BTreeMap::new(),
            breakers: None,
        }
    }

    /// Applies the breakers, bulkheads and rate limits of `[handlers.NAME]`.
    pub fn with_limits(mut self, limits: BTreeMap<String, HandlerSettings>) -> WorkerPool {
        self.limits = limits;
        self
    }

    /// Applies the policy overrides of these routes to their tasks.
    pub fn with_routes(mut self, routes: &[RouteSettings]) -> WorkerPool {
        self.served = Arc::new(Served::clone(&self.served).with_routes(routes));
        self
    }

    /// Follows the breakers with the member's follower, which the member runs.
    pub(crate) fn with_breakers(mut self, breakers: Arc<BreakerFollower>) -> WorkerPool {
        self.breakers = Some(breakers);
        self
    }

    /// Reports tasks that become permanent failures (parking).
    pub(crate) fn with_finals(mut self, finals: Finals) -> WorkerPool {
        self.finals = finals;
        self
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
            .claim(self.served.names(), 1, &self.worker_id, lease)
            .await?;
        let Some(task) = claimed.into_iter().next() else {
            return Ok(None);
        };
        let registered = self.served.registered_for(&task);
        let never_lost = CancellationToken::new();
        let (finish, _) =
            attempt::run_attempt(&self.store, &registered, &task, &self.worker_id, never_lost)
                .await;
        let written = self
            .store
            .finish(&self.worker_id, std::slice::from_ref(&finish))
            .await?;
        let processed = Processed {
            id: task.id,
            outcome: finish.outcome,
            written: !written.is_empty(),
        };
        if !processed.written {
            // Fenced: its call has stopped, the task may run again.
            self.store.calls_stopped(&[finish.lease]).await?;
        }
        if processed.written && processed.outcome.status() == Status::PermanentFailure {
            self.finals.permanent_failure(Arc::new(task), finish.error);
        }
        Ok(Some(processed))
    }

    /// Runs until `shutdown` fires, then stops claiming, lets running handlers (and
    /// compensations) finish for up to `shutdown_timeout`, writes their results and
    /// releases the leases (and compensation claims) of the rest.
    /// A background part that panics (its own breaker follower, rate sharer, heartbeat,
    /// listener, finisher, compensator) stops the pool the same way and is its error.
    pub async fn run(self, shutdown: CancellationToken) -> std::result::Result<(), PartDied> {
        let watch = Watch::default();
        let shutdown = watch.stop_on(&shutdown);
        let in_flight = Arc::new(InFlight::default());
        let wake = Arc::new(Notify::new());
        let background_stop = CancellationToken::new();
        let (completions_tx, completions_rx) = mpsc::unbounded_channel();
        let (breakers, own_following) = match &self.breakers {
            Some(shared) => (shared.clone(), None),
            None => {
                let own = Arc::new(BreakerFollower::new(
                    self.store.clone(),
                    self.metrics.clone(),
                    &self.limits,
                    self.served.names(),
                ));
                let stop = background_stop.clone();
                let following = watch.spawn("breaker follower", own.clone().run(stop));
                (own, Some(following))
            }
        };
        let admission = Arc::new(Admission::new(
            self.store.clone(),
            breakers,
            &self.limits,
            self.served.names(),
        ));
        let sharing = watch.spawn(
            "rate sharer",
            admission.clone().run(background_stop.clone()),
        );

        let mut finisher = watch.spawn(
            "finisher",
            Finisher {
                store: self.store.clone(),
                worker_id: self.worker_id.clone(),
                in_flight: in_flight.clone(),
                metrics: self.metrics.clone(),
                batch_size: self.settings.batch_size as usize,
                give_up_after: self.settings.lease,
                wake: wake.clone(),
                finals: self.finals.clone(),
                admission: admission.clone(),
            }
            .run(completions_rx),
        );
        let (fenced, fenced_heard) = tokio::sync::watch::channel(());
        let heartbeat = watch.spawn(
            "heartbeat",
            inflight::heartbeat_loop(
                self.store.clone(),
                in_flight.clone(),
                self.metrics.clone(),
                Beat::new(self.settings.heartbeat, fenced_heard.clone()),
                self.settings.lease,
                background_stop.clone(),
            ),
        );
        let signals = Signals {
            wake: wake.clone(),
            fenced,
        };
        let listener = watch.spawn(
            "listener",
            wakeup::listen(self.store.clone(), signals, background_stop.clone()),
        );
        tracing::info!(worker = %self.worker_id, handlers = ?self.served.names(),
            concurrency = self.settings.concurrency, batch_size = self.settings.batch_size,
            "worker pool started");

        let claimer = Arc::new(Claimer {
            store: self.store.clone(),
            worker_id: self.worker_id.clone(),
            served: self.served.clone(),
            admission,
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            keep_final_tasks: self.finals.wanted(),
            slots: Arc::new(Semaphore::new(self.settings.concurrency as usize)),
            in_flight: in_flight.clone(),
            wake,
            completions: completions_tx,
            attempts: TaskTracker::new(),
            interrupt: CancellationToken::new(),
            floors: DueFloors::default(),
        });
        let compensator = watch.spawn(
            "compensator",
            Compensator {
                store: self.store.clone(),
                worker_id: self.worker_id.clone(),
                served: self.served.clone(),
                metrics: self.metrics.clone(),
                settings: self.settings.clone(),
                fenced: fenced_heard,
            }
            .run(shutdown.clone()),
        );
        let mut claim_loops = JoinSet::new();
        for _ in 0..CLAIM_LOOPS {
            claim_loops.spawn(claimer.clone().run(shutdown.clone()));
        }
        while let Some(joined) = claim_loops.join_next().await {
            if let Err(error) = joined {
                if let Ok(panic) = error.try_into_panic() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
        // Running compensations and attempts drain side by side, under one deadline each.
        let _ = tokio::join!(compensator, self.drain_attempts(&claimer));
        drop(claimer);
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
        self.release(&in_flight).await;
        background_stop.cancel();
        // Their panics are in `watch`.
        let _ = tokio::join!(heartbeat, sharing, listener);
        if let Some(following) = own_following {
            let _ = following.await;
        }
        match watch.failure() {
            Some(message) => Err(PartDied(message)),
            None => Ok(()),
        }
    }

    /// Lets running handlers finish until the shutdown deadline, then interrupts them.
    async fn drain_attempts(&self, claimer: &Claimer) {
        let attempts = &claimer.attempts;
        attempts.close();
        tracing::info!(running = attempts.len(), deadline = ?self.settings.shutdown_timeout,
            "shutting down: no more claims, waiting for running handlers");
        let deadline = self.settings.shutdown_timeout;
        if tokio::time::timeout(deadline, attempts.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = attempts.len(),
                "shutdown deadline passed; interrupting handlers"
            );
            claimer.interrupt.cancel();
            attempts.wait().await;
        }
    }

    /// Gives back the leases of attempts that were interrupted or could not be written.
    async fn release(&self, in_flight: &InFlight) {
        let unfinished = in_flight.drain();
        if unfinished.is_empty() {
            return;
        }
        match self.store.release(&self.worker_id, &unfinished).await {
            Ok(released) => {
                tracing::info!(released = released.len(), "leases released");
                // The rest were fenced meanwhile; their calls have stopped too.
                let fenced: Vec<Lease> = (unfinished.into_iter())
                    .filter(|lease| !released.contains(&lease.id))
                    .collect();
                if !fenced.is_empty() {
                    inflight::say_calls_stopped(&self.store, &fenced).await;
                }
            }
            Err(error) => tracing::warn!(%error, leases = unfinished.len(),
                "could not release leases; the tasks come back when the leases lapse"),
        }
    }
}

/// `host-pid-random`: unique per process, readable in the attempt history.
fn worker_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let suffix: u16 = rand::random();
    format!("{host}-{}-{suffix:04x}", std::process::id())
}
