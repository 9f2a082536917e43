//! Wakes the idle claim loop when tasks are inserted, and the lease keepers when an
//! operator fenced leases (PostgreSQL LISTEN/NOTIFY).

use sqlx::postgres::{PgListener, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// Where the listener passes what it hears.
pub(crate) struct Signals {
    /// Poked when tasks became due (the claim loops wait on it).
    pub(crate) wake: Arc<Notify>,
    /// Bumped when an operator fenced leases or compensation claims: the heartbeats
    /// check theirs at once.
    pub(crate) fenced: watch::Sender<()>,
}

/// Listens on the store's due and fenced channels and passes each notification on,
/// until `stop` fires. Reconnects after a lost connection and passes both on once then,
/// since notifications sent meanwhile are gone.
pub(crate) async fn listen(store: Store, signals: Signals, stop: CancellationToken) {
    let (due, fenced) = (store.due_channel(), store.fenced_channel());
    // The listener holds its connection for good: it gets its own, outside the store's
    // pool, so even a pool of one connection is left to the claims.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with((*store.pool().connect_options()).clone());
    // Failing to listen again is logged once, not at every try.
    let mut failing = false;
    loop {
        let listener = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen_all([due.as_str(), fenced.as_str()]).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            l = listener => l,
        };
        match outcome {
            Ok(mut listener) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("listening for notifications again");
                }
                signals.wake.notify_one();
                signals.fenced.send_replace(());
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        received = listener.try_recv() => match received {
                            Ok(Some(heard)) if heard.channel() == fenced => {
                                signals.fenced.send_replace(());
                            }
                            Ok(Some(_)) => signals.wake.notify_one(),
                            Ok(None) => {
                                tracing::warn!("notification connection lost; reconnecting");
                                break;
                            }
                            Err(error) => {
                                tracing::warn!(%error, "notification listener failed; reconnecting");
                                break;
                            }
                        }
                    }
                }
            }
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "cannot listen for notifications; polling meanwhile, \
                    operator actions reach running calls at the next heartbeat");
            }
            Err(error) => tracing::debug!(%error, "still cannot listen for notifications"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
