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
        let rows = sqlx::query(
            "SELECT * FROM recovery_member \
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

    /// The attempt budgets the fleet applies, as its live members recorded them, over
    /// `own` (the reader's configuration): see [`fleet_budgets_of`].
    pub async fn fleet_budgets(&self, own: &Budgets) -> Result<Budgets> {
        let mut members = self.live_members().await?;
        members.sort_by(|a, b| b.started_at.cmp(&a.started_at).then(a.id.cmp(&b.id)));
        Ok(fleet_budgets_of(&members, own))
    }
}

/// The budgets a fleet of `members` (newest started first) applies, over `own`:
/// a handler's from the newest member whose workers serve it (they count its
/// attempts), else from the newest that knows it, else `own`'s; the routes' and the
/// default from the newest member that recorded budgets (members share the routes'
/// configuration). With no member's record (a fleet down, members older than the
/// record), `own`. Mid-upgrade, members may disagree: the newest is what the fleet
/// is moving to.
pub fn fleet_budgets_of(members: &[Member], own: &Budgets) -> Budgets {
    let recorded: Vec<(&Member, &Budgets)> = members
        .iter()
        .filter_map(|m| m.budgets.as_ref().map(|b| (m, b)))
        .collect();
    let Some((_, newest)) = recorded.first() else {
        return own.clone();
    };
    let mut handlers: Vec<(String, i32)> = Vec::new();
    let names = recorded
        .iter()
        .flat_map(|(_, b)| b.handlers.iter().map(|(name, _)| name))
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
        let budget = recorded
            .iter()
            .filter(|(member, _)| member.serves(name))
            .chain(recorded.iter())
            .find_map(|(_, budgets)| of(budgets))
            .or_else(|| of(own));
        if let Some(budget) = budget {
            handlers.push((name.clone(), budget));
        }
    }
    Budgets {
        routes: newest.routes.clone(),
        handlers,
        default: newest.default,
    }
}
