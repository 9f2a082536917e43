//! Wakes the idle claim loop when tasks are inserted (PostgreSQL LISTEN/NOTIFY).

use sqlx::postgres::{PgListener, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// Listens on the store's due channel and pokes `wake` for every notification, until
/// `stop` fires. Reconnects after a lost connection and pokes once then, since
/// notifications sent meanwhile are gone.
pub(crate) async fn listen(store: Store, wake: Arc<Notify>, stop: CancellationToken) {
    let channel = store.due_channel();
    // The listener holds its connection for good: it gets its own, outside the store's
    // pool, so even a pool of one connection is left to the claims.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with((*store.pool().connect_options()).clone());
    loop {
        let listener = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            l = listener => l,
        };
        match outcome {
            Ok(mut listener) => {
                wake.notify_one();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        received = listener.try_recv() => match received {
                            Ok(Some(_)) => wake.notify_one(),
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
            Err(error) => tracing::warn!(%error, "cannot listen for new tasks; polling meanwhile"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
