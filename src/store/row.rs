//! Reading a `recovery_task` row into a [`Task`].

use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{Result, StoreError};
use crate::headers;
use crate::task::{SourceCoordinates, Task, TaskId};

/// Builds a task from a row that has every column of `recovery_task`.
pub(crate) fn task_from_row(row: &PgRow) -> Result<Task> {
    let id = TaskId(row.try_get("id")?);
    let status: String = row.try_get("status")?;
    let status = status
        .parse()
        .map_err(|e| StoreError::MalformedRow(format!("task {id}: {e}")))?;
    let header_bytes: Vec<u8> = row.try_get("msg_headers")?;
    let headers = headers::decode(&header_bytes)
        .map_err(|e| StoreError::MalformedRow(format!("task {id}: {e}")))?;
    let topic: Option<String> = row.try_get("source_topic")?;
    let partition: Option<i32> = row.try_get("source_partition")?;
    let offset: Option<i64> = row.try_get("source_offset")?;
    let source = match (topic, partition, offset) {
        (Some(topic), Some(partition), Some(offset)) => Some(SourceCoordinates {
            topic,
            partition,
            offset,
        }),
        _ => None,
    };
    Ok(Task {
        id,
        dedup_key: row.try_get("dedup_key")?,
        handler: row.try_get("handler")?,
        event_type: row.try_get("event_type")?,
        correlation_id: row.try_get("correlation_id")?,
        source,
        source_timestamp: row.try_get("source_timestamp")?,
        source_timestamp_type: row.try_get("source_timestamp_type")?,
        key: row.try_get("msg_key")?,
        value: row.try_get("msg_value")?,
        headers,
        error_class: row.try_get("error_class")?,
        error_message: row.try_get("error_message")?,
        status,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        last_error: row.try_get("last_error")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_version: row.try_get("lease_version")?,
        leased_at: row.try_get("leased_at")?,
        checkpoint: row.try_get("checkpoint")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

/// Decodes every row, stopping at the first malformed one.
pub(crate) fn tasks_from_rows(rows: &[PgRow]) -> Result<Vec<Task>> {
    rows.iter().map(task_from_row).collect()
}
