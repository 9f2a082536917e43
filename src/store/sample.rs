//! Fleet-wide figures for the metrics, computed by one member per interval (whichever
//! first finds the last sample old) and read by every member, so that the counting
//! query runs once per interval for the whole fleet, not once per scrape per member.
//!
//! Each turn counts what is unfinished or unsuccessful, through the partial indexes that
//! hold those tasks: its cost follows the backlog, not the store. Resolved tasks, the
//! bulk of a store, are recounted only every [`RESOLVED_RECOUNT`]: counting them reads
//! every one (ten million took a core 4 s), and the alerts never look at them.
//!
//! Counting a huge backlog exactly still takes seconds (ten million unfinished tasks:
//! 3.6 s). A turn that took `t` therefore makes the next one wait at least
//! [`SAMPLE_COST_SHARE`] times `t` (`t` read as 12 s at most): the counting keeps to a
//! tenth of one backend's time up to a backlog whose count takes 12 s, and the figures
//! are two minutes old at the very most. `t` is the wall time of the counting, lock
//! waits included: a count held up by a lock waits longer, within those two minutes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::groups::{GroupQuery, Groups, MAX_GROUPS, MOST_TREND_BUCKETS};
use super::inspect::{OldestDue, StatusCount};
use super::members::MEMBER_LIVE_WITHIN;
use super::Stats;
use super::{Result, Store};

/// How often members refresh the fleet-wide figures (one of them counts per turn).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(15);

/// A sample whose last turn began longer ago than this has no member taking turns (the
/// longest wait between turns is two minutes): a view then takes the turn itself.
pub const SAMPLE_ABANDONED: Duration = Duration::from_secs(180);

/// Longest the count of resolved tasks is reused by later samples.
pub const RESOLVED_RECOUNT: Duration = Duration::from_secs(300);

/// A count of the resolved tasks is reused for this many times as long as it took
/// (within [`RESOLVED_RECOUNT`]): a small store's are counted every turn, ten million
/// (4 s) every 200 s.
pub const RESOLVED_COST_SHARE: f64 = 50.0;

/// How long a count of the resolved tasks that took `count_ms` is reused: its cost times
/// [`RESOLVED_COST_SHARE`], at most [`RESOLVED_RECOUNT`] (and that long when the time
/// is unknown or not a number).
pub fn resolved_recount_after(count_ms: Option<f64>) -> Duration {
    match count_ms {
        Some(ms) if ms.is_finite() => {
            let reused =
                (ms.max(0.0) * RESOLVED_COST_SHARE / 1000.0).min(RESOLVED_RECOUNT.as_secs_f64());
            Duration::from_secs_f64(reused)
        }
        _ => RESOLVED_RECOUNT,
    }
}

/// The next turn waits at least this many times as long as the last one's counting took.
pub const SAMPLE_COST_SHARE: f64 = 10.0;

/// Longest count time that rule reads: the next turn waits two minutes at most.
const COUNT_READ_AT_MOST: Duration = Duration::from_secs(12);

/// How long after a turn whose counting took `count_ms` the next one may start, for a
/// sampling `interval`: the rule the turn's statement applies to the stored count.
pub fn next_turn_after(interval: Duration, count_ms: f64) -> Duration {
    // NaN reads as no time at all, as a count time the statement cannot read does.
    let read = if count_ms.is_nan() {
        0.0
    } else {
        count_ms.clamp(0.0, COUNT_READ_AT_MOST.as_millis() as f64)
    };
    let waited = Duration::from_secs_f64(read * SAMPLE_COST_SHARE / 1000.0);
    waited.max(interval.mul_f64(0.9))
}

/// What a view refreshed every few seconds shows of the fleet's last sample
/// ([`Store::sampled_stats`]).
#[derive(Debug, Clone)]
pub struct Sampled {
    /// Counts by status and handler and due work as sampled, with the last hour's
    /// outcomes and the live members as they are.
    pub stats: Stats,
    /// When the sample counted the tasks.
    pub counted_at: Option<DateTime<Utc>>,
    /// What broke, as sampled ([`FleetFigures::broke`]).
    pub broke: Option<Groups>,
}

/// The figures of one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetFigures {
    /// (status, handler, tasks); the resolved ones as of `resolved_counted_at`.
    pub tasks: Vec<(String, String, i64)>,
    /// When the resolved tasks were last counted (PostgreSQL's clock).
    #[serde(default)]
    pub resolved_counted_at: Option<DateTime<Utc>>,
    /// How long that count of the resolved tasks took, in milliseconds (absent in
    /// figures an earlier release stored).
    #[serde(default)]
    pub resolved_count_ms: Option<f64>,
    /// (handler, tasks due now, seconds the oldest has waited).
    pub due: Vec<(String, i64, f64)>,
    /// Members seen recently.
    pub members_live: i64,
    /// The biggest causes of tasks not done: (cause id, class, tasks, first seen as
    /// seconds since the epoch), at most [`SAMPLED_CAUSES`].
    #[serde(default)]
    pub causes: Vec<(i64, String, i64, f64)>,
    /// What broke, as the console's overview shows it: the tasks not done grouped by
    /// cause ([`GroupQuery::default`]), the [`SAMPLED_CAUSES`] biggest groups, counted
    /// with the rest (absent when the grouping failed, or in figures an earlier release
    /// stored; figures that cannot be read as groups read as absent).
    #[serde(default)]
    pub broke: Option<Groups>,
    /// When these figures were counted (PostgreSQL's clock; absent in figures an
    /// earlier release stored).
    #[serde(default)]
    pub counted_at: Option<DateTime<Utc>>,
    /// How long this sample's counting took, in milliseconds.
    #[serde(default)]
    pub count_ms: f64,
}

/// Most causes the fleet's figures (and metrics) carry: the biggest, so that the series
/// stay few whatever the errors say.
pub const SAMPLED_CAUSES: i64 = 20;

impl Store {
    /// Takes the turn to sample if the last sample is older than `interval` and than
    /// [`SAMPLE_COST_SHARE`] times its counting (one member wins each turn), computes and
    /// stores the figures; then answers the latest figures.
    pub async fn sample_figures(&self, interval: Duration) -> Result<FleetFigures> {
        // The turn answers the previous figures (the upsert leaves them) and the time.
        // A count time that is not a number (a hand-edited row) counts as none.
        // A turn dated ahead of the clock (a clock set back, a hand's edit) is due: it
        // would hold every member off for good. The row held longer than
        // TURN_LOCK_WAIT (a hand's lock) fails the turn with `lock_not_available`.
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "SET LOCAL lock_timeout = {}",
            TURN_LOCK_WAIT.as_millis()
        ))
        .execute(&mut *tx)
        .await?;
        let turn: Option<(Option<String>, Option<String>, DateTime<Utc>)> = sqlx::query_as(&format!(
            "INSERT INTO recovery_sample (id, sampled_at, figures) VALUES (1, now(), '{{}}') \
             ON CONFLICT (id) DO UPDATE SET sampled_at = now() \
             WHERE recovery_sample.sampled_at < now() - greatest($1, $2 * CASE \
                 WHEN jsonb_typeof(recovery_sample.figures->'count_ms') = 'number' \
                 THEN round(least(greatest((recovery_sample.figures->>'count_ms')::numeric, 0), $3::float8::numeric), 3)::float8 \
                 ELSE 0 END) * interval '1 millisecond' \
                OR recovery_sample.sampled_at > now() + interval '1 minute' \
             RETURNING {FIGURES}, now()"
        ))
        .bind(interval.as_millis() as f64 * 0.9)
        .bind(SAMPLE_COST_SHARE)
        .bind(COUNT_READ_AT_MOST.as_millis() as f64)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        if let Some((previous, previous_broke, now)) = turn {
            let previous = readable_figures(previous, previous_broke);
            let counting = std::time::Instant::now();
            let mut figures = self.count_figures(&previous, now).await?;
            figures.count_ms = counting.elapsed().as_secs_f64() * 1000.0;
            sqlx::query("UPDATE recovery_sample SET figures = $1 WHERE id = 1")
                .bind(serde_json::to_value(&figures).expect("figures serialize"))
                .execute(&self.pool)
                .await?;
            // The turn also keeps the outcome counts to the last two hours (the chart
            // reads one).
            sqlx::query(
                "DELETE FROM recovery_outcome_minute \
                 WHERE minute < now() - interval '2 hours' OR NOT isfinite(minute)",
            )
            .execute(&self.pool)
            .await?;
            return Ok(figures);
        }
        let (stored, broke): (Option<String>, Option<String>) = sqlx::query_as(&format!(
            "SELECT {FIGURES} FROM recovery_sample WHERE id = 1"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(readable_figures(stored, broke))
    }

    async fn count_figures(
        &self,
        previous: &FleetFigures,
        now: DateTime<Utc>,
    ) -> Result<FleetFigures> {
        // Each count reads its statuses' partial index (`recovery_task_due_by_handler`, the
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
            Some(at) => now.signed_duration_since(at).to_std().map_or(true, |age| {
                age >= resolved_recount_after(previous.resolved_count_ms)
            }),
            None => true,
        };
        let resolving = std::time::Instant::now();
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
        let resolved_count_ms = if recount {
            Some(resolving.elapsed().as_secs_f64() * 1000.0)
        } else {
            previous.resolved_count_ms
        };
        let due = sqlx::query_as(
            "SELECT handler, count(*), extract(epoch FROM now() - recovery_clamp_time(min(next_attempt_at)))::float8 \
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
        // What broke, as the overview shows it; the metrics' causes are its groups.
        let broke = self
            .groups(&GroupQuery {
                limit: SAMPLED_CAUSES,
                ..GroupQuery::default()
            })
            .await
            .map(|groups| Groups {
                counted_at: now,
                ..groups
            })
            .inspect_err(|error| {
                tracing::warn!(%error, "sampling: the tasks not done could not be grouped by cause");
            })
            .ok();
        let causes = match &broke {
            Some(broke) => sampled_causes(broke),
            None => self.biggest_causes().await?,
        };
        Ok(FleetFigures {
            tasks,
            resolved_counted_at,
            resolved_count_ms,
            due,
            members_live,
            causes,
            broke,
            counted_at: Some(now),
            count_ms: 0.0,
        })
    }

    /// The [`SAMPLED_CAUSES`] biggest causes of tasks not done, for the metrics, when
    /// they could not be grouped (a grouping has a statement timeout; this has none).
    async fn biggest_causes(&self) -> Result<Vec<(i64, String, i64, f64)>> {
        // The cause index alone (`recovery_task_cause`), then one row per listed cause.
        Ok(sqlx::query_as(
            "SELECT g.cause_id, c.class, g.tasks, \
                    CASE WHEN isfinite(c.first_seen) THEN extract(epoch FROM c.first_seen)::float8 \
                         ELSE 0 END \
             FROM (SELECT cause_id, count(*) AS tasks FROM recovery_task \
                   WHERE status IN ('failed', 'permanent_failure') AND cause_id IS NOT NULL \
                   GROUP BY cause_id ORDER BY tasks DESC, cause_id LIMIT $1) g \
             JOIN recovery_cause c ON c.id = g.cause_id ORDER BY g.tasks DESC, g.cause_id",
        )
        .bind(SAMPLED_CAUSES)
        .fetch_all(&self.pool)
        .await?)
    }
}

/// The metrics' causes of a grouping by cause: (cause id, class, tasks, first seen as
/// seconds since the epoch; 0 when unreadable), the group without a cause left out.
fn sampled_causes(broke: &Groups) -> Vec<(i64, String, i64, f64)> {
    (broke.groups.iter())
        .filter_map(|group| {
            let cause = group.cause.as_ref()?;
            let first_seen = cause.first_seen.map_or(0.0, |at| at.timestamp() as f64);
            Some((cause.id, cause.class.clone(), group.tasks, first_seen))
        })
        .collect()
}

impl Store {
    /// The figures of [`Store::stats`] as the fleet last sampled them, with the last
    /// hour's outcomes and the live members, when the tasks were counted, and What broke
    /// as sampled. For a view
    /// refreshed every few seconds: the members count once per turn for the whole fleet
    /// ([`SAMPLE_EVERY`], and the resolved tasks, the bulk of a store, as
    /// [`resolved_recount_after`] says), however many consoles are open. The caller
    /// takes a turn itself only when no member took one for [`SAMPLE_ABANDONED`] (none
    /// running): a view never races the members for the count, which on a huge backlog
    /// takes longer than a request may. When another session holds the sample's row
    /// past [`TURN_LOCK_WAIT`], the view answers the last figures.
    pub async fn sampled_stats(&self) -> Result<Sampled> {
        let latest: Option<(Option<String>, Option<String>, bool)> = sqlx::query_as(&format!(
            "SELECT {FIGURES}, sampled_at > now() - $1 * interval '1 millisecond' \
                AND sampled_at <= now() + interval '1 minute' \
             FROM recovery_sample WHERE id = 1"
        ))
        .bind(SAMPLE_ABANDONED.as_millis() as f64)
        .fetch_optional(&self.pool)
        .await?;
        let figures = match latest {
            Some((stored, broke, true)) => readable_figures(stored, broke),
            Some((stored, broke, false)) => match self.sample_figures(SAMPLE_EVERY).await {
                Ok(figures) => figures,
                // The row held: the last figures, with their time.
                Err(error) if lock_not_available(&error) => readable_figures(stored, broke),
                Err(error) => return Err(error),
            },
            None => self.sample_figures(SAMPLE_EVERY).await?,
        };
        let mut tasks: Vec<StatusCount> = (figures.tasks.iter())
            .filter_map(|(status, handler, count)| {
                Some(StatusCount {
                    status: status.parse().ok()?,
                    handler: handler.clone(),
                    count: *count,
                })
            })
            .collect();
        tasks.sort_by(|a, b| (a.status.as_str(), &a.handler).cmp(&(b.status.as_str(), &b.handler)));
        let mut due: Vec<OldestDue> = (figures.due.iter())
            .map(|(handler, due, age)| OldestDue {
                handler: handler.clone(),
                due: *due,
                oldest_due_seconds: *age,
            })
            .collect();
        due.sort_by(|a, b| a.handler.cmp(&b.handler));
        let stats = Stats {
            tasks,
            due,
            last_hour: self.last_hour().await?,
            members: self.live_members().await?,
        };
        Ok(Sampled {
            stats,
            counted_at: figures.counted_at,
            broke: figures.broke,
        })
    }
}

/// Longest a turn waits for the sample's row (another turn holds it for milliseconds).
const TURN_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Whether `error` is PostgreSQL's `lock_not_available` (a `lock_timeout` ran out).
fn lock_not_available(error: &super::StoreError) -> bool {
    match error {
        super::StoreError::Database(error) => {
            error.as_database_error().and_then(|e| e.code()).as_deref() == Some("55P03")
        }
        _ => false,
    }
}

/// The stored figures' columns: all but What broke, and What broke apart, so that a
/// What broke this release cannot read (a number no `f64` holds, nesting deeper than the
/// reader goes) leaves the rest of the figures readable.
const FIGURES: &str = "\
    CASE WHEN jsonb_typeof(figures) = 'object' THEN (figures - 'broke')::text \
         ELSE figures::text END, \
    (figures -> 'broke')::text";

/// The stored figures ([`FIGURES`]), or none when they cannot be read (a row edited by
/// hand, a number no `f64` holds): the next turn writes them whole again. What broke
/// is read apart, and only as this release writes it (at most [`MAX_GROUPS`] groups, a
/// trend of at most [`MOST_TREND_BUCKETS`]): a page shows it every few seconds.
fn readable_figures(stored: Option<String>, broke: Option<String>) -> FleetFigures {
    let mut figures: FleetFigures = (stored.as_deref())
        .and_then(|stored| serde_json::from_str(stored).ok())
        .unwrap_or_default();
    figures.broke = (broke.as_deref())
        .and_then(|broke| serde_json::from_str::<Groups>(broke).ok())
        .filter(|broke| {
            broke.groups.len() <= MAX_GROUPS as usize
                && (broke.groups.iter()).all(|g| g.trend.len() <= MOST_TREND_BUCKETS as usize)
        });
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_turn_waits_ten_counts_within_the_interval_and_two_minutes() {
        let interval = Duration::from_secs(15);
        let after = |ms| next_turn_after(interval, ms).as_secs_f64();
        assert_eq!(
            after(20.0),
            13.5,
            "a quick count: the interval (less a tenth)"
        );
        assert_eq!(after(11_450.0), 114.5);
        for huge in [60_000.0, f64::INFINITY, f64::MAX] {
            assert_eq!(after(huge), 120.0, "{huge}: two minutes at most");
        }
        for odd in [-5.0, f64::NEG_INFINITY, f64::NAN, 1e-300] {
            assert_eq!(after(odd), 13.5, "{odd}: read as no time");
        }
    }

    #[test]
    fn a_resolved_count_is_reused_fifty_times_its_cost_within_five_minutes() {
        let after = |ms| resolved_recount_after(ms).as_secs_f64();
        assert_eq!(after(Some(1.0)), 0.05, "a small store: every turn");
        assert_eq!(after(Some(4_000.0)), 200.0, "ten million tasks");
        for huge in [10_000.0, f64::MAX] {
            assert_eq!(after(Some(huge)), 300.0, "{huge}: five minutes at most");
        }
        for negative in [-5.0, f64::MIN, -0.0] {
            assert_eq!(after(Some(negative)), 0.0, "{negative}: read as no time");
        }
        for unknown in [
            None,
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
        ] {
            assert_eq!(after(unknown), 300.0, "{unknown:?}: five minutes");
        }
    }
}
