//! The handler API: what developers implement to retry a failure, and how a member calls
//! one: [`invoke`] (timeouts, panics, verdicts) under the fleet's breakers as this member
//! follows them ([`breakers`]).

pub(crate) mod breakers;
#[cfg(feature = "demo")]
pub(crate) mod faults;
pub mod invoke;
mod log;
mod recovery;
mod registry;
pub mod republish;
pub mod webhook;

pub use self::log::LogHandler;
pub use recovery::CheckpointError;
pub(crate) use recovery::{KeptCheckpoint, RecoveryPoints};
pub use registry::{HandlerRegistry, Policy, Registered, RegistryError};
pub use republish::RepublishHandler;
pub use webhook::WebhookHandler;

use async_trait::async_trait;
use std::fmt::Display;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::task::Task;

/// A handler's verdict on a failed attempt. The handler classifies; the worker never guesses.
/// Build one with [`HandlerError::transient`], [`HandlerError::permanent`] or
/// [`HandlerError::retry_after`]; more variants may come.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Worth retrying with backoff (a timeout, a 503, a lost connection).
    #[error("{0}")]
    Transient(String),
    /// Retrying cannot help (a validation error, a 404): stop now.
    #[error("{0}")]
    Permanent(String),
    /// Retry no sooner than `after` (a server's Retry-After).
    #[error("{message} (retry after {after:?})")]
    RetryAfter {
        /// Delay asked for by the downstream system.
        after: Duration,
        /// What went wrong.
        message: String,
    },
}

impl HandlerError {
    /// A transient error from anything printable.
    pub fn transient(error: impl Display) -> Self {
        HandlerError::Transient(error.to_string())
    }

    /// A permanent error from anything printable.
    pub fn permanent(error: impl Display) -> Self {
        HandlerError::Permanent(error.to_string())
    }

    /// A retry-after error from anything printable.
    pub fn retry_after(after: Duration, error: impl Display) -> Self {
        HandlerError::RetryAfter {
            after,
            message: error.to_string(),
        }
    }
}

/// What a handler knows about the attempt it runs in.
#[derive(Debug, Clone)]
pub struct HandlerContext {
    /// The worker running the attempt.
    pub worker_id: String,
    /// Attempt number, 1 for the first.
    pub attempt: u32,
    /// Cancelled when the lease is lost or the process stops: stop early if you can.
    pub cancellation: CancellationToken,
    /// The redrive job (a paced retry) that made this task due again, if one did: the
    /// call is part of an operator's redrive, not the task's own retries.
    pub redrive_job: Option<i64>,
    recovery: Option<RecoveryPoints>,
}

impl HandlerContext {
    /// A context for attempt `attempt` with nowhere to save a checkpoint
    /// ([`HandlerContext::save_checkpoint`] answers `Unavailable`); a handler's tests
    /// get one that keeps it from `redrive::testing` (its `HandlerTest`).
    pub fn new(
        worker_id: impl Into<String>,
        attempt: u32,
        cancellation: CancellationToken,
    ) -> Self {
        HandlerContext {
            worker_id: worker_id.into(),
            attempt,
            cancellation,
            redrive_job: None,
            recovery: None,
        }
    }

    /// The context of an attempt that redrive job `job` made due, if any.
    pub fn with_redrive_job(mut self, job: Option<i64>) -> Self {
        self.redrive_job = job;
        self
    }

    /// Saves to `recovery`: the task's row, or memory.
    pub(crate) fn with_recovery(mut self, recovery: RecoveryPoints) -> Self {
        self.recovery = Some(recovery);
        self
    }

    /// Saves a recovery point: the next attempt of this task receives it as
    /// `task.checkpoint` (the last one saved). Written under the attempt's lease: an
    /// attempt that lost its lease gets [`CheckpointError::Fenced`] and should stop.
    /// Process mode's inline attempt keeps it, and stores the last one with the failure.
    /// Save after each step whose side effect must not be repeated.
    pub async fn save_checkpoint(
        &self,
        checkpoint: &serde_json::Value,
    ) -> Result<(), CheckpointError> {
        match &self.recovery {
            Some(recovery) => recovery.save(checkpoint).await,
            None => Err(CheckpointError::Unavailable),
        }
    }
}

impl From<CheckpointError> for HandlerError {
    /// A checkpoint that could not be saved fails the attempt transiently.
    fn from(error: CheckpointError) -> Self {
        HandlerError::transient(error)
    }
}

/// Retries one kind of failure. One required method; policy has overridable defaults
/// (`None` means "use the `[retry]` settings").
///
/// ```
/// use redrive::{Handler, HandlerContext, HandlerError, Task};
///
/// struct SyncOrder;
///
/// #[async_trait::async_trait]
/// impl Handler for SyncOrder {
///     async fn handle(&self, _ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
///         match task.failure.value.as_deref() {
///             Some(b"") | None => Err(HandlerError::permanent("empty order")),
///             Some(_) => Ok(()),
///         }
///     }
///     fn max_attempts(&self) -> Option<u32> {
///         Some(5)
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Retries the task. `Ok` resolves it; an error is classified by its variant.
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError>;

    /// Longest a call may run before it counts as a transient failure.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Attempts before the task becomes a permanent failure.
    fn max_attempts(&self) -> Option<u32> {
        None
    }

    /// Delay between attempts.
    fn backoff(&self) -> Option<Backoff> {
        None
    }

    /// Whether this handler undoes its work when a task ends in PERMANENT_FAILURE: when
    /// true, [`Handler::compensate`] runs for each such task.
    fn compensates(&self) -> bool {
        false
    }

    /// Backwards recovery (a saga's compensating step), run once a task of this handler
    /// has ended in PERMANENT_FAILURE, if [`Handler::compensates`]. The task comes as it
    /// ended, with its last checkpoint (which steps were done). `Ok` marks it
    /// compensated; a transient error is retried under the handler's timeout, max
    /// attempts and backoff, counted apart from the task's attempts; a permanent error
    /// (or the budget used up) marks the compensation failed. Runs at least once per
    /// permanent failure, more than once only if a member dies mid-call: make it
    /// idempotent.
    async fn compensate(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let _ = (ctx, task);
        Ok(())
    }
}
