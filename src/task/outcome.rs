//! The vocabulary of attempt outcomes: how the handler answered (for the breakers and
//! brakes), what an attempt decided for its task, and what its row in the attempt
//! history (`recovery_attempt.outcome`) says happened.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::Status;

/// How the handler answered, for a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The handler was not called (no attempts left).
    NotCalled,
    /// It succeeded, or failed permanently: the downstream answered.
    Answered,
    /// It failed transiently (an error or a timeout).
    Transient,
    /// It panicked: a transient failure for the task and the breaker, and a failure of
    /// the handler's own for the bad-deploy brake.
    Panicked,
}

/// What an attempt decided for its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishOutcome {
    /// The handler succeeded: the task is RESOLVED.
    Resolved,
    /// Try again at the given time.
    Retry {
        /// When the next attempt is due.
        at: DateTime<Utc>,
    },
    /// No more attempts: the task is PERMANENT_FAILURE.
    PermanentFailure,
    /// The attempt was past the task's budget (earlier attempts lapsed with their
    /// leases): the task is PERMANENT_FAILURE without its handler having been called.
    NotCalled,
}

impl FinishOutcome {
    /// The task's status once the outcome is written.
    pub fn status(self) -> Status {
        match self {
            FinishOutcome::Resolved => Status::Resolved,
            FinishOutcome::Retry { .. } => Status::Failed,
            FinishOutcome::PermanentFailure | FinishOutcome::NotCalled => Status::PermanentFailure,
        }
    }

    /// The outcome as written to the attempt history.
    pub fn history(self) -> AttemptOutcome {
        match self {
            FinishOutcome::Resolved => AttemptOutcome::Resolved,
            FinishOutcome::Retry { .. } => AttemptOutcome::Retry,
            FinishOutcome::PermanentFailure => AttemptOutcome::PermanentFailure,
            FinishOutcome::NotCalled => AttemptOutcome::NotCalled,
        }
    }
}

/// What a row of the attempt history says happened. The `recovery_attempt.outcome`
/// column holds these values and no other (a `CHECK` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The handler succeeded.
    Resolved,
    /// The handler failed; the task is due again.
    Retry,
    /// The handler failed for good, or for the last time its budget allowed.
    PermanentFailure,
    /// The attempt was past the task's budget: the task ended without a call.
    NotCalled,
    /// The attempt's lease lapsed (its member died or stalled); written by the claim
    /// that took the task over.
    LeaseExpired,
    /// The lease was given back at shutdown before the handler finished; not counted.
    Released,
    /// An operator acted while the attempt ran; its result was dropped.
    Fenced,
    /// An operator retried the task; not an attempt.
    OperatorRetry,
    /// An operator discarded the task; not an attempt.
    OperatorDiscard,
    /// An operator resolved the task; not an attempt.
    OperatorResolve,
}

impl AttemptOutcome {
    /// Every outcome, in the order the history's `CHECK` lists them.
    pub const ALL: [AttemptOutcome; 10] = [
        AttemptOutcome::Resolved,
        AttemptOutcome::Retry,
        AttemptOutcome::PermanentFailure,
        AttemptOutcome::NotCalled,
        AttemptOutcome::LeaseExpired,
        AttemptOutcome::Released,
        AttemptOutcome::Fenced,
        AttemptOutcome::OperatorRetry,
        AttemptOutcome::OperatorDiscard,
        AttemptOutcome::OperatorResolve,
    ];

    /// The value stored in the `outcome` column.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Resolved => "resolved",
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::PermanentFailure => "permanent_failure",
            AttemptOutcome::NotCalled => "not_called",
            AttemptOutcome::LeaseExpired => "lease_expired",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Fenced => "fenced",
            AttemptOutcome::OperatorRetry => "operator_retry",
            AttemptOutcome::OperatorDiscard => "operator_discard",
            AttemptOutcome::OperatorResolve => "operator_resolve",
        }
    }

    /// Whether the row records a handler's answer (a call made within the budget).
    pub fn answered(self) -> bool {
        matches!(
            self,
            AttemptOutcome::Resolved | AttemptOutcome::Retry | AttemptOutcome::PermanentFailure
        )
    }

    /// Whether the row stands for an attempt counted in the task's `attempts` (not an
    /// attempt given back, nor an operator's action).
    pub fn counted(self) -> bool {
        !matches!(
            self,
            AttemptOutcome::Released
                | AttemptOutcome::OperatorRetry
                | AttemptOutcome::OperatorDiscard
                | AttemptOutcome::OperatorResolve
        )
    }

    /// The column values of the outcomes `keep` selects, to bind as a `text[]`.
    pub(crate) fn values_where(keep: impl Fn(AttemptOutcome) -> bool) -> Vec<&'static str> {
        Self::ALL
            .into_iter()
            .filter(|&o| keep(o))
            .map(AttemptOutcome::as_str)
            .collect()
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An outcome string that is not one of the known ones.
#[derive(Debug, thiserror::Error)]
#[error("unknown attempt outcome {0:?}")]
pub struct UnknownOutcome(pub String);

impl FromStr for AttemptOutcome {
    type Err = UnknownOutcome;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| UnknownOutcome(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_through_their_column_value_and_serde() {
        for outcome in AttemptOutcome::ALL {
            assert_eq!(outcome.as_str().parse::<AttemptOutcome>().unwrap(), outcome);
            let json = serde_json::to_value(outcome).unwrap();
            assert_eq!(json, outcome.as_str());
            assert_eq!(
                serde_json::from_value::<AttemptOutcome>(json).unwrap(),
                outcome
            );
        }
        let distinct: std::collections::HashSet<_> =
            AttemptOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(distinct.len(), AttemptOutcome::ALL.len());
        assert!("operator_".parse::<AttemptOutcome>().is_err());
    }

    #[test]
    fn a_finish_outcome_writes_its_status_and_history() {
        let at = Utc::now();
        let cases = [
            (FinishOutcome::Resolved, Status::Resolved, "resolved"),
            (FinishOutcome::Retry { at }, Status::Failed, "retry"),
            (
                FinishOutcome::PermanentFailure,
                Status::PermanentFailure,
                "permanent_failure",
            ),
            (
                FinishOutcome::NotCalled,
                Status::PermanentFailure,
                "not_called",
            ),
        ];
        for (outcome, status, history) in cases {
            assert_eq!(
                (outcome.status(), outcome.history().as_str()),
                (status, history)
            );
        }
        assert!(!AttemptOutcome::NotCalled.answered());
        assert!(AttemptOutcome::NotCalled.counted());
    }
}
