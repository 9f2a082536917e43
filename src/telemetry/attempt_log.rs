//! The one log line of each attempt's outcome, at the level its outcome deserves.

use chrono::{DateTime, Utc};

use crate::task::FinishOutcome;

/// What the line of one attempt says.
pub struct AttemptLine<'a> {
    /// The task (absent for an inline attempt that had no id reserved).
    pub task_id: Option<i64>,
    /// Its handler.
    pub handler: &'a str,
    /// Attempt number.
    pub attempt: i32,
    /// The ingest route, if any.
    pub route: Option<&'a str>,
    /// The correlation id, if any.
    pub correlation_id: Option<&'a str>,
    /// What the attempt decided.
    pub outcome: FinishOutcome,
    /// Its error.
    pub error: Option<&'a str>,
}

/// Logs the outcome: resolved at debug, a retry at info (with when and how long from
/// now), a permanent failure at warn (also one that ended the task without a call).
pub fn log_attempt(line: &AttemptLine<'_>) {
    let AttemptLine {
        task_id,
        handler,
        attempt,
        route,
        correlation_id,
        outcome,
        error,
    } = *line;
    match outcome {
        FinishOutcome::Resolved => tracing::debug!(
            task_id,
            handler,
            attempt,
            route,
            correlation_id,
            outcome = outcome.history().as_str(),
            "attempt resolved the task"
        ),
        FinishOutcome::Retry { at } => {
            let delay = delay_until(at);
            tracing::info!(
                task_id, handler, attempt, route, correlation_id, outcome = outcome.history().as_str(),
                next_attempt_at = %at.to_rfc3339(), delay = %delay, error,
                "attempt failed; retry scheduled"
            )
        }
        FinishOutcome::PermanentFailure => tracing::warn!(
            task_id,
            handler,
            attempt,
            route,
            correlation_id,
            outcome = outcome.history().as_str(),
            error,
            "attempt failed for good; the task is a permanent failure"
        ),
        FinishOutcome::NotCalled => tracing::warn!(
            task_id,
            handler,
            attempt,
            route,
            correlation_id,
            outcome = outcome.history().as_str(),
            error,
            "no attempts left; the task is a permanent failure without a call"
        ),
    }
}

fn delay_until(at: DateTime<Utc>) -> String {
    let delay = (at - Utc::now()).to_std().unwrap_or_default();
    humantime::format_duration(std::time::Duration::from_millis(delay.as_millis() as u64))
        .to_string()
}
