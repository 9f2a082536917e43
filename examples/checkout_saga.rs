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
//! `checkout-ledger.txt`): `KEY STEP` per step done, where `KEY` is
//! `task.idempotency_key()`, the same on every attempt and every delivery of the order.
//! To watch a crash between steps, set `CHECKOUT_PAUSE_AFTER=take_payment`: the first
//! attempt of each order then stops after that step's checkpoint (appending the key to
//! `LEDGER.paused`) until the process is killed; run it again without the variable and
//! the next attempt publishes the event without paying twice.
//!
//! A crash between a side effect and its checkpoint repeats that one step on the next
//! attempt: make each step idempotent as well (a payment keyed by
//! `task.idempotency_key()`), the checkpoint saves redoing the steps before it. On a
//! process-mode route, a member that dies mid-call loses the inline attempt's
//! checkpoint with it, and the message, delivered again, runs from the first step under
//! a new `task.id`: the key is what keeps the payment single there.
//!
//! An order whose value holds `"refuse": true` has its event rejected for good after
//! the payment: the task ends in PERMANENT_FAILURE and the handler's compensation undoes
//! the steps done, last first (`refund_payment`, then `cancel_order`), once. Once the
//! downstream accepts such orders (`CHECKOUT_ACCEPT_REFUSED=1`), an operator may retry
//! the task: a plain `redrive tasks retry` is refused because its compensation ran, and
//! `--force` runs it again from the first step (the order saved and paid anew), never
//! from the checkpoint the compensation undid.

use async_trait::async_trait;
use redrive::{Handler, HandlerContext, HandlerError, Task};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The steps, in order.
const STEPS: [&str; 3] = ["save_order", "take_payment", "publish_event"];

/// What undoes each step (publishing is the last step: it is never undone).
const UNDO: [&str; 3] = ["cancel_order", "refund_payment", "retract_event"];

struct Checkout {
    ledger: PathBuf,
    pause_after: Option<String>,
    accept_refused: bool,
}

impl Checkout {
    /// One side effect: a durable line in the ledger, keyed as a payment API's call would
    /// be, so that a downstream can tell a repeat from a second payment.
    fn perform(&self, task: &Task, step: &str) -> Result<(), HandlerError> {
        append(
            &self.ledger,
            &format!("{} {step}\n", task.idempotency_key()),
        )
    }

    /// Whether this order's attempt should stop after `step` (once per order).
    fn pauses_after(&self, task: &Task, step: &str) -> bool {
        let paused = std::fs::read_to_string(self.ledger.with_extension("paused"));
        self.pause_after.as_deref() == Some(step)
            && !paused
                .unwrap_or_default()
                .lines()
                .any(|key| key == task.idempotency_key())
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
        let done = steps_done(task);
        for (n, step) in STEPS.iter().enumerate().skip(done) {
            if *step == "publish_event" && refused(task) && !self.accept_refused {
                return Err(HandlerError::permanent("event rejected: order refused"));
            }
            self.perform(task, step)?;
            // A stale attempt (its lease taken over) is refused here and stops.
            ctx.save_checkpoint(&json!({ "steps_done": n + 1, "last": step }))
                .await?;
            tracing::info!(task = %task.id, step, "step done");
            if self.pauses_after(task, step) {
                append(
                    &self.ledger.with_extension("paused"),
                    &format!("{}\n", task.idempotency_key()),
                )?;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(7200))
    }

    fn compensates(&self) -> bool {
        true
    }

    /// Undoes the steps the checkpoint says were done, last first.
    async fn compensate(&self, _ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let done = steps_done(task);
        for (step, undo) in STEPS.iter().zip(UNDO).take(done).rev() {
            self.perform(task, undo)?;
            tracing::info!(task = %task.id, step, undo, "step undone");
        }
        Ok(())
    }
}

/// How many steps the last recovery point says are done.
fn steps_done(task: &Task) -> usize {
    task.checkpoint
        .as_ref()
        .and_then(|c| c["steps_done"].as_u64())
        .unwrap_or(0) as usize
}

/// Whether the order asks for its event to be rejected (`"refuse": true`).
fn refused(task: &Task) -> bool {
    task.failure
        .value
        .as_deref()
        .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
        .is_some_and(|order| order["refuse"] == json!(true))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let checkout = Checkout {
        ledger: std::env::var_os("CHECKOUT_LEDGER")
            .map(PathBuf::from)
            .unwrap_or_else(|| "checkout-ledger.txt".into()),
        pause_after: std::env::var("CHECKOUT_PAUSE_AFTER").ok(),
        accept_refused: std::env::var_os("CHECKOUT_ACCEPT_REFUSED").is_some(),
    };
    redrive::cli::main_with(|fleet| fleet.handler("checkout", checkout)).await
}
