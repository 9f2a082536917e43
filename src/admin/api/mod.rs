//! The admin JSON API: every operator verb as an endpoint under `/api/v1/`, behind bearer
//! tokens, with an OpenAPI 3 document generated from the code. Each endpoint reads its
//! request ([`extract`]), calls one method of [`Operations`] (which checks the rules and
//! the role) and answers what it returns; lists answer the one envelope (`items`,
//! `next_cursor`). Its endpoints: [`tasks`] (list, show, retry, discard, resolve,
//! groups, stats, check, transform), [`replays`] (start, list, pause, cancel, resume),
//! [`fleet`] (audit, members, breakers, brakes), [`approvals`] (list, approve, reject).

mod approvals;
mod extract;
mod fleet;
mod replays;
mod tasks;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{middleware, Router};
use std::sync::Arc;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::auth::{self, Tokens};
use super::limit;
use crate::operations::{HeavyReads, Operations};

/// The operations every endpoint calls.
type Shared = State<Arc<Operations>>;

/// The OpenAPI document of the admin API.
#[derive(OpenApi)]
#[openapi(
    info(title = "redrive admin API", description = "Look at recovery tasks and act on them."),
    paths(
        tasks::list_tasks, tasks::get_task, tasks::retry, tasks::transform, tasks::discard, tasks::resolve,
        tasks::stats, tasks::check, tasks::groups,
        replays::replay, replays::list_replays, replays::cancel_replay, replays::pause_replay, replays::resume_replay,
        fleet::audit, fleet::members, fleet::breakers, fleet::open_breaker,
        fleet::close_breaker, fleet::release_breaker, fleet::brakes, fleet::engage_brake,
        fleet::release_brake, approvals::list_approvals, approvals::approve, approvals::reject
    ),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API's endpoints over `operations`, authenticated by `tokens`; heavy reads take
/// one of the `heavy` slots.
pub(super) fn router(
    operations: Arc<Operations>,
    tokens: Arc<Tokens>,
    heavy: HeavyReads,
) -> Router {
    let limited = || middleware::from_fn_with_state(heavy.clone(), limit::heavy);
    Router::new()
        .route("/api/v1/tasks", get(tasks::list_tasks))
        .route("/api/v1/groups", get(tasks::groups))
        .route("/api/v1/tasks/retry", post(tasks::retry))
        .route("/api/v1/tasks/transform", post(tasks::transform))
        .route("/api/v1/tasks/discard", post(tasks::discard))
        .route("/api/v1/tasks/resolve", post(tasks::resolve))
        .route("/api/v1/tasks/replay", post(replays::replay))
        .route("/api/v1/tasks/{id}", get(tasks::get_task))
        .route("/api/v1/replays", get(replays::list_replays))
        .route("/api/v1/replays/{id}/cancel", post(replays::cancel_replay))
        .route("/api/v1/replays/{id}/pause", post(replays::pause_replay))
        .route("/api/v1/replays/{id}/resume", post(replays::resume_replay))
        .route("/api/v1/stats", get(tasks::stats).route_layer(limited()))
        .route("/api/v1/check", get(tasks::check).route_layer(limited()))
        .route("/api/v1/audit", get(fleet::audit))
        .route("/api/v1/members", get(fleet::members))
        .route("/api/v1/breakers", get(fleet::breakers))
        .route("/api/v1/breakers/{handler}/open", post(fleet::open_breaker))
        .route(
            "/api/v1/breakers/{handler}/close",
            post(fleet::close_breaker),
        )
        .route(
            "/api/v1/breakers/{handler}/release",
            post(fleet::release_breaker),
        )
        .route("/api/v1/brakes", get(fleet::brakes))
        .route("/api/v1/brakes/{route}/engage", post(fleet::engage_brake))
        .route("/api/v1/brakes/{route}/release", post(fleet::release_brake))
        .route("/api/v1/approvals", get(approvals::list_approvals))
        .route("/api/v1/approvals/{id}/approve", post(approvals::approve))
        .route("/api/v1/approvals/{id}/reject", post(approvals::reject))
        .route_layer(middleware::from_fn_with_state(tokens, auth::authenticate))
        .with_state(operations)
}
