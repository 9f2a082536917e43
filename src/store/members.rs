//! Fleet members: each records itself on a timer; "live" means seen recently.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use std::time::Duration;

use super::budgets::Budgets;
use super::{Result, Store};

/// How often a member records itself.
pub const MEMBER_BEAT: Duration = Duration::from_secs(10);

/// A member not seen for this long is not live (three missed beats).
pub const MEMBER_LIVE_WITHIN: Duration = Duration::from_secs(30);

/// A member's row is deleted once it has not been seen for a day.
const MEMBER_FORGOTTEN_AFTER: &str = "1 day";

/// A fleet member as it last recorded itself.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Member {
    /// Its worker id (what leases and the history name).
    pub id: String,
    /// Host name.
    pub host: String,
    /// redrive version.
    pub version: String,
    /// What it runs: `worker`, `ingest`, `admin`, `replay`.
    pub roles: Vec<String>,
    /// The handlers its worker pool serves (empty: not recorded, taken as every one).
    pub handlers: Vec<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it last recorded itself.
    pub last_seen: DateTime<Utc>,
    /// The attempt budgets it applies (none: a member older than this field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Budgets>,
}

impl Member {
    /// Whether its worker pool calls `handler`.
    pub fn serves(&self, handler: &str) -> bool {
        self.roles.iter().any(|r| r == "worker")
            && (self.handlers.is_empty() || self.handlers.iter().any(|h| h == handler))
    }
}

impl Store {
    /// Records (or refreshes) `member`, with `last_seen` set to the database's now, and
    /// forgets members gone for a day.
    pub async fn record_member(&self, member: &Member) -> Result<()> {
        sqlx::query(
            "INSERT INTO recovery_member \
                 (id, host, version, roles, handlers, started_at, last_seen, budgets) \
             VALUES ($1, $2, $3, $4, $5, $6, now(), $7) \
             ON CONFLICT (id) DO UPDATE SET last_seen = now(), roles = excluded.roles, \
                 handlers = excluded.handlers, budgets = excluded.budgets",
        )
        .bind(&member.id)
        .bind(&member.host)
        .bind(&member.version)
        .bind(&member.roles)
        .bind(&member.handlers)
        .bind(member.started_at)
        .bind(member.budgets.as_ref().map(sqlx::types::Json))
        .execute(&self.pool)
        .await?;
        sqlx::query(&format!(
            "DELETE FROM recovery_member WHERE last_seen < now() - interval '{MEMBER_FORGOTTEN_AFTER}'"
        ))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes `id` (a member that stops cleanly).
    pub async fn forget_member(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM recovery_member WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Members seen within [`MEMBER_LIVE_WITHIN`], by id.
    pub async fn live_members(&self) -> Result<Vec<Member>> {
        // Read as no row can stop the reading (a row written by hand): times within
        // the years chrono reads, no NULL among the names.
        let rows = sqlx::query(
            "SELECT id, host, version, array_remove(roles, NULL) AS roles, \
                    array_remove(handlers, NULL) AS handlers, budgets, \
                    least(greatest(started_at, '0001-01-01 00:00:00+00'), '9999-12-31 00:00:00+00') AS started_at, \
                    least(greatest(last_seen, '0001-01-01 00:00:00+00'), '9999-12-31 00:00:00+00') AS last_seen \
             FROM recovery_member \
             WHERE last_seen > now() - $1 * interval '1 millisecond' ORDER BY id",
        )
        .bind(MEMBER_LIVE_WITHIN.as_millis() as f64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Member {
                    id: r.try_get("id")?,
                    host: r.try_get("host")?,
                    version: r.try_get("version")?,
                    roles: r.try_get("roles")?,
                    handlers: r.try_get("handlers")?,
                    started_at: super::time::required(r, "started_at")?,
                    last_seen: super::time::required(r, "last_seen")?,
                    budgets: r
                        .try_get::<Option<serde_json::Value>, _>("budgets")?
                        .and_then(Budgets::recorded),
                })
            })
            .collect()
    }

    /// The attempt budgets the fleet applies, as its live workers recorded them, over
    /// `own` (the reader's configuration): see [`fleet_budgets_of`]. A member's row
    /// that does not read (a time out of range, a NULL among its handlers, budgets of
    /// another shape: written by hand, or by another release) is passed over: one row
    /// must not stop every reader of the fleet.
    pub async fn fleet_budgets(&self, own: &Budgets) -> Result<Budgets> {
        let rows = sqlx::query(
            "SELECT array_remove(handlers, NULL) AS handlers, budgets FROM recovery_member \
             WHERE last_seen > now() - $1 * interval '1 millisecond' \
               AND budgets IS NOT NULL AND 'worker' = ANY(roles) AND isfinite(started_at) \
             ORDER BY started_at DESC, id",
        )
        .bind(MEMBER_LIVE_WITHIN.as_millis() as f64)
        .fetch_all(&self.pool)
        .await?;
        let workers: Vec<Worker> = rows
            .iter()
            .filter_map(|row| {
                Some(Worker {
                    handlers: row.try_get("handlers").ok()?,
                    budgets: Budgets::recorded(row.try_get("budgets").ok()?)?,
                })
            })
            .collect();
        Ok(fleet_budgets_of(&workers, own))
    }
}

/// A live worker member's record of what it serves and the budgets it applies.
#[derive(Debug, Clone, PartialEq)]
struct Worker {
    /// The handlers its pool serves (empty: every one).
    handlers: Vec<String>,
    /// The budgets it applies.
    budgets: Budgets,
}

impl Worker {
    fn serves(&self, handler: &str) -> bool {
        self.handlers.is_empty() || self.handlers.iter().any(|h| h == handler)
    }
}

/// The budgets a fleet of `workers` (newest started first) applies, over `own`: the
/// workers count the attempts. A handler's from the newest worker that serves it, else
/// from the newest that knows it, else `own`'s; the routes' and the default from the
/// newest worker (members share the routes' configuration). With no worker's record
/// (a fleet down, members older than the record), `own`. Mid-upgrade, workers may
/// disagree: the newest is what the fleet is moving to.
fn fleet_budgets_of(workers: &[Worker], own: &Budgets) -> Budgets {
    let Some(newest) = workers.first() else {
        return own.clone();
    };
    let mut handlers: Vec<(String, i32)> = Vec::new();
    let names = workers
        .iter()
        .flat_map(|w| w.budgets.handlers.iter().map(|(name, _)| name))
        .chain(own.handlers.iter().map(|(name, _)| name));
    for name in names {
        if handlers.iter().any(|(known, _)| known == name) {
            continue;
        }
        let of = |budgets: &Budgets| {
            budgets
                .handlers
                .iter()
                .find(|(h, _)| h == name)
                .map(|h| h.1)
        };
        let budget = workers
            .iter()
            .filter(|worker| worker.serves(name))
            .chain(workers.iter())
            .find_map(|worker| of(&worker.budgets))
            .or_else(|| of(own));
        if let Some(budget) = budget {
            handlers.push((name.clone(), budget));
        }
    }
    Budgets {
        routes: newest.budgets.routes.clone(),
        handlers,
        default: newest.budgets.default,
    }
}
