//! Fleet-wide figures for the metrics, computed by one member per interval (whichever
//! first finds the last sample old) and read by every member, so that the counting
//! query runs once per interval for the whole fleet, not once per scrape per member.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::members::MEMBER_LIVE_WITHIN;
use super::{Result, Store};

/// The figures of one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetFigures {
    /// (status, handler, tasks).
    pub tasks: Vec<(String, String, i64)>,
    /// (handler, tasks due now, seconds the oldest has waited).
    pub due: Vec<(String, i64, f64)>,
    /// Members seen recently.
    pub members_live: i64,
}

impl Store {
    /// Takes the turn to sample if the last sample is older than `interval` (one member
    /// wins each turn), computes and stores the figures; then answers the latest figures.
    pub async fn sample_figures(&self, interval: Duration) -> Result<FleetFigures> {
        let turn: Option<i32> = sqlx::query_scalar(
            "INSERT INTO recovery_sample (id, sampled_at, figures) VALUES (1, now(), '{}') \
             ON CONFLICT (id) DO UPDATE SET sampled_at = now() \
             WHERE recovery_sample.sampled_at < now() - $1 * interval '1 millisecond' \
             RETURNING id",
        )
        .bind(interval.as_millis() as f64 * 0.9)
        .fetch_optional(&self.pool)
        .await?;
        if turn.is_some() {
            let figures = self.count_figures().await?;
            sqlx::query("UPDATE recovery_sample SET figures = $1 WHERE id = 1")
                .bind(serde_json::to_value(&figures).expect("figures serialize"))
                .execute(&self.pool)
                .await?;
            return Ok(figures);
        }
        let stored: serde_json::Value =
            sqlx::query_scalar("SELECT figures FROM recovery_sample WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
        Ok(serde_json::from_value(stored).unwrap_or_default())
    }

    async fn count_figures(&self) -> Result<FleetFigures> {
        let tasks = sqlx::query_as(
            "SELECT status, handler, count(*) FROM recovery_task GROUP BY status, handler",
        )
        .fetch_all(&self.pool)
        .await?;
        let due = sqlx::query_as(
            "SELECT handler, count(*), extract(epoch FROM now() - min(next_attempt_at))::float8 \
             FROM recovery_task WHERE status = 'failed' AND next_attempt_at <= now() \
             GROUP BY handler",
        )
        .fetch_all(&self.pool)
        .await?;
        let members_live = sqlx::query_scalar(
            "SELECT count(*) FROM recovery_member \
             WHERE last_seen > now() - $1 * interval '1 millisecond'",
        )
        .bind(MEMBER_LIVE_WITHIN.as_millis() as f64)
        .fetch_one(&self.pool)
        .await?;
        Ok(FleetFigures {
            tasks,
            due,
            members_live,
        })
    }
}
