//! Brakes of routes, shared by the fleet through one row per route: engaged by the
//! member that sees a process-mode route's failures (its bad-deploy brake) or by an
//! operator on any route (audited), followed by every member, released by the hold's
//! end or by an operator (audited).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::Row;
use std::time::Duration;

use super::{Operator, Result, Store, StoreError};

/// One route's brake as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Brake {
    /// The route.
    pub route: String,
    /// While in the future, the route is paused on every member.
    pub engaged_until: Option<DateTime<Utc>>,
    /// When it was last engaged.
    pub engaged_at: Option<DateTime<Utc>>,
    /// Who engaged it last: a member (its bad-deploy brake) or an operator.
    pub engaged_by: Option<String>,
    /// Why, in words (the failure share seen, or the operator's reason).
    pub reason: Option<String>,
    /// How many times it engaged (an engaged brake held longer counts once).
    pub trips: i32,
    /// When an operator last released it.
    pub released_at: Option<DateTime<Utc>>,
    /// Who.
    pub released_by: Option<String>,
}

impl Brake {
    /// The brake of `route` before it ever engaged (it has no row yet).
    pub fn never_engaged(route: &str) -> Brake {
        Brake {
            route: route.to_owned(),
            engaged_until: None,
            engaged_at: None,
            engaged_by: None,
            reason: None,
            trips: 0,
            released_at: None,
            released_by: None,
        }
    }

    /// Whether the route is paused now.
    pub fn engaged(&self, now: DateTime<Utc>) -> bool {
        self.engaged_until.is_some_and(|until| until > now)
    }
}

fn brake_from_row(row: &PgRow) -> Result<Brake> {
    Ok(Brake {
        route: row.try_get("route")?,
        engaged_until: super::time::optional(row, "engaged_until")?,
        engaged_at: super::time::optional(row, "engaged_at")?,
        engaged_by: row.try_get("engaged_by")?,
        reason: row.try_get("reason")?,
        trips: row.try_get("trips")?,
        released_at: super::time::optional(row, "released_at")?,
        released_by: row.try_get("released_by")?,
    })
}

impl Store {
    /// Engages `route`'s brake for `cool_down` unless it is engaged already; true when
    /// this call engaged it (the caller logs and counts the trip).
    pub async fn engage_brake(
        &self,
        route: &str,
        cool_down: Duration,
        member: &str,
        reason: &str,
    ) -> Result<bool> {
        let engaged = sqlx::query(
            "INSERT INTO recovery_brake AS b \
                 (route, engaged_until, engaged_at, engaged_by, reason, trips) \
             VALUES ($1, now() + $2 * interval '1 millisecond', now(), $3, $4, 1) \
             ON CONFLICT (route) DO UPDATE \
             SET engaged_until = excluded.engaged_until, engaged_at = now(), \
                 engaged_by = $3, reason = $4, trips = b.trips + 1 \
             WHERE b.engaged_until IS NULL OR b.engaged_until <= now() \
             RETURNING route",
        )
        .bind(route)
        .bind(cool_down.as_millis() as f64)
        .bind(member)
        .bind(reason)
        .fetch_optional(&self.pool)
        .await?;
        Ok(engaged.is_some())
    }

    /// Engages `route`'s brake on `operator`'s word for `span` from now, audited
    /// (`brake_engage`): every member pauses the route within a second or so. A brake
    /// engaged already is held for `span` from now instead.
    pub async fn engage_brake_by(
        &self,
        route: &str,
        span: Duration,
        operator: &Operator,
    ) -> Result<Brake> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "INSERT INTO recovery_brake AS b \
                 (route, engaged_until, engaged_at, engaged_by, reason, trips) \
             VALUES ($1, now() + $2 * interval '1 millisecond', now(), $3, $4, 1) \
             ON CONFLICT (route) DO UPDATE \
             SET engaged_until = excluded.engaged_until, engaged_at = now(), \
                 engaged_by = $3, reason = $4, \
                 trips = b.trips + CASE WHEN b.engaged_until > now() THEN 0 ELSE 1 END \
             RETURNING *",
        )
        .bind(route)
        .bind(span.as_millis() as f64)
        .bind(&operator.actor)
        .bind(&operator.reason)
        .fetch_one(&mut *tx)
        .await?;
        let brake = brake_from_row(&row)?;
        let details = serde_json::json!({ "route": route, "until": brake.engaged_until });
        self.insert_audit(&mut tx, operator, "brake_engage", None, Some(details))
            .await?;
        tx.commit().await?;
        Ok(brake)
    }

    /// Every brake that ever engaged, by route.
    pub async fn brakes(&self) -> Result<Vec<Brake>> {
        let rows = sqlx::query("SELECT * FROM recovery_brake ORDER BY route")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(brake_from_row).collect()
    }

    /// The routes whose brake is engaged now.
    pub async fn engaged_routes(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT route FROM recovery_brake WHERE engaged_until > now() ORDER BY route",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Releases `route`'s engaged brake for `operator`, audited: every member resumes
    /// the route within a second or so. An unengaged brake is an error.
    pub async fn release_brake(&self, route: &str, operator: &Operator) -> Result<Brake> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "UPDATE recovery_brake SET engaged_until = NULL, released_at = now(), \
                 released_by = $2 \
             WHERE route = $1 AND engaged_until > now() RETURNING *",
        )
        .bind(route)
        .bind(&operator.actor)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::NotEngaged(route.to_owned()));
        };
        let brake = brake_from_row(&row)?;
        let details = serde_json::json!({ "route": route, "trips": brake.trips });
        self.insert_audit(&mut tx, operator, "brake_release", None, Some(details))
            .await?;
        tx.commit().await?;
        Ok(brake)
    }
}
