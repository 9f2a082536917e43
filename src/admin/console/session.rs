//! Console sessions: a cookie that says who signed in and until when, signed with a key
//! derived from that caller's token.
//!
//! The cookie is `NAME.EXPIRY.MAC`: the token's name, the end of the session (Unix
//! seconds), and an HMAC-SHA256 of both keyed by a SHA-256 of the token. Every member
//! with the same tokens accepts it without shared state; rotating a token (or removing
//! it) ends its sessions at once, and the role is the token's role at each request, so
//! a changed role applies at once too. Signing out clears the cookie in the browser; a
//! copy taken before stays valid until it expires (at most [`LIFETIME`]) or the token
//! is rotated. Expiry is compared with the member's clock (a few seconds of skew
//! between members move an 8-hour session's end by as much).
//!
//! The cookie is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's
//! page sends it), `Path=/console`. It is `Secure` when the request reached the member
//! through a TLS-terminating proxy that says so (`X-Forwarded-Proto: https`): redrive
//! itself serves plain HTTP, and a browser keeps no `Secure` cookie from a plain-HTTP
//! address other than localhost, so the flag cannot be set unconditionally.

use axum::extract::{Request, State};
use axum::http::header::{COOKIE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

use super::error::PageError;
use super::Console;
use crate::admin::auth::Tokens;
use crate::config::Role;
use crate::operations::Actor;
use crate::readable::hex;

/// The session cookie's name.
const COOKIE_NAME: &str = "redrive_session";

/// How long a session lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// The caller of an open API (no tokens, loopback only): it needs no session.
fn anonymous() -> Actor {
    Actor {
        name: "anonymous".into(),
        role: Role::Operate,
    }
}

fn mac(token: &[u8], name: &str, expires: i64) -> Hmac<Sha256> {
    let key = Sha256::new()
        .chain_update(b"redrive console session\0")
        .chain_update(token)
        .finalize();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes a key of any size");
    mac.update(name.as_bytes());
    mac.update(b"\0");
    mac.update(expires.to_string().as_bytes());
    mac
}

/// The cookie value of a session of `name` (whose token is `token`) ending at
/// `expires` (Unix seconds).
pub(crate) fn sign(name: &str, token: &[u8], expires: i64) -> String {
    let tag = mac(token, name, expires).finalize().into_bytes();
    format!("{name}.{expires}.{}", hex(&tag))
}

/// The caller a cookie value names, if its signature holds under that caller's current
/// token and it has not expired by `now` (Unix seconds).
fn verify(tokens: &Tokens, value: &str, now: i64) -> Option<Actor> {
    let mut parts = value.split('.');
    let (name, expires, tag) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let expires: i64 = expires.parse().ok()?;
    let tag = unhex(tag)?;
    let (caller, token) = tokens.named(name)?;
    mac(token, name, expires).verify_slice(&tag).ok()?;
    (now < expires).then_some(caller)
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The session cookie's value in `headers`, if the browser sent one.
fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
}

/// Whether a TLS-terminating proxy says the browser used HTTPS.
fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// `Set-Cookie` starting a session with `value`.
pub(crate) fn set_cookie(value: &str, request: &HeaderMap) -> HeaderValue {
    let secure = if over_https(request) { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE_NAME}={value}; Path=/console; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
        LIFETIME.as_secs()
    );
    HeaderValue::from_str(&cookie).expect("a session cookie is visible ASCII")
}

/// `Set-Cookie` ending the session in this browser.
pub(crate) fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static(
        "redrive_session=; Path=/console; Max-Age=0; HttpOnly; SameSite=Strict",
    )
}

/// The caller of a request: the open API's anonymous operator, or the session's.
pub(crate) fn caller(console: &Console, headers: &HeaderMap) -> Option<Actor> {
    if console.tokens.is_open() {
        return Some(anonymous());
    }
    let now = chrono::Utc::now().timestamp();
    verify(&console.tokens, presented(headers)?, now)
}

/// Middleware: sets the [`Actor`] of a page request. Without a session a page is
/// redirected to the sign-in page (which comes back to it); a live fragment or a form
/// post is answered 401.
pub(crate) async fn require(
    State(console): State<Arc<Console>>,
    mut request: Request,
    next: Next,
) -> Response {
    match caller(&console, request.headers()) {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None if request.method() == Method::GET
            && !request.uri().path().starts_with("/console/live/") =>
        {
            let back = request
                .uri()
                .path_and_query()
                .map_or("/console/", |p| p.as_str());
            let query = serde_urlencoded::to_string([("next", back)]).unwrap_or_default();
            let mut response = StatusCode::SEE_OTHER.into_response();
            let location = HeaderValue::from_str(&format!("/console/login?{query}"))
                .unwrap_or(HeaderValue::from_static("/console/login"));
            response.headers_mut().insert(LOCATION, location);
            response
        }
        None => {
            PageError::unauthorized("sign in again: no session, or it has ended").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(operate: &str) -> Tokens {
        crate::admin::test_tokens(operate)
    }

    #[test]
    fn a_signed_session_names_its_caller_until_it_expires_or_its_token_changes() {
        let tokens = tokens("operate-token-0123456789");
        let value = sign("ops", b"operate-token-0123456789", 1_000);
        let caller = verify(&tokens, &value, 999).expect("valid before its expiry");
        assert_eq!((caller.name.as_str(), caller.role), ("ops", Role::Operate));
        assert_eq!(verify(&tokens, &value, 1_000), None, "expired");
        let rotated = self::tokens("operate-token-rotated-0000");
        assert_eq!(
            verify(&rotated, &value, 999),
            None,
            "a rotated token ends it"
        );
    }

    #[test]
    fn a_forged_or_malformed_session_names_no_one() {
        let tokens = tokens("operate-token-0123456789");
        let viewer = sign("viewer", b"read-token-0123456789ab", 1_000);
        let (_, rest) = viewer.split_once('.').unwrap();
        let mut later = viewer.replace(".1000.", ".9000.");
        assert_eq!(verify(&tokens, &later, 999), None, "expiry moved");
        later = format!("ops.{rest}");
        assert_eq!(verify(&tokens, &later, 999), None, "name changed");
        let unsigned = sign("ops", b"not-the-token", 1_000);
        assert_eq!(verify(&tokens, &unsigned, 999), None, "signed with a guess");
        for garbage in [
            "",
            "ops",
            "ops.1000",
            "ops.x.00",
            "ops.1000.zz",
            "a.1.00.extra",
        ] {
            assert_eq!(verify(&tokens, garbage, 0), None, "{garbage:?}");
        }
        assert!(verify(&tokens, &viewer, 999).is_some());
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_behind_https() {
        let plain = set_cookie("v", &HeaderMap::new());
        let plain = plain.to_str().unwrap();
        for part in [
            "Path=/console",
            "HttpOnly",
            "SameSite=Strict",
            "Max-Age=28800",
        ] {
            assert!(plain.contains(part), "{plain}");
        }
        assert!(!plain.contains("Secure"), "{plain}");
        let mut proxied = HeaderMap::new();
        proxied.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(set_cookie("v", &proxied)
            .to_str()
            .unwrap()
            .ends_with("; Secure"));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_static("a=1; redrive_session=ops.5.ab; b=2"),
        );
        assert_eq!(presented(&headers), Some("ops.5.ab"));
        headers.insert(COOKIE, HeaderValue::from_static("redrive_sessionx=1"));
        assert_eq!(presented(&headers), None);
    }
}
