//! Why an operation was refused or failed, in kinds every face can render: the admin
//! API maps each to an HTTP status, the CLI prints its text.

use crate::replay::ReplayError;
use crate::store::{Approval, ApprovalRowError, ReplayRowError, StoreError};

/// Result alias of the operations.
pub type Result<T, E = OperationError> = std::result::Result<T, E>;

/// Why an operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    /// The request is wrong (a bad filter, a value out of bounds, a missing reason);
    /// the text names the field.
    #[error("{0}")]
    BadRequest(String),
    /// What it names does not exist (a task, a replay job, a breaker, a route).
    #[error("{0}")]
    NotFound(String),
    /// The actor may not do this (a read-only actor asking for a change).
    #[error("{0}")]
    Forbidden(String),
    /// What it names is not in a state for this (a replay job that ended, a brake that
    /// is not engaged).
    #[error("{0}")]
    Conflict(String),
    /// Kafka could not be reached or refused (checking a replay's topics).
    #[error("kafka: {0}")]
    Kafka(String),
    /// The database failed.
    #[error(transparent)]
    Store(StoreError),
    /// The action selects more tasks than `operations.approval_over`: it was recorded
    /// as waiting for a second operator, and nothing else was done.
    #[error(
        "this {verb} selects {selected} tasks, more than operations.approval_over ({over}): it \
         waits as approval {id} for a second operator (`redrive approvals approve {id}`, \
         or the console's Approvals page); nothing was done yet",
        verb = approval.verb, selected = approval.selected, id = approval.id
    )]
    NeedsApproval {
        /// The deployment's threshold.
        over: u64,
        /// The approval recorded.
        approval: Box<Approval>,
    },
    /// This process runs as many heavy reads (counts of every task) as it allows
    /// ([`super::HEAVY_READS`]); the text says when to try again.
    #[error("{0}")]
    Busy(String),
    /// A count this caller waited on failed so: every caller that waited is told the
    /// same at once, rather than each counting again behind the others.
    #[error("{0}")]
    Shared(std::sync::Arc<OperationError>),
}

impl OperationError {
    /// A [`OperationError::Busy`]: every heavy-read slot of this process is taken.
    pub fn busy() -> OperationError {
        OperationError::Busy(format!(
            "the {} heavy reads (stats, check, groupings) this member runs at once are all \
             running; try again in a few seconds",
            super::HEAVY_READS
        ))
    }

    /// A [`OperationError::BadRequest`] saying `message`.
    pub fn bad_request(message: impl Into<String>) -> OperationError {
        OperationError::BadRequest(message.into())
    }
}

impl From<StoreError> for OperationError {
    fn from(error: StoreError) -> OperationError {
        match error {
            StoreError::UnknownTasks(_) | StoreError::Replay(ReplayRowError::Unknown(_)) => {
                OperationError::NotFound(error.to_string())
            }
            StoreError::Replay(ReplayRowError::NotYours { .. })
            | StoreError::NotEngaged(_)
            | StoreError::Approval(ApprovalRowError::Decided { .. }) => {
                OperationError::Conflict(error.to_string())
            }
            StoreError::Approval(ApprovalRowError::Unknown(_)) => {
                OperationError::NotFound(error.to_string())
            }
            StoreError::Approval(ApprovalRowError::OwnAction { .. }) => {
                OperationError::Forbidden(error.to_string())
            }
            other => OperationError::Store(other),
        }
    }
}

impl From<ReplayError> for OperationError {
    fn from(error: ReplayError) -> OperationError {
        match error {
            ReplayError::Store(error) => error.into(),
            ReplayError::UnknownTopic(_) | ReplayError::Invalid(_) => {
                OperationError::BadRequest(error.to_string())
            }
            ReplayError::Kafka(reason) => OperationError::Kafka(reason),
        }
    }
}
