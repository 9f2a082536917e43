//! The leases this process holds, and the heartbeat that keeps them alive.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::store::Store;
use crate::task::Lease;
use crate::telemetry::{DatabaseFailed, DbOp, Metrics};

/// Leases held by this process, each with the token that tells its handler it was lost
/// (the compensator keeps its claims, leases on compensations, in one of its own).
///
/// Keyed by the whole lease, `(id, version)`: after a lapse the same process may hold a
/// newer lease on the same task while the old attempt is still running, and the old
/// attempt's bookkeeping must never touch the new lease's entry.
///
/// Each lease also has a local deadline: when it was claimed or last extended (the
/// instant the statement was sent, never later than the database's), plus the lease.
/// A member cut off from PostgreSQL cannot extend its leases; once a deadline passes,
/// another member may take the task, so the call is cancelled here too.
#[derive(Default)]
pub(crate) struct InFlight {
    leases: Mutex<HashMap<Lease, Held>>,
}

struct Held {
    lost: CancellationToken,
    deadline: Instant,
    /// Its result went to be written: a heartbeat that no longer finds the lease may have
    /// met that write, so only the write's answer says whether it was taken over.
    finishing: bool,
}

impl InFlight {
    /// Records a lease claimed by a statement sent at `claimed_at`; returns the token
    /// cancelled if the lease is lost.
    pub(crate) fn insert(
        &self,
        lease: Lease,
        claimed_at: Instant,
        length: Duration,
    ) -> CancellationToken {
        let lost = CancellationToken::new();
        let held = Held {
            lost: lost.clone(),
            deadline: claimed_at + length,
            finishing: false,
        };
        self.leases
            .lock()
            .expect("in-flight lock")
            .insert(lease, held);
        lost
    }

    /// Moves the deadlines of `extended` leases to `sent_at + length`.
    fn extended(&self, extended: &HashSet<Lease>, sent_at: Instant, length: Duration) {
        let mut leases = self.leases.lock().expect("in-flight lock");
        for (lease, held) in leases.iter_mut() {
            if extended.contains(lease) {
                held.deadline = sent_at + length;
            }
        }
    }

    /// Cancels the leases whose local deadline passes before `by`: they may be taken
    /// over by then. Leaves alone those whose results went to be written (their write
    /// tells). Returns how many.
    fn lose_lapsing(&self, by: Instant) -> usize {
        let mut leases = self.leases.lock().expect("in-flight lock");
        let lapsing: Vec<Lease> = (leases.iter())
            .filter(|(_, held)| held.deadline <= by && !held.finishing)
            .map(|(lease, _)| *lease)
            .collect();
        for lease in &lapsing {
            if let Some(held) = leases.remove(lease) {
                held.lost.cancel();
            }
        }
        lapsing.len()
    }

    /// Marks a lease whose result goes to be written, if it is still held: from then on
    /// [`InFlight::lose`] leaves it to the write, which counts a takeover itself.
    /// Answers false when it was lost meanwhile (the result is to be dropped).
    pub(crate) fn finishing(&self, lease: Lease) -> bool {
        let mut leases = self.leases.lock().expect("in-flight lock");
        match leases.get_mut(&lease) {
            Some(held) => {
                held.finishing = true;
                true
            }
            None => false,
        }
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
    /// Leaves alone those whose results are being written (their write tells); returns
    /// how many it marked.
    pub(super) fn lose(&self, lost: &[Lease]) -> usize {
        let mut leases = self.leases.lock().expect("in-flight lock");
        let mut count = 0;
        for lease in lost {
            if let Entry::Occupied(held) = leases.entry(*lease) {
                if !held.get().finishing {
                    held.remove().lost.cancel();
                    count += 1;
                }
            }
        }
        count
    }
}

/// When held leases (or compensation claims) are checked: every heartbeat interval, and
/// at once when an operator fenced some, so a call whose lease the operator took stops
/// within a round trip rather than at the next heartbeat.
pub(crate) struct Beat {
    ticker: Interval,
    fenced: watch::Receiver<()>,
}

impl Beat {
    /// Beats each `interval` from now, and when `fenced` changes.
    pub(crate) fn new(interval: Duration, fenced: watch::Receiver<()>) -> Beat {
        let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Beat { ticker, fenced }
    }

    /// Waits for the next beat.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.ticker.tick() => {}
            // A closed channel (the listener stopped) leaves the ticker.
            Ok(()) = self.fenced.changed() => {}
        }
    }
}

/// Extends every held lease at each `beat` until `stop` fires.
pub(crate) async fn heartbeat_loop(
    store: Store,
    in_flight: Arc<InFlight>,
    metrics: Metrics,
    mut beat: Beat,
    lease: Duration,
    stop: CancellationToken,
) {
    let interval = beat.ticker.period();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = beat.next() => {}
        }
        let held = in_flight.snapshot();
        if !held.is_empty() {
            // A statement stuck on a dead connection must not keep the deadlines below
            // from being checked.
            let renewing = renew(&store, &in_flight, &metrics, held, lease);
            if tokio::time::timeout(interval, renewing).await.is_err() {
                metrics.count_database_error(DbOp::Heartbeat);
            }
        }
        // What would lapse before the next beat could renew it is given up now: cut
        // off from the database, this member cannot know whether another took it over.
        let lapsing = in_flight.lose_lapsing(Instant::now() + interval);
        if lapsing > 0 {
            metrics.leases_lapsed_locally.inc_by(lapsing as u64);
            tracing::warn!(
                count = lapsing,
                "leases could not be renewed before their deadline; their handlers are cancelled"
            );
        }
    }
}

/// Extends `held`; cancels the leases that were taken over.
async fn renew(
    store: &Store,
    in_flight: &InFlight,
    metrics: &Metrics,
    held: Vec<Lease>,
    lease: Duration,
) {
    let sent_at = Instant::now();
    match store.heartbeat(&held, lease).await {
        Ok(extended) => {
            metrics.health.database_ok();
            let extended: HashSet<Lease> = extended.into_iter().collect();
            in_flight.extended(&extended, sent_at, lease);
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
            DatabaseFailed {
                op: DbOp::Heartbeat,
                error: &error,
            }
            .emit(metrics);
        }
    }
}

/// Says that the calls of these fenced leases stopped, so their tasks (and keys) may run
/// again at once. A few tries a moment apart: a pool busy for an instant must not hold
/// the tasks back for a whole lease. Leases lost for other reasons cost nothing.
pub(crate) async fn say_calls_stopped(store: &Store, leases: &[Lease]) {
    let mut pause = Duration::from_millis(100);
    for tries_left in (0..5).rev() {
        match store.calls_stopped(leases).await {
            Ok(()) => return,
            Err(error) if tries_left == 0 => {
                tracing::warn!(%error, leases = leases.len(),
                    "could not say fenced calls stopped; their tasks wait for their old leases' deadlines");
            }
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
    }
}
