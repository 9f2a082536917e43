//! Logging set-up, the Prometheus metrics of a redrive process, and its health.

mod attempt_log;
mod metrics;

pub use attempt_log::{log_attempt, AttemptLine};
pub use metrics::Metrics;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global `tracing` subscriber on stderr: text or JSON lines (`log.format`;
/// `auto` is text on a terminal), filtered by `RUST_LOG`, else `level`. JSON lines carry
/// the fields of their spans (an attempt's task id, a batch's route). Does nothing if a
/// subscriber is already installed.
pub fn init_logging(format: LogFormat, level: &str) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
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
}

/// Serves `GET /metrics` in Prometheus' text format until `shutdown` fires.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { metrics.render() }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
