//! The claim loop: take due tasks in batches as slots free up, start their attempts.

use std::sync::Arc;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::admission::{Admission, Permits, BLOCKED_RECHECK};
use super::attempt;
use super::due_floor::DueFloors;
use super::finisher::{AttemptContext, Completion};
use super::inflight::{say_calls_stopped, InFlight};
use super::served::Served;
use crate::backoff::Pause;
use crate::config::WorkerSettings;
use crate::store::{Claimed, Store};
use crate::task::{Status, Task};
use crate::telemetry::{DatabaseFailed, DbOp, Metrics};

/// What one claim round took, and the statement that failed, if one did.
struct ClaimRound {
    /// When the round's first statement was sent: no lease of it began earlier.
    started: tokio::time::Instant,
    claimed: Vec<(Task, Permits)>,
    /// How many of the claimed tasks were taken over from lapsed leases.
    recovered: usize,
    failure: Option<crate::store::StoreError>,
}

/// State shared by the claim loops of one pool.
pub(crate) struct Claimer {
    pub(crate) store: Store,
    pub(crate) worker_id: Arc<str>,
    pub(crate) served: Arc<Served>,
    /// Breakers, bulkheads and rate limits of the served handlers.
    pub(crate) admission: Arc<Admission>,
    /// Batch size, lease and poll interval.
    pub(crate) settings: WorkerSettings,
    pub(crate) metrics: Metrics,
    /// Keep the task of a permanent failure for the final sinks.
    pub(crate) keep_final_tasks: bool,
    /// One permit per task between claim and written result: the pool's concurrency.
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) completions: mpsc::UnboundedSender<Completion>,
    /// Running attempts, waited for at shutdown.
    pub(crate) attempts: TaskTracker,
    /// Fired when the shutdown deadline passes: running attempts are dropped.
    pub(crate) interrupt: CancellationToken,
    /// Where each claim lane's walk of the due index starts.
    pub(crate) floors: DueFloors,
}

impl Claimer {
    /// Claims and starts attempts until `shutdown` fires.
    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let settings = &self.settings;
        let batch_size = settings.batch_size as usize;
        let mut pause = Pause::database();
        loop {
            let wanted = self.slots.available_permits().clamp(1, batch_size);
            let mut permit = tokio::select! {
                _ = shutdown.cancelled() => return,
                permit = self.slots.clone().acquire_many_owned(wanted as u32) => {
                    permit.expect("the semaphore is never closed")
                }
            };
            let round = self.claim(wanted as u32).await;
            // Every task claimed is started, whatever failed later in the round: its
            // lease and attempt are already committed.
            let tasks = round.claimed;
            self.metrics.leases_recovered.inc_by(round.recovered as u64);
            let wait = match round.failure {
                None => {
                    pause.reset();
                    self.metrics.health.database_ok();
                    None
                }
                Some(error) => {
                    DatabaseFailed {
                        op: DbOp::Claim,
                        error: &error,
                    }
                    .emit(&self.metrics);
                    Some(pause.next_pause())
                }
            };
            let drained = tasks.len() < wanted;
            let took_none = tasks.is_empty();
            self.metrics.claimed.inc_by(tasks.len() as u64);
            self.metrics.in_flight.add(tasks.len() as i64);
            for (task, permits) in tasks {
                let slot = permit.split(1).expect("one permit per claimed task");
                self.start(task, slot, permits, round.started);
            }
            drop(permit);
            if let Some(wait) = wait {
                // A statement failed: wait before the next round.
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
            if !drained {
                // More is probably due: let the other claim loop in too.
                self.wake.notify_one();
            } else if self.idle(&shutdown, took_none).await {
                return;
            }
        }
    }

    /// Claims up to `wanted` due tasks: of the handlers without limits in one
    /// statement, then of each limited handler within its grant, then probes of
    /// half-open breakers. A statement that fails ends the round, and the round keeps
    /// what the statements before it claimed.
    async fn claim(&self, wanted: u32) -> ClaimRound {
        let mut round = ClaimRound {
            started: tokio::time::Instant::now(),
            claimed: Vec::new(),
            recovered: 0,
            failure: None,
        };
        if let Err(error) = self.claim_into(wanted, &mut round).await {
            round.failure = Some(error);
        }
        round
    }

    async fn claim_into(&self, wanted: u32, round: &mut ClaimRound) -> crate::store::Result<()> {
        let (lease, owner) = (self.settings.lease, &*self.worker_id);
        let plan = self.admission.plan(self.served.names());
        if !plan.shared.is_empty() {
            let tasks = self.claim_lane(&plan.shared, wanted).await?;
            round.recovered += tasks.recovered;
            (round.claimed).extend(tasks.tasks.into_iter().map(|t| (t, Permits::default())));
        }
        for handler in &plan.limited {
            let room = wanted.saturating_sub(round.claimed.len() as u32);
            let Some(mut grant) = self.admission.grant(handler, room) else {
                continue;
            };
            let lane = std::slice::from_ref(handler);
            let tasks = self.claim_lane(lane, grant.count).await?;
            round.recovered += tasks.recovered;
            let limiter = self.admission.limiter(handler);
            (round.claimed).extend(
                tasks
                    .tasks
                    .into_iter()
                    .map(|t| (t, grant.take_one(limiter.clone()))),
            );
        }
        for (handler, settings) in &plan.probing {
            let room = wanted.saturating_sub(round.claimed.len() as u32);
            if room == 0 {
                break;
            }
            let probes = self
                .store
                .claim_probes(handler, settings, room, owner, lease)
                .await?;
            (round.claimed).extend(probes.into_iter().map(|t| (t, Permits::default())));
        }
        Ok(())
    }

    /// Claims up to `wanted` due tasks of the handlers of `lane`, walking the due index
    /// from the lane's floor.
    async fn claim_lane(&self, lane: &[String], wanted: u32) -> crate::store::Result<Claimed> {
        let (lease, owner) = (self.settings.lease, &*self.worker_id);
        let from = self.floors.start(lane);
        let claimed = (self.store)
            .claim_from(lane, wanted, owner, lease, from)
            .await?;
        self.floors.claimed(lane, from, claimed.first_due);
        Ok(claimed)
    }

    /// Starts one attempt; its result goes to the finisher with the slot.
    fn start(
        &self,
        task: Task,
        slot: tokio::sync::OwnedSemaphorePermit,
        mut permits: Permits,
        claimed_at: tokio::time::Instant,
    ) {
        let lease_lost = (self.in_flight).insert(task.lease(), claimed_at, self.settings.lease);
        let registered = self.served.registered_for(&task);
        let keep_task = self.keep_final_tasks;
        let worker_id = self.worker_id.clone();
        let completions = self.completions.clone();
        let metrics = self.metrics.clone();
        let interrupt = self.interrupt.clone();
        let span = tracing::info_span!(
            "attempt",
            task_id = task.id.0,
            handler = %task.handler,
            attempt = task.attempts,
            route = task.failure.route.as_deref(),
            correlation_id = task.failure.correlation_id.as_deref(),
        );
        let store = self.store.clone();
        let in_flight = self.in_flight.clone();
        let work = async move {
            permits.wait_for_turn().await;
            let (finish, verdict) =
                attempt::run_attempt(&store, &registered, &task, &worker_id, lease_lost).await;
            if !in_flight.finishing(task.lease()) {
                // Fenced or lapsed meanwhile: the write would be fenced out anyway. The
                // call has stopped: a task an operator acted on may run again at once.
                metrics.in_flight.dec();
                say_calls_stopped(&store, &[task.lease()]).await;
                return;
            }
            let handler: Arc<str> = task.handler.as_str().into();
            metrics
                .handler_seconds
                .with_label_values(&[&*handler])
                .observe(finish.duration.as_secs_f64());
            let context = AttemptContext {
                attempt: task.attempts,
                route: task.failure.route.clone(),
                correlation_id: task.failure.correlation_id.clone(),
            };
            let parked = finish.outcome.status() == Status::PermanentFailure && keep_task;
            let task = parked.then(|| Arc::new(task));
            // The finisher outlives every attempt; a send cannot fail.
            let _ = completions.send(Completion {
                finish,
                verdict,
                _bulkhead: permits.bulkhead,
                handler,
                context,
                task,
                _slot: slot,
            });
        };
        self.attempts.spawn(
            async move {
                tokio::select! {
                    _ = interrupt.cancelled() => {}
                    _ = work => {}
                }
            }
            .instrument(span),
        );
    }

    /// Waits for a notification, the next due task or the poll interval, whichever comes
    /// first. Returns true if shutdown was asked for meanwhile. After a claim that took
    /// nothing, a task due now is one another transaction holds (an operator's action,
    /// another member's claim): it is looked at again after [`BLOCKED_RECHECK`], not at
    /// once, which spun the loop for as long as the row stayed held.
    async fn idle(&self, shutdown: &CancellationToken, took_none: bool) -> bool {
        let plan = self.admission.plan(self.served.names());
        let mut poll = self.settings.poll_interval;
        if plan.blocked {
            // A bulkhead slot or rate ticket frees up without a notification.
            poll = poll.min(BLOCKED_RECHECK);
        }
        // A floor in force hides what is due before it until the next full walk.
        if let Some(full_walk) = self.floors.until_full_walk() {
            poll = poll.min(full_walk);
        }
        // Only the handlers claimed without limits are asked about: a limited or
        // breaker-held handler's tasks may be due now with no room for them, and
        // waking at once for those would spin; they are looked at every `poll`.
        let next_due = if plan.shared.is_empty() {
            Ok(None)
        } else {
            let from = self.floors.start(&plan.shared);
            self.store.next_due(&plan.shared, from).await
        };
        let wait = match next_due {
            Ok(Some(due_in)) if took_none => due_in.max(BLOCKED_RECHECK).min(poll),
            Ok(Some(due_in)) => due_in.min(poll),
            Ok(None) => poll,
            Err(error) => {
                DatabaseFailed {
                    op: DbOp::NextDue,
                    error: &error,
                }
                .emit(&self.metrics);
                poll
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = self.wake.notified() => false,
            _ = tokio::time::sleep(wait) => false,
        }
    }
}
