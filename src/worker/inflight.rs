//! The leases this process holds, and the heartbeat that keeps them alive.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::store::Store;
use crate::task::Lease;
use crate::telemetry::Metrics;

/// Leases held by this process, each with the token that tells its handler it was lost
/// (the compensator keeps its claims, leases on compensations, in one of its own).
///
/// Keyed by the whole lease, `(id, version)`: after a lapse the same process may hold a
/// newer lease on the same task while the old attempt is still running, and the old
/// attempt's bookkeeping must never touch the new lease's entry.
#[derive(Default)]
pub(crate) struct InFlight {
    leases: Mutex<HashMap<Lease, CancellationToken>>,
}

impl InFlight {
    /// Records a new lease; returns the token cancelled if the lease is lost.
    pub(crate) fn insert(&self, lease: Lease) -> CancellationToken {
        let token = CancellationToken::new();
        let mut leases = self.leases.lock().expect("in-flight lock");
        leases.insert(lease, token.clone());
        token
    }

    /// Forgets leases whose results were written (or given up on).
    pub(crate) fn remove(&self, done: impl IntoIterator<Item = Lease>) {
        let mut leases = self.leases.lock().expect("in-flight lock");
        for lease in done {
            leases.remove(&lease);
        }
    }

    /// Every lease held now.
    pub(crate) fn snapshot(&self) -> Vec<Lease> {
        let leases = self.leases.lock().expect("in-flight lock");
        leases.keys().copied().collect()
    }

    /// Removes and returns every lease (at shutdown, to release them).
    pub(crate) fn drain(&self) -> Vec<Lease> {
        let mut leases = self.leases.lock().expect("in-flight lock");
        leases.drain().map(|(lease, _)| lease).collect()
    }

    /// Marks leases as lost: their handlers are told to stop, their results are dropped.
    pub(super) fn lose(&self, lost: &[Lease]) -> usize {
        let mut leases = self.leases.lock().expect("in-flight lock");
        let mut count = 0;
        for lease in lost {
            if let Some(token) = leases.remove(lease) {
                token.cancel();
                count += 1;
            }
        }
        count
    }
}

/// Extends every held lease each `interval` until `stop` fires.
pub(crate) async fn heartbeat_loop(
    store: Store,
    in_flight: Arc<InFlight>,
    metrics: Metrics,
    interval: Duration,
    lease: Duration,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let held = in_flight.snapshot();
        if held.is_empty() {
            continue;
        }
        match store.heartbeat(&held, lease).await {
            Ok(extended) => {
                metrics.health.database_ok();
                let extended: HashSet<Lease> = extended.into_iter().collect();
                let lost: Vec<Lease> = held.into_iter().filter(|l| !extended.contains(l)).collect();
                let count = in_flight.lose(&lost);
                if count > 0 {
                    metrics
                        .fenced_writes
                        .with_label_values(&["heartbeat"])
                        .inc_by(count as u64);
                    tracing::warn!(
                        count,
                        "leases were taken over; their handlers are cancelled"
                    );
                }
            }
            Err(error) => {
                metrics
                    .database_errors
                    .with_label_values(&["heartbeat"])
                    .inc();
                metrics.health.database_failed("heartbeat", &error);
            }
        }
    }
}
