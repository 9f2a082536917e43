//! Re-failures: what ingest reads about the task a captured message says it came from.

use sqlx::Row;
use std::collections::HashMap;

use super::{Result, Store};
use crate::task::TaskId;

/// A stored task that a captured message names in its `redrive-task-id` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ancestor {
    /// Its id.
    pub id: TaskId,
    /// Its generation.
    pub generation: i32,
    /// The route that captured it.
    pub route: Option<String>,
    /// The topic its message lived on before it was dead-lettered.
    pub original_topic: Option<String>,
    /// What its dead letter reported, else its last attempt's error.
    pub error: Option<String>,
}

impl Store {
    /// The newest task id drawn from the id sequence (by a stored task or a
    /// reservation), if any was.
    pub async fn newest_task_id(&self) -> Result<Option<TaskId>> {
        let newest: Option<i64> = sqlx::query_scalar(
            "SELECT pg_sequence_last_value(pg_get_serial_sequence('recovery_task', 'id')::regclass)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(newest.map(TaskId))
    }

    /// The tasks among `ids` that exist, by id.
    pub async fn ancestors(&self, ids: &[TaskId]) -> Result<HashMap<TaskId, Ancestor>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let raw: Vec<i64> = ids.iter().map(|id| id.0).collect();
        let rows = sqlx::query(
            "SELECT id, generation, route, original_topic, \
                    coalesce(error_message, last_error) AS error \
             FROM recovery_task WHERE id = ANY($1)",
        )
        .bind(raw)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let id = TaskId(row.try_get("id")?);
                let ancestor = Ancestor {
                    id,
                    generation: row.try_get("generation")?,
                    route: row.try_get("route")?,
                    original_topic: row.try_get("original_topic")?,
                    error: row.try_get("error")?,
                };
                Ok((id, ancestor))
            })
            .collect()
    }
}
