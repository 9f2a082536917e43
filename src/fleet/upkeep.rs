//! What every fleet member does besides ingest and work: record itself as live, delete
//! expired final tasks, and run detached replay jobs. Each loop outlives database
//! outages: an error is logged once per change and the loop tries again later.

use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::config::{KafkaSettings, RetentionSettings, RouteSettings};
use crate::replay::Replayer;
use crate::store::{Backfill, Member, Store, MEMBER_BEAT, RETENTION_BATCH};
use crate::task::Status;
use crate::telemetry::{DbOp, Metrics};

/// How often a member looks for a detached replay job to run.
const REPLAY_LOOK_EVERY: Duration = Duration::from_secs(2);

/// Counts each failure of a loop's statements, and logs it when the loop starts failing
/// or fails differently, and its recovery.
struct Trouble {
    metrics: Metrics,
    op: DbOp,
    last: Option<String>,
}

impl Trouble {
    /// The trouble of a loop whose statements count as `op`.
    fn new(metrics: &Metrics, op: DbOp) -> Self {
        Trouble {
            metrics: metrics.clone(),
            op,
            last: None,
        }
    }

    fn failed(&mut self, what: &str, error: &dyn std::fmt::Display) {
        self.metrics.count_database_error(self.op);
        let text = error.to_string();
        if self.last.as_ref() != Some(&text) {
            tracing::warn!(error = %text, "{what} failed; trying again later");
            self.last = Some(text);
        }
    }

    fn ok(&mut self, what: &str) {
        if self.last.take().is_some() {
            tracing::info!("{what} works again");
        }
    }
}

/// Sleeps `period` unless `shutdown` fires first; false when it fired.
async fn pause(period: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(period) => true,
    }
}

/// Records `member` every [`MEMBER_BEAT`] until shutdown, then removes it.
pub async fn keep_member_recorded(
    store: Store,
    member: Member,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let mut trouble = Trouble::new(&metrics, DbOp::Upkeep);
    loop {
        match store.record_member(&member).await {
            Ok(()) => trouble.ok("recording this member"),
            Err(error) => trouble.failed("recording this member", &error),
        }
        if !pause(MEMBER_BEAT, &shutdown).await {
            break;
        }
    }
    if let Err(error) = store.forget_member(&member.id).await {
        tracing::debug!(%error, "could not remove this member's row; it expires by itself");
    }
}

/// Gives the tasks stored before causes were (or by a member of an earlier release) their
/// cause, a batch at a time beside the drain, until every one has one; then looks again
/// each minute (a member that starts later may extend the work).
pub async fn backfill_causes(store: Store, metrics: Metrics, shutdown: CancellationToken) {
    let mut trouble = Trouble::new(&metrics, DbOp::Upkeep);
    let mut extended = false;
    loop {
        if !extended {
            extended = store.extend_cause_backfill().await.is_ok();
        }
        let wait = match store.backfill_causes().await {
            Ok(Backfill::Progressed { set }) => {
                trouble.ok("setting the causes of earlier tasks");
                tracing::debug!(set, "set the causes of earlier tasks");
                Duration::from_millis(50)
            }
            Ok(Backfill::Busy) => Duration::from_secs(5),
            Ok(Backfill::Done) => Duration::from_secs(60),
            Err(error) => {
                trouble.failed("setting the causes of earlier tasks", &error);
                Duration::from_secs(5)
            }
        };
        if !pause(wait, &shutdown).await {
            return;
        }
    }
}

/// Deletes expired final tasks every `retention.interval` until shutdown.
pub async fn apply_retention(
    store: Store,
    retention: RetentionSettings,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let ages = [
        (Status::Resolved, retention.resolved),
        (Status::Discarded, retention.discarded),
        (Status::PermanentFailure, retention.permanent_failure),
    ];
    let mut trouble = Trouble::new(&metrics, DbOp::Upkeep);
    loop {
        'statuses: for (status, age) in ages {
            let Some(age) = age else { continue };
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                match store.delete_expired(status, age).await {
                    Ok(deleted) => {
                        trouble.ok("retention");
                        metrics
                            .retention_deleted
                            .with_label_values(&[status.as_str()])
                            .inc_by(deleted.max(0) as u64);
                        if deleted < RETENTION_BATCH {
                            break;
                        }
                    }
                    Err(error) => {
                        trouble.failed("retention", &error);
                        break 'statuses;
                    }
                }
            }
        }
        if !pause(retention.interval, &shutdown).await {
            return;
        }
    }
}

/// Runs detached replay jobs, one at a time, until shutdown, refusing those that would
/// produce to a topic one of `routes` captures.
pub async fn run_detached_replays(
    store: Store,
    kafka: KafkaSettings,
    max_message_bytes: u32,
    runner: String,
    routes: Vec<RouteSettings>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let replayer = Replayer::new(store.clone(), kafka, max_message_bytes, runner, routes)
        .with_metrics(metrics.clone());
    let mut trouble = Trouble::new(&metrics, DbOp::Upkeep);
    loop {
        match store.claim_detached_replay(replayer.runner()).await {
            Ok(Some(job)) => {
                trouble.ok("looking for replay jobs");
                let id = job.id;
                tracing::info!(job = id, "running a replay job");
                let run = replayer.run(job, &|_, _| {}, &shutdown);
                match AssertUnwindSafe(run).catch_unwind().await {
                    Ok(Ok(job)) => tracing::info!(
                        job = id,
                        status = %job.status,
                        produced = job.produced,
                        "replay job stopped"
                    ),
                    Ok(Err(error)) => tracing::warn!(job = id, %error, "replay job failed"),
                    Err(panic) => {
                        // A bug in one job fails that job, not the member.
                        let error = format!(
                            "the replay job panicked: {}",
                            crate::parts::panic_message(panic.as_ref())
                        );
                        tracing::error!(job = id, %error, "replay job failed");
                        if let Err(error) = store
                            .finish_replay(id, replayer.runner(), Some(&error))
                            .await
                        {
                            tracing::warn!(job = id, %error, "could not mark the replay job failed");
                        }
                    }
                }
                if shutdown.is_cancelled() {
                    // The job was given back for another member; do not take it again.
                    return;
                }
                continue;
            }
            Ok(None) => trouble.ok("looking for replay jobs"),
            Err(error) => trouble.failed("looking for replay jobs", &error),
        }
        if !pause(REPLAY_LOOK_EVERY, &shutdown).await {
            return;
        }
    }
}

/// Keeps the fleet-wide gauges (tasks by status and handler, due work, live members)
/// current until shutdown.
pub async fn sample_fleet_figures(store: Store, metrics: Metrics, shutdown: CancellationToken) {
    let mut trouble = Trouble::new(&metrics, DbOp::Sample);
    let mut shown = std::collections::HashSet::new();
    let mut shown_causes = std::collections::HashSet::new();
    loop {
        match store.sample_figures(crate::store::SAMPLE_EVERY).await {
            Ok(figures) => {
                trouble.ok("sampling the fleet's figures");
                show(&metrics, &figures, &mut shown, &mut shown_causes);
            }
            Err(error) => trouble.failed("sampling the fleet's figures", &error),
        }
        if !pause(crate::store::SAMPLE_EVERY, &shutdown).await {
            return;
        }
    }
}

/// Sets the gauges to `figures`; series shown before and absent now go to zero.
fn show(
    metrics: &Metrics,
    figures: &crate::store::FleetFigures,
    shown: &mut std::collections::HashSet<(String, String)>,
    shown_causes: &mut std::collections::HashSet<(String, String)>,
) {
    let mut now = std::collections::HashSet::new();
    for (status, handler, count) in &figures.tasks {
        metrics
            .tasks
            .with_label_values(&[status, handler])
            .set(*count);
        now.insert((status.clone(), handler.clone()));
    }
    for (handler, due, age) in &figures.due {
        metrics.tasks_due.with_label_values(&[handler]).set(*due);
        metrics
            .oldest_due_seconds
            .with_label_values(&[handler])
            .set(*age);
        now.insert(("due".into(), handler.clone()));
    }
    for (kind, handler) in shown.difference(&now) {
        if kind == "due" {
            metrics.tasks_due.with_label_values(&[handler]).set(0);
            metrics
                .oldest_due_seconds
                .with_label_values(&[handler])
                .set(0.0);
        } else {
            metrics.tasks.with_label_values(&[kind, handler]).set(0);
        }
    }
    *shown = now;
    metrics.members_live.set(figures.members_live);
    show_causes(metrics, figures, shown_causes);
}

/// Sets the cause gauges to `figures`; a cause no longer among the biggest loses its
/// series, so that their number stays bounded however many causes come and go.
fn show_causes(
    metrics: &Metrics,
    figures: &crate::store::FleetFigures,
    shown: &mut std::collections::HashSet<(String, String)>,
) {
    let mut now = std::collections::HashSet::new();
    for (cause, class, tasks, first_seen) in &figures.causes {
        let labels = [cause.to_string(), class.clone()];
        let labels_ref = [labels[0].as_str(), labels[1].as_str()];
        metrics
            .cause_tasks
            .with_label_values(&labels_ref)
            .set(*tasks);
        (metrics.cause_first_seen.with_label_values(&labels_ref)).set(*first_seen);
        now.insert((labels[0].clone(), labels[1].clone()));
    }
    for (cause, class) in shown.difference(&now) {
        let _ = metrics.cause_tasks.remove_label_values(&[cause, class]);
        let _ = metrics
            .cause_first_seen
            .remove_label_values(&[cause, class]);
    }
    *shown = now;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the upkeep loops' database errors were documented under
    /// `redrive_worker_database_errors_total{operation="upkeep"}` but logged only, never
    /// counted. Each failure counts, though only a new error is logged.
    #[test]
    fn every_failure_of_an_upkeep_loop_is_counted_by_its_operation() {
        let metrics = Metrics::new();
        let mut upkeep = Trouble::new(&metrics, DbOp::Upkeep);
        let mut sample = Trouble::new(&metrics, DbOp::Sample);
        upkeep.failed("retention", &"connection refused");
        upkeep.failed("retention", &"connection refused");
        upkeep.ok("retention");
        upkeep.failed("retention", &"connection refused");
        sample.failed("sampling", &"statement timeout");
        let text = metrics.render();
        for expected in [
            r#"redrive_worker_database_errors_total{operation="upkeep"} 3"#,
            r#"redrive_worker_database_errors_total{operation="sample"} 1"#,
            r#"redrive_worker_database_errors_total{operation="claim"} 0"#,
        ] {
            assert!(text.contains(expected), "{expected} missing from:\n{text}");
        }
    }
}
