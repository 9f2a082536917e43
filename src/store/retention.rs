//! Retention: final tasks older than their status's age are deleted with their history
//! and compensation (never while the compensation is owed),
//! oldest first, a few hundred per transaction. Rows another member is deleting are
//! skipped (`SKIP LOCKED`), so members never do the same rows twice nor wait on each other.

use std::time::Duration;

use super::{Result, Store, ORDERED_WALK};
use crate::task::Status;

/// Tasks deleted per transaction.
pub const RETENTION_BATCH: i64 = 500;

const DELETE_BATCH: &str = r#"
WITH expired AS (
    SELECT id FROM recovery_task
    WHERE finished_at IS NOT NULL AND finished_at < now() - $2 * interval '1 millisecond'
      AND status = $1
      -- A task stays while its compensation is owed.
      AND NOT EXISTS (SELECT 1 FROM recovery_compensation c
                      WHERE c.task_id = recovery_task.id AND c.state = 'pending')
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED),
history AS (
    DELETE FROM recovery_attempt WHERE task_id IN (SELECT id FROM expired)),
compensation AS (
    DELETE FROM recovery_compensation WHERE task_id IN (SELECT id FROM expired)),
compensation_history AS (
    DELETE FROM recovery_compensation_attempt WHERE task_id IN (SELECT id FROM expired)),
gone AS (
    DELETE FROM recovery_task WHERE id IN (SELECT id FROM expired) RETURNING id)
SELECT count(*) FROM gone
"#;

impl Store {
    /// Deletes one batch of `status` tasks finished more than `age` ago, and their
    /// history. Returns how many tasks went (fewer than a batch: nothing more is due).
    pub async fn delete_expired(&self, status: Status, age: Duration) -> Result<i64> {
        debug_assert!(status.is_final(), "only final tasks expire");
        let mut tx = self.pool.begin_with(ORDERED_WALK).await?;
        let deleted = sqlx::query_scalar(DELETE_BATCH)
            .bind(status.as_str())
            .bind(age.as_millis() as f64)
            .bind(RETENTION_BATCH)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted)
    }
}
