//! The console's stylesheet and script, embedded in the binary: nothing to build, and
//! nothing loaded from anywhere else.

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

use super::error::PageError;

const CSS: &str = include_str!("static/console.css");
const JS: &str = include_str!("static/console.js");

/// `GET /console/static/{file}`: `console.css` or `console.js`. A browser revalidates
/// them on each use (`no-cache`), so a new member's assets apply at once.
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let (content_type, body) = match file.as_str() {
        "console.css" => ("text/css; charset=utf-8", CSS),
        "console.js" => ("text/javascript; charset=utf-8", JS),
        _ => return PageError::not_found(format!("no asset {file:?}")).into_response(),
    };
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
        .into_response()
}
