//! The task endpoints: list, show, retry, discard, resolve, stats, check.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::{Extension, Json};
use std::sync::Arc;

use super::extract::{asks_fresh, body, id, paged, split};
use super::Shared;
use crate::admin::error::{ApiError, ErrorBody};
use crate::operations::{
    ActAnswer, ActRequest, Actor, FilterParams, GroupParams, Operations, Page, PageRequest,
    TransformAnswer, TransformRequest, Verb, GROUP_PARAMS,
};
use crate::store::{CheckReport, Groups, Stats, TaskDetail, TaskSummary};

/// What broke: the tasks a filter selects (with no status given, those not done)
/// grouped by cause (or `by` class, handler, route, topic), biggest first, each with
/// first and last seen, a trend, the handlers and routes it spans, and an example.
/// The same query within 15 s is answered from one count (`counted_at` says when),
/// unless the request says `Cache-Control: no-cache` (or `no-store`, `max-age=0`,
/// `Pragma: no-cache`); a retry, discard or resolve through this member counts again.
#[utoipa::path(get, path = "/api/v1/groups", params(FilterParams, GroupParams), security(("bearer" = [])),
    responses((status = 200, body = Groups), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn groups(
    State(operations): Shared,
    headers: axum::http::HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Json<Groups>, ApiError> {
    let (params, filter) = split::<GroupParams, FilterParams>(raw.as_deref(), &GROUP_PARAMS)?;
    let fresh = asks_fresh(&headers);
    Ok(Json(operations.groups(&filter, &params, fresh).await?))
}

/// Lists the tasks a filter selects, newest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/tasks", params(FilterParams, PageRequest), security(("bearer" = [])),
    responses((status = 200, body = Page<TaskSummary>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_tasks(
    State(operations): Shared,
    RawQuery(raw): RawQuery,
) -> Result<Json<Page<TaskSummary>>, ApiError> {
    let (page, filter) = paged::<FilterParams>(raw.as_deref())?;
    Ok(Json(operations.list(&filter, &page).await?))
}

/// One task: every field, its payload readable, its attempt history.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", params(("id" = i64, Path, description = "Task id")),
    security(("bearer" = [])),
    responses((status = 200, body = TaskDetail), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_task(
    State(operations): Shared,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TaskDetail>, ApiError> {
    Ok(Json(operations.show(id(path, "task")?).await?))
}

/// Runs a bulk verb to its end even if the client goes away meanwhile (a proxy's or a
/// script's timeout): a bulk action over a million tasks takes minutes, and one
/// stopped part-way with nobody told is worse than one that finishes. The audit entry
/// says what it changed.
async fn act(
    operations: &Arc<Operations>,
    actor: Actor,
    verb: Verb,
    request: Result<Json<ActRequest>, JsonRejection>,
) -> Result<Json<ActAnswer>, ApiError> {
    let request = body(request)?;
    let answer = (operations.act_to_end(actor, verb, request, |_| {}).await)
        .map_err(|failed| ApiError::internal(format!("the action failed: {failed}")))?;
    Ok(Json(answer?))
}

/// Makes tasks due again with a new attempt budget (failed, permanent_failure and
/// discarded ones); a task whose compensation has started only with `force` (then from
/// no checkpoint). A dry run answers the counts and a sample.
#[utoipa::path(post, path = "/api/v1/tasks/retry", request_body = ActRequest, security(("bearer" = [])),
    responses((status = 200, body = ActAnswer), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn retry(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    request: Result<Json<ActRequest>, JsonRejection>,
) -> Result<Json<ActAnswer>, ApiError> {
    act(&operations, actor, Verb::Retry, request).await
}

/// Fixes stored JSON payloads (failed, permanent_failure and discarded tasks): set,
/// remove, rename or map fields by JSON Pointer. A dry run answers what it would change
/// (with a diff of a few tasks), fail on and leave alone; applied, each changed payload
/// becomes a new version, the value as it came kept. Runs to its end if the client goes
/// away.
#[utoipa::path(post, path = "/api/v1/tasks/transform", request_body = TransformRequest, security(("bearer" = [])),
    responses((status = 200, body = TransformAnswer), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn transform(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    request: Result<Json<TransformRequest>, JsonRejection>,
) -> Result<Json<TransformAnswer>, ApiError> {
    let request = body(request)?;
    let run = tokio::spawn(async move { operations.transform(&actor, &request).await });
    let answer = (run.await)
        .map_err(|failed| ApiError::internal(format!("the transform failed: {failed}")))?;
    Ok(Json(answer?))
}

/// Gives up on tasks (failed and permanent_failure ones): they become discarded.
#[utoipa::path(post, path = "/api/v1/tasks/discard", request_body = ActRequest, security(("bearer" = [])),
    responses((status = 200, body = ActAnswer), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn discard(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    request: Result<Json<ActRequest>, JsonRejection>,
) -> Result<Json<ActAnswer>, ApiError> {
    act(&operations, actor, Verb::Discard, request).await
}

/// Declares tasks handled (failed and permanent_failure ones): they become resolved; a
/// task whose compensation has started only with `force`.
#[utoipa::path(post, path = "/api/v1/tasks/resolve", request_body = ActRequest, security(("bearer" = [])),
    responses((status = 200, body = ActAnswer), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn resolve(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    request: Result<Json<ActRequest>, JsonRejection>,
) -> Result<Json<ActAnswer>, ApiError> {
    act(&operations, actor, Verb::Resolve, request).await
}

/// Counts by status and handler, due work per handler, the last hour's outcomes, live
/// members.
#[utoipa::path(get, path = "/api/v1/stats", security(("bearer" = [])),
    responses((status = 200, body = Stats), (status = 429, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn stats(State(operations): Shared) -> Result<Json<Stats>, ApiError> {
    Ok(Json(operations.stats().await?))
}

/// Checks the store's invariants (reads every task: use sparingly).
#[utoipa::path(get, path = "/api/v1/check", security(("bearer" = [])),
    responses((status = 200, body = CheckReport), (status = 429, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn check(State(operations): Shared) -> Result<Json<CheckReport>, ApiError> {
    Ok(Json(operations.check().await?))
}
