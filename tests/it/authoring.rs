//! What a handler author meets: configured webhooks served by any binary, the handler of
//! docs/handlers.md kept as the example that CI builds, and `redrive::testing`.

use async_trait::async_trait;
use redrive::config::WebhookSettings;
use redrive::task::FinishOutcome;
use redrive::testing::{task, HandlerTest, TEST_TASK_ID};
use redrive::{Fleet, FleetError, Handler, HandlerContext, HandlerError, Settings, Task};
use serde_json::json;
use std::time::Duration;

use crate::support::docs::blocks;
use crate::support::settings;

struct Noop;

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn with_webhook(name: &str) -> Settings {
    let mut settings = settings("authoring");
    settings.webhooks.insert(
        name.into(),
        WebhookSettings {
            url: Some("http://127.0.0.1:9/hook".into()),
            ..WebhookSettings::default()
        },
    );
    settings
}

#[test]
fn a_configured_webhook_is_served_by_a_binary_that_registers_only_its_own_handlers() {
    let fleet = Fleet::builder(with_webhook("billing"))
        .handler("order-sync", Noop)
        .build()
        .unwrap();
    assert_eq!(fleet.handler_names(), ["billing", "order-sync"]);

    let fleet = Fleet::builder(with_webhook("billing"))
        .with_builtin_handlers()
        .build()
        .unwrap();
    assert_eq!(fleet.handler_names(), ["billing", "log", "republish"]);
}

#[test]
fn a_webhook_named_like_a_handler_in_code_is_refused_naming_its_key() {
    for (name, builder) in [
        (
            "order-sync",
            Fleet::builder(with_webhook("order-sync")).handler("order-sync", Noop),
        ),
        (
            "log",
            Fleet::builder(with_webhook("log")).with_builtin_handlers(),
        ),
    ] {
        let Err(FleetError::Config(error)) = builder.build() else {
            panic!("webhooks.{name} beside a handler {name:?} was accepted")
        };
        let text = error.to_string();
        assert!(
            text.contains(&format!("webhooks.{name}")) && text.contains("registered in code too"),
            "{text}"
        );
    }
}

#[test]
fn the_handler_pages_handler_and_its_test_are_the_order_sync_example_that_ci_builds() {
    let root = env!("CARGO_MANIFEST_DIR");
    let example = std::fs::read_to_string(format!("{root}/examples/order_sync.rs")).unwrap();
    for section in ["Writing a handler", "Testing a handler"] {
        let blocks = blocks("docs/handlers.md", section, "rust");
        assert!(!blocks.is_empty(), "{section} shows code");
        for block in blocks {
            assert!(
                example.contains(&block),
                "docs/handlers.md's {section} shows code that examples/order_sync.rs does not hold:\n{block}"
            );
        }
    }
}

/// Saves a checkpoint per step; fails transiently after `fail_after` steps.
struct Steps {
    fail_after: u64,
}

#[async_trait]
impl Handler for Steps {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let done = (task.checkpoint.as_ref()).map_or(0, |c| c["steps_done"].as_u64().unwrap());
        for step in done + 1..=3 {
            if step > self.fail_after {
                return Err(HandlerError::transient(format!("step {step} is down")));
            }
            ctx.save_checkpoint(&json!({ "steps_done": step, "task": task.id }))
                .await?;
        }
        Ok(())
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(2)
    }
}

#[tokio::test]
async fn the_test_helper_runs_one_attempt_as_the_worker_would() {
    let first = HandlerTest::new(Steps { fail_after: 1 })
        .perform(&task("steps", "x"))
        .await;
    assert!(
        matches!(first.outcome, FinishOutcome::Retry { .. }),
        "{first:?}"
    );
    assert_eq!(first.error.as_deref(), Some("step 2 is down"));
    assert_eq!(
        first.checkpoint,
        Some(json!({ "steps_done": 1, "task": TEST_TASK_ID }))
    );

    // The second attempt resumes from the first one's checkpoint; it is the last one.
    let mut second = task("steps", "x");
    second.attempts = 2;
    second.checkpoint = first.checkpoint;
    let resumed = HandlerTest::new(Steps { fail_after: 2 })
        .perform(&second)
        .await;
    assert_eq!(resumed.outcome, FinishOutcome::PermanentFailure);
    assert_eq!(
        resumed.checkpoint,
        Some(json!({ "steps_done": 2, "task": TEST_TASK_ID }))
    );
    assert!(resumed
        .error
        .unwrap()
        .contains("gave up after 2 of 2 attempts"));
}

struct Panics;

#[async_trait]
impl Handler for Panics {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        panic!("bug in the handler")
    }
}

struct Slow;

#[async_trait]
impl Handler for Slow {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        std::future::pending().await
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(50))
    }
}

#[tokio::test]
async fn the_test_helper_turns_a_panic_or_a_timeout_into_a_transient_failure() {
    let panicked = HandlerTest::new(Panics).perform(&task("p", "x")).await;
    assert!(matches!(panicked.outcome, FinishOutcome::Retry { .. }));
    assert!(panicked
        .error
        .unwrap()
        .contains("handler panicked: bug in the handler"));

    let timed_out = HandlerTest::new(Slow).perform(&task("s", "x")).await;
    assert!(matches!(timed_out.outcome, FinishOutcome::Retry { .. }));
    assert!(timed_out.error.unwrap().contains("timed out after 50ms"));
}

/// Does one step, then waits for a second one that cancellation cuts short.
struct StopsWhenCancelled;

#[async_trait]
impl Handler for StopsWhenCancelled {
    async fn handle(&self, ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        ctx.save_checkpoint(&json!({ "steps_done": 1 })).await?;
        tokio::select! {
            _ = ctx.cancellation.cancelled() => {
                return Err(HandlerError::transient("cancelled after step 1"));
            }
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        ctx.save_checkpoint(&json!({ "steps_done": 2 })).await?;
        Ok(())
    }

    /// Without the cancellation, the attempt times out (and the test fails, not hangs).
    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(5))
    }
}

/// Never returns, and ignores its cancellation.
struct Deaf;

#[async_trait]
impl Handler for Deaf {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        std::future::pending().await
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(5))
    }
}

/// Issue 17 follow-up: a handler author tests that the handler stops when its
/// cancellation fires (the lease lost, the member stopping); one that ignores it is
/// stopped by the worker.
#[tokio::test]
async fn the_test_helper_fires_the_cancellation_a_handler_must_honour() {
    let cancelled = HandlerTest::new(StopsWhenCancelled)
        .cancel_after(Duration::from_millis(20))
        .perform(&task("steps", "x"))
        .await;
    assert_eq!(cancelled.error.as_deref(), Some("cancelled after step 1"));
    assert_eq!(cancelled.checkpoint, Some(json!({ "steps_done": 1 })));
    assert!(matches!(cancelled.outcome, FinishOutcome::Retry { .. }));

    let deaf = HandlerTest::new(Deaf)
        .cancel_after(Duration::from_millis(1))
        .perform(&task("s", "x"))
        .await;
    assert_eq!(
        deaf.error.as_deref(),
        Some("the lease was lost; the call was stopped")
    );
}
