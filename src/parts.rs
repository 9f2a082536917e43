//! Background parts of a member (breaker followers, heartbeats, listeners, finishers)
//! that must not die unseen: a part that panics is logged, and the member it belongs to
//! stops with an error, so that a supervisor restarts it, instead of running on without
//! the part (breakers no longer followed, leases no longer renewed).

use futures::FutureExt;
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Watches a group of parts: fires when the first of them panics, and keeps what it said.
#[derive(Clone, Default)]
pub(crate) struct Watch {
    died: CancellationToken,
    first: Arc<OnceLock<String>>,
}

impl Watch {
    /// Spawns `part`; a panic in it is logged and fires [`Watch::died`].
    pub(crate) fn spawn<F>(&self, name: &'static str, part: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Default + Send + 'static,
    {
        let watch = self.clone();
        tokio::spawn(async move {
            match AssertUnwindSafe(part).catch_unwind().await {
                Ok(output) => output,
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    tracing::error!(part = name, %message, "a part of this member panicked; stopping the member");
                    let _ = watch.first.set(format!("{name}: {message}"));
                    watch.died.cancel();
                    F::Output::default()
                }
            }
        })
    }

    /// The first panic, if one happened: the error the member stops with.
    pub(crate) fn failure(&self) -> Option<String> {
        self.first.get().cloned()
    }

    /// A token that fires on `shutdown` or when a watched part died: what the parts
    /// that do the work stop on.
    pub(crate) fn stop_on(&self, shutdown: &CancellationToken) -> CancellationToken {
        let stop = CancellationToken::new();
        let (died, shutdown, fire) = (self.died.clone(), shutdown.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = died.cancelled() => {}
                _ = shutdown.cancelled() => {}
                _ = fire.cancelled() => {}
            }
            fire.cancel();
        });
        stop
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_panics() -> bool {
        true
    }

    #[tokio::test]
    async fn a_panicking_part_fires_the_watch_and_stops_the_work() {
        let watch = Watch::default();
        let shutdown = CancellationToken::new();
        let stop = watch.stop_on(&shutdown);
        let quiet = watch.spawn("quiet", async {});
        quiet.await.unwrap();
        assert!(watch.failure().is_none(), "a part that ends is not a death");
        assert!(!stop.is_cancelled());
        let part = watch.spawn("follower", async {
            if watch_panics() {
                panic!("boom");
            }
        });
        part.await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), stop.cancelled())
            .await
            .expect("the work is told to stop");
        assert_eq!(watch.failure().as_deref(), Some("follower: boom"));
        assert!(
            !shutdown.is_cancelled(),
            "the member's own token is left alone"
        );
    }
}
