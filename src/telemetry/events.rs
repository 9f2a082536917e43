//! Events a member logs and counts together: each a struct with typed labels, emitted
//! where it happens in one call, so that a log line never goes without its count.

use super::Metrics;
use crate::store::StoreError;

/// A member's database operation, as `redrive_worker_database_errors_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbOp {
    /// The claim of due tasks.
    Claim,
    /// The batched write of attempt results.
    Finish,
    /// The renewal of leases and claims.
    Heartbeat,
    /// The look for when the next task is due.
    NextDue,
    /// The storing of consumed failures.
    Ingest,
    /// The member's upkeep: its record, retention, causes of earlier tasks, replay jobs.
    Upkeep,
    /// The sampling of the fleet's figures for the metrics.
    Sample,
}

impl DbOp {
    /// Every operation (each label is exported from the start, at zero).
    pub const ALL: [DbOp; 7] = [
        DbOp::Claim,
        DbOp::Finish,
        DbOp::Heartbeat,
        DbOp::NextDue,
        DbOp::Ingest,
        DbOp::Upkeep,
        DbOp::Sample,
    ];

    /// The operation's label.
    pub fn label(self) -> &'static str {
        match self {
            DbOp::Claim => "claim",
            DbOp::Finish => "finish",
            DbOp::Heartbeat => "heartbeat",
            DbOp::NextDue => "next_due",
            DbOp::Ingest => "ingest",
            DbOp::Upkeep => "upkeep",
            DbOp::Sample => "sample",
        }
    }
}

/// A database statement of the member failed.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseFailed<'a> {
    /// What the member was doing.
    pub op: DbOp,
    /// What the database (or the way to it) answered.
    pub error: &'a StoreError,
}

impl DatabaseFailed<'_> {
    /// Counts it by operation and tells the member's health, which logs "unreachable"
    /// once for an error waiting may cure, and any other error each time.
    pub fn emit(&self, metrics: &Metrics) {
        metrics.count_database_error(self.op);
        metrics.health.database_failed(self.op.label(), self.error);
    }
}
