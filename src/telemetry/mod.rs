//! Logging set-up, the Prometheus metrics of a redrive process, the events that log and
//! count together (`events`: a failed database statement), its health, and the fleet's
//! alert rules.

mod alerts;
mod attempt_log;
mod events;
mod health;
mod log_lines;
mod metrics;

pub use alerts::{AlertSettings, AlertSettingsError, CANNOT_CONSUME_CODES};
pub use attempt_log::{log_attempt, AttemptLine};
pub use events::{DatabaseFailed, DbOp};
pub use health::{Health, Readiness};
pub use metrics::{Metrics, WEBHOOK_CLASSES};

use std::sync::OnceLock;
use std::time::Duration;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::store::Store;
use log_lines::LogLines;

/// The log writer of this process, once [`init_logging`] started it.
static LOG_LINES: OnceLock<LogLines> = OnceLock::new();

/// How long [`flush_logs`] waits for queued log lines at most.
const FLUSH_WITHIN: Duration = Duration::from_secs(1);

/// Installs the global `tracing` subscriber on stderr: text or JSON lines (`log.format`;
/// `auto` is text on a terminal), filtered by `RUST_LOG`, else `level`. JSON lines carry
/// the fields of their spans (an attempt's task id, a batch's route). Lines are written
/// by a thread of its own, through a bounded queue: a slow, stuck or closed stderr never
/// stops or stalls the process; keep the returned guard until the process ends (dropping it
/// flushes them). Does nothing if a subscriber is already installed.
pub fn init_logging(format: LogFormat, level: &str) -> LogGuard {
    use std::io::IsTerminal;
    // The pool's "ping on idle connection returned error" (INFO, a line per dropped
    // connection, many at each database restart) stays out unless asked for by RUST_LOG.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},sqlx_core::pool::inner=warn")));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let writer = LOG_LINES
        .get_or_init(|| LogLines::start(std::io::stderr(), json))
        .clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(writer);
    let _ = if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .flatten_event(true)
            .try_init()
    } else {
        builder.try_init()
    };
    LogGuard(())
}

/// Flushes the log lines when dropped (see [`init_logging`]).
#[derive(Debug)]
pub struct LogGuard(());

impl Drop for LogGuard {
    fn drop(&mut self) {
        flush_logs();
    }
}

/// Waits (up to a second) for the log lines queued so far to reach stderr.
pub fn flush_logs() {
    if let Some(lines) = LOG_LINES.get() {
        lines.flush(FLUSH_WITHIN);
    }
}

/// Serves `GET /metrics` (Prometheus text format), `GET /healthz` (alive) and
/// `GET /readyz` (ready: the database answers with its migrations current, Kafka when
/// ingest runs, not shutting down; 503 with what is wrong otherwise) until `stop` fires,
/// then lets requests in progress finish for up to `drain`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    store: Store,
    stop: tokio_util::sync::CancellationToken,
    drain: std::time::Duration,
) {
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Json;
    let scrape = {
        let (metrics, store) = (metrics.clone(), store.clone());
        move || {
            let (metrics, store) = (metrics.clone(), store.clone());
            async move {
                let pool = store.pool();
                let idle = pool.num_idle() as i64;
                let gauge = &metrics.pool_connections;
                gauge.with_label_values(&["idle"]).set(idle);
                gauge
                    .with_label_values(&["in_use"])
                    .set(i64::from(pool.size()) - idle);
                let ready = metrics.health.readiness(&store).await.ready;
                metrics.ready.set(if ready { 1.0 } else { 0.0 });
                metrics.render()
            }
        }
    };
    let ready = move || {
        let (metrics, store) = (metrics.clone(), store.clone());
        async move {
            let readiness = metrics.health.readiness(&store).await;
            metrics.ready.set(if readiness.ready { 1.0 } else { 0.0 });
            let status = if readiness.ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, Json(readiness))
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(scrape))
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "alive"})) }),
        )
        .route("/readyz", get(ready));
    crate::listener::serve(listener, app, stop, drain).await
}
