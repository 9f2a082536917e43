//! The last hour's attempt outcomes minute by minute, for the console's chart. It reads
//! the same history rows as [`Store::stats`]'s `last_hour` (one pass over the attempts
//! of the last hour), grouped by minute as well.

use serde::Serialize;
use sqlx::Row;

use super::{Result, Store};

/// Attempts with one outcome that started in one minute of the last hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutcomeMinute {
    /// Whole minutes before the database's now: 0 is the current minute, 59 the oldest.
    pub minutes_ago: i32,
    /// `resolved`, `retry`, `permanent_failure`, `fenced`, `operator_retry`, ...
    pub outcome: String,
    /// How many.
    pub count: i64,
}

impl Store {
    /// The last hour's history rows counted per minute and outcome, newest minute first.
    pub async fn outcome_minutes(&self) -> Result<Vec<OutcomeMinute>> {
        let rows = sqlx::query(
            "SELECT least(floor(extract(epoch FROM now() - started_at) / 60), 59)::int AS ago, \
                    outcome, count(*) AS n \
             FROM recovery_attempt WHERE started_at > now() - interval '1 hour' \
             GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(OutcomeMinute {
                    minutes_ago: r.try_get::<i32, _>("ago")?.max(0),
                    outcome: r.try_get("outcome")?,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }
}
