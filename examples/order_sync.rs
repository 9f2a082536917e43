//! A fleet member with a handler of your own, in a few lines.
//!
//! Run it against the local PostgreSQL, then feed it tasks from another terminal:
//!
//! ```text
//! cargo run --example order_sync -- run
//! echo '{"order": 42}' | cargo run --example order_sync -- enqueue --handler order-sync
//! echo 'not json'      | cargo run --example order_sync -- enqueue --handler order-sync
//! ```
//!
//! The first task resolves; the second is a permanent failure (invalid JSON will never
//! parse, so retrying is pointless).

use async_trait::async_trait;
use redrive::{Handler, HandlerContext, HandlerError, LogHandler, Task};
use std::time::Duration;

/// Pretends to push an order to a downstream service.
struct OrderSync;

#[async_trait]
impl Handler for OrderSync {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let bytes = task.failure.value.as_deref().unwrap_or_default();
        let order: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| HandlerError::permanent(format!("not an order: {e}")))?;
        tracing::info!(task = %task.id, attempt = ctx.attempt, %order, "order synced");
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(5))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(8)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The same CLI as `redrive` (run, migrate, enqueue, bench) with our handlers.
    redrive::cli::main_with(|fleet| {
        fleet
            .handler("log", LogHandler)
            .handler("order-sync", OrderSync)
    })
    .await
}
