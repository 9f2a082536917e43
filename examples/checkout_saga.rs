//! A multi-step handler with recovery points: save the order, take the payment, publish
//! an event. After each step it saves a checkpoint; a later attempt (after a crash, a
//! timeout or a transient error) reads it and skips the steps already done, so no side
//! effect is repeated.
//!
//! ```text
//! cargo run --example checkout_saga -- run
//! echo '{"order": 7}' | cargo run --example checkout_saga -- enqueue --handler checkout
//! ```
//!
//! The side effects are lines appended to a ledger file (`CHECKOUT_LEDGER`, default
//! `checkout-ledger.txt`): `TASK STEP` per step done. To watch a crash between steps,
//! set `CHECKOUT_PAUSE_AFTER=take_payment`: a first attempt then stops after that step's
//! checkpoint (appending the task id to `LEDGER.paused`) until the process is killed;
//! run it again without the variable and the next attempt publishes the event without
//! paying twice.
//!
//! A crash between a side effect and its checkpoint repeats that one step on the next
//! attempt: make each step idempotent as well (a payment keyed by the task), the
//! checkpoint saves redoing the steps before it.

use async_trait::async_trait;
use redrive::{Handler, HandlerContext, HandlerError, Task};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The steps, in order.
const STEPS: [&str; 3] = ["save_order", "take_payment", "publish_event"];

struct Checkout {
    ledger: PathBuf,
    pause_after: Option<String>,
}

impl Checkout {
    /// One side effect: a durable line in the ledger.
    fn perform(&self, task: &Task, step: &str) -> Result<(), HandlerError> {
        append(&self.ledger, &format!("{} {step}\n", task.id))
    }
}

/// Appends `line` in one write (concurrent attempts append whole lines) and syncs it.
fn append(path: &std::path::Path, line: &str) -> Result<(), HandlerError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(HandlerError::transient)?;
    file.write_all(line.as_bytes())
        .map_err(HandlerError::transient)?;
    file.sync_all().map_err(HandlerError::transient)
}

#[async_trait]
impl Handler for Checkout {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        // The last recovery point: how many steps are done.
        let done = task
            .checkpoint
            .as_ref()
            .and_then(|c| c["steps_done"].as_u64())
            .unwrap_or(0) as usize;
        for (n, step) in STEPS.iter().enumerate().skip(done) {
            self.perform(task, step)?;
            // A stale attempt (its lease taken over) is refused here and stops.
            ctx.save_checkpoint(&json!({ "steps_done": n + 1, "last": step }))
                .await?;
            tracing::info!(task = %task.id, step, "step done");
            if ctx.attempt == 1 && self.pause_after.as_deref() == Some(*step) {
                append(
                    &self.ledger.with_extension("paused"),
                    &format!("{}\n", task.id),
                )?;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(7200))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let checkout = Checkout {
        ledger: std::env::var_os("CHECKOUT_LEDGER")
            .map(PathBuf::from)
            .unwrap_or_else(|| "checkout-ledger.txt".into()),
        pause_after: std::env::var("CHECKOUT_PAUSE_AFTER").ok(),
    };
    redrive::cli::main_with(|fleet| fleet.handler("checkout", checkout)).await
}
