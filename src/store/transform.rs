//! Payload transforms as rows: the stored values of a selection read batch by batch, and
//! each changed value written as a new version (the value as it came kept), only where it
//! is still the value the transform read: a task is transformed whole or not at all.

use sqlx::Row;

use super::filter::{bind_selection, Selection, CONDITION};
use super::operate::Operator;
use super::{Result, Store, ORDERED_WALK};
use crate::task::TaskId;

/// The statuses a transform applies to: those a retry or a replay redrives.
pub const TRANSFORMABLE: [&str; 3] = ["failed", "permanent_failure", "discarded"];

/// One stored payload as a transform reads it.
#[derive(Debug, Clone)]
pub struct StoredPayload {
    /// The task.
    pub id: TaskId,
    /// Its value; none when the message had none.
    pub value: Option<Vec<u8>>,
    /// False when the payload was too large to store at ingest.
    pub payload_stored: bool,
}

/// A new version of one task's value.
#[derive(Debug, Clone)]
pub struct NewPayload {
    /// The task.
    pub id: TaskId,
    /// The value the transform read.
    pub old: Vec<u8>,
    /// The value it wrote.
    pub new: Vec<u8>,
}

impl Store {
    /// The next payloads of `selection` after task id `after` (at most `limit`, in id
    /// order) in a status a transform applies to.
    pub async fn payloads(
        &self,
        selection: &Selection,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredPayload>> {
        let statement = format!(
            "SELECT id, msg_value, payload_stored FROM recovery_task \
             WHERE {CONDITION} AND id > $20 AND status = ANY($21) ORDER BY id LIMIT $22"
        );
        let mut tx = self.pool.begin_with(ORDERED_WALK).await?;
        let rows = bind_selection(sqlx::query(&statement), selection)
            .bind(after)
            .bind(&TRANSFORMABLE[..])
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|row| {
                Ok(StoredPayload {
                    id: TaskId(row.try_get("id")?),
                    value: row.try_get("msg_value")?,
                    payload_stored: row.try_get("payload_stored")?,
                })
            })
            .collect()
    }

    /// How many tasks of `selection` a transform applies to (by status).
    pub async fn count_transformable(&self, selection: &Selection) -> Result<i64> {
        let statement =
            format!("SELECT count(*) FROM recovery_task WHERE {CONDITION} AND status = ANY($20)");
        let row = bind_selection(sqlx::query(&statement), selection)
            .bind(&TRANSFORMABLE[..])
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Opens the audit row of a transform by `operator` of `selection` (`details`: the
    /// transform), count 0; each batch adds what it wrote.
    pub async fn begin_transform(
        &self,
        operator: &Operator,
        selection: &Selection,
        details: serde_json::Value,
    ) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let audit = self
            .insert_audit(
                &mut tx,
                operator,
                "transform",
                Some(selection),
                Some(details),
            )
            .await?;
        tx.commit().await?;
        Ok(audit)
    }

    /// Writes `payloads` as new versions, each only where the stored value is still the
    /// one read and the task still in a status a transform applies to, and adds what it
    /// wrote to audit row `audit`, in one transaction: the tasks it wrote.
    pub async fn write_payloads(&self, audit: i64, payloads: &[NewPayload]) -> Result<Vec<TaskId>> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = payloads.iter().map(|p| p.id.0).collect();
        let olds: Vec<&[u8]> = payloads.iter().map(|p| p.old.as_slice()).collect();
        let news: Vec<&[u8]> = payloads.iter().map(|p| p.new.as_slice()).collect();
        let mut tx = self.pool.begin().await?;
        let written: Vec<i64> = sqlx::query_scalar(
            "UPDATE recovery_task t SET msg_value = v.new, \
                 original_value = coalesce(t.original_value, t.msg_value), \
                 payload_version = t.payload_version + 1, \
                 updated_at = now() \
             FROM unnest($1::bigint[], $2::bytea[], $3::bytea[]) AS v(id, old, new) \
             WHERE t.id = v.id AND t.msg_value = v.old AND t.status = ANY($4) \
             RETURNING t.id",
        )
        .bind(&ids)
        .bind(&olds)
        .bind(&news)
        .bind(&TRANSFORMABLE[..])
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query("UPDATE recovery_audit SET count = count + $2 WHERE id = $1")
            .bind(audit)
            .bind(written.len() as i64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(written.into_iter().map(TaskId).collect())
    }

    /// Task `id`'s value as it came, when a transform changed it, and its version (1: as
    /// it came).
    pub async fn payload_version(&self, id: TaskId) -> Result<(Option<Vec<u8>>, i32)> {
        let row =
            sqlx::query("SELECT original_value, payload_version FROM recovery_task WHERE id = $1")
                .bind(id.0)
                .fetch_optional(&self.pool)
                .await?;
        match row {
            Some(row) => Ok((
                row.try_get("original_value")?,
                row.try_get("payload_version")?,
            )),
            None => Ok((None, 1)),
        }
    }
}
