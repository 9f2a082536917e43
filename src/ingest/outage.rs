//! A member that cannot store what it consumes gives its partitions to the group. While
//! the database does not answer, librdkafka keeps the member's assignment (it polls and
//! heartbeats) and a rebalance even hands it more, while members that can store sit
//! idle. Once ingest's statements have failed for `ingest.release_partitions_after`
//! with none answering in between, the consumer leaves the group (committing only what
//! was stored); the member waits for the database, then joins again with a new one.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// Since when ingest's statements have failed, with none answering in between.
#[derive(Debug, Default)]
pub(crate) struct StoreOutage(Mutex<Option<Instant>>);

impl StoreOutage {
    /// A statement failed because the database is unreachable.
    pub(crate) fn failed(&self) {
        self.0.lock().unwrap().get_or_insert_with(Instant::now);
    }

    /// A statement was answered.
    pub(crate) fn answered(&self) {
        *self.0.lock().unwrap() = None;
    }

    /// Whether statements have failed for at least `limit` without an answer.
    pub(crate) fn lasted(&self, limit: Duration) -> bool {
        self.0
            .lock()
            .unwrap()
            .is_some_and(|since| since.elapsed() >= limit)
    }
}

/// How often a member that gave its partitions up asks the database whether it answers.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Longest one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits until the database answers a probe; false when `shutdown` fires first.
pub(crate) async fn until_database_answers(store: &Store, shutdown: &CancellationToken) -> bool {
    loop {
        if let Ok(Ok(())) = tokio::time::timeout(PROBE_TIMEOUT, store.ping()).await {
            return true;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}
