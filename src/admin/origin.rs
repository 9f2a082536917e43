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
//!
//! One kind of cross-site request passes: a person following a link to a console page
//! from another site (a chat, a ticket, a runbook): a top-level `GET` navigation
//! (`Sec-Fetch-Mode: navigate`, `Sec-Fetch-Dest: document`). Console pages change
//! nothing on `GET`, cannot be framed (`frame-ancestors 'none'`) nor read by the other
//! site, and the session cookie (`SameSite=Strict`) does not come along: a signed-in
//! operator is asked to sign in again, then lands on the page.

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, Method};
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
    let navigation =
        is_console_navigation(request.method(), request.uri().path(), request.headers());
    check(guard, request.headers(), navigation)?;
    Ok(next.run(request).await)
}

/// Whether the request is a browser's top-level `GET` of a console page: a person
/// following a link.
fn is_console_navigation(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    let says = |name: &str, value: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case(value))
    };
    (method == Method::GET || method == Method::HEAD)
        && (path == "/" || path == "/console" || path.starts_with("/console/"))
        && says("sec-fetch-mode", "navigate")
        && says("sec-fetch-dest", "document")
}

fn check(guard: Guard, headers: &HeaderMap, navigation: bool) -> Result<(), ApiError> {
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
    let cross_site = site.eq_ignore_ascii_case("cross-site")
        || site.eq_ignore_ascii_case("same-site")
        || foreign_origin;
    if cross_site && !navigation {
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

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    /// Found by the third issue 16 attack: a link to a console page from a chat or a
    /// ticket was answered with a JSON 403. A top-level navigation to a console page
    /// passes; every other cross-site request is refused as before.
    #[test]
    fn a_link_to_a_console_page_from_another_site_is_followed_and_nothing_else() {
        let guard = Guard { open: false };
        let link = [
            ("host", "127.0.0.1:9465"),
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ];
        let passes = |method: Method, path: &str, pairs: &[(&'static str, &'static str)]| {
            let map = headers(pairs);
            check(guard, &map, is_console_navigation(&method, path, &map)).is_ok()
        };
        assert!(passes(Method::GET, "/console/tasks", &link));
        assert!(passes(Method::GET, "/console/jobs/ab12", &link));
        assert!(passes(Method::GET, "/", &link));
        assert!(
            !passes(Method::POST, "/console/actions/run", &link),
            "a form post"
        );
        assert!(!passes(Method::GET, "/api/v1/tasks", &link), "the API");
        assert!(!passes(Method::GET, "/consolex", &link));
        let script = [
            ("host", "127.0.0.1:9465"),
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "cors"),
            ("sec-fetch-dest", "empty"),
        ];
        assert!(!passes(Method::GET, "/console/tasks", &script), "a fetch()");
        let frame = [
            ("host", "127.0.0.1:9465"),
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "iframe"),
        ];
        assert!(!passes(Method::GET, "/console/tasks", &frame), "a frame");
        let open = Guard { open: true };
        let rebound = headers(&[
            ("host", "evil.example"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ]);
        assert!(check(open, &rebound, true).is_err(), "the Host check stays");
    }

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
