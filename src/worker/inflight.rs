//! The leases this process holds, and the heartbeat that keeps them alive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::store::Store;
use crate::task::{Lease, TaskId};
use crate::telemetry::Metrics;

/// Leases held by this process, each with the token that tells its handler it was lost.
#[derive(Default)]
pub(crate) struct InFlight {
    leases: Mutex<HashMap<TaskId, (i64, CancellationToken)>>,
}

impl InFlight {
    /// Records a new lease; returns the token cancelled if the lease is lost.
    pub(crate) fn insert(&self, lease: Lease) -> CancellationToken {
        let token = CancellationToken::new();
        let mut leases = self.leases.lock().expect("in-flight lock");
        leases.insert(lease.id, (lease.version, token.clone()));
        token
    }

    /// Forgets leases whose results were written (or given up on).
    pub(crate) fn remove(&self, ids: impl IntoIterator<Item = TaskId>) {
        let mut leases = self.leases.lock().expect("in-flight lock");
        for id in ids {
            leases.remove(&id);
        }
    }

    /// Every lease held now.
    pub(crate) fn snapshot(&self) -> Vec<Lease> {
        let leases = self.leases.lock().expect("in-flight lock");
        leases
            .iter()
            .map(|(&id, &(version, _))| Lease { id, version })
            .collect()
    }

    /// Removes and returns every lease (at shutdown, to release them).
    pub(crate) fn drain(&self) -> Vec<Lease> {
        let mut leases = self.leases.lock().expect("in-flight lock");
        leases
            .drain()
            .map(|(id, (version, _))| Lease { id, version })
            .collect()
    }

    /// Marks leases as lost: their handlers are told to stop, their results are dropped.
    fn lose(&self, lost: &[Lease]) -> usize {
        let mut leases = self.leases.lock().expect("in-flight lock");
        let mut count = 0;
        for lease in lost {
            if leases
                .get(&lease.id)
                .is_some_and(|(v, _)| *v == lease.version)
            {
                let (_, token) = leases.remove(&lease.id).expect("present");
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
                let extended: std::collections::HashSet<TaskId> = extended.into_iter().collect();
                let lost: Vec<Lease> = held
                    .into_iter()
                    .filter(|l| !extended.contains(&l.id))
                    .collect();
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
                tracing::warn!(%error, "heartbeat failed; leases may lapse");
            }
        }
    }
}
