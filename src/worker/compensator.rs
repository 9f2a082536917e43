//! Compensations: a member's loop that claims the compensations owed by tasks of its
//! compensating handlers, runs [`crate::Handler::compensate`] under the handler's
//! timeout, and writes each result under its claim. Compensations are rare: one small
//! batch per poll interval, run concurrently.

use chrono::Utc;
use futures::future::join_all;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::served::Served;
use crate::handlers::invoke::{classify, guarded};
use crate::handlers::HandlerContext;
use crate::store::{Compensating, CompensationOutcome, CompensationResult, FinishOutcome, Store};
use crate::telemetry::Metrics;

/// Compensations claimed at once.
const BATCH: i64 = 16;

/// Claims and runs compensations until `stop` fires (the batch running then finishes).
pub(crate) struct Compensator {
    pub(crate) store: Store,
    pub(crate) worker_id: Arc<str>,
    pub(crate) served: Arc<Served>,
    pub(crate) metrics: Metrics,
    /// How long a claim holds a compensation: a member that dies leaves it this long.
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
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
        while !stop.is_cancelled() {
            let claimed = self
                .store
                .claim_compensations(&handlers, BATCH, self.lease)
                .await;
            let full = match claimed {
                Ok(claimed) => {
                    let full = claimed.len() as i64 == BATCH;
                    join_all(claimed.into_iter().map(|c| self.compensate(c))).await;
                    full
                }
                Err(error) => {
                    tracing::warn!(%error, "could not claim compensations; retrying");
                    false
                }
            };
            if !full {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(self.poll_interval) => {}
                }
            }
        }
    }

    /// Runs one compensation and writes its result.
    async fn compensate(&self, claimed: Compensating) {
        let task = &claimed.task;
        let registered = self.served.registered_for(task);
        let attempt = u32::try_from(claimed.attempt).unwrap_or(u32::MAX);
        let ctx = HandlerContext::new(&*self.worker_id, attempt, CancellationToken::new());
        let started_at = Utc::now();
        let clock = Instant::now();
        let verdict = guarded(
            registered.policy.timeout,
            registered.handler.compensate(&ctx, task),
        )
        .await;
        let duration = clock.elapsed();
        let max_attempts = registered.policy.max_attempts;
        let (outcome, error) = classify(verdict, attempt, max_attempts, &registered.policy);
        let outcome = match outcome {
            FinishOutcome::Resolved => CompensationOutcome::Compensated,
            FinishOutcome::Retry { at } => CompensationOutcome::Retry { at },
            FinishOutcome::PermanentFailure => CompensationOutcome::Failed,
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
}
