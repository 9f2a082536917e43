//! The approval endpoints (four eyes, `operations.approval_over`): list, approve (by
//! another operator than the requester; the action then runs), reject.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};

use super::extract::{body, id, query};
use super::Shared;
use crate::admin::error::{ApiError, ErrorBody};
use crate::operations::{Actor, Page, PageRequest, ReasonRequest};
use crate::store::Approval;

/// Which approvals.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalParams {
    /// Only those waiting for a decision.
    pub pending: bool,
    /// Approvals per page (1 to 1000; default 50).
    pub limit: Option<i64>,
    /// Continue after this approval id.
    pub after: Option<i64>,
}

/// Approvals, newest first: actions waiting for a second operator, and decided ones with
/// what the approved action answered.
#[utoipa::path(get, path = "/api/v1/approvals", params(ApprovalParams), security(("bearer" = [])),
    responses((status = 200, body = Page<Approval>), (status = 400, body = ErrorBody)))]
pub async fn list_approvals(
    State(operations): Shared,
    q: Result<Query<ApprovalParams>, QueryRejection>,
) -> Result<Json<Page<Approval>>, ApiError> {
    let params = query(q)?;
    let page = PageRequest {
        limit: params.limit,
        after: params.after,
    };
    Ok(Json(operations.approvals(params.pending, &page).await?))
}

/// Approves a waiting action (never by its requester) and runs it as the requester's
/// action, the approver named in its audit reason; `outcome` holds what it answered.
#[utoipa::path(post, path = "/api/v1/approvals/{id}/approve", params(("id" = i64, Path, description = "Approval id")),
    request_body = ReasonRequest, security(("bearer" = [])),
    responses((status = 200, body = Approval), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn approve(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Approval>, ApiError> {
    let approval = id(path, "approval")?;
    let reason = body(request)?.reason;
    let run = tokio::spawn(async move {
        operations
            .approve(&actor, approval, reason.as_deref())
            .await
    });
    let answer = (run.await)
        .map_err(|failed| ApiError::internal(format!("the approved action failed: {failed}")))?;
    Ok(Json(answer?))
}

/// Rejects a waiting action (its requester withdraws it so).
#[utoipa::path(post, path = "/api/v1/approvals/{id}/reject", params(("id" = i64, Path, description = "Approval id")),
    request_body = ReasonRequest, security(("bearer" = [])),
    responses((status = 200, body = Approval), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn reject(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Approval>, ApiError> {
    let approval = id(path, "approval")?;
    let reason = body(request)?.reason;
    Ok(Json(
        operations
            .reject(&actor, approval, reason.as_deref())
            .await?,
    ))
}
