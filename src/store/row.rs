//! Reading a `recovery_task` row into a [`Task`].

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{Result, StoreError};
use crate::headers::{self, Header};
use crate::task::{Failure, Lease, OriginalCoordinates, SourceCoordinates, Task, TaskId};

/// Every column of `recovery_task`, each prefixed with the literal given (`"t."`, or none):
/// statements that read whole tasks name them, never `*`, so that a column a later
/// release's migration adds does not change their result type. PostgreSQL refuses to run
/// a statement prepared for the old one ("cached plan must not change result type"):
/// members of an earlier release, whose claim returned `t.*`, failed every claim after
/// a column was added, until their connections were replaced (found by the upgrade
/// rehearsal, `bench/upgrade-rehearsal/`).
macro_rules! task_columns {
    () => {
        task_columns!("")
    };
    ($p:literal) => {
        concat!(
            $p,
            "id",
            ", ",
            $p,
            "dedup_key",
            ", ",
            $p,
            "handler",
            ", ",
            $p,
            "event_type",
            ", ",
            $p,
            "correlation_id",
            ", ",
            $p,
            "source_topic",
            ", ",
            $p,
            "source_partition",
            ", ",
            $p,
            "source_offset",
            ", ",
            $p,
            "source_timestamp",
            ", ",
            $p,
            "source_timestamp_type",
            ", ",
            $p,
            "msg_key",
            ", ",
            $p,
            "msg_value",
            ", ",
            $p,
            "msg_headers",
            ", ",
            $p,
            "error_class",
            ", ",
            $p,
            "error_message",
            ", ",
            $p,
            "status",
            ", ",
            $p,
            "attempts",
            ", ",
            $p,
            "max_attempts",
            ", ",
            $p,
            "next_attempt_at",
            ", ",
            $p,
            "last_error",
            ", ",
            $p,
            "lease_owner",
            ", ",
            $p,
            "lease_version",
            ", ",
            $p,
            "leased_at",
            ", ",
            $p,
            "checkpoint",
            ", ",
            $p,
            "created_at",
            ", ",
            $p,
            "updated_at",
            ", ",
            $p,
            "finished_at",
            ", ",
            $p,
            "original_topic",
            ", ",
            $p,
            "original_partition",
            ", ",
            $p,
            "original_offset",
            ", ",
            $p,
            "error_stacktrace",
            ", ",
            $p,
            "route",
            ", ",
            $p,
            "ingest_note",
            ", ",
            $p,
            "value_size",
            ", ",
            $p,
            "payload_stored",
            ", ",
            $p,
            "attempt_grants",
            ", ",
            $p,
            "order_key",
            ", ",
            $p,
            "held",
            ", ",
            $p,
            "generation",
            ", ",
            $p,
            "previous_task_id",
            ", ",
            $p,
            "previous_error",
            ", ",
            $p,
            "disposition",
            ", ",
            $p,
            "redrive_job",
            ", ",
            $p,
            "redriven_by"
        )
    };
}
pub(crate) use task_columns;

/// Builds a task from a row that has every column of `recovery_task`.
pub(crate) fn task_from_row(row: &PgRow) -> Result<Task> {
    let headers = stored_headers(row)?;
    task_with_headers(row, headers)
}

/// [`task_from_row`] for showing a task: a row whose stored headers cannot be decoded
/// is read without them. The task, and why its headers are missing, if they are.
pub(crate) fn task_to_show(row: &PgRow) -> Result<(Task, Option<String>)> {
    match stored_headers(row) {
        Ok(headers) => Ok((task_with_headers(row, headers)?, None)),
        Err(error) => Ok((task_with_headers(row, Vec::new())?, Some(error.to_string()))),
    }
}

/// Decodes the row's `msg_headers`.
fn stored_headers(row: &PgRow) -> Result<Vec<Header>> {
    let id = TaskId(row.try_get("id")?);
    let header_bytes: Vec<u8> = row.try_get("msg_headers")?;
    headers::decode(&header_bytes)
        .map_err(|e| StoreError::MalformedRow(format!("task {id}: msg_headers: {e}")))
}

/// Builds a task from a row, its headers decoded already.
fn task_with_headers(row: &PgRow, headers: Vec<Header>) -> Result<Task> {
    let id = TaskId(row.try_get("id")?);
    let status: String = row.try_get("status")?;
    let status = status
        .parse()
        .map_err(|e| StoreError::MalformedRow(format!("task {id}: status: {e}")))?;
    let source = coordinates(row, "source")?;
    let original = original_coordinates(row)?;
    Ok(Task {
        id,
        dedup_key: row.try_get("dedup_key")?,
        handler: row.try_get("handler")?,
        failure: Failure {
            event_type: row.try_get("event_type")?,
            correlation_id: row.try_get("correlation_id")?,
            source,
            source_timestamp: timestamp(row, id, "source_timestamp")?,
            source_timestamp_type: row.try_get("source_timestamp_type")?,
            key: row.try_get("msg_key")?,
            value: row.try_get("msg_value")?,
            headers,
            payload_stored: row.try_get("payload_stored")?,
            value_size: row.try_get("value_size")?,
            original,
            error_class: row.try_get("error_class")?,
            error_message: row.try_get("error_message")?,
            error_stacktrace: row.try_get("error_stacktrace")?,
            route: row.try_get("route")?,
            ingest_note: row.try_get("ingest_note")?,
            generation: row.try_get("generation")?,
            previous_task: row
                .try_get::<Option<i64>, _>("previous_task_id")?
                .map(TaskId),
            previous_error: row.try_get("previous_error")?,
            disposition: row.try_get("disposition")?,
        },
        status,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        attempt_grants: row.try_get("attempt_grants")?,
        next_attempt_at: required_timestamp(row, id, "next_attempt_at")?,
        held: row.try_get("held")?,
        last_error: row.try_get("last_error")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_version: row.try_get("lease_version")?,
        leased_at: timestamp(row, id, "leased_at")?,
        checkpoint: row.try_get("checkpoint")?,
        created_at: required_timestamp(row, id, "created_at")?,
        updated_at: required_timestamp(row, id, "updated_at")?,
        finished_at: timestamp(row, id, "finished_at")?,
        redrive_job: row.try_get("redrive_job")?,
        redriven_by: row.try_get("redriven_by")?,
    })
}

/// Reads timestamp column `name` of task `id`: a time out of range makes the row
/// malformed (see [`super::time`]).
pub(super) fn timestamp(row: &PgRow, id: TaskId, name: &str) -> Result<Option<DateTime<Utc>>> {
    super::time::decode(row, name)?
        .map_err(|why| StoreError::MalformedRow(format!("task {id}: {name}: {why}")))
}

/// [`timestamp`] of a column that is never NULL.
pub(super) fn required_timestamp(row: &PgRow, id: TaskId, name: &str) -> Result<DateTime<Utc>> {
    timestamp(row, id, name)?
        .ok_or_else(|| StoreError::MalformedRow(format!("task {id}: {name}: NULL")))
}

/// Reads `<prefix>_topic`, `<prefix>_partition` and `<prefix>_offset`.
fn coordinates(row: &PgRow, prefix: &str) -> Result<Option<SourceCoordinates>> {
    let topic: Option<String> = row.try_get(format!("{prefix}_topic").as_str())?;
    let partition: Option<i32> = row.try_get(format!("{prefix}_partition").as_str())?;
    let offset: Option<i64> = row.try_get(format!("{prefix}_offset").as_str())?;
    Ok(match (topic, partition, offset) {
        (Some(topic), Some(partition), Some(offset)) => Some(SourceCoordinates {
            topic,
            partition,
            offset,
        }),
        _ => None,
    })
}

/// Reads `original_topic`, `original_partition` and `original_offset`: the topic alone
/// is enough.
fn original_coordinates(row: &PgRow) -> Result<Option<OriginalCoordinates>> {
    let topic: Option<String> = row.try_get("original_topic")?;
    Ok(match topic {
        Some(topic) => Some(OriginalCoordinates {
            topic,
            partition: row.try_get("original_partition")?,
            offset: row.try_get("original_offset")?,
        }),
        None => None,
    })
}

/// A claimed row that could not be read into a [`Task`].
#[derive(Debug)]
pub(crate) struct Unreadable {
    /// The claim the row was taken under: the task's lease, or its compensation's claim.
    pub(crate) lease: Lease,
    /// Why it could not be read.
    pub(crate) reason: String,
}

/// Decodes each row on its own: one malformed row does not take the others with it.
/// Fails only when a row lacks even its id or fencing token.
pub(crate) fn decode_each(rows: &[PgRow]) -> Result<(Vec<Task>, Vec<Unreadable>)> {
    let mut tasks = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for row in rows {
        match decode_one(row, "lease_version")? {
            Ok(task) => tasks.push(task),
            Err(row) => unreadable.push(row),
        }
    }
    Ok((tasks, unreadable))
}

/// Decodes one claimed row whose fencing token is column `fence`: the task, or why it
/// cannot be read under that claim. Fails only when the row lacks its id or token.
pub(crate) fn decode_one(
    row: &PgRow,
    fence: &str,
) -> Result<std::result::Result<Task, Unreadable>> {
    let error = match task_from_row(row) {
        Ok(task) => return Ok(Ok(task)),
        Err(error) => error,
    };
    Ok(Err(Unreadable {
        lease: Lease {
            id: TaskId(row.try_get("id")?),
            version: row.try_get(fence)?,
        },
        reason: error.to_string(),
    }))
}
