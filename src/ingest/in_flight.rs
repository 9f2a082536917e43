//! Which partitions' messages are in flushes still running, so that a rebalance gives a
//! partition up only once the batches holding its messages are stored and their offsets
//! committed: its next owner starts after them instead of running the same messages
//! beside them (a process-mode call twice at once, an older message applied after a
//! newer one).
//!
//! The rebalance callback runs inside the consumer's poll, on the consume loop's
//! thread, so it waits with a blocking wait (bounded by [`REVOKED_FLUSH_WAIT`]) while
//! the flushes, spawned tasks, run on the runtime's other threads.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::offsets::Offsets;

/// How long a rebalance waits for the flushes holding a revoked partition. Past it the
/// partition is given up uncommitted: its new owner gets its messages again (stored
/// ones are deduplicated; a process-mode call may then overlap, as before this wait).
pub(crate) const REVOKED_FLUSH_WAIT: Duration = Duration::from_secs(10);

/// A (topic, partition).
type Partition = (String, i32);

/// The flushes running per partition, and what finished ones stored.
#[derive(Default)]
pub(crate) struct FlushesInFlight {
    state: Mutex<State>,
    ended: Condvar,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    partitions: HashMap<Partition, Held>,
    /// Partitions given up since the consume loop last looked: the messages of theirs
    /// not yet flushed are its new owner's.
    given_up: Vec<Partition>,
}

/// One partition's flushes.
#[derive(Default)]
struct Held {
    /// The flushes holding its messages that have not ended.
    running: HashSet<u64>,
    /// The next offset after every message stored, when all that ended succeeded.
    stored: Option<i64>,
    /// A flush holding its messages failed: no offset of it may be committed here.
    failed: bool,
}

impl FlushesInFlight {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves the counts consistent (each update is a
        // single map operation), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes a flush of messages of these partitions starting; the guard notes its end.
    pub(crate) fn start(self: &Arc<Self>, partitions: impl Iterator<Item = Partition>) -> Flushing {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let partitions: Vec<Partition> = partitions.collect();
        let mut state = self.lock();
        for partition in &partitions {
            state
                .partitions
                .entry(partition.clone())
                .or_default()
                .running
                .insert(id);
        }
        Flushing {
            id,
            partitions,
            in_flight: self.clone(),
            ended: false,
        }
    }

    fn end(&self, id: u64, partitions: &[Partition], stored: Option<&Offsets>) {
        let mut state = self.lock();
        for partition in partitions {
            // A partition given up while this flush ran is no longer tracked here.
            let Some(held) = state.partitions.get_mut(partition) else {
                continue;
            };
            if !held.running.remove(&id) {
                continue;
            }
            match stored.and_then(|offsets| offsets.get(partition)) {
                Some(next) => held.stored = Some(held.stored.map_or(*next, |s| s.max(*next))),
                None => held.failed = true,
            }
        }
        drop(state);
        self.ended.notify_all();
    }

    /// Whether a flush holding one of `revoked` is running.
    pub(crate) fn holds_any(&self, revoked: &[Partition]) -> bool {
        let state = self.lock();
        revoked.iter().any(|p| {
            state
                .partitions
                .get(p)
                .is_some_and(|held| !held.running.is_empty())
        })
    }

    /// Gives `revoked` up: waits until no flush holds them or `wait` has passed, then
    /// returns the offsets that may be committed for them (partitions whose flushes all
    /// stored their messages). Blocks the calling thread.
    pub(crate) fn give_up(&self, revoked: &[Partition], wait: Duration) -> Offsets {
        let deadline = Instant::now() + wait;
        let mut state = self.lock();
        loop {
            let running = revoked.iter().any(|p| {
                state
                    .partitions
                    .get(p)
                    .is_some_and(|held| !held.running.is_empty())
            });
            let left = deadline.saturating_duration_since(Instant::now());
            if !running || left.is_zero() {
                break;
            }
            state = self
                .ended
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        let mut committable = Offsets::new();
        for partition in revoked {
            if let Some(held) = state.partitions.remove(partition) {
                match (held.running.is_empty(), held.failed, held.stored) {
                    (true, false, Some(next)) => {
                        committable.insert(partition.clone(), next);
                    }
                    (false, _, _) => tracing::warn!(
                        topic = %partition.0,
                        partition = partition.1,
                        "a revoked partition's batch is still being stored; its new owner \
                         gets its messages again"
                    ),
                    _ => {}
                }
            }
            state.given_up.push(partition.clone());
        }
        committable
    }

    /// The partitions given up since the last call.
    pub(crate) fn take_given_up(&self) -> Vec<Partition> {
        std::mem::take(&mut self.lock().given_up)
    }
}

/// A running flush; dropping it without [`Flushing::stored`] notes it failed.
pub(crate) struct Flushing {
    id: u64,
    partitions: Vec<Partition>,
    in_flight: Arc<FlushesInFlight>,
    ended: bool,
}

impl Flushing {
    /// The flush ended: `stored` when its messages are stored, `None` when it failed.
    pub(crate) fn ended(mut self, stored: Option<&Offsets>) {
        self.ended = true;
        self.in_flight.end(self.id, &self.partitions, stored);
    }
}

impl Drop for Flushing {
    fn drop(&mut self) {
        if !self.ended {
            self.in_flight.end(self.id, &self.partitions, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(partition: i32) -> Partition {
        ("t".to_owned(), partition)
    }

    fn offsets(entries: &[(i32, i64)]) -> Offsets {
        entries.iter().map(|(q, next)| (p(*q), *next)).collect()
    }

    #[test]
    fn a_partition_is_committable_once_every_flush_holding_it_stored() {
        let in_flight = Arc::new(FlushesInFlight::default());
        let first = in_flight.start([p(0), p(1)].into_iter());
        let second = in_flight.start([p(0)].into_iter());
        second.ended(Some(&offsets(&[(0, 20)])));
        assert!(in_flight.holds_any(&[p(0)]), "the first still holds it");
        let waiter = std::thread::spawn({
            let in_flight = in_flight.clone();
            move || in_flight.give_up(&[p(0)], Duration::from_secs(30))
        });
        std::thread::sleep(Duration::from_millis(50));
        first.ended(Some(&offsets(&[(0, 10), (1, 7)])));
        assert_eq!(waiter.join().unwrap(), offsets(&[(0, 20)]));
        assert_eq!(in_flight.take_given_up(), vec![p(0)]);
        assert!(in_flight.take_given_up().is_empty());
    }

    #[test]
    fn a_failed_or_unfinished_flush_makes_nothing_committable() {
        let in_flight = Arc::new(FlushesInFlight::default());
        drop(in_flight.start([p(0)].into_iter()));
        let ok = in_flight.start([p(0)].into_iter());
        ok.ended(Some(&offsets(&[(0, 5)])));
        let _running = in_flight.start([p(1)].into_iter());
        let started = Instant::now();
        let committable = in_flight.give_up(&[p(0), p(1)], Duration::from_millis(100));
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "waited for p1"
        );
        assert!(committable.is_empty(), "{committable:?}");
    }

    #[test]
    fn a_flush_ending_after_its_partition_was_given_up_and_taken_again_counts_nowhere() {
        let in_flight = Arc::new(FlushesInFlight::default());
        let late = in_flight.start([p(0)].into_iter());
        assert!(in_flight.give_up(&[p(0)], Duration::ZERO).is_empty());
        let again = in_flight.start([p(0)].into_iter());
        late.ended(Some(&offsets(&[(0, 99)])));
        assert!(in_flight.holds_any(&[p(0)]), "the new flush still runs");
        again.ended(Some(&offsets(&[(0, 3)])));
        assert_eq!(
            in_flight.give_up(&[p(0)], Duration::ZERO),
            offsets(&[(0, 3)]),
            "not the stale flush's offset"
        );
    }
}
