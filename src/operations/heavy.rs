//! Heavy reads (counts of every task: stats, check, a grouping's count) run a few at a
//! time per process, each to its end: a statement PostgreSQL runs on keeps its slot
//! even when the caller stops waiting (a client hanging up), so that callers giving up
//! and asking again cannot run more of them at once than allowed, nor take every
//! connection of the admin API's small pool.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::{OperationError, Result};

/// Most heavy reads one process runs at once; one more is refused at once
/// ([`OperationError::Busy`]) instead of queueing more work on the database.
pub const HEAVY_READS: usize = 2;

/// The heavy-read slots of one process (clones share them).
#[derive(Clone)]
pub struct HeavyReads(Arc<Semaphore>);

impl Default for HeavyReads {
    fn default() -> HeavyReads {
        HeavyReads(Arc::new(Semaphore::new(HEAVY_READS)))
    }
}

impl HeavyReads {
    /// Runs `work` in a free slot, or answers [`OperationError::Busy`] at once. The work
    /// runs on its own task holding the slot: it ends (its statements bounded by their
    /// timeout) whether or not the caller still waits for it.
    pub async fn run<F>(&self, work: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let slot = (self.0.clone().try_acquire_owned()).map_err(|_| OperationError::busy())?;
        let running = tokio::spawn(async move {
            let output = work.await;
            drop(slot);
            output
        });
        match running.await {
            Ok(output) => Ok(output),
            Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
            Err(_) => Err(OperationError::Busy("this process is stopping".into())),
        }
    }

    /// Slots free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.0.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A caller that stops waiting leaves its work running in its slot: the next caller
    /// beyond the limit is refused until the work ends, and the work does end.
    #[tokio::test]
    async fn work_abandoned_by_its_caller_keeps_its_slot_until_it_ends() {
        let heavy = HeavyReads::default();
        let (go, gone) = tokio::sync::watch::channel(false);
        for _ in 0..HEAVY_READS {
            let mut gone = gone.clone();
            let abandoned = heavy.run(async move {
                let _ = gone.wait_for(|go| *go).await;
            });
            let waited = tokio::time::timeout(Duration::from_millis(50), abandoned).await;
            assert!(waited.is_err(), "the work was still running");
        }
        assert_eq!(heavy.free(), 0, "abandoned work holds its slots");
        assert!(matches!(
            heavy.run(async {}).await,
            Err(OperationError::Busy(_))
        ));
        go.send(true).unwrap();
        let start = std::time::Instant::now();
        while heavy.free() < HEAVY_READS {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the ended work gave its slots back: {} free",
                heavy.free()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(heavy.run(async { 7 }).await.unwrap(), 7);
    }
}
