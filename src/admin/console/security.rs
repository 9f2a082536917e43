//! The headers every answer of the admin listener carries, the console's pages and the
//! API's JSON alike (set outside the origin guard, so its refusals carry them too).
//!
//! - A strict Content Security Policy: scripts, styles and fetches from this origin
//!   only, no inline script or style (the console has none), no plugins, no framing,
//!   forms posting only here. A payload that smuggled markup past the escaping could
//!   still run nothing.
//! - `X-Content-Type-Options: nosniff`, and `X-Frame-Options: DENY` for browsers that
//!   predate `frame-ancestors`.
//! - `Referrer-Policy: same-origin`: no address of the console (its filters name keys
//!   and errors) leaves for another site. Not `no-referrer`: under it browsers send
//!   `Origin: null` with the console's own form posts, which the cross-site guard
//!   cannot tell from a sandboxed foreign page and refuses.
//! - Cross-origin isolation of the window and the resources (`Cross-Origin-Opener-Policy`,
//!   `Cross-Origin-Resource-Policy`).
//! - `Cache-Control: no-store` unless a handler chose otherwise: payloads are not
//!   written to a browser's disk cache.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::HeaderValue;
use axum::response::Response;

/// The console's Content Security Policy.
pub(crate) const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
    base-uri 'none'";

/// Middleware (`map_response`): adds the security headers to `response`.
pub(crate) async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (CONTENT_SECURITY_POLICY, POLICY),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (X_FRAME_OPTIONS, "DENY"),
        (REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
