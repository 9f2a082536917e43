//! The audit log: one row per operator action, written in the action's transaction.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, Row};

use super::filter::Selection;
use super::operate::Operator;
use super::{Result, Store};

/// One operator action as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Row id (newest is highest).
    pub id: i64,
    /// When the action started.
    pub at: DateTime<Utc>,
    /// Who: an admin token's name or `cli:<user>`.
    pub actor: String,
    /// What: `retry`, `discard`, `resolve`, `replay`, `replay_cancel`, ...
    pub action: String,
    /// The task ids it was given, if it was given ids.
    pub ids: Option<Vec<i64>>,
    /// The filter it was given, if it was given a filter.
    #[schema(value_type = Option<Object>)]
    pub filter: Option<serde_json::Value>,
    /// The operator's reason.
    pub reason: Option<String>,
    /// Anything else the action records (a replay's target, a retry's budget).
    #[schema(value_type = Option<Object>)]
    pub details: Option<serde_json::Value>,
    /// Tasks it changed so far.
    pub count: i64,
}

/// Which audit rows to list.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// Only rows written at or after.
    pub since: Option<DateTime<Utc>>,
    /// Rows older than this id (the previous page's last id).
    pub before: Option<i64>,
    /// Rows to return (at most 1000; 100 by default).
    pub limit: Option<i64>,
}

impl Store {
    /// Writes the audit row of an action (on `selection`, if it acts on tasks) and
    /// returns its id.
    pub(crate) async fn insert_audit(
        &self,
        conn: &mut PgConnection,
        operator: &Operator,
        action: &str,
        selection: Option<&Selection>,
        details: Option<serde_json::Value>,
    ) -> Result<i64> {
        let (ids, filter) = match selection {
            Some(Selection::Ids(ids)) => {
                (Some(ids.iter().map(|id| id.0).collect::<Vec<_>>()), None)
            }
            Some(Selection::Filter(filter)) => (
                None,
                Some(serde_json::to_value(filter).expect("a filter serializes")),
            ),
            None => (None, None),
        };
        let id = sqlx::query_scalar(
            "INSERT INTO recovery_audit (actor, action, ids, filter, reason, details) \
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        )
        .bind(&operator.actor)
        .bind(action)
        .bind(ids)
        .bind(filter)
        .bind(&operator.reason)
        .bind(details)
        .fetch_one(conn)
        .await?;
        Ok(id)
    }

    /// Audit rows, newest first.
    pub async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query(
            "SELECT * FROM recovery_audit \
             WHERE ($1::text IS NULL OR actor = $1) AND ($2::text IS NULL OR action = $2) \
               AND ($3::timestamptz IS NULL OR at >= $3) AND ($4::bigint IS NULL OR id < $4) \
             ORDER BY id DESC LIMIT $5",
        )
        .bind(&query.actor)
        .bind(&query.action)
        .bind(query.since)
        .bind(query.before)
        .bind(query.limit.unwrap_or(100).clamp(1, 1000))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: super::time::required(r, "at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    ids: r.try_get("ids")?,
                    filter: r.try_get("filter")?,
                    reason: r.try_get("reason")?,
                    details: r.try_get("details")?,
                    count: r.try_get("count")?,
                })
            })
            .collect()
    }
}
