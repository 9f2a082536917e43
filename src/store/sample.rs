//! Fleet-wide figures for the metrics, computed by one member per interval (whichever
//! first finds the last sample old) and read by every member, so that the counting
//! query runs once per interval for the whole fleet, not once per scrape per member.
//!
//! Each turn counts what is unfinished or unsuccessful, through the partial indexes that
//! hold those tasks: its cost follows the backlog, not the store. Resolved tasks, the
//! bulk of a store, are recounted only every [`RESOLVED_RECOUNT`]: counting them reads
//! every one (ten million took a core 4 s), and the alerts never look at them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::members::MEMBER_LIVE_WITHIN;
use super::{Result, Store};

/// How long the count of resolved tasks is reused by later samples.
pub const RESOLVED_RECOUNT: Duration = Duration::from_secs(300);

/// The figures of one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetFigures {
    /// (status, handler, tasks); the resolved ones as of `resolved_counted_at`.
    pub tasks: Vec<(String, String, i64)>,
    /// When the resolved tasks were last counted (PostgreSQL's clock).
    #[serde(default)]
    pub resolved_counted_at: Option<DateTime<Utc>>,
    /// (handler, tasks due now, seconds the oldest has waited).
    pub due: Vec<(String, i64, f64)>,
    /// Members seen recently.
    pub members_live: i64,
}

impl Store {
    /// Takes the turn to sample if the last sample is older than `interval` (one member
    /// wins each turn), computes and stores the figures; then answers the latest figures.
    pub async fn sample_figures(&self, interval: Duration) -> Result<FleetFigures> {
        // The turn answers the previous figures (the upsert leaves them) and the time.
        let turn: Option<(serde_json::Value, DateTime<Utc>)> = sqlx::query_as(
            "INSERT INTO recovery_sample (id, sampled_at, figures) VALUES (1, now(), '{}') \
             ON CONFLICT (id) DO UPDATE SET sampled_at = now() \
             WHERE recovery_sample.sampled_at < now() - $1 * interval '1 millisecond' \
             RETURNING figures, now()",
        )
        .bind(interval.as_millis() as f64 * 0.9)
        .fetch_optional(&self.pool)
        .await?;
        if let Some((previous, now)) = turn {
            let previous: FleetFigures = serde_json::from_value(previous).unwrap_or_default();
            let figures = self.count_figures(&previous, now).await?;
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

    async fn count_figures(
        &self,
        previous: &FleetFigures,
        now: DateTime<Utc>,
    ) -> Result<FleetFigures> {
        // Each count reads its statuses' partial index (`recovery_task_due`, the
        // unsuccessful ones), not the table.
        let mut tasks: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT 'failed', handler, count(*) FROM recovery_task WHERE status = 'failed' \
             GROUP BY handler",
        )
        .fetch_all(&self.pool)
        .await?;
        tasks.extend(
            sqlx::query_as::<_, (String, String, i64)>(
                "SELECT status, handler, count(*) FROM recovery_task \
                 WHERE status IN ('permanent_failure', 'discarded') GROUP BY status, handler",
            )
            .fetch_all(&self.pool)
            .await?,
        );
        let recount = match previous.resolved_counted_at {
            // A clock that went back recounts too.
            Some(at) => now
                .signed_duration_since(at)
                .to_std()
                .map_or(true, |age| age >= RESOLVED_RECOUNT),
            None => true,
        };
        let resolved_counted_at = if recount {
            tasks.extend(
                sqlx::query_as::<_, (String, String, i64)>(
                    "SELECT 'resolved', handler, count(*) FROM recovery_task \
                     WHERE status = 'resolved' GROUP BY handler",
                )
                .fetch_all(&self.pool)
                .await?,
            );
            Some(now)
        } else {
            let resolved = previous
                .tasks
                .iter()
                .filter(|(status, _, _)| status == "resolved");
            tasks.extend(resolved.cloned());
            previous.resolved_counted_at
        };
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
            resolved_counted_at,
            due,
            members_live,
        })
    }
}
