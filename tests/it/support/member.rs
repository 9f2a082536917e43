//! A fleet member running in this process, on a test's store.

use redrive::{Fleet, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A fleet member running in this process on a test's store, until [`Member::stop`].
pub struct Member {
    stop: CancellationToken,
    run: JoinHandle<()>,
}

impl Member {
    /// Runs `fleet` on `store` until [`Member::stop`].
    pub fn start(fleet: Fleet, store: &Store) -> Member {
        let stop = CancellationToken::new();
        let run = tokio::spawn({
            let (store, stop) = (store.clone(), stop.clone());
            async move { fleet.run_with_store(store, stop).await.unwrap() }
        });
        Member { stop, run }
    }

    /// Stops the member and waits for its shutdown; panics if it failed.
    pub async fn stop(self) {
        self.stop.cancel();
        self.run.await.unwrap();
    }
}
