//! The built-in `webhook` handler: one HTTP call per attempt, classified by its answer.

use async_trait::async_trait;
use base64::Engine;
use chrono::{DateTime, Utc};
use prometheus::IntCounter;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Client, Response, StatusCode};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use super::{Handler, HandlerContext, HandlerError};
use crate::config::{redact, ConfigError, ResolvedTarget, WebhookBody, WebhookSettings};
use crate::task::{OriginalCoordinates, SourceCoordinates, Task};
use crate::telemetry::{Metrics, WEBHOOK_CLASSES};

/// Most bytes of a response body kept in the recorded error.
pub const ERROR_BODY_BYTES: usize = 2048;

/// Header carrying the idempotency key, the same on every attempt of a task.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

// The other headers a call carries, named once rather than parsed per call.
const TASK_ID_HEADER: HeaderName = HeaderName::from_static("x-redrive-task-id");
const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-redrive-attempt");
/// The redrive job (a paced retry) that made the task due again, when one did.
const JOB_HEADER: HeaderName = HeaderName::from_static("x-redrive-job");
/// The task's generation (1 for a first failure, one more for each re-failure).
const GENERATION_HEADER: HeaderName = HeaderName::from_static("x-redrive-generation");
const CORRELATION_ID_HEADER: HeaderName = HeaderName::from_static("x-correlation-id");

/// Bytes an envelope takes beyond its value, about (the buffer grows if it needs more).
const ENVELOPE_ROOM: usize = 1024;

/// Version of the idempotency key's recipe, hashed in with its parts.
const KEY_RECIPE: &[u8] = b"redrive-idempotency-key-v1";

/// Calls an HTTP endpoint per attempt. 2xx resolves the task; a connection error, a
/// timeout, 408, 425, 429 and 5xx are transient (with `Retry-After` honoured up to
/// `retry_after_max`); any other answer is permanent. Redirects are not followed. Its
/// errors show the URL without credentials ([`redact`]), and scrub them from the body.
pub struct WebhookHandler {
    name: String,
    fleet: String,
    client: Client,
    own: ResolvedTarget,
    routes: BTreeMap<String, ResolvedTarget>,
    timeout: Duration,
    retry_after_max: Duration,
    /// `redrive_webhook_calls_total` of this handler, one counter per class of
    /// [`WEBHOOK_CLASSES`], once [`WebhookHandler::with_metrics`] set them.
    calls: Option<[IntCounter; WEBHOOK_CLASSES.len()]>,
}

impl WebhookHandler {
    /// A handler for `[webhooks.NAME]` of the fleet named `fleet` (see
    /// [`crate::Settings::fleet_identity`]); refuses settings that do not validate.
    pub fn new(
        name: &str,
        settings: &WebhookSettings,
        fleet: &str,
    ) -> Result<WebhookHandler, ConfigError> {
        settings.validate(name)?;
        let client = Client::builder()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("redrive/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ConfigError::new(format!("webhooks.{name}"), e.to_string()))?;
        let routes = settings
            .routes
            .keys()
            .map(|route| Ok((route.clone(), settings.resolve(name, Some(route))?)))
            .collect::<Result<_, ConfigError>>()?;
        Ok(WebhookHandler {
            name: name.to_owned(),
            fleet: fleet.to_owned(),
            client,
            own: settings.resolve(name, None)?,
            routes,
            timeout: settings.timeout,
            retry_after_max: settings.retry_after_max,
            calls: None,
        })
    }

    /// Counts its calls in `metrics` (`redrive_webhook_calls_total`), by answer.
    pub fn with_metrics(mut self, metrics: Metrics) -> WebhookHandler {
        self.calls = Some(WEBHOOK_CLASSES.map(|class| {
            metrics
                .webhook_calls
                .with_label_values(&[&self.name, class])
        }));
        self
    }

    /// Counts a call whose answer was `status` (`None`: no answer).
    fn count(&self, status: Option<StatusCode>) {
        if let Some(calls) = &self.calls {
            let class = status_class(status);
            if let Some(counter) = WEBHOOK_CLASSES.iter().position(|c| *c == class) {
                calls[counter].inc();
            }
        }
    }

    fn target(&self, task: &Task) -> &ResolvedTarget {
        task.failure
            .route
            .as_deref()
            .and_then(|route| self.routes.get(route))
            .unwrap_or(&self.own)
    }

    fn classify(&self, status: StatusCode, headers: &HeaderMap, body: &str) -> HandlerError {
        let message = format!("HTTP {status}: {body}");
        let transient = status.is_server_error() || matches!(status.as_u16(), 408 | 425 | 429);
        if !transient {
            return HandlerError::Permanent(message);
        }
        match retry_after(headers, Utc::now()) {
            Some(after) => HandlerError::retry_after(after.min(self.retry_after_max), message),
            None => HandlerError::Transient(message),
        }
    }
}

#[async_trait]
impl Handler for WebhookHandler {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let target = self.target(task);
        let key = idempotency_key(&self.fleet, task);
        let (content_type, body) = match target.body {
            WebhookBody::Raw => {
                if !task.failure.payload_stored {
                    return Err(HandlerError::permanent(
                        "the payload was not stored (minimal form, see ingest_note); \
                         there is no value to send",
                    ));
                }
                let value = task.failure.value.clone().unwrap_or_default();
                ("application/octet-stream", value)
            }
            WebhookBody::Envelope => {
                let envelope = Envelope::new(&self.name, key.clone(), ctx, task);
                // Room for the value and the envelope around it, so that it is written
                // once rather than grown through several copies.
                let mut json = Vec::with_capacity(
                    ENVELOPE_ROOM + task.failure.value.as_ref().map_or(0, Vec::len),
                );
                serde_json::to_writer(&mut json, &envelope).map_err(HandlerError::permanent)?;
                ("application/json", json)
            }
        };
        let mut request = self
            .client
            .request(target.method.clone(), target.url.clone())
            .header(CONTENT_TYPE, content_type)
            .headers(target.headers.clone())
            .header(IDEMPOTENCY_KEY, key)
            .header(TASK_ID_HEADER, HeaderValue::from(task.id.0))
            .header(ATTEMPT_HEADER, HeaderValue::from(ctx.attempt))
            .header(
                GENERATION_HEADER,
                HeaderValue::from(task.failure.generation),
            );
        if let Some(job) = ctx.redrive_job {
            request = request.header(JOB_HEADER, HeaderValue::from(job));
        }
        if let Some(value) = task.failure.correlation_id.as_deref().and_then(header_text) {
            request = request.header(CORRELATION_ID_HEADER, value);
        }
        let response = request.body(body).send().await.map_err(|error| {
            self.count(None);
            HandlerError::transient(format!(
                "{} {}: {}",
                target.method,
                redact::redacted(&target.url),
                redact::scrub(&describe(&error.without_url()), &target.url)
            ))
        })?;
        let status = response.status();
        self.count(Some(status));
        if status.is_success() {
            read_to_end(response).await;
            return Ok(());
        }
        let headers = response.headers().clone();
        // The server may echo the request, credentials and all.
        let body = redact::scrub(&head_of_body(response).await, &target.url);
        Err(self.classify(status, &headers, &body))
    }

    fn timeout(&self) -> Option<Duration> {
        // A little over the client's own timeout, so its clearer error comes first.
        Some(self.timeout + Duration::from_secs(1))
    }
}

/// `text` as a header value when it is printable ASCII (spaces inside included) and
/// reads back the same: anything else (a line break, a tab, bytes past ASCII, which
/// targets read in different ways, or spaces around it, which HTTP drops) stays in the
/// envelope only.
fn header_text(text: &str) -> Option<HeaderValue> {
    (text.bytes().all(|b| (b' '..=b'~').contains(&b)) && text.trim() == text)
        .then(|| HeaderValue::from_str(text).ok())
        .flatten()
}

/// `sha256:` and the hex SHA-256 of the fleet's identity, the task's dedup key (its id
/// when it has none) and its content digest ([`crate::task::Failure::content_digest`]):
/// the same on every attempt of the task, another key for other content at the same
/// coordinates (a recreated topic) and for the same message in another fleet.
pub fn idempotency_key(fleet: &str, task: &Task) -> String {
    let id = task.id.to_string();
    let dedup = task.dedup_key.as_deref().unwrap_or(&id);
    let digest = task.failure.content_digest();
    let mut hasher = Sha256::new();
    for part in [
        KEY_RECIPE,
        fleet.as_bytes(),
        dedup.as_bytes(),
        digest.as_bytes(),
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    format!("sha256:{}", crate::readable::hex(&hasher.finalize()))
}

/// The class of an answer, as `redrive_webhook_calls_total{class}` names it: `2xx` to
/// `5xx`, or `error` (no answer, or a status outside 200 to 599).
fn status_class(status: Option<StatusCode>) -> &'static str {
    match status.map(|s| s.as_u16() / 100) {
        Some(2) => "2xx",
        Some(3) => "3xx",
        Some(4) => "4xx",
        Some(5) => "5xx",
        _ => "error",
    }
}

/// Delay asked for by `Retry-After`: delta seconds or an HTTP date (a past date is 0).
pub fn retry_after(headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = DateTime::parse_from_rfc2822(text).ok()?;
    Some(
        (at.with_timezone(&Utc) - now)
            .to_std()
            .unwrap_or(Duration::ZERO),
    )
}

/// The most of a successful answer's body read so that its connection can serve the
/// next call; past it the connection is closed instead.
const SUCCESS_BODY_BYTES: usize = 64 * 1024;

/// Reads a successful answer's body to its end, up to [`SUCCESS_BODY_BYTES`]: a body
/// left unread closes the connection, and each call would open a new one. The answer
/// was a success whatever the body does.
async fn read_to_end(mut response: Response) {
    let mut read = 0;
    while read <= SUCCESS_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => return,
        }
    }
}

/// The first [`ERROR_BODY_BYTES`] of a response body as text (lossy), read without
/// taking in the rest: a huge or endless body costs no more than that.
async fn head_of_body(mut response: Response) -> String {
    let mut head = Vec::new();
    let mut cut = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = ERROR_BODY_BYTES - head.len();
                if chunk.len() > room {
                    head.extend_from_slice(&chunk[..room]);
                    cut = true;
                    break;
                }
                head.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(error) => {
                head.extend_from_slice(
                    format!(" [body unreadable: {}]", describe(&error)).as_bytes(),
                );
                break;
            }
        }
    }
    let mut text = String::from_utf8_lossy(&head).into_owned();
    if text.len() > ERROR_BODY_BYTES {
        // Replacement characters (3 bytes each) stand for invalid bytes: cut again.
        let end = (0..=ERROR_BODY_BYTES)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(end);
    }
    if cut {
        text.push_str(" [cut]");
    }
    text
}

/// A reqwest error with its causes, which say what actually went wrong.
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    let mut text = kind.to_owned();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Bytes in the envelope: text when they are UTF-8 (borrowed), base64 otherwise.
#[derive(Serialize)]
struct Bytes<'a> {
    encoding: &'static str,
    data: Cow<'a, str>,
}

impl<'a> Bytes<'a> {
    fn new(bytes: &'a [u8]) -> Bytes<'a> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Bytes {
                encoding: "utf8",
                data: Cow::Borrowed(text),
            },
            Err(_) => Bytes {
                encoding: "base64",
                data: Cow::Owned(base64::engine::general_purpose::STANDARD.encode(bytes)),
            },
        }
    }
}

#[derive(Serialize)]
struct EnvelopeHeader<'a> {
    name: Bytes<'a>,
    value: Option<Bytes<'a>>,
}

/// The JSON body of an `envelope` call.
#[derive(Serialize)]
struct Envelope<'a> {
    task_id: i64,
    handler: &'a str,
    attempt: u32,
    idempotency_key: String,
    route: Option<&'a str>,
    event_type: Option<&'a str>,
    correlation_id: Option<&'a str>,
    payload_stored: bool,
    key: Option<Bytes<'a>>,
    value: Option<Bytes<'a>>,
    headers: Vec<EnvelopeHeader<'a>>,
    failure: FailureContext<'a>,
}

#[derive(Serialize)]
struct FailureContext<'a> {
    source: Option<&'a SourceCoordinates>,
    original: Option<&'a OriginalCoordinates>,
    error_class: Option<&'a str>,
    error_message: Option<&'a str>,
    last_error: Option<&'a str>,
    created_at: DateTime<Utc>,
}

impl<'a> Envelope<'a> {
    fn new(
        handler: &'a str,
        idempotency_key: String,
        ctx: &HandlerContext,
        task: &'a Task,
    ) -> Envelope<'a> {
        let failure = &task.failure;
        Envelope {
            task_id: task.id.0,
            handler,
            attempt: ctx.attempt,
            idempotency_key,
            route: failure.route.as_deref(),
            event_type: failure.event_type.as_deref(),
            correlation_id: failure.correlation_id.as_deref(),
            payload_stored: failure.payload_stored,
            key: failure.key.as_deref().map(Bytes::new),
            value: failure.value.as_deref().map(Bytes::new),
            headers: failure
                .headers
                .iter()
                .map(|h| EnvelopeHeader {
                    name: Bytes::new(&h.name),
                    value: h.value.as_deref().map(Bytes::new),
                })
                .collect(),
            failure: FailureContext {
                source: failure.source.as_ref(),
                original: failure.original.as_ref(),
                error_class: failure.error_class.as_deref(),
                error_message: failure.error_message.as_deref(),
                last_error: task.last_error.as_deref(),
                created_at: task.created_at,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_status_class() {
        let class = |code: u16| status_class(Some(StatusCode::from_u16(code).unwrap()));
        assert_eq!(class(204), "2xx");
        assert_eq!(class(302), "3xx");
        assert_eq!(class(429), "4xx");
        assert_eq!(class(503), "5xx");
        assert_eq!(class(103), "error");
        assert_eq!(status_class(None), "error");
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = DateTime::parse_from_rfc3339("2026-11-22T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers, now), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("120"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(120)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Sun, 22 Nov 2026 10:01:30 GMT"),
        );
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(90)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Sun, 22 Nov 2026 09:00:00 GMT"),
        );
        assert_eq!(retry_after(&headers, now), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers, now), None);
    }

    #[test]
    fn idempotency_keys_name_fleet_coordinates_and_content() {
        let mut task = crate::task::NewTask::new("h", "v").unsaved();
        task.id = crate::task::TaskId(7);
        task.dedup_key = Some("kafka:orders:0:42".into());
        let key = idempotency_key("redrive/redrive", &task);
        // The recipe is a promise across versions: a task retried after an upgrade must
        // carry the key its earlier attempts carried (value computed apart, in Python).
        assert_eq!(
            key,
            "sha256:8e9e81770acda7cf8420ec0f7dd4bed6e2963f090f5c8af59ee463f66db6f8c3"
        );
        assert_eq!(
            task.failure.content_digest(),
            "8d8a9fb25605b03c6065353fe9fce73b"
        );
        assert!(key.bytes().all(|b| b.is_ascii_graphic()), "a header value");
        assert_eq!(key, idempotency_key("redrive/redrive", &task), "stable");

        let mut other = task.clone();
        other.id = crate::task::TaskId(8);
        assert_eq!(
            key,
            idempotency_key("redrive/redrive", &other),
            "not the id"
        );
        other.failure.value = Some(b"w".to_vec());
        assert_ne!(key, idempotency_key("redrive/redrive", &other), "content");
        assert_ne!(key, idempotency_key("redrive/eu", &task), "fleet");
        task.dedup_key = Some("kafka:orders:0:43".into());
        assert_ne!(
            key,
            idempotency_key("redrive/redrive", &task),
            "coordinates"
        );

        // Without a dedup key, the task id stands in.
        task.dedup_key = None;
        let by_id = idempotency_key("redrive/redrive", &task);
        task.id = crate::task::TaskId(9);
        assert_ne!(by_id, idempotency_key("redrive/redrive", &task));
    }
}
