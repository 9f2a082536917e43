//! The last hour's attempt outcomes minute by minute, for the console's chart and
//! [`Store::stats`]'s `last_hour`. They read `recovery_outcome_minute`, which the history
//! table's trigger keeps (attempts per minute of their start, outcome and backend), not
//! the history rows: at most 60 minutes × outcomes × backends rows, however many
//! attempts the hour held.

use serde::Serialize;
use sqlx::Row;

use super::inspect::OutcomeCount;
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

/// The minutes of the last hour, the current one included; a start time a member's
/// clock put ahead of the database's by less than an hour counts in the current minute
/// (and an infinite one in none).
pub(super) const LAST_HOUR: &str =
    "minute > now() - interval '1 hour' AND minute < now() + interval '1 hour'";

impl Store {
    /// The last hour's history rows counted per minute and outcome, newest minute first.
    pub async fn outcome_minutes(&self) -> Result<Vec<OutcomeMinute>> {
        let rows = sqlx::query(
            &"SELECT greatest(least(floor(extract(epoch FROM date_trunc('minute', now()) - minute) / 60), 59), 0)::int AS ago, \
                    outcome, sum(attempts)::bigint AS n \
             FROM recovery_outcome_minute WHERE {LAST_HOUR} \
             GROUP BY 1, 2 ORDER BY 1, 2"
            .replace("{LAST_HOUR}", LAST_HOUR),
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(OutcomeMinute {
                    minutes_ago: r.try_get("ago")?,
                    outcome: r.try_get("outcome")?,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }

    /// The last hour's attempts by outcome (the minutes of [`Store::outcome_minutes`]).
    pub async fn last_hour(&self) -> Result<Vec<OutcomeCount>> {
        sqlx::query(&format!(
            "SELECT outcome, sum(attempts)::bigint AS n FROM recovery_outcome_minute \
             WHERE {LAST_HOUR} GROUP BY outcome ORDER BY outcome"
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            Ok(OutcomeCount {
                outcome: r.try_get("outcome")?,
                count: r.try_get("n")?,
            })
        })
        .collect()
    }
}
