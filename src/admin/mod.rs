//! The admin HTTP API (`admin.listen`): the operators' verbs as JSON, behind bearer
//! tokens, with an OpenAPI 3 document generated from the code. The operator console
//! (`crate::console`) is served beside it.

mod auth;
mod error;
mod limit;
mod origin;
mod routes;

use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::config::{AdminSettings, DatabaseSettings};
use crate::store::{Store, StoreError};

pub use auth::{Caller, Tokens};
pub use error::{ApiError, ErrorBody};
pub use limit::HEAVY_READS;
pub use routes::{ActionRequest, ActionResponse, AppState, ReplayRequest, MAX_IDS};

/// The OpenAPI document of the admin API.
#[derive(OpenApi)]
#[openapi(
    info(title = "redrive admin API", description = "Look at recovery tasks and act on them."),
    paths(
        routes::list_tasks, routes::get_task, routes::retry, routes::discard, routes::resolve,
        routes::replay, routes::list_replays, routes::cancel_replay, routes::stats,
        routes::audit, routes::members, routes::check
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

/// The API's routes over `state`, authenticated by `tokens` (the OpenAPI document is
/// public), and the operator console under `/console/` (see `crate::console`).
/// Cross-site requests, and on an open API foreign host names, are refused first (see
/// `origin`); every answer carries the console's security headers.
pub fn router(state: AppState, tokens: Tokens) -> Router {
    let guard = origin::Guard {
        open: tokens.is_open(),
    };
    let heavy = limit::heavy_slots();
    let limited = || middleware::from_fn_with_state(heavy.clone(), limit::heavy);
    let (state, tokens) = (Arc::new(state), Arc::new(tokens));
    let console = crate::console::router(state.clone(), tokens.clone(), heavy.clone());
    let api = Router::new()
        .route("/api/v1/tasks", get(routes::list_tasks))
        .route("/api/v1/tasks/retry", post(routes::retry))
        .route("/api/v1/tasks/discard", post(routes::discard))
        .route("/api/v1/tasks/resolve", post(routes::resolve))
        .route("/api/v1/tasks/replay", post(routes::replay))
        .route("/api/v1/tasks/{id}", get(routes::get_task))
        .route("/api/v1/replays", get(routes::list_replays))
        .route("/api/v1/replays/{id}/cancel", post(routes::cancel_replay))
        .route("/api/v1/stats", get(routes::stats).route_layer(limited()))
        .route("/api/v1/audit", get(routes::audit))
        .route("/api/v1/members", get(routes::members))
        .route("/api/v1/check", get(routes::check).route_layer(limited()))
        .route_layer(middleware::from_fn_with_state(tokens, auth::authenticate))
        .with_state(state);
    Router::new()
        .route(
            "/api/v1/openapi.json",
            get(|| async { Json(ApiDoc::openapi()) }),
        )
        .merge(api)
        .merge(console)
        .fallback(|| async { ApiError::not_found("no such endpoint; see /api/v1/openapi.json") })
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
