//! One attempt: call the handler under its timeout, survive a panic, classify the result.

use chrono::Utc;
use futures::FutureExt;
use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::handlers::{HandlerContext, HandlerError, Policy, Registered};
use crate::store::{Finish, FinishOutcome};
use crate::task::Task;

/// Runs one attempt of `task`. `lease_lost` is handed to the handler as its
/// cancellation signal; the handler's timeout bounds a handler that ignores it.
pub(crate) async fn run_attempt(
    registered: &Registered,
    task: &Task,
    worker_id: &str,
    lease_lost: CancellationToken,
) -> Finish {
    let policy = &registered.policy;
    let attempt = u32::try_from(task.attempts).unwrap_or(0);
    let max_attempts = task
        .max_attempts
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(policy.max_attempts);
    let started_at = Utc::now();
    let clock = Instant::now();

    // Attempts beyond the limit were used up elsewhere: by workers that died or lost
    // their lease mid-call, or by process mode's inline attempt.
    let verdict = if attempt > max_attempts {
        Err(HandlerError::Permanent(format!(
            "no attempts left: attempt {attempt} exceeds max attempts {max_attempts}"
        )))
    } else {
        let ctx = HandlerContext {
            worker_id: worker_id.to_owned(),
            attempt,
            cancellation: lease_lost.clone(),
        };
        let call = tokio::time::timeout(policy.timeout, registered.handler.handle(&ctx, task));
        match AssertUnwindSafe(call).catch_unwind().await {
            Ok(Ok(verdict)) => verdict,
            Ok(Err(_elapsed)) => Err(HandlerError::Transient(format!(
                "handler timed out after {}",
                humantime::format_duration(policy.timeout)
            ))),
            Err(panic) => Err(HandlerError::Transient(format!(
                "handler panicked: {}",
                panic_message(panic.as_ref())
            ))),
        }
    };
    let duration = clock.elapsed();
    let (outcome, error) = classify(verdict, attempt, max_attempts, policy);
    Finish {
        lease: task.lease(),
        outcome,
        started_at,
        duration,
        error,
    }
}

/// Maps a handler's verdict to what happens to the task next.
pub(crate) fn classify(
    verdict: Result<(), HandlerError>,
    attempt: u32,
    max_attempts: u32,
    policy: &Policy,
) -> (FinishOutcome, Option<String>) {
    let error = match verdict {
        Ok(()) => return (FinishOutcome::Resolved, None),
        Err(HandlerError::Permanent(message)) => {
            return (FinishOutcome::PermanentFailure, Some(message))
        }
        Err(error) => error,
    };
    if attempt >= max_attempts {
        let message = format!("{error} (gave up after {attempt} of {max_attempts} attempts)");
        return (FinishOutcome::PermanentFailure, Some(message));
    }
    let delay = match &error {
        HandlerError::RetryAfter { after, .. } => *after,
        _ => policy.backoff.delay(attempt),
    };
    let at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
    (FinishOutcome::Retry { at }, Some(error.to_string()))
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::{Backoff, Jitter};
    use std::time::Duration;

    fn policy() -> Policy {
        Policy {
            timeout: Duration::from_secs(1),
            max_attempts: 3,
            backoff: Backoff {
                base: Duration::from_secs(10),
                factor: 2.0,
                cap: Duration::from_secs(100),
                jitter: Jitter::None,
            },
        }
    }

    #[test]
    fn outcomes_follow_the_handlers_classification_and_the_attempt_limit() {
        let p = policy();
        assert_eq!(classify(Ok(()), 1, 3, &p).0, FinishOutcome::Resolved);
        let (outcome, error) = classify(Err(HandlerError::permanent("bad")), 1, 3, &p);
        assert_eq!(
            (outcome, error.as_deref()),
            (FinishOutcome::PermanentFailure, Some("bad"))
        );

        let before = Utc::now();
        let (outcome, _) = classify(Err(HandlerError::transient("down")), 2, 3, &p);
        let FinishOutcome::Retry { at } = outcome else {
            panic!("expected a retry, got {outcome:?}")
        };
        let delay = (at - before).num_milliseconds();
        assert!(
            (20_000..21_000).contains(&delay),
            "second failure waits base*2: {delay}"
        );

        let (outcome, error) = classify(Err(HandlerError::transient("down")), 3, 3, &p);
        assert_eq!(outcome, FinishOutcome::PermanentFailure);
        assert!(error.unwrap().contains("gave up after 3 of 3 attempts"));
    }

    #[test]
    fn retry_after_overrides_the_backoff() {
        let before = Utc::now();
        let error = HandlerError::retry_after(Duration::from_secs(2), "429");
        let (outcome, _) = classify(Err(error), 1, 3, &policy());
        let FinishOutcome::Retry { at } = outcome else {
            panic!("expected a retry")
        };
        let delay = (at - before).num_milliseconds();
        assert!((2_000..3_000).contains(&delay), "{delay}");
    }
}
