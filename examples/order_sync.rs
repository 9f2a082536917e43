//! A fleet member with a handler of your own, in a few lines, and its test.
//! docs/handlers.md shows this file ("Writing a handler", "Testing a handler"); `cargo
//! test --example order_sync` runs its test.
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
use redrive::{Handler, HandlerContext, HandlerError, Task};
use std::time::Duration;

/// Pushes an order to a downstream service (here, it logs it).
struct OrderSync;

#[async_trait]
impl Handler for OrderSync {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let bytes = task.failure.value.as_deref().unwrap_or_default();
        let order: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| HandlerError::permanent(format!("not an order: {e}")))?;
        // Call the downstream system here: a 503 is `HandlerError::transient(..)`, a 429
        // with Retry-After is `HandlerError::retry_after(..)`, a 400 is permanent.
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
    // redrive's whole CLI (run, migrate, enqueue, tasks, ...) with the built-in `log`
    // and `republish` handlers and ours; each `[webhooks.NAME]` is served anyway.
    redrive::cli::main_with(|fleet| {
        fleet
            .with_builtin_handlers()
            .handler("order-sync", OrderSync)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::OrderSync;
    use redrive::task::FinishOutcome;
    use redrive::testing::{task, HandlerTest};

    #[tokio::test]
    async fn an_order_resolves_and_anything_else_fails_for_good() {
        let test = HandlerTest::new(OrderSync);

        let synced = test.perform(&task("order-sync", r#"{"order": 42}"#)).await;
        assert_eq!(synced.outcome, FinishOutcome::Resolved);

        let refused = test.perform(&task("order-sync", "not json")).await;
        assert_eq!(refused.outcome, FinishOutcome::PermanentFailure);
        assert!(refused.error.unwrap().starts_with("not an order"));
    }
}
