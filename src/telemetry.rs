//! Logging set-up and the Prometheus metrics of a redrive process.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber: human-readable lines on stderr, filtered by
/// `RUST_LOG` (default `default_level`). Does nothing if one is already installed.
pub fn init_logging(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Counters and gauges of the worker pool, registered in their own registry.
#[derive(Clone)]
pub struct Metrics {
    /// The registry to expose on `/metrics`.
    pub registry: Registry,
    /// Tasks claimed.
    pub claimed: IntCounter,
    /// Attempts written, by handler and outcome (`resolved`, `retry`, `permanent_failure`).
    pub attempts: IntCounterVec,
    /// Writes refused because the fencing token no longer matched, by operation.
    pub fenced_writes: IntCounterVec,
    /// Handler call duration, by handler.
    pub handler_seconds: HistogramVec,
    /// Tasks leased by this process right now.
    pub in_flight: IntGauge,
    /// Database errors seen by the worker pool, by operation.
    pub database_errors: IntCounterVec,
    /// Consumed messages, by route and outcome (`stored`, `redelivered`, `processed`).
    pub ingested: IntCounterVec,
    /// Permanent failures produced to the parking topic, by result.
    pub parked: IntCounterVec,
    /// Errors the Kafka consumer reported, by librdkafka error code.
    pub consumer_errors: IntCounterVec,
    /// Final tasks deleted by retention, by status.
    pub retention_deleted: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let claimed = IntCounter::new("redrive_tasks_claimed_total", "Tasks claimed").unwrap();
        let attempts = IntCounterVec::new(
            Opts::new("redrive_attempts_total", "Attempts finished, by outcome"),
            &["handler", "outcome"],
        )
        .unwrap();
        let fenced_writes = IntCounterVec::new(
            Opts::new(
                "redrive_fenced_writes_total",
                "Writes dropped because the lease was taken over",
            ),
            &["operation"],
        )
        .unwrap();
        let handler_seconds = HistogramVec::new(
            HistogramOpts::new("redrive_handler_duration_seconds", "Handler call duration")
                .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0]),
            &["handler"],
        )
        .unwrap();
        let in_flight =
            IntGauge::new("redrive_tasks_in_flight", "Tasks leased by this process").unwrap();
        let database_errors = IntCounterVec::new(
            Opts::new(
                "redrive_worker_database_errors_total",
                "Database errors in the worker pool",
            ),
            &["operation"],
        )
        .unwrap();
        let ingested = IntCounterVec::new(
            Opts::new(
                "redrive_ingested_messages_total",
                "Consumed messages, by outcome",
            ),
            &["route", "outcome"],
        )
        .unwrap();
        let parked = IntCounterVec::new(
            Opts::new(
                "redrive_parked_total",
                "Permanent failures produced to the parking topic",
            ),
            &["result"],
        )
        .unwrap();
        let consumer_errors = IntCounterVec::new(
            Opts::new(
                "redrive_consumer_errors_total",
                "Errors reported by the Kafka consumer, by librdkafka error code",
            ),
            &["code"],
        )
        .unwrap();
        let retention_deleted = IntCounterVec::new(
            Opts::new(
                "redrive_retention_deleted_tasks_total",
                "Final tasks deleted by retention, by status",
            ),
            &["status"],
        )
        .unwrap();
        for status in ["resolved", "discarded", "permanent_failure"] {
            retention_deleted.with_label_values(&[status]);
        }
        for metric in [
            Box::new(claimed.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(retention_deleted.clone()),
            Box::new(attempts.clone()),
            Box::new(fenced_writes.clone()),
            Box::new(handler_seconds.clone()),
            Box::new(in_flight.clone()),
            Box::new(database_errors.clone()),
            Box::new(ingested.clone()),
            Box::new(parked.clone()),
            Box::new(consumer_errors.clone()),
        ] {
            registry.register(metric).expect("metric names are unique");
        }
        Metrics {
            registry,
            claimed,
            attempts,
            fenced_writes,
            handler_seconds,
            in_flight,
            database_errors,
            ingested,
            parked,
            consumer_errors,
            retention_deleted,
        }
    }

    /// The registry in Prometheus' text format.
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }
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
