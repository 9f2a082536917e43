//! Recovery points: a handler saves how far it got (JSON) during an attempt; the next
//! attempt of the task finds it in `task.checkpoint` and carries on from there.

use crate::store::{Store, StoreError};
use crate::task::Lease;

/// Why a checkpoint was not saved.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The attempt lost its lease (taken over, or an operator acted): a newer attempt or
    /// decision owns the task, and a stale attempt's checkpoint is refused.
    #[error("checkpoint refused: the attempt lost its lease (the task was taken over or an operator acted)")]
    Fenced,
    /// A process-mode inline attempt has no stored task yet to save it on.
    #[error("no stored task to save a checkpoint on (a process-mode inline attempt)")]
    Unavailable,
    /// The database could not be reached.
    #[error("checkpoint not saved: {0}")]
    Store(#[from] StoreError),
}

/// Where an attempt's recovery points go: its task's row, under its lease.
#[derive(Debug, Clone)]
pub(crate) struct RecoveryPoints {
    pub(crate) store: Store,
    pub(crate) lease: Lease,
}

impl RecoveryPoints {
    pub(crate) async fn save(&self, checkpoint: &serde_json::Value) -> Result<(), CheckpointError> {
        match self.store.save_checkpoint(self.lease, checkpoint).await? {
            true => Ok(()),
            false => Err(CheckpointError::Fenced),
        }
    }
}
