//! The redrive job endpoints (replays and paced retries): start a replay (or a dry run),
//! list, pause, cancel, resume.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::extract::{body, id, query};
use super::Shared;
use crate::admin::error::{ApiError, ErrorBody};
use crate::operations::{Actor, Page, PageRequest, ReplayPreview, ReplayRequest, Runner};
use crate::store::ReplayJob;

/// Starts a replay job, run by a fleet member: the stored messages of the tasks a
/// filter selects, produced to a topic. The topics are checked first. With `dry_run`,
/// answers what it would produce and skip (and why), with a sample, and records nothing.
#[utoipa::path(post, path = "/api/v1/tasks/replay", request_body = ReplayRequest, security(("bearer" = [])),
    responses((status = 202, body = ReplayJob), (status = 200, description = "dry run", body = ReplayPreview),
              (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn replay(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    request: Result<Json<ReplayRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(request)?;
    if request.dry_run {
        let preview = operations.preview_replay(&actor, &request).await?;
        return Ok(Json(preview).into_response());
    }
    let job = operations
        .start_replay(&actor, &request, Runner::Fleet)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(job)).into_response())
}

/// Replay jobs with their progress, newest first.
#[utoipa::path(get, path = "/api/v1/replays", params(PageRequest), security(("bearer" = [])),
    responses((status = 200, body = Page<ReplayJob>), (status = 400, body = ErrorBody)))]
pub async fn list_replays(
    State(operations): Shared,
    q: Result<Query<PageRequest>, QueryRejection>,
) -> Result<Json<Page<ReplayJob>>, ApiError> {
    Ok(Json(operations.replays(&query(q)?).await?))
}

/// Cancels a replay job; its runner stops after its current batch.
#[utoipa::path(post, path = "/api/v1/replays/{id}/cancel", params(("id" = i64, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = ReplayJob), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn cancel_replay(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ReplayJob>, ApiError> {
    let job = id(path, "replay job")?;
    Ok(Json(operations.cancel_replay(&actor, job).await?))
}

/// Pauses a job (a replay or a paced retry); its runner stops after its current batch
/// and no member takes it until it is resumed.
#[utoipa::path(post, path = "/api/v1/replays/{id}/pause", params(("id" = i64, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = ReplayJob), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn pause_replay(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ReplayJob>, ApiError> {
    let job = id(path, "replay job")?;
    Ok(Json(operations.pause_replay(&actor, job).await?))
}

/// How a job is resumed.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
pub struct ResumeParams {
    /// A new rate (slowing it down): a paced job's full pace, an unpaced replay's rate.
    pub rate: Option<f64>,
}

/// Hands a paused or interrupted job (its runner stopped, or it failed) to the fleet's
/// members, as `redrive replays resume --detach`: one of them continues it where it
/// stopped; `?rate=` slows it down. A paused job judges its step afresh.
#[utoipa::path(post, path = "/api/v1/replays/{id}/resume", params(("id" = i64, Path, description = "Job id"), ResumeParams),
    security(("bearer" = [])),
    responses((status = 200, body = ReplayJob), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn resume_replay(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ResumeParams>, QueryRejection>,
) -> Result<Json<ReplayJob>, ApiError> {
    let job = id(path, "replay job")?;
    let rate = query(q)?.rate;
    let resumed = operations.resume_replay(&actor, job, Runner::Fleet, None, rate);
    Ok(Json(resumed.await?))
}
