//! Testing a handler without a database or a broker: build a task, run one attempt of
//! it as the worker pool would (the handler's timeout, a panic caught, the verdict
//! classified against its attempt budget), and read what happens next.
//! [`HandlerTest::cancel_after`] fires the attempt's cancellation, as a lost lease or a
//! stopping member does, to test that the handler stops on it.
//!
//! ```
//! use redrive::task::FinishOutcome;
//! use redrive::testing::{task, HandlerTest};
//! use redrive::{Handler, HandlerContext, HandlerError, Task};
//!
//! struct Validate;
//!
//! #[async_trait::async_trait]
//! impl Handler for Validate {
//!     async fn handle(&self, _ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
//!         match task.failure.value.as_deref() {
//!             Some(b"ok") => Ok(()),
//!             _ => Err(HandlerError::transient("not yet")),
//!         }
//!     }
//!     fn max_attempts(&self) -> Option<u32> {
//!         Some(3)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let test = HandlerTest::new(Validate);
//! assert_eq!(test.perform(&task("validate", "ok")).await.outcome, FinishOutcome::Resolved);
//!
//! let mut last = task("validate", "nope");
//! last.attempts = 3; // the last attempt of the budget
//! let performed = test.perform(&last).await;
//! assert_eq!(performed.outcome, FinishOutcome::PermanentFailure);
//! assert!(performed.error.unwrap().contains("gave up after 3 of 3 attempts"));
//! # }
//! ```

use std::convert::Infallible;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::config::RetrySettings;
use crate::handlers::invoke::invoke;
use crate::handlers::{
    Handler, HandlerContext, HandlerRegistry, KeptCheckpoint, RecoveryPoints, Registered,
};
use crate::task::{FinishOutcome, NewTask, Task, TaskId};

/// The id of a task built by [`task`].
pub const TEST_TASK_ID: TaskId = TaskId(1);

/// A task of `handler` whose message has only `value`, as a first attempt receives it:
/// id [`TEST_TASK_ID`], attempt 1, no checkpoint. Set its public fields for more (key,
/// headers, `attempts` for a later attempt, `checkpoint` to resume from one).
pub fn task(handler: &str, value: impl Into<Vec<u8>>) -> Task {
    let mut new = NewTask::new(handler, value);
    new.id = Some(TEST_TASK_ID);
    new.unsaved()
}

/// One handler under test, with the policy the worker pool would give it.
pub struct HandlerTest {
    registered: Registered,
    cancel_after: Option<Duration>,
}

/// What one attempt decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Performed {
    /// What happens to the task next: resolved, retried at a time, or a permanent
    /// failure (the handler said so, or the attempt was its last).
    pub outcome: FinishOutcome,
    /// The error the attempt recorded (a timeout or a panic is one), if it failed.
    pub error: Option<String>,
    /// The last checkpoint the attempt saved: the next attempt's `task.checkpoint`.
    pub checkpoint: Option<serde_json::Value>,
}

impl HandlerTest {
    /// Tests `handler` under its own policy, and the default `[retry]` settings for what
    /// it leaves to them.
    pub fn new(handler: impl Handler) -> HandlerTest {
        HandlerTest::with_retry(handler, &RetrySettings::default())
    }

    /// Tests `handler` with `retry` as the `[retry]` settings.
    pub fn with_retry(handler: impl Handler, retry: &RetrySettings) -> HandlerTest {
        const NAME: &str = "under-test";
        let mut registry = HandlerRegistry::default();
        registry
            .register(NAME, handler)
            .expect("a fresh registry takes a valid name");
        let mut selected = registry
            .select(&[NAME.to_owned()], retry)
            .expect("the handler was registered");
        let registered = selected.remove(NAME).expect("selected by name");
        HandlerTest {
            registered,
            cancel_after: None,
        }
    }

    /// Fires each attempt's cancellation (`ctx.cancellation`) `after` its start, as the
    /// worker pool does when the attempt's lease is lost or the member stops. A handler
    /// that returns on it keeps its own verdict; one that runs on past a short grace
    /// (250 ms) is dropped, and the attempt's error is "the lease was lost; the call was
    /// stopped".
    pub fn cancel_after(mut self, after: Duration) -> HandlerTest {
        self.cancel_after = Some(after);
        self
    }

    /// Runs attempt number `task.attempts` (1 when below) of `task`, as the worker pool
    /// would; checkpoints the handler saves are kept in [`Performed::checkpoint`].
    pub async fn perform(&self, task: &Task) -> Performed {
        let kept = KeptCheckpoint::default();
        let attempt = u32::try_from(task.attempts).unwrap_or(0).max(1);
        let cancellation = CancellationToken::new();
        let ctx = HandlerContext::new("test-worker", attempt, cancellation.clone())
            .with_recovery(RecoveryPoints::Kept(kept.clone()));
        let cancel = async {
            if let Some(after) = self.cancel_after {
                tokio::time::sleep(after).await;
                cancellation.cancel();
            }
            std::future::pending::<Infallible>().await
        };
        let attempted = tokio::select! {
            biased;
            attempted = invoke(&self.registered, &ctx, task) => attempted,
            never = cancel => match never {},
        };
        Performed {
            outcome: attempted.outcome,
            error: attempted.error,
            checkpoint: kept.last(),
        }
    }
}
