//! `[webhooks.NAME]`: one built-in `webhook` handler per table, registered under NAME.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::checks::{at_most, within, ONE_DAY, ONE_HOUR};
use super::redact;
use super::{duration, ConfigError};

/// What a webhook call sends as its body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookBody {
    /// A JSON envelope: task, key, value (UTF-8 or base64), headers and failure context.
    #[default]
    Envelope,
    /// The message value, byte for byte.
    Raw,
}

/// Where and how a webhook call goes. Header values and the URL's userinfo and query
/// may hold credentials: `Debug` shows header names only and the URL redacted
/// ([`redact`]).
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookTarget {
    /// `http://` or `https://` URL.
    pub url: Option<String>,
    /// HTTP method (`POST` by default).
    pub method: Option<String>,
    /// Extra request headers (`Authorization`, ...).
    pub headers: BTreeMap<String, String>,
    /// `envelope` or `raw`.
    pub body: Option<WebhookBody>,
}

impl fmt::Debug for WebhookTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookTarget")
            .field("url", &self.url.as_deref().map(redact::redacted_text))
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body", &self.body)
            .finish()
    }
}

/// `[webhooks.NAME]`: a webhook handler named NAME. `Debug` shows header names only and
/// the URL redacted.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookSettings {
    /// `http://` or `https://` URL (required).
    pub url: Option<String>,
    /// HTTP method (`POST` by default).
    pub method: Option<String>,
    /// Extra request headers (`Authorization`, ...).
    pub headers: BTreeMap<String, String>,
    /// `envelope` (the default) or `raw`.
    pub body: Option<WebhookBody>,
    /// `[webhooks.NAME.routes.ROUTE]`: what differs for the tasks of one ingest route
    /// (unset keys come from the handler's table; headers are merged over it).
    pub routes: BTreeMap<String, WebhookTarget>,
    /// Longest wait for the TCP (and TLS) connection.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// Longest a whole call may take, connection to last byte.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Longest delay a server's `Retry-After` may ask for.
    #[serde(deserialize_with = "duration")]
    pub retry_after_max: Duration,
}

impl fmt::Debug for WebhookSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("target", &self.own())
            .field("routes", &self.routes)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("retry_after_max", &self.retry_after_max)
            .finish()
    }
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            url: None,
            method: None,
            headers: BTreeMap::new(),
            body: None,
            routes: BTreeMap::new(),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            retry_after_max: Duration::from_secs(3600),
        }
    }
}

/// A target with every part checked and parsed, ready for reqwest. `Debug` shows the
/// URL redacted and header names only.
#[derive(Clone)]
pub struct ResolvedTarget {
    /// Where to send.
    pub url: Url,
    /// How.
    pub method: Method,
    /// Extra headers.
    pub headers: HeaderMap,
    /// What to send.
    pub body: WebhookBody,
}

impl fmt::Debug for ResolvedTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedTarget")
            .field("url", &redact::redacted(&self.url))
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body", &self.body)
            .finish()
    }
}

impl WebhookSettings {
    /// Checks every key of `[webhooks.NAME]`; errors name the key.
    pub(crate) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = format!("webhooks.{name}");
        within(
            &format!("{key}.connect_timeout"),
            self.connect_timeout,
            ONE_HOUR,
        )?;
        within(&format!("{key}.timeout"), self.timeout, ONE_DAY)?;
        at_most(
            &format!("{key}.retry_after_max"),
            self.retry_after_max,
            ONE_DAY,
        )?;
        self.resolve(name, None)?;
        for route in self.routes.keys() {
            self.resolve(name, Some(route))?;
        }
        Ok(())
    }

    /// The handler's own target (the table's top-level keys).
    pub fn own(&self) -> WebhookTarget {
        WebhookTarget {
            url: self.url.clone(),
            method: self.method.clone(),
            headers: self.headers.clone(),
            body: self.body,
        }
    }

    /// The target for tasks of `route` (the handler's own for none or an unlisted route).
    pub fn resolve(&self, name: &str, route: Option<&str>) -> Result<ResolvedTarget, ConfigError> {
        let own = &self.own();
        let (key, over) = match route.and_then(|r| self.routes.get_key_value(r)) {
            Some((route, over)) => (format!("webhooks.{name}.routes.{route}"), Some(over)),
            None => (format!("webhooks.{name}"), None),
        };
        let url = over
            .and_then(|o| o.url.as_deref())
            .or(own.url.as_deref())
            .ok_or_else(|| ConfigError::new(format!("{key}.url"), "is required"))?;
        let url =
            parse_url(url).map_err(|reason| ConfigError::new(format!("{key}.url"), reason))?;
        let method = over
            .and_then(|o| o.method.as_deref())
            .or(own.method.as_deref())
            .unwrap_or("POST");
        let method = Method::from_bytes(method.as_bytes())
            .ok()
            .filter(|m| {
                method.bytes().all(|b| b.is_ascii_uppercase())
                    && !method.is_empty()
                    && m != Method::CONNECT
            })
            .ok_or_else(|| {
                ConfigError::new(
                    format!("{key}.method"),
                    format!("{method:?} is not an HTTP method like POST or PUT"),
                )
            })?;
        let mut headers = HeaderMap::new();
        let merged = own
            .headers
            .iter()
            .chain(over.map(|o| &o.headers).into_iter().flatten());
        for (name, value) in merged {
            let header_key = format!("{key}.headers.{name}");
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ConfigError::new(&header_key, "is not a valid HTTP header name"))?;
            if let Some(why) = reserved(&name) {
                return Err(ConfigError::new(&header_key, why));
            }
            let value = HeaderValue::from_str(value).map_err(|_| {
                ConfigError::new(
                    &header_key,
                    "the value must be visible ASCII (no line breaks or control characters)",
                )
            })?;
            headers.insert(name, value);
        }
        let body = over.and_then(|o| o.body).or(own.body).unwrap_or_default();
        Ok(ResolvedTarget {
            url,
            method,
            headers,
            body,
        })
    }
}

/// Why a configured header may not be `name`, if it may not: redrive sets it on every
/// call (a second value would reach the target beside redrive's, or first), or it frames
/// the request. `Content-Type` may be set: it replaces redrive's. An underscore counts as
/// a hyphen: an environment variable can spell no hyphen, and many servers (CGI, WSGI,
/// Rack, PHP) read both spellings as one header.
fn reserved(name: &HeaderName) -> Option<&'static str> {
    match name.as_str().replace('_', "-").as_str() {
        "idempotency-key"
        | "x-redrive-task-id"
        | "x-redrive-attempt"
        | "x-redrive-generation"
        | "x-redrive-job"
        | "x-correlation-id" => Some("is set by redrive on calls and cannot be configured"),
        "content-length" | "transfer-encoding" | "connection" => {
            Some("frames the request and cannot be configured")
        }
        _ => None,
    }
}

/// Parses a target URL; an error shows it redacted, or not at all when it does not parse.
fn parse_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("is not a URL ({e})"))?;
    let shown = redact::redacted(&url);
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{shown:?} must be an http:// or https:// URL"));
    }
    if url.host_str().unwrap_or_default().is_empty() {
        return Err(format!("{shown:?} has no host"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> WebhookSettings {
        WebhookSettings {
            url: Some(url.into()),
            ..WebhookSettings::default()
        }
    }

    #[test]
    fn bad_url_method_and_header_name_their_key() {
        let error = |s: &WebhookSettings| s.validate("billing").unwrap_err().to_string();
        assert!(error(&settings("ftp://x/")).contains("webhooks.billing.url"));
        assert!(error(&settings("not a url")).contains("webhooks.billing.url"));
        assert!(error(&WebhookSettings::default()).contains("webhooks.billing.url: is required"));

        let mut s = settings("http://127.0.0.1:1/");
        s.method = Some("P OST".into());
        assert!(
            error(&s).contains("webhooks.billing.method"),
            "{}",
            error(&s)
        );

        let mut s = settings("http://127.0.0.1:1/");
        s.headers.insert("X Bad".into(), "1".into());
        assert!(error(&s).contains("webhooks.billing.headers.X Bad"));
        let mut s = settings("http://127.0.0.1:1/");
        s.headers.insert("X-Ok".into(), "a\nb".into());
        assert!(error(&s).contains("webhooks.billing.headers.X-Ok"));

        // Found by an attack: a configured Idempotency-Key went out beside redrive's,
        // first, and a target reading the first value took it.
        for name in [
            "Idempotency-Key",
            "x-redrive-task-id",
            "X-Redrive-Attempt",
            "X-Redrive-Job",
            "x_redrive_generation",
            "X-Correlation-Id",
            "idempotency_key",
            "X_CORRELATION_ID",
        ] {
            let mut s = settings("http://127.0.0.1:1/");
            s.headers.insert(name.into(), "1".into());
            let shown = error(&s);
            assert!(
                shown.contains(&format!("webhooks.billing.headers.{name}"))
                    && shown.contains("set by redrive"),
                "{shown}"
            );
        }
        let mut s = settings("http://127.0.0.1:1/");
        s.routes.insert(
            "orders".into(),
            WebhookTarget {
                headers: [("Content-Length".to_owned(), "3".to_owned())].into(),
                ..WebhookTarget::default()
            },
        );
        assert!(error(&s).contains("webhooks.billing.routes.orders.headers.Content-Length: frames"));
        let mut s = settings("http://127.0.0.1:1/");
        s.headers
            .insert("Content-Type".into(), "application/cloudevents+json".into());
        s.validate("billing")
            .expect("Content-Type replaces redrive's");

        let mut s = settings("http://127.0.0.1:1/");
        s.routes.insert(
            "orders".into(),
            WebhookTarget {
                url: Some("mailto:x@y".into()),
                ..WebhookTarget::default()
            },
        );
        assert!(error(&s).contains("webhooks.billing.routes.orders.url"));
    }

    #[test]
    fn a_route_overrides_the_handlers_target_and_merges_headers() {
        let mut s = settings("http://a.example/");
        s.headers.insert("X-One".into(), "1".into());
        s.headers.insert("X-Two".into(), "2".into());
        s.routes.insert(
            "orders".into(),
            WebhookTarget {
                url: Some("https://b.example/hook".into()),
                method: Some("PUT".into()),
                headers: [("X-Two".to_owned(), "route".to_owned())].into(),
                body: Some(WebhookBody::Raw),
            },
        );
        s.validate("h").unwrap();
        let own = s.resolve("h", Some("other")).unwrap();
        assert_eq!(own.url.as_str(), "http://a.example/");
        assert_eq!(own.method, Method::POST);
        assert_eq!(own.body, WebhookBody::Envelope);
        let route = s.resolve("h", Some("orders")).unwrap();
        assert_eq!(route.url.as_str(), "https://b.example/hook");
        assert_eq!(route.method, Method::PUT);
        assert_eq!(route.body, WebhookBody::Raw);
        assert_eq!(route.headers["x-one"], "1");
        assert_eq!(route.headers["x-two"], "route");
    }

    #[test]
    fn debug_output_hides_header_values() {
        let mut s = settings("http://a.example/");
        s.headers
            .insert("Authorization".into(), "Bearer hunter2-secret".into());
        let shown = format!("{s:?}");
        assert!(shown.contains("Authorization"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
