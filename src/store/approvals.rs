//! Approvals as rows: an action that waits for a second operator, decided once (approved
//! or rejected, whoever comes first), with what the approved action answered.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::operate::Operator;
use super::{Result, Store, StoreError};

/// An action waiting for (or given) a second operator's decision.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Approval {
    /// Its id.
    pub id: i64,
    /// When it was asked for.
    pub created_at: DateTime<Utc>,
    /// `retry`, `discard`, `resolve`, `replay` or `transform`.
    pub verb: String,
    /// The request as it was sent.
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
    /// The request's JSON text, as stored: what the approved action runs.
    #[serde(skip)]
    pub request_text: String,
    /// Tasks it selected when it was asked for.
    pub selected: i64,
    /// Who asked.
    pub requested_by: String,
    /// Why they asked.
    pub reason: Option<String>,
    /// `pending`, `approved` or `rejected`.
    pub status: String,
    /// Who decided.
    pub decided_by: Option<String>,
    /// When.
    pub decided_at: Option<DateTime<Utc>>,
    /// Why (a rejection's reason).
    pub decision_reason: Option<String>,
    /// What the approved action answered, or why it failed.
    #[schema(value_type = Object)]
    pub outcome: Option<serde_json::Value>,
}

/// Why an approval could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalRowError {
    /// No such approval.
    #[error("no approval {0}")]
    Unknown(i64),
    /// It was decided already.
    #[error("approval {id} was {status} already")]
    Decided {
        /// The approval.
        id: i64,
        /// Its status.
        status: String,
    },
    /// The requester may not approve their own action.
    #[error(
        "approval {id} was asked for by {actor}: a second operator (another token, console \
         user or shell user) must approve it"
    )]
    OwnAction {
        /// The approval.
        id: i64,
        /// Who asked, and tried to approve.
        actor: String,
    },
}

fn approval_from_row(row: &PgRow) -> Result<Approval> {
    let text: String = row.try_get("request")?;
    Ok(Approval {
        id: row.try_get("id")?,
        created_at: super::time::required(row, "created_at")?,
        verb: row.try_get("verb")?,
        request: serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text.clone())),
        request_text: text,
        selected: row.try_get("selected")?,
        requested_by: row.try_get("requested_by")?,
        reason: row.try_get("reason")?,
        status: row.try_get("status")?,
        decided_by: row.try_get("decided_by")?,
        decided_at: super::time::optional(row, "decided_at")?,
        decision_reason: row.try_get("decision_reason")?,
        outcome: row.try_get("outcome")?,
    })
}

impl Store {
    /// Records `verb` of `request`, selecting `selected` tasks, as waiting for a second
    /// operator, audited (`approval_request`).
    pub async fn request_approval(
        &self,
        operator: &Operator,
        verb: &str,
        request: String,
        selected: i64,
    ) -> Result<Approval> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "INSERT INTO recovery_approval (verb, request, selected, requested_by, reason) \
             VALUES ($1, $2, $3, $4, $5) RETURNING *",
        )
        .bind(verb)
        .bind(&request)
        .bind(selected)
        .bind(&operator.actor)
        .bind(&operator.reason)
        .fetch_one(&mut *tx)
        .await?;
        let approval = approval_from_row(&row)?;
        let details =
            serde_json::json!({ "approval": approval.id, "verb": verb, "selected": selected });
        self.insert_audit(&mut tx, operator, "approval_request", None, Some(details))
            .await?;
        tx.commit().await?;
        Ok(approval)
    }

    /// Up to `limit` approvals, newest first, older than `after` if given; with
    /// `pending`, only those waiting.
    pub async fn approvals(
        &self,
        pending: bool,
        limit: i64,
        after: Option<i64>,
    ) -> Result<Vec<Approval>> {
        let rows = sqlx::query(
            "SELECT * FROM recovery_approval \
             WHERE (NOT $1 OR status = 'pending') AND ($3::bigint IS NULL OR id < $3) \
             ORDER BY id DESC LIMIT $2",
        )
        .bind(pending)
        .bind(limit.clamp(1, 1000))
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(approval_from_row).collect()
    }

    /// One approval.
    pub async fn approval(&self, id: i64) -> Result<Option<Approval>> {
        let row = sqlx::query("SELECT * FROM recovery_approval WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(approval_from_row).transpose()
    }

    /// Decides approval `id` for `operator`: approved (never by who asked) or rejected
    /// (by anyone, the requester withdrawing it too), audited. Only the first decision
    /// counts: a second one, or one racing it, is refused.
    pub async fn decide_approval(
        &self,
        operator: &Operator,
        id: i64,
        approve: bool,
    ) -> Result<Approval> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "UPDATE recovery_approval SET \
                 status = CASE WHEN $3 THEN 'approved' ELSE 'rejected' END, \
                 decided_by = $2, decided_at = now(), decision_reason = $4 \
             WHERE id = $1 AND status = 'pending' AND (NOT $3 OR requested_by <> $2) \
             RETURNING *",
        )
        .bind(id)
        .bind(&operator.actor)
        .bind(approve)
        .bind(&operator.reason)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            drop(tx);
            let error = match self.approval(id).await? {
                None => ApprovalRowError::Unknown(id),
                Some(a) if a.status != "pending" => ApprovalRowError::Decided {
                    id,
                    status: a.status,
                },
                Some(a) => ApprovalRowError::OwnAction {
                    id,
                    actor: a.requested_by,
                },
            };
            return Err(StoreError::Approval(error));
        };
        let approval = approval_from_row(&row)?;
        let action = match approve {
            true => "approval_approve",
            false => "approval_reject",
        };
        let details = serde_json::json!({
            "approval": id,
            "verb": approval.verb,
            "requested_by": approval.requested_by,
        });
        self.insert_audit(&mut tx, operator, action, None, Some(details))
            .await?;
        tx.commit().await?;
        Ok(approval)
    }

    /// Records what approved action `id` answered (or why it failed).
    pub async fn record_approval_outcome(&self, id: i64, outcome: serde_json::Value) -> Result<()> {
        sqlx::query("UPDATE recovery_approval SET outcome = $2 WHERE id = $1")
            .bind(id)
            .bind(outcome)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
