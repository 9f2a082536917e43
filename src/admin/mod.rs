//! The admin HTTP API (`admin.listen`): every operator verb as JSON, behind bearer
//! tokens, with an OpenAPI 3 document generated from the code. Each endpoint reads its
//! request, calls one method of [`Operations`] (which checks the rules and the role) and
//! answers what it returns; lists answer the one envelope (`items`, `next_cursor`).
//!
//! Its pieces: `tasks` (list, show, retry, discard, resolve, stats, check), `replays`
//! (start, list, cancel, resume), `fleet` (audit, members, breakers, brakes), `extract`
//! (reading requests), `auth` (tokens), `origin` (browsers kept out), `limit` (heavy
//! reads), `error` (statuses).
//! The operator console (`crate::console`) is served beside it.

mod auth;
mod error;
mod extract;
mod fleet;
mod limit;
mod origin;
mod replays;
mod tasks;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::config::{AdminSettings, DatabaseSettings};
use crate::operations::Operations;
use crate::store::{Store, StoreError};

#[cfg(test)]
pub(crate) use auth::test_tokens;
pub use auth::Tokens;
pub use error::{ApiError, ErrorBody};
pub use limit::HEAVY_READS;

/// The operations every endpoint calls.
type Shared = State<Arc<Operations>>;

/// The OpenAPI document of the admin API.
#[derive(OpenApi)]
#[openapi(
    info(title = "redrive admin API", description = "Look at recovery tasks and act on them."),
    paths(
        tasks::list_tasks, tasks::get_task, tasks::retry, tasks::discard, tasks::resolve,
        tasks::stats, tasks::check, tasks::groups,
        replays::replay, replays::list_replays, replays::cancel_replay, replays::resume_replay,
        fleet::audit, fleet::members, fleet::breakers, fleet::open_breaker,
        fleet::close_breaker, fleet::release_breaker, fleet::brakes, fleet::engage_brake,
        fleet::release_brake
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

/// The API's routes over `operations`, authenticated by `tokens` (the OpenAPI document
/// is public), and the operator console under `/console/` (see `crate::console`).
/// Cross-site requests, and on an open API foreign host names, are refused first (see
/// `origin`); every answer carries the console's security headers.
pub fn router(operations: Operations, tokens: Tokens) -> Router {
    let guard = origin::Guard {
        open: tokens.is_open(),
    };
    let heavy = limit::heavy_slots();
    let limited = || middleware::from_fn_with_state(heavy.clone(), limit::heavy);
    let (operations, tokens) = (Arc::new(operations), Arc::new(tokens));
    let console = crate::console::router(operations.clone(), tokens.clone(), heavy.clone());
    let api = Router::new()
        .route("/api/v1/tasks", get(tasks::list_tasks))
        .route("/api/v1/groups", get(tasks::groups).route_layer(limited()))
        .route("/api/v1/tasks/retry", post(tasks::retry))
        .route("/api/v1/tasks/discard", post(tasks::discard))
        .route("/api/v1/tasks/resolve", post(tasks::resolve))
        .route("/api/v1/tasks/replay", post(replays::replay))
        .route("/api/v1/tasks/{id}", get(tasks::get_task))
        .route("/api/v1/replays", get(replays::list_replays))
        .route("/api/v1/replays/{id}/cancel", post(replays::cancel_replay))
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
        .route_layer(middleware::from_fn_with_state(tokens, auth::authenticate))
        .with_state(operations);
    Router::new()
        .route(
            "/api/v1/openapi.json",
            get(|| async { Json(ApiDoc::openapi()) }),
        )
        .merge(api)
        .merge(console)
        .fallback(|| async { ApiError::not_found("no such endpoint; see /api/v1/openapi.json") })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::method_not_allowed(format!(
                "{method} is not a method of this address; see /api/v1/openapi.json"
            ))
        })
        .layer(middleware::from_fn_with_state(
            guard,
            origin::refuse_foreign,
        ))
        .layer(middleware::map_response(crate::console::secure_headers))
}

/// Connections the API's own pool opens at most (per member).
pub const CONNECTIONS: u32 = 4;

/// The store the API works on: a pool of its own of at most [`CONNECTIONS`], whose
/// statements PostgreSQL cancels after `admin.statement_timeout`, so that API requests
/// neither take the fleet's connections nor hold the database for long.
pub fn api_store(database: &DatabaseSettings, admin: &AdminSettings) -> Result<Store, StoreError> {
    Store::connect_bounded(database, CONNECTIONS, admin.statement_timeout)
}

/// Serves the API on `listener` until `shutdown` fires; requests in progress then get
/// up to `drain` to finish. A request's head must arrive within 10 s.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
    drain: std::time::Duration,
) {
    crate::listener::serve(listener, app, shutdown, drain).await
}
