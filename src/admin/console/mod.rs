//! The operator console: server-rendered HTML pages under `/console/` on the admin
//! listener, with the API's tokens and roles.
//!
//! - **Pages**: the fleet overview, live-updating
//!   ([`overview`], opening with what broke, [`broke`], and with the outcome chart of
//!   [`chart`]); every cause, or the groups by class, handler, route or topic
//!   ([`causes`], its query and links in [`cause_query`]); the task list with every filter
//!   of [`TaskFilter`](crate::store::TaskFilter) and keyset paging ([`tasks`], the form in
//!   [`filter`]); a task's detail ([`detail`]); replay jobs with their progress
//!   ([`replays`]); the audit log ([`audit`]); members, breakers and brakes ([`fleet`]).
//!   Every page reads through the store's own read functions; the console writes no SQL.
//! - **Sign-in** ([`login`], [`session`]): an operator pastes a token once; the console
//!   answers with a signed session cookie that every member accepts without shared
//!   state, and that ends with its expiry or when the token is rotated. An open API (no
//!   tokens, loopback only) needs no sign-in: its caller is `anonymous`, operate.
//! - **Safety** ([`security`]): a strict Content Security Policy on every response, no
//!   inline script or style, every payload byte escaped or shown as hex (maud escapes
//!   whatever it interpolates); cross-site requests are refused by the admin listener's
//!   origin guard before they reach a page.
//! - **Assets** ([`assets`]): one stylesheet and one small script, embedded in the
//!   binary; no build step.
//!
//! - **Actions** (operate callers only; a read caller sees no control and the layer
//!   refuses its writes): bulk retry / discard / resolve / replay by selection or filter
//!   ([`actions`], the form they post in [`form`], the confirm page in [`confirm`],
//!   background progress in [`jobs`]);
//!   replay cancel and resume, breaker and brake commands ([`commands`]). Every write
//!   is one `Operations` verb.

mod actions;
mod approvals;
mod assets;
mod audit;
mod broke;
mod cause_query;
mod causes;
mod chart;
mod commands;
mod confirm;
mod detail;
mod error;
mod filter;
mod fleet;
mod form;
mod jobs;
mod layout;
mod login;
mod overview;
mod replays;
mod security;
mod session;
mod tasks;

use axum::response::Redirect;
use axum::routing::{get, post};
use axum::{middleware, Router};
use std::sync::Arc;

use crate::admin::auth::Tokens;
use crate::operations::Operations;

pub(crate) use security::secure_headers;

/// What the console's handlers share.
pub(crate) struct Console {
    /// The operator verbs (and their store), as the admin API has them.
    app: Arc<Operations>,
    /// The API's tokens: who may sign in, and with which role.
    tokens: Arc<Tokens>,
    /// Sign-in attempts per client address.
    logins: login::Attempts,
    /// The overview's figures, read at most once per refresh period per member.
    overview: overview::Cache,
    /// The bulk actions this member runs in the background.
    jobs: Arc<jobs::Jobs>,
}

/// Shared console state.
type Shared = axum::extract::State<Arc<Console>>;

/// The console's routes: `/` and `/console` lead to the overview; every page but the
/// sign-in page and the assets needs a session (or an open API).
pub(crate) fn router(app: Arc<Operations>, tokens: Arc<Tokens>) -> Router {
    let console = Arc::new(Console {
        app,
        tokens,
        logins: login::Attempts::new(),
        overview: overview::Cache::default(),
        jobs: Arc::default(),
    });
    let pages = Router::new()
        .route("/console/", get(overview::page))
        .route("/console/live/overview", get(overview::live))
        .route("/console/causes", get(causes::page))
        .route("/console/tasks", get(tasks::page))
        .route("/console/tasks/{id}", get(detail::page))
        .route("/console/actions/preview", post(actions::preview))
        .route("/console/actions/run", post(actions::run))
        .route("/console/jobs/{id}", get(jobs::page))
        .route("/console/live/jobs/{id}", get(jobs::live))
        .route("/console/replays", get(replays::page))
        .route("/console/live/replays", get(replays::live))
        .route(
            "/console/replays/{id}/cancel",
            post(commands::cancel_replay),
        )
        .route(
            "/console/replays/{id}/resume",
            post(commands::resume_replay),
        )
        .route("/console/replays/{id}/pause", post(commands::pause_replay))
        .route("/console/approvals", get(approvals::page))
        .route(
            "/console/approvals/{id}/{decision}",
            post(approvals::decide),
        )
        .route(
            "/console/breakers/{handler}/{command}",
            post(commands::breaker),
        )
        .route("/console/brakes/engage", post(commands::engage_brake))
        .route(
            "/console/brakes/{route}/release",
            post(commands::release_brake),
        )
        .route("/console/audit", get(audit::page))
        .route("/console/fleet", get(fleet::page))
        .route("/console/logout", post(login::logout))
        .route_layer(middleware::from_fn_with_state(
            console.clone(),
            session::require,
        ));
    Router::new()
        .route("/", get(|| async { Redirect::to("/console/") }))
        .route("/console", get(|| async { Redirect::to("/console/") }))
        .route("/console/login", get(login::page).post(login::submit))
        .route("/console/static/{file}", get(assets::serve))
        .route("/console/{*rest}", get(error::no_such_page))
        .merge(pages)
        .with_state(console)
}
