//! Signing in with a token, and out.
//!
//! An operator pastes one of `admin.tokens` into the sign-in page; the console answers
//! with a session cookie (see [`super::session`]) and goes back to the page that asked.
//! Sign-in attempts are limited per client address: [`ATTEMPTS_PER_MINUTE`] at once,
//! then one more every 60 / [`ATTEMPTS_PER_MINUTE`] s; one more is answered 429 with
//! `Retry-After` before the token is looked at. Every attempt counts, right or wrong.
//! The address is the TCP peer's (a proxy in front makes every browser one client:
//! forwarded addresses can be forged, so they are not read). IPv6 clients are counted
//! per /64, what one host usually holds.

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::header::{LOCATION, SET_COOKIE};
use axum::http::{Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use maud::html;
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;

use super::error::PageError;
use super::layout;
use super::session::{self, LIFETIME};
use super::Shared;
use crate::operations::Actor;

/// Sign-in attempts a client may make at once.
pub(crate) const ATTEMPTS_PER_MINUTE: u32 = 5;

/// Clients remembered before the ones not seen for a minute are forgotten.
const CLIENTS_KEPT: usize = 10_000;

/// Sign-in attempts per client address.
pub(crate) struct Attempts {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
}

impl Attempts {
    /// No attempt counted yet.
    pub(crate) fn new() -> Attempts {
        let per_minute = NonZeroU32::new(ATTEMPTS_PER_MINUTE).expect("a positive constant");
        Attempts {
            limiter: RateLimiter::keyed(Quota::per_minute(per_minute)),
        }
    }

    /// Counts an attempt of `client`; `Err(seconds)` to wait when it has made too many.
    fn admit(&self, client: IpAddr) -> Result<(), u64> {
        if self.limiter.len() > CLIENTS_KEPT {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(&client_key(client))
            .map_err(|not_until| {
                let wait = not_until.wait_time_from(self.limiter.clock().now());
                wait.as_secs_f64().ceil().max(1.0) as u64
            })
    }
}

/// The key a client is counted under: its IPv4 address, or its IPv6 /64.
fn client_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// Where to go after signing in: a console page, else the overview (never another site).
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(next)
            if next.starts_with("/console/")
                && !next.contains("//")
                && !next.contains('\\')
                && !next.chars().any(char::is_control) =>
        {
            next
        }
        _ => "/console/",
    }
}

fn see_other(to: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let location =
        HeaderValue::from_str(to).unwrap_or_else(|_| HeaderValue::from_static("/console/"));
    response.headers_mut().insert(LOCATION, location);
    response
}

/// The sign-in form; `problem` above it if the last attempt failed.
fn form(status: StatusCode, next: &str, problem: Option<&str>) -> Response {
    let body = html! {
        @if let Some(problem) = problem {
            p.error role="alert" { (problem) }
        }
        p { "Paste one of this fleet's admin tokens (" code { "admin.tokens" } " in its configuration). "
            "A session lasts " (LIFETIME.as_secs() / 3600) " hours, or until the token is changed." }
        form.login method="post" action="/console/login" {
            input type="hidden" name="next" value=(next);
            div.field {
                label for="token" { "Token" }
                input type="password" id="token" name="token" autocomplete="current-password" required autofocus;
            }
            div.buttons { button type="submit" { "Sign in" } }
        }
    };
    (status, layout::bare("Sign in to redrive", body)).into_response()
}

/// The sign-in page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Next {
    next: Option<String>,
}

/// `GET /console/login`: the form, or straight on when no sign-in is needed.
pub(crate) async fn page(
    State(console): Shared,
    headers: HeaderMap,
    query: Result<Query<Next>, QueryRejection>,
) -> Response {
    let next = query.map(|Query(q)| q.next).unwrap_or_default();
    let next = safe_next(next.as_deref());
    if session::caller(&console, &headers).is_some() {
        return see_other(next);
    }
    form(StatusCode::OK, next, None)
}

/// The sign-in form's fields.
#[derive(Deserialize)]
pub(crate) struct SignIn {
    token: String,
    #[serde(default)]
    next: Option<String>,
}

/// `POST /console/login`: a session for a known token.
pub(crate) async fn submit(
    State(console): Shared,
    extensions: Extensions,
    headers: HeaderMap,
    sign_in: Result<Form<SignIn>, FormRejection>,
) -> Response {
    let client = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    if let Err(seconds) = console.logins.admit(client) {
        tracing::warn!(%client, "console: sign-in attempts over the limit");
        return PageError::too_many(
            format!(
                "too many sign-in attempts from this address; try again in {seconds} s \
                 ({ATTEMPTS_PER_MINUTE} a minute at most)"
            ),
            seconds,
        )
        .into_response();
    }
    let Ok(Form(sign_in)) = sign_in else {
        return PageError::bad_request("the sign-in form was not sent whole").into_response();
    };
    let next = safe_next(sign_in.next.as_deref());
    if console.tokens.is_open() {
        return see_other(next);
    }
    let presented = sign_in.token.trim().as_bytes();
    let Some((caller, token)) = console
        .tokens
        .identify(presented)
        .and_then(|caller| console.tokens.named(&caller.name))
    else {
        tracing::warn!(%client, "console: sign-in with an unknown token");
        return form(
            StatusCode::UNAUTHORIZED,
            next,
            Some("That is not one of this fleet's admin tokens."),
        );
    };
    tracing::info!(%client, actor = %caller.name, "console: signed in");
    let expires = chrono::Utc::now().timestamp() + LIFETIME.as_secs() as i64;
    let value = session::sign(&caller.name, token, expires);
    let mut response = see_other(next);
    response
        .headers_mut()
        .insert(SET_COOKIE, session::set_cookie(&value, &headers));
    response
}

/// `POST /console/logout`: ends the session in this browser.
pub(crate) async fn logout(Extension(caller): Extension<Actor>) -> Response {
    tracing::info!(actor = %caller.name, "console: signed out");
    let mut response = see_other("/console/login");
    response
        .headers_mut()
        .insert(SET_COOKIE, session::clear_cookie());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sixth_rapid_attempt_of_a_client_waits_and_others_do_not() {
        let attempts = Attempts::new();
        let client: IpAddr = "192.0.2.7".parse().unwrap();
        for _ in 0..ATTEMPTS_PER_MINUTE {
            assert_eq!(attempts.admit(client), Ok(()));
        }
        let wait = attempts.admit(client).unwrap_err();
        assert!((1..=12).contains(&wait), "{wait}");
        assert_eq!(attempts.admit("192.0.2.8".parse().unwrap()), Ok(()));
    }

    #[test]
    fn ipv6_clients_count_per_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(client_key(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn after_signing_in_only_console_pages_are_gone_to() {
        assert_eq!(
            safe_next(Some("/console/tasks?status=failed")),
            "/console/tasks?status=failed"
        );
        for foreign in [
            None,
            Some("https://evil.example/"),
            Some("//evil.example/console/"),
            Some("/console//evil.example"),
            Some("/console/\\evil"),
            Some("/api/v1/tasks"),
            Some("/console/\r\nSet-Cookie: x"),
        ] {
            assert_eq!(safe_next(foreign), "/console/", "{foreign:?}");
        }
    }
}
