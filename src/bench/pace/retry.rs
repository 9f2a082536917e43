//! The paced retry of `redrive bench redrive-pace`: the fleet's workers call a handler
//! that fails. Its failed calls wait an hour before their next attempt, so every call
//! counted is one the job let through, not a retry of the handler's own.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::{pause_then_resume, seed, Downstream, Measured, PaceBenchOptions};
use crate::backoff::{Backoff, Jitter};
use crate::bench::{drop_schema, fresh_store};
use crate::config::Settings;
use crate::fleet::Fleet;
use crate::handlers::{Handler, HandlerContext, HandlerError};
use crate::operations::{ActRequest, Actor, FilterParams, Runner, Verb};
use crate::replay::Replayer;
use crate::task::Task;

/// A handler calling the downstream.
struct Calls(Arc<Downstream>);

#[async_trait]
impl Handler for Calls {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        match self.0.call() {
            true => Err(HandlerError::transient("HTTP 503 from the downstream")),
            false => Ok(()),
        }
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(5)
    }

    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff {
            base: Duration::from_secs(3600),
            factor: 2.0,
            cap: Duration::from_secs(3600),
            jitter: Jitter::None,
        })
    }
}

/// A paced retry of the options' tasks into a downstream failing from the start, or
/// after `fail_after` calls.
pub(super) async fn scenario(
    settings: &Settings,
    options: &PaceBenchOptions,
    fail_after: Option<u64>,
) -> anyhow::Result<Result<Measured, String>> {
    let store = fresh_store(settings).await?;
    seed(&store, options.tasks, "downstream", "orders").await?;
    let downstream = Downstream::new(fail_after);
    let fleet = Fleet::builder(settings.clone())
        .handler("downstream", Calls(downstream.clone()))
        .build()?;
    let stop_workers = CancellationToken::new();
    let pool = fleet.worker_pool(store.clone());
    let workers = tokio::spawn({
        let stop = stop_workers.clone();
        async move { pool.run(stop).await }
    });
    let request = ActRequest {
        filter: Some(FilterParams {
            handler: Some("downstream".into()),
            ..FilterParams::default()
        }),
        reason: Some("bench".into()),
        pace: Some(options.pace()),
        ..ActRequest::default()
    };
    let operations = fleet.operations(store.clone());
    let answer = (operations.act_by(
        &Actor::shell(),
        Verb::Retry,
        &request,
        Runner::Here("bench"),
        |_| {},
    ))
    .await?;
    let job = answer
        .job
        .ok_or_else(|| anyhow::anyhow!("no job recorded"))?;
    let replayer = Replayer::new(
        store.clone(),
        settings.kafka.clone(),
        settings.ingest.max_message_bytes,
        "bench".into(),
        Vec::new(),
    );
    // Every task resolved but those that failed (they wait an hour).
    let tasks = i64::try_from(options.tasks)?;
    let resolved = |failing_calls: u64| {
        let store = store.clone();
        async move {
            let resolved: i64 =
                sqlx::query_scalar("SELECT count(*) FROM recovery_task WHERE status = 'resolved'")
                    .fetch_one(store.pool())
                    .await?;
            Ok(resolved >= tasks - i64::try_from(failing_calls)?)
        }
    };
    let measured = pause_then_resume(&operations, &replayer, job, &downstream, resolved).await;
    stop_workers.cancel();
    workers.await??;
    drop_schema(&store).await?;
    measured
}
