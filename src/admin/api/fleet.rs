//! The fleet's endpoints: audit log, members, circuit breakers, brakes.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};

use super::extract::{body, name, query};
use super::Shared;
use crate::admin::error::{ApiError, ErrorBody};
use crate::operations::{Actor, AuditRequest, EngageRequest, Operations, Page, ReasonRequest};
use crate::resilience::breaker::Breaker;
use crate::store::{AuditEntry, Brake, BreakerCommand, Member};

/// The audit log of operator actions, newest first.
#[utoipa::path(get, path = "/api/v1/audit", params(AuditRequest), security(("bearer" = [])),
    responses((status = 200, body = Page<AuditEntry>), (status = 400, body = ErrorBody)))]
pub async fn audit(
    State(operations): Shared,
    q: Result<Query<AuditRequest>, QueryRejection>,
) -> Result<Json<Page<AuditEntry>>, ApiError> {
    Ok(Json(operations.audit(&query(q)?).await?))
}

/// Fleet members seen recently.
#[utoipa::path(get, path = "/api/v1/members", security(("bearer" = [])),
    responses((status = 200, body = Page<Member>)))]
pub async fn members(State(operations): Shared) -> Result<Json<Page<Member>>, ApiError> {
    Ok(Json(operations.members().await?))
}

/// Every configured circuit breaker (and stored ones of handlers this member does not
/// know): state, forced state, counts, hold, last reason.
#[utoipa::path(get, path = "/api/v1/breakers", security(("bearer" = [])),
    responses((status = 200, body = Page<Breaker>)))]
pub async fn breakers(State(operations): Shared) -> Result<Json<Page<Breaker>>, ApiError> {
    Ok(Json(operations.breakers().await?))
}

async fn command(
    operations: &Operations,
    actor: &Actor,
    path: Result<Path<String>, PathRejection>,
    command: BreakerCommand,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Breaker>, ApiError> {
    let (handler, request) = (name(path)?, body(request)?);
    let breaker = operations.command_breaker(actor, &handler, command, &request);
    Ok(Json(breaker.await?))
}

/// Forces a handler's breaker open: its tasks wait until it is closed or released.
#[utoipa::path(post, path = "/api/v1/breakers/{handler}/open", request_body = ReasonRequest,
    params(("handler" = String, Path, description = "Handler name")), security(("bearer" = [])),
    responses((status = 200, body = Breaker), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn open_breaker(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Breaker>, ApiError> {
    command(&operations, &actor, path, BreakerCommand::Open, request).await
}

/// Forces a handler's breaker closed: calls go through, whatever fails.
#[utoipa::path(post, path = "/api/v1/breakers/{handler}/close", request_body = ReasonRequest,
    params(("handler" = String, Path, description = "Handler name")), security(("bearer" = [])),
    responses((status = 200, body = Breaker), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn close_breaker(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Breaker>, ApiError> {
    command(&operations, &actor, path, BreakerCommand::Close, request).await
}

/// Releases a breaker's forced state: it is closed and counts afresh.
#[utoipa::path(post, path = "/api/v1/breakers/{handler}/release", request_body = ReasonRequest,
    params(("handler" = String, Path, description = "Handler name")), security(("bearer" = [])),
    responses((status = 200, body = Breaker), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn release_breaker(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Breaker>, ApiError> {
    command(&operations, &actor, path, BreakerCommand::Release, request).await
}

/// Every route's brake (and stored ones of routes this member does not know): engaged
/// or not, until when, by whom, why, trips.
#[utoipa::path(get, path = "/api/v1/brakes", security(("bearer" = [])),
    responses((status = 200, body = Page<Brake>)))]
pub async fn brakes(State(operations): Shared) -> Result<Json<Page<Brake>>, ApiError> {
    Ok(Json(operations.brakes().await?))
}

/// Engages a route's brake on purpose (any route, capture or process): every member
/// stops consuming it within a second or so, for `for` (default 1h, at most 7 days) or
/// until released.
#[utoipa::path(post, path = "/api/v1/brakes/{route}/engage", request_body = EngageRequest,
    params(("route" = String, Path, description = "Route name")), security(("bearer" = [])),
    responses((status = 200, body = Brake), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn engage_brake(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<EngageRequest>, JsonRejection>,
) -> Result<Json<Brake>, ApiError> {
    let (route, request) = (name(path)?, body(request)?);
    Ok(Json(
        operations.engage_brake(&actor, &route, &request).await?,
    ))
}

/// Releases a route's engaged brake: every member resumes the route within a second or
/// so.
#[utoipa::path(post, path = "/api/v1/brakes/{route}/release", request_body = ReasonRequest,
    params(("route" = String, Path, description = "Route name")), security(("bearer" = [])),
    responses((status = 200, body = Brake), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn release_brake(
    State(operations): Shared,
    Extension(actor): Extension<Actor>,
    path: Result<Path<String>, PathRejection>,
    request: Result<Json<ReasonRequest>, JsonRejection>,
) -> Result<Json<Brake>, ApiError> {
    let (route, request) = (name(path)?, body(request)?);
    Ok(Json(
        operations.release_brake(&actor, &route, &request).await?,
    ))
}
