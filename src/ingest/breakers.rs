//! Process mode and the fleet's circuit breakers: while a handler's breaker is open or
//! half-open, process-mode messages of that handler are not called inline; they are
//! stored unattempted and wait behind the breaker like every other task of the handler
//! (no attempt used, the downstream left alone).

use std::collections::BTreeSet;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::brake::FOLLOW_EVERY;
use crate::store::Store;

/// The handlers whose breaker is not closed, as last read.
#[derive(Default)]
pub(crate) struct InlineBreakers {
    unclosed: Mutex<BTreeSet<String>>,
}

impl InlineBreakers {
    /// Whether `handler` may be called inline now.
    pub(crate) fn allows(&self, handler: &str) -> bool {
        !self.unclosed.lock().expect("breakers").contains(handler)
    }

    /// Reads the breakers every [`FOLLOW_EVERY`] until `stop`; a failed read keeps the
    /// last answer.
    pub(crate) async fn follow(&self, store: &Store, stop: CancellationToken) {
        loop {
            match store.unclosed_breakers().await {
                Ok(unclosed) => {
                    *self.unclosed.lock().expect("breakers") = unclosed.into_iter().collect()
                }
                Err(error) => tracing::debug!(%error, "could not read the breakers"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
        }
    }
}
