//! Which browsers' requests the admin API refuses, before any token is looked at.
//!
//! - **Cross-site requests**, always: a browser says where a request comes from
//!   (`Sec-Fetch-Site`, `Origin`); the API serves no web page, so a request another
//!   site's page makes is refused, whatever it carries.
//! - **Foreign host names**, when no token is configured: an open API listens on
//!   loopback, and a `Host` other than a loopback name or address means a page on a
//!   domain that now resolves to this machine (DNS rebinding).
//!
//! Clients that are not browsers (curl, scripts, the CLI) send neither header and a
//! loopback `Host`, and are not affected.

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::error::ApiError;

/// What the guard checks.
#[derive(Debug, Clone, Copy)]
pub struct Guard {
    /// No token is configured: only loopback host names are answered.
    pub open: bool,
}

/// Middleware: refuses a cross-site request, and a foreign `Host` on an open API, with
/// a 403 that says why.
pub async fn refuse_foreign(
    State(guard): State<Guard>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    check(guard, request.headers())?;
    Ok(next.run(request).await)
}

fn check(guard: Guard, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    if guard.open && !host.is_some_and(is_loopback_host) {
        return Err(ApiError::forbidden(format!(
            "Host {:?} is not a loopback name: this API has no token and answers only \
             localhost, 127.0.0.0/8 and [::1] (configure admin.tokens to serve other names)",
            host.unwrap_or("")
        )));
    }
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let foreign_origin = headers.get(ORIGIN).is_some_and(|origin| {
        let authority = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, authority)| authority);
        match (authority, host) {
            (Some(authority), Some(host)) => !authority.eq_ignore_ascii_case(host),
            _ => true,
        }
    });
    if site.eq_ignore_ascii_case("cross-site")
        || site.eq_ignore_ascii_case("same-site")
        || foreign_origin
    {
        return Err(ApiError::forbidden(
            "cross-site request refused: the admin API answers no other site's web page",
        ));
    }
    Ok(())
}

/// Whether `host` (a `Host` header: a name or address with an optional port) names
/// this machine's loopback interface.
fn is_loopback_host(host: &str) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        let Some((address, port)) = rest.split_once(']') else {
            return false;
        };
        let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(is_port);
        return port_ok && address.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback());
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return false,
        None => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_names_and_addresses_of_loopback_only() {
        for host in [
            "localhost",
            "LocalHost:9465",
            "127.0.0.1",
            "127.0.0.1:9465",
            "127.255.0.3:1",
            "[::1]",
            "[::1]:9465",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "127.0.0.1:",
            "127.0.0.1:x",
            "10.0.0.1:9465",
            "[::2]:9465",
            "[::1",
            "[::1]x",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
