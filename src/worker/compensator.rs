//! Compensations: a member's loop that claims the compensations owed by tasks of its
//! compensating handlers, runs [`crate::Handler::compensate`] under the handler's
//! timeout, and writes each result under its claim. Compensations are rare: one small
//! batch per poll interval, run concurrently.
//!
//! A running call's claim is kept alive by a heartbeat, like an attempt's lease, so a
//! call longer than the lease is not claimed again elsewhere. A claim the heartbeat finds
//! lost (an operator retried or resolved the task, or the claim lapsed) cancels the call's
//! token and stops the call. At shutdown, running calls have `worker.shutdown_timeout` to
//! finish; then they are interrupted and their claims given back.

use chrono::Utc;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::inflight::{Beat, InFlight};
use super::served::Served;
use crate::config::WorkerSettings;
use crate::handlers::invoke::{classify, guarded};
use crate::handlers::HandlerContext;
use crate::store::{Compensating, CompensationOutcome, CompensationResult, Store};
use crate::task::{FinishOutcome, Lease};
use crate::telemetry::{DbOp, Metrics};

/// Compensations claimed at once.
const BATCH: i64 = 16;

/// Claims and runs compensations until `stop` fires, then lets running calls finish
/// until the shutdown deadline.
pub(crate) struct Compensator {
    pub(crate) store: Store,
    pub(crate) worker_id: Arc<str>,
    pub(crate) served: Arc<Served>,
    pub(crate) metrics: Metrics,
    /// Lease, heartbeat, poll interval and shutdown timeout.
    pub(crate) settings: WorkerSettings,
    /// Changes when an operator fenced claims: they are checked at once.
    pub(crate) fenced: watch::Receiver<()>,
}

/// What the running calls share with the loop.
#[derive(Default)]
struct Calls {
    /// Claims held, each with the token cancelled when the heartbeat finds it lost.
    claims: InFlight,
    /// Fired at the shutdown deadline: calls still running stop and give their claims back.
    interrupt: CancellationToken,
}

impl Compensator {
    /// The loop; returns at once when no served handler compensates.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let handlers = self.served.compensating();
        if handlers.is_empty() {
            return;
        }
        for handler in &handlers {
            for outcome in ["compensated", "retry", "failed"] {
                self.metrics
                    .compensations
                    .with_label_values(&[handler, outcome]);
            }
        }
        let this = Arc::new(self);
        let shared = Arc::new(Calls::default());
        let mut running = JoinSet::new();
        let mut heartbeat = Beat::new(this.settings.heartbeat, this.fenced.clone());
        while !stop.is_cancelled() {
            // The claims' local deadlines (kept by the claim set; the heartbeat, not a
            // deadline check, finds a lost claim here).
            let claimed_at = tokio::time::Instant::now();
            let full = match this
                .store
                .claim_compensations(&handlers, BATCH, &this.worker_id, this.settings.lease)
                .await
            {
                Ok(claimed) => {
                    let full = claimed.len() as i64 == BATCH;
                    for claimed in claimed {
                        let lost =
                            shared
                                .claims
                                .insert(claimed.claim(), claimed_at, this.settings.lease);
                        running.spawn(this.clone().compensate(claimed, lost, shared.clone()));
                    }
                    full
                }
                Err(error) => {
                    tracing::warn!(%error, "could not claim compensations; retrying");
                    false
                }
            };
            if !this
                .keep_alive(&mut running, &shared, &mut heartbeat, stop.cancelled())
                .await
            {
                break;
            }
            if !full {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(this.settings.poll_interval) => {}
                }
            }
        }
        let deadline = tokio::time::sleep(this.settings.shutdown_timeout);
        if !this
            .keep_alive(&mut running, &shared, &mut heartbeat, deadline)
            .await
        {
            tracing::warn!(
                running = running.len(),
                "shutdown deadline passed; interrupting compensations"
            );
            shared.interrupt.cancel();
            let never = std::future::pending::<()>();
            this.keep_alive(&mut running, &shared, &mut heartbeat, never)
                .await;
        }
    }

    /// Extends the claims of the running calls each heartbeat until every call ended
    /// (true) or `until` came first (false). A call's panic is the loop's.
    async fn keep_alive(
        &self,
        running: &mut JoinSet<()>,
        shared: &Calls,
        heartbeat: &mut Beat,
        until: impl Future,
    ) -> bool {
        tokio::pin!(until);
        loop {
            tokio::select! {
                biased;
                joined = running.join_next() => match joined {
                    None => return true,
                    Some(Err(error)) => {
                        if let Ok(panic) = error.try_into_panic() {
                            std::panic::resume_unwind(panic);
                        }
                    }
                    Some(Ok(())) => {}
                },
                _ = &mut until => return false,
                _ = heartbeat.next() => self.extend(&shared.claims).await,
            }
        }
    }

    /// One heartbeat: extends the claims held, and cancels the calls whose claims were lost.
    async fn extend(&self, claims: &InFlight) {
        let held = claims.snapshot();
        if held.is_empty() {
            return;
        }
        match self
            .store
            .extend_compensations(&held, self.settings.lease)
            .await
        {
            Ok(extended) => {
                let lost: Vec<Lease> = held.into_iter().filter(|c| !extended.contains(c)).collect();
                let count = claims.lose(&lost);
                if count > 0 {
                    self.metrics
                        .fenced_writes
                        .with_label_values(&["heartbeat"])
                        .inc_by(count as u64);
                    tracing::warn!(
                        count,
                        "compensation claims were lost (an operator acted, or they lapsed); \
                         their calls are cancelled"
                    );
                }
            }
            Err(error) => {
                self.metrics.count_database_error(DbOp::Heartbeat);
                tracing::warn!(%error, "could not extend compensation claims");
            }
        }
    }

    /// Runs one compensation and writes its result; stops the call when its claim is
    /// lost (`lost` fires) or at the shutdown deadline (then gives the claim back).
    async fn compensate(
        self: Arc<Self>,
        claimed: Compensating,
        lost: CancellationToken,
        shared: Arc<Calls>,
    ) {
        let task = &claimed.task;
        let claim = claimed.claim();
        let registered = self.served.registered_for(task);
        let attempt = u32::try_from(claimed.attempt).unwrap_or(u32::MAX);
        let ctx = HandlerContext::new(&*self.worker_id, attempt, lost.clone());
        let started_at = Utc::now();
        let clock = Instant::now();
        let call = guarded(
            registered.policy.timeout,
            registered.handler.compensate(&ctx, task),
        );
        // The call first: a handler that heeds its token may still answer.
        let verdict = tokio::select! {
            biased;
            guarded = call => guarded.verdict,
            _ = lost.cancelled() => {
                tracing::warn!(task_id = task.id.0, handler = %task.handler,
                    "compensation stopped: its claim was lost");
                return;
            }
            _ = shared.interrupt.cancelled() => {
                self.release(claim, started_at, clock.elapsed()).await;
                shared.claims.remove([claim]);
                return;
            }
        };
        shared.claims.remove([claim]);
        let duration = clock.elapsed();
        let max_attempts = registered.policy.max_attempts;
        let (outcome, error) = classify(verdict, attempt, max_attempts, &registered.policy);
        let outcome = match outcome {
            FinishOutcome::Resolved => CompensationOutcome::Compensated,
            FinishOutcome::Retry { at } => CompensationOutcome::Retry { at },
            FinishOutcome::PermanentFailure | FinishOutcome::NotCalled => {
                CompensationOutcome::Failed
            }
        };
        let result = CompensationResult {
            task_id: task.id,
            version: claimed.version,
            outcome,
            started_at,
            duration,
            error,
        };
        let written = match self
            .store
            .finish_compensation(&self.worker_id, &result)
            .await
        {
            Ok(written) => written,
            Err(error) => {
                tracing::warn!(task_id = task.id.0, %error,
                    "could not write a compensation's result; it runs again after its claim lapses");
                return;
            }
        };
        if !written {
            tracing::info!(task_id = task.id.0, handler = %task.handler,
                "compensation result dropped: claimed again or cancelled meanwhile");
            return;
        }
        self.metrics
            .compensations
            .with_label_values(&[&task.handler, outcome.label()])
            .inc();
        let error = result.error.as_deref();
        match outcome {
            CompensationOutcome::Compensated => tracing::info!(task_id = task.id.0,
                handler = %task.handler, attempt, outcome = outcome.label(), "task compensated"),
            CompensationOutcome::Retry { at } => tracing::info!(task_id = task.id.0,
                handler = %task.handler, attempt, outcome = outcome.label(),
                next_attempt_at = %at.to_rfc3339(), error, "compensation failed; retry scheduled"),
            CompensationOutcome::Failed => tracing::warn!(task_id = task.id.0,
                handler = %task.handler, attempt, outcome = outcome.label(), error,
                "compensation failed for good"),
        }
    }

    /// Gives back the claim of a call interrupted at shutdown; should that fail, the
    /// claim lapses after its lease.
    async fn release(&self, claim: Lease, started_at: chrono::DateTime<Utc>, took: Duration) {
        match self
            .store
            .release_compensation(&self.worker_id, claim, started_at, took)
            .await
        {
            Ok(released) => tracing::info!(
                task_id = claim.id.0,
                released,
                "compensation interrupted at shutdown; its claim was given back"
            ),
            Err(error) => tracing::warn!(task_id = claim.id.0, %error,
                "could not give back an interrupted compensation's claim; it lapses after its lease"),
        }
    }
}
