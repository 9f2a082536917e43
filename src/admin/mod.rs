//! The admin listener (`admin.listen`) serves two faces over [`Operations`], with the
//! same tokens and roles: the JSON API (`api`: tasks, replays, the fleet's audit,
//! members, breakers and brakes, with its OpenAPI document) and the operator console
//! (`console`: server-rendered pages under `/console/`). Beside them, what both share:
//! `auth` (the tokens, and the API's bearer check), `origin` (cross-site requests and
//! foreign host names kept out), `limit` (heavy reads a few at a time) and `error` (the
//! JSON error answers).

mod api;
pub(crate) mod auth;
mod console;
mod error;
mod limit;
mod origin;

use axum::routing::get;
use axum::{middleware, Json, Router};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;

use crate::config::{AdminSettings, DatabaseSettings};
use crate::operations::Operations;
use crate::store::{Store, StoreError};

pub use crate::operations::HEAVY_READS;
pub use api::ApiDoc;
#[cfg(test)]
pub(crate) use auth::test_tokens;
pub use auth::Tokens;
pub use error::{ApiError, ErrorBody};

/// The API's routes over `operations`, authenticated by `tokens` (the OpenAPI document
/// is public), and the operator console under `/console/` (see `console`).
/// Cross-site requests, and on an open API foreign host names, are refused first (see
/// `origin`); every answer carries the console's security headers.
pub fn router(operations: Operations, tokens: Tokens) -> Router {
    let guard = origin::Guard {
        open: tokens.is_open(),
    };
    let heavy = operations.heavy_reads();
    let (operations, tokens) = (Arc::new(operations), Arc::new(tokens));
    let console = console::router(operations.clone(), tokens.clone());
    let api = api::router(operations.clone(), tokens.clone(), heavy.clone());
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
        .layer(middleware::map_response(console::secure_headers))
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
