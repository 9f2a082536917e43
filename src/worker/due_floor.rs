//! Where each claim starts its walk of the due index.
//!
//! A claim walks the due tasks of each of its handlers in due order (the index
//! `recovery_task_due_by_handler`). At the start of each walk lie the entries of row versions that are dead but cannot be removed yet: every
//! task claimed or finished leaves one, and they stay until vacuum comes by, or for as
//! long as a long transaction anywhere on the server pins the MVCC horizon. Each costs
//! the walk a visit to the table. Under a pinned horizon they pile up by thousands a
//! second, and a claim of 100 tasks read 8,800 buffers (51 ms) to find them, against 9
//! (0.1 ms) when it started near them (`redrive bench horizon`).
//!
//! So a claim lane (one set of handlers) starts its walk [`FLOOR_MARGIN`] before the
//! earliest due time its last claim found, and walks its handlers' due tasks from their
//! start again at least every [`FULL_WALK_EVERY`] (the due tasks of other handlers are
//! never walked). A task set due before the floor after it was set (a
//! transaction longer than the margin that stored it, an operator's retry at a time
//! past, a row another transaction held when the claim passed it) waits for that full
//! walk: at most about a second more, never forever. The idle wait is cut short to make
//! that walk on time.

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How far before the earliest due time the last claim found the next one starts:
/// a task stored by a transaction that began up to this long before, and committed
/// after that claim, is still met.
pub(crate) const FLOOR_MARGIN: Duration = Duration::from_secs(1);

/// How often a lane walks the due index from its start.
pub(crate) const FULL_WALK_EVERY: Duration = Duration::from_secs(1);

/// Most lanes remembered: the handler sets of one pool are few (the shared set, each
/// limited handler); a breaker opening or closing makes a new shared set.
const MOST_LANES: usize = 64;

/// One lane's floor.
#[derive(Debug, Clone, Copy)]
struct Floor {
    /// Where the walk starts.
    from: DateTime<Utc>,
    /// When the full walk that set it was made.
    walked_at: Instant,
}

/// The floors of a pool's claim lanes, shared by its claim loops.
#[derive(Debug, Default)]
pub(crate) struct DueFloors {
    lanes: Mutex<HashMap<Vec<String>, Floor>>,
}

impl DueFloors {
    /// Where the next claim of `lane` starts: `None` walks the whole index (no floor
    /// yet, or the last full walk is [`FULL_WALK_EVERY`] old).
    pub(crate) fn start(&self, lane: &[String]) -> Option<DateTime<Utc>> {
        let lanes = self.lanes.lock().expect("floors lock");
        let floor = lanes.get(lane)?;
        (floor.walked_at.elapsed() < FULL_WALK_EVERY).then_some(floor.from)
    }

    /// Records a claim of `lane` that started at `started` (from [`DueFloors::start`])
    /// and found `first_due` as its earliest due time.
    pub(crate) fn claimed(
        &self,
        lane: &[String],
        started: Option<DateTime<Utc>>,
        first_due: Option<DateTime<Utc>>,
    ) {
        let mut lanes = self.lanes.lock().expect("floors lock");
        let from = first_due.map(|due| due - FLOOR_MARGIN);
        match (started, from) {
            // A full walk sets the floor, or (finding nothing due) clears it: the next
            // claim walks the whole index again, as an idle member's always did.
            (None, Some(from)) => {
                if lanes.len() >= MOST_LANES && !lanes.contains_key(lane) {
                    lanes.clear();
                }
                let floor = Floor {
                    from,
                    walked_at: Instant::now(),
                };
                lanes.insert(lane.to_vec(), floor);
            }
            (None, None) => {
                lanes.remove(lane);
            }
            // A walk from the floor moves it on; the full walk stays due when it was.
            (Some(_), Some(from)) => {
                if let Some(floor) = lanes.get_mut(lane) {
                    floor.from = floor.from.max(from);
                }
            }
            (Some(_), None) => {}
        }
    }

    /// How long until some lane's floor lapses and its next claim walks the whole
    /// index; `None` when no floor is in force.
    pub(crate) fn until_full_walk(&self) -> Option<Duration> {
        let lanes = self.lanes.lock().expect("floors lock");
        lanes
            .values()
            .map(|f| FULL_WALK_EVERY.saturating_sub(f.walked_at.elapsed()))
            .filter(|left| !left.is_zero())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(name: &str) -> Vec<String> {
        vec![name.to_owned()]
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("a time")
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_walk_sets_the_floor_a_margin_before_what_it_found_and_lapses() {
        let floors = DueFloors::default();
        let shared = lane("a");
        assert_eq!(floors.start(&shared), None, "no floor before a claim");
        floors.claimed(&shared, None, Some(at(100)));
        let from = at(100) - FLOOR_MARGIN;
        assert_eq!(floors.start(&shared), Some(from));
        assert_eq!(floors.until_full_walk(), Some(FULL_WALK_EVERY));

        tokio::time::advance(FULL_WALK_EVERY).await;
        assert_eq!(floors.start(&shared), None, "the full walk is due again");
        assert_eq!(floors.until_full_walk(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn walks_from_the_floor_move_it_forward_only_and_keep_the_full_walk_due() {
        let floors = DueFloors::default();
        let shared = lane("a");
        floors.claimed(&shared, None, Some(at(100)));
        tokio::time::advance(Duration::from_millis(600)).await;
        let started = floors.start(&shared);
        floors.claimed(&shared, started, Some(at(200)));
        assert_eq!(floors.start(&shared), Some(at(200) - FLOOR_MARGIN));
        // An earlier due time (another loop's claim, a straggler) does not move it back.
        floors.claimed(&shared, started, Some(at(150)));
        assert_eq!(floors.start(&shared), Some(at(200) - FLOOR_MARGIN));
        // Nothing found from the floor leaves it.
        floors.claimed(&shared, started, None);
        assert_eq!(floors.start(&shared), Some(at(200) - FLOOR_MARGIN));
        // The full walk stays due a second after the one that set the floor.
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(floors.start(&shared), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_walk_that_finds_nothing_clears_the_floor_and_lanes_are_apart() {
        let floors = DueFloors::default();
        let (a, b) = (lane("a"), lane("b"));
        floors.claimed(&a, None, Some(at(100)));
        floors.claimed(&b, None, Some(at(50)));
        assert_eq!(floors.start(&a), Some(at(100) - FLOOR_MARGIN));
        assert_eq!(floors.start(&b), Some(at(50) - FLOOR_MARGIN));
        floors.claimed(&b, None, None);
        assert_eq!(floors.start(&b), None);
        assert_eq!(floors.start(&a), Some(at(100) - FLOOR_MARGIN));
    }

    #[tokio::test(start_paused = true)]
    async fn lanes_past_the_most_remembered_start_over() {
        let floors = DueFloors::default();
        for n in 0..MOST_LANES {
            floors.claimed(&lane(&n.to_string()), None, Some(at(1)));
        }
        assert!(floors.start(&lane("0")).is_some());
        floors.claimed(&lane("new"), None, Some(at(1)));
        assert_eq!(floors.start(&lane("0")), None, "forgotten");
        assert!(floors.start(&lane("new")).is_some());
    }
}
