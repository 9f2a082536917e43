//! One way to call a handler, used by the worker pool and by process-mode ingest alike:
//! under its timeout, with a panic caught, and the verdict classified into what happens
//! to the task next.

use chrono::{DateTime, Utc};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use super::{HandlerContext, HandlerError, Policy, Registered};
use crate::task::{AttemptKind, Cause, FinishOutcome, Task, Verdict};

/// The longest delay before a retry: a larger backoff or Retry-After is clamped to it,
/// so adding it to the current time can never overflow.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);

/// What one attempt decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempted {
    /// How the handler answered.
    pub verdict: Verdict,
    /// What happens to the task next.
    pub outcome: FinishOutcome,
    /// The attempt's error, if it failed.
    pub error: Option<String>,
    /// What broke, if it failed: how the handler answered and its message's fingerprint.
    pub cause: Option<Cause>,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// How long the handler ran.
    pub duration: Duration,
}

/// Runs attempt `ctx.attempt` of `task`: calls the handler under `policy.timeout`
/// (a timeout or a panic is a transient failure), then classifies the verdict against
/// the attempt budget. An attempt beyond the budget (attempts used up by workers that
/// died mid-call) ends the task without calling the handler.
pub(crate) async fn invoke(
    registered: &Registered,
    ctx: &HandlerContext,
    task: &Task,
) -> Attempted {
    let policy = &registered.policy;
    let max_attempts = task
        .max_attempts
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(policy.max_attempts)
        .saturating_add(u32::try_from(task.attempt_grants).unwrap_or(0));
    let started_at = Utc::now();
    let clock = Instant::now();
    let (outcome, error, kind, cause) = if ctx.attempt > max_attempts {
        let error = format!(
            "no attempts left: attempt {} exceeds max attempts {max_attempts}",
            ctx.attempt
        );
        let cause = Cause::of_attempt(AttemptKind::NoAttemptsLeft, &error);
        (
            FinishOutcome::NotCalled,
            Some(error),
            Verdict::NotCalled,
            Some(cause),
        )
    } else {
        let guarded = call(registered, ctx, task).await;
        let cause = guarded.cause();
        let kind = match &guarded.verdict {
            _ if guarded.failure == Some(AttemptKind::Panic) => Verdict::Panicked,
            Ok(()) | Err(HandlerError::Permanent(_)) => Verdict::Answered,
            Err(_) => Verdict::Transient,
        };
        let (outcome, error) = classify(guarded.verdict, ctx.attempt, max_attempts, policy);
        (outcome, error, kind, cause)
    };
    let duration = clock.elapsed();
    Attempted {
        verdict: kind,
        outcome,
        error,
        cause,
        started_at,
        duration,
    }
}

/// The handler's verdict, with its timeout applied and a panic caught. A call whose
/// lease is lost (the context's cancellation fires: taken over, fenced, or past its
/// deadline while the database could not be reached) is stopped at once, whether or
/// not the handler watches the token: its late effects could land after the next
/// attempt's, or after the next task of its key.
async fn call(registered: &Registered, ctx: &HandlerContext, task: &Task) -> Guarded {
    let lost = || Guarded {
        verdict: Err(HandlerError::Transient(
            "the lease was lost; the call was stopped".into(),
        )),
        failure: Some(AttemptKind::LeaseLost),
    };
    if ctx.cancellation.is_cancelled() {
        return lost();
    }
    let call = guarded(
        registered.policy.timeout,
        registered.handler.handle(ctx, task),
    );
    tokio::pin!(call);
    tokio::select! {
        biased;
        verdict = &mut call => verdict,
        _ = ctx.cancellation.cancelled() => {
            // A handler that watches its token gets a moment to stop on its own.
            let _ = tokio::time::timeout(CANCEL_GRACE, &mut call).await;
            lost()
        }
    }
}

/// How long a cancelled call may take to notice its token before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_millis(250);

/// A handler method's verdict under its timeout, with a panic caught.
pub(crate) struct Guarded {
    /// The verdict: a timeout or a panic is a transient failure.
    pub(crate) verdict: Result<(), HandlerError>,
    /// How the call failed where the handler did not say (it timed out, panicked or
    /// lost its lease); `None` when the verdict is the handler's own.
    pub(crate) failure: Option<AttemptKind>,
}

impl Guarded {
    /// What broke, when the call failed.
    fn cause(&self) -> Option<Cause> {
        let error = self.verdict.as_ref().err()?;
        let (kind, message) = match error {
            HandlerError::Transient(message) => (AttemptKind::Transient, message),
            HandlerError::Permanent(message) => (AttemptKind::Permanent, message),
            HandlerError::RetryAfter { message, .. } => (AttemptKind::RetryAfter, message),
        };
        Some(Cause::of_attempt(self.failure.unwrap_or(kind), message))
    }
}

/// The verdict of `call` (a handler method), under `timeout` and with a panic caught:
/// both are transient failures.
pub(crate) async fn guarded(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<(), HandlerError>>,
) -> Guarded {
    let call = tokio::time::timeout(timeout, call);
    let (verdict, failure) = match AssertUnwindSafe(call).catch_unwind().await {
        Ok(Ok(verdict)) => (verdict, None),
        Ok(Err(_elapsed)) => {
            let error = format!(
                "handler timed out after {}",
                humantime::format_duration(timeout)
            );
            (
                Err(HandlerError::Transient(error)),
                Some(AttemptKind::Timeout),
            )
        }
        Err(panic) => {
            let error = format!(
                "handler panicked: {}",
                crate::parts::panic_message(panic.as_ref())
            );
            (
                Err(HandlerError::Transient(error)),
                Some(AttemptKind::Panic),
            )
        }
    };
    Guarded { verdict, failure }
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
    let at = retry_time(Utc::now(), delay);
    (FinishOutcome::Retry { at }, Some(error.to_string()))
}

/// `now + delay`, with the delay clamped to [`MAX_RETRY_DELAY`].
pub(crate) fn retry_time(now: DateTime<Utc>, delay: Duration) -> DateTime<Utc> {
    let delay = chrono::Duration::from_std(delay.min(MAX_RETRY_DELAY))
        .expect("MAX_RETRY_DELAY fits a chrono duration");
    now.checked_add_signed(delay)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::{Backoff, Jitter};

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

    /// Regression: `now + delay` overflowed (a panic outside the handler's guard) for a
    /// huge backoff cap or a server's Retry-After.
    #[test]
    fn huge_delays_are_clamped_not_a_panic() {
        let mut p = policy();
        p.backoff.cap = Duration::MAX;
        p.backoff.base = Duration::MAX;
        let before = Utc::now();
        for verdict in [
            HandlerError::transient("down"),
            HandlerError::retry_after(Duration::MAX, "come back in 10^12 years"),
        ] {
            let (outcome, _) = classify(Err(verdict), 1, 3, &p);
            let FinishOutcome::Retry { at } = outcome else {
                panic!("expected a retry")
            };
            let delay = (at - before).to_std().unwrap();
            assert!(
                delay <= MAX_RETRY_DELAY + Duration::from_secs(1),
                "{delay:?}"
            );
            assert!(
                delay >= MAX_RETRY_DELAY - Duration::from_secs(60),
                "{delay:?}"
            );
        }
        assert_eq!(
            retry_time(DateTime::<Utc>::MAX_UTC, Duration::from_secs(1)),
            DateTime::<Utc>::MAX_UTC
        );
    }
}
