//! The audit log of operator actions, newest first.

use serde::Deserialize;

use super::error::{OperationError, Result};
use super::page::{Page, PageRequest};
use super::selection::parse_time;
use super::Operations;
use crate::store::{AuditEntry, AuditQuery};

/// Which audit entries: the query of `GET /api/v1/audit`, and what `redrive audit` reads.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditRequest {
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action (retry, discard, resolve, replay, replay_cancel, replay_resume,
    /// breaker_open, breaker_close, breaker_release, brake_engage, brake_release).
    pub action: Option<String>,
    /// Only entries at or after: an RFC 3339 time, or a duration meaning that long ago
    /// ("1d").
    pub since: Option<String>,
    /// Entries per page, 1 to 1000 (default 50).
    pub limit: Option<i64>,
    /// The previous page's `next_cursor`: entries older than this entry id (also read
    /// as `before`).
    #[serde(alias = "before")]
    pub after: Option<i64>,
}

impl Operations {
    /// A page of the audit log, newest first.
    pub async fn audit(&self, request: &AuditRequest) -> Result<Page<AuditEntry>> {
        let page = PageRequest {
            limit: request.limit,
            after: request.after,
        };
        let limit = page.limit()?;
        for (name, text) in [("actor", &request.actor), ("action", &request.action)] {
            if text.as_deref().is_some_and(|t| t.contains('\0')) {
                return Err(OperationError::bad_request(format!(
                    "{name} must not contain a NUL character"
                )));
            }
        }
        let since = (request.since.as_deref())
            .map(|text| parse_time(text).map_err(|e| format!("since: {e}")))
            .transpose()
            .map_err(OperationError::BadRequest)?;
        let entries = (self.store)
            .audit(&AuditQuery {
                actor: request.actor.clone(),
                action: request.action.clone(),
                since,
                before: page.after()?,
                limit: Some(limit),
            })
            .await?;
        Ok(Page::after(entries, limit, |entry| entry.id))
    }
}
