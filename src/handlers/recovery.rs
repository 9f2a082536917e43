//! Recovery points: a handler saves how far it got (JSON) during an attempt; the next
//! attempt of the task finds it in `task.checkpoint` and carries on from there.

use std::sync::{Arc, Mutex, PoisonError};

use crate::store::{Store, StoreError};
use crate::task::Lease;

/// Why a checkpoint was not saved.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The attempt lost its lease (taken over, or an operator acted): a newer attempt or
    /// decision owns the task, and a stale attempt's checkpoint is refused.
    #[error("checkpoint refused: the attempt lost its lease (the task was taken over or an operator acted)")]
    Fenced,
    /// The context has nowhere to save it (one built with [`crate::HandlerContext::new`]).
    #[error("no place to save a checkpoint (a context built with HandlerContext::new)")]
    Unavailable,
    /// The database could not be reached.
    #[error("checkpoint not saved: {0}")]
    Store(#[from] StoreError),
}

/// Where an attempt's recovery points go.
#[derive(Debug, Clone)]
pub(crate) enum RecoveryPoints {
    /// Its task's row, under its lease (an attempt of a stored task).
    Stored { store: Store, lease: Lease },
    /// Kept in memory (process mode's inline attempt, whose failure is stored with the
    /// last one; or a handler's test).
    Kept(KeptCheckpoint),
}

impl RecoveryPoints {
    pub(crate) async fn save(&self, checkpoint: &serde_json::Value) -> Result<(), CheckpointError> {
        match self {
            RecoveryPoints::Stored { store, lease } => {
                match store.save_checkpoint(*lease, checkpoint).await? {
                    true => Ok(()),
                    false => Err(CheckpointError::Fenced),
                }
            }
            RecoveryPoints::Kept(kept) => {
                kept.replace(checkpoint.clone());
                Ok(())
            }
        }
    }
}

/// The last checkpoint an attempt saved, kept in memory until it is read.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeptCheckpoint(Arc<Mutex<Option<serde_json::Value>>>);

impl KeptCheckpoint {
    fn replace(&self, checkpoint: serde_json::Value) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(checkpoint);
    }

    /// The last checkpoint saved, if any.
    pub(crate) fn last(&self) -> Option<serde_json::Value> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
