//! The Prometheus metrics of a redrive member, in their own registry. Every series a
//! dashboard or alert reads exists from start-up (zero until used): labelled series are
//! created for every handler, route, operation and outcome the member knows.

use std::sync::Arc;

use super::alerts::CANNOT_CONSUME_CODES;
use super::events::DbOp;
use super::health::Health;
use crate::task::FinishOutcome;
use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry,
};

/// Outcomes of an attempt, as the `outcome` label says them.
pub const ATTEMPT_OUTCOMES: [&str; 3] = ["resolved", "retry", "permanent_failure"];
/// Ingest outcomes of a consumed message.
pub const INGEST_OUTCOMES: [&str; 5] = [
    "stored",
    "redelivered",
    "processed",
    "deferred",
    "collision",
];
/// Why redrive produces a message.
pub const PRODUCE_PURPOSES: [&str; 3] = ["republish", "parking", "replay"];
/// librdkafka error codes (as `redrive_consumer_errors_total` names them) whose series
/// exist from start-up, besides [`CANNOT_CONSUME_CODES`].
pub const CONSUMER_ERROR_CODES: [&str; 3] =
    ["BrokerTransportFailure", "UnknownTopicOrPartition", "other"];
/// Answers of a webhook call, as `redrive_webhook_calls_total{class}` names them.
pub const WEBHOOK_CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "error"];
/// Task statuses.
pub const STATUSES: [&str; 4] = ["failed", "resolved", "permanent_failure", "discarded"];

/// Counters, gauges and histograms of one member.
#[derive(Clone)]
pub struct Metrics {
    /// The registry to expose on `/metrics`.
    pub registry: Registry,
    /// Tasks claimed.
    pub claimed: IntCounter,
    /// Attempts written, by handler and outcome (`resolved`, `retry`, `permanent_failure`).
    pub attempts: IntCounterVec,
    /// Retries scheduled, by handler.
    pub retries_scheduled: IntCounterVec,
    /// Tasks that became permanent failures (by an attempt or at ingest), by handler.
    pub permanent_failures: IntCounterVec,
    /// Writes refused because the fencing token no longer matched, by operation.
    pub fenced_writes: IntCounterVec,
    /// Tasks claimed again after their lease expired (a worker died or stalled).
    pub leases_recovered: IntCounter,
    /// Calls cancelled because their lease could not be renewed before its deadline
    /// (this member was cut off from the database).
    pub leases_lapsed_locally: IntCounter,
    /// Handler call duration, by handler.
    pub handler_seconds: HistogramVec,
    /// Tasks leased by this process right now.
    pub in_flight: IntGauge,
    /// Database errors of this member, by operation (see [`DbOp`]; counted by
    /// [`Metrics::count_database_error`] and [`super::DatabaseFailed`]).
    database_errors: IntCounterVec,
    /// Consumed messages, by route and outcome.
    pub ingested: IntCounterVec,
    /// Captured re-failures of messages redrive produced, by route and lineage:
    /// `linked` (retried as the next generation) or `loop_stopped` (past the route's
    /// `max_generations`: stored PERMANENT_FAILURE and parked).
    pub refailures: IntCounterVec,
    /// Permanent failures produced to the parking topic, by result.
    pub parked: IntCounterVec,
    /// Messages redrive produced (republish, parking, replay), by result.
    pub produced: IntCounterVec,
    /// Errors the Kafka consumer reported, by librdkafka error code.
    pub consumer_errors: IntCounterVec,
    /// Messages behind the partition's end, by topic and partition (librdkafka statistics;
    /// with no committed offset yet, every message the partition holds).
    pub consumer_lag: IntGaugeVec,
    /// The group's committed offset, by topic and partition (librdkafka statistics): a
    /// topic whose offsets stop moving while it has lag has stalled.
    pub consumer_committed_offset: IntGaugeVec,
    /// Final tasks deleted by retention, by status.
    pub retention_deleted: IntCounterVec,
    /// Connections of this member's database pool, by state (`in_use`, `idle`).
    pub pool_connections: IntGaugeVec,
    /// Members seen recently (fleet-wide; every member exports the same value).
    pub members_live: IntGauge,
    /// Tasks by status and handler (fleet-wide, sampled).
    pub tasks: IntGaugeVec,
    /// Tasks due now, by handler (fleet-wide, sampled).
    pub tasks_due: IntGaugeVec,
    /// How long the oldest due task has waited, by handler (fleet-wide, sampled).
    pub oldest_due_seconds: GaugeVec,
    /// `redrive_cause_tasks{cause,class}`: tasks not done (failed or given up) of each of
    /// the biggest causes (fleet-wide, sampled; at most [`crate::store::SAMPLED_CAUSES`]).
    pub cause_tasks: IntGaugeVec,
    /// `redrive_cause_first_seen_timestamp_seconds{cause,class}`: when each of those
    /// causes was first seen.
    pub cause_first_seen: GaugeVec,
    /// 1 while this member is ready (see `/readyz`).
    pub ready: Gauge,
    /// The member's health, which `/readyz` reads and whose changes are logged once.
    pub health: Arc<Health>,
    /// `redrive_breaker_state{handler}`: 0 closed, 1 half-open, 2 open (as last seen).
    pub breaker_state: IntGaugeVec,
    /// `redrive_breaker_transitions_total{handler,to}`: state changes this member made.
    pub breaker_transitions: IntCounterVec,
    /// `redrive_compensations_total{handler,outcome}`: compensation attempts written.
    pub compensations: IntCounterVec,
    /// `redrive_brake_engaged{route}`: 1 while this member keeps the route paused.
    pub brake_engaged: IntGaugeVec,
    /// `redrive_ingest_partitions_released`: 1 while this member has given its partitions
    /// to the group because it cannot store what it consumes (the database unreachable).
    pub ingest_released: IntGauge,
    /// `redrive_brake_trips_total{route}`: brakes this member engaged.
    pub brake_trips: IntCounterVec,
    /// `redrive_webhook_calls_total{handler,class}`: webhook calls by answer (2xx, 3xx,
    /// 4xx, 5xx, or `error`: no answer).
    pub webhook_calls: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let metric = IntCounter::new(name, help).expect("a valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn counters(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let metric = IntGauge::new(name, help).expect("a valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

impl Metrics {
    /// Counts a failed database statement of `op` (one that is also logged: see
    /// [`super::DatabaseFailed`], which does both).
    pub fn count_database_error(&self, op: DbOp) {
        self.database_errors.with_label_values(&[op.label()]).inc();
    }

    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = &registry;
        let build_info = gauges(
            r,
            "redrive_build_info",
            "redrive's version (always 1)",
            &["version"],
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let handler_seconds = HistogramVec::new(
            HistogramOpts::new("redrive_handler_duration_seconds", "Handler call duration")
                .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0]),
            &["handler"],
        )
        .expect("a valid metric");
        r.register(Box::new(handler_seconds.clone()))
            .expect("registered once");
        let in_flight = IntGauge::new("redrive_tasks_in_flight", "Tasks leased by this process")
            .expect("a valid metric");
        r.register(Box::new(in_flight.clone()))
            .expect("registered once");
        let members_live = IntGauge::new(
            "redrive_members_live",
            "Fleet members seen recently (fleet-wide: aggregate with max)",
        )
        .expect("a valid metric");
        r.register(Box::new(members_live.clone()))
            .expect("registered once");
        let oldest_due_seconds = GaugeVec::new(
            Opts::new(
                "redrive_oldest_due_task_age_seconds",
                "How long the oldest due task has waited, by handler (fleet-wide: aggregate with max)",
            ),
            &["handler"],
        )
        .expect("a valid metric");
        r.register(Box::new(oldest_due_seconds.clone()))
            .expect("registered once");
        let ready = Gauge::new("redrive_ready", "1 while this member is ready (/readyz)")
            .expect("a valid metric");
        r.register(Box::new(ready.clone()))
            .expect("registered once");
        let metrics = Metrics {
            breaker_state: gauges(
                r,
                "redrive_breaker_state",
                "Circuit breaker state by handler: 0 closed, 1 half-open, 2 open (fleet-wide: aggregate with max)",
                &["handler"],
            ),
            breaker_transitions: counters(
                r,
                "redrive_breaker_transitions_total",
                "Circuit breaker state changes made by this member, by handler and new state",
                &["handler", "to"],
            ),
            brake_engaged: gauges(
                r,
                "redrive_brake_engaged",
                "1 while a route is paused by its brake on this member (bad-deploy or operator)",
                &["route"],
            ),
            ingest_released: gauge(
                r,
                "redrive_ingest_partitions_released",
                "1 while this member has given its partitions to the group: it cannot store what it consumes (database unreachable)",
            ),
            brake_trips: counters(
                r,
                "redrive_brake_trips_total",
                "Bad-deploy brakes this member engaged, by route (an operator's are in the audit log)",
                &["route"],
            ),
            webhook_calls: counters(
                r,
                "redrive_webhook_calls_total",
                "Webhook calls by handler and answer: 2xx, 3xx, 4xx, 5xx, error (no answer)",
                &["handler", "class"],
            ),
            compensations: counters(
                r,
                "redrive_compensations_total",
                "Compensation attempts written, by handler and outcome (compensated, retry, failed)",
                &["handler", "outcome"],
            ),
            claimed: counter(r, "redrive_tasks_claimed_total", "Tasks claimed"),
            attempts: counters(
                r,
                "redrive_attempts_total",
                "Attempts finished, by outcome",
                &["handler", "outcome"],
            ),
            retries_scheduled: counters(
                r,
                "redrive_retries_scheduled_total",
                "Retries scheduled, by handler",
                &["handler"],
            ),
            permanent_failures: counters(
                r,
                "redrive_permanent_failures_total",
                "Tasks that became permanent failures, by handler",
                &["handler"],
            ),
            fenced_writes: counters(
                r,
                "redrive_fenced_writes_total",
                "Writes dropped because the lease was taken over",
                &["operation"],
            ),
            leases_recovered: counter(
                r,
                "redrive_leases_recovered_total",
                "Tasks claimed again after their lease expired",
            ),
            leases_lapsed_locally: counter(
                r,
                "redrive_leases_lapsed_locally_total",
                "Calls cancelled because their lease could not be renewed in time",
            ),
            handler_seconds,
            in_flight,
            database_errors: counters(
                r,
                "redrive_worker_database_errors_total",
                "Database errors of this member, by operation",
                &["operation"],
            ),
            ingested: counters(
                r,
                "redrive_ingested_messages_total",
                "Consumed messages, by outcome",
                &["route", "outcome"],
            ),
            refailures: counters(
                r,
                "redrive_refailures_total",
                "Captured re-failures of messages redrive produced, by route and lineage \
                 (linked, loop_stopped)",
                &["route", "lineage"],
            ),
            parked: counters(
                r,
                "redrive_parked_total",
                "Permanent failures produced to the parking topic",
                &["result"],
            ),
            produced: counters(
                r,
                "redrive_produced_messages_total",
                "Messages produced by republish, parking and replay, by result",
                &["purpose", "result"],
            ),
            consumer_errors: counters(
                r,
                "redrive_consumer_errors_total",
                "Errors reported by the Kafka consumer, by librdkafka error code",
                &["code"],
            ),
            consumer_lag: gauges(
                r,
                "redrive_consumer_lag",
                "Messages behind the end of the partition (librdkafka statistics)",
                &["topic", "partition"],
            ),
            consumer_committed_offset: gauges(
                r,
                "redrive_consumer_committed_offset",
                "The consumer group's committed offset, by topic and partition (librdkafka statistics)",
                &["topic", "partition"],
            ),
            retention_deleted: counters(
                r,
                "redrive_retention_deleted_tasks_total",
                "Final tasks deleted by retention, by status",
                &["status"],
            ),
            pool_connections: gauges(
                r,
                "redrive_db_pool_connections",
                "Connections of this member's database pool, by state",
                &["state"],
            ),
            members_live,
            tasks: gauges(
                r,
                "redrive_tasks",
                "Tasks by status and handler (fleet-wide: aggregate with max)",
                &["status", "handler"],
            ),
            tasks_due: gauges(
                r,
                "redrive_tasks_due",
                "Tasks due now, by handler (fleet-wide: aggregate with max)",
                &["handler"],
            ),
            oldest_due_seconds,
            cause_tasks: gauges(
                r,
                "redrive_cause_tasks",
                "Tasks not done (failed or given up) of each of the biggest causes, by cause id \
                 and class (fleet-wide: aggregate with max)",
                &["cause", "class"],
            ),
            cause_first_seen: {
                let metric = GaugeVec::new(
                    Opts::new(
                        "redrive_cause_first_seen_timestamp_seconds",
                        "When each of the biggest causes was first seen (fleet-wide)",
                    ),
                    &["cause", "class"],
                )
                .expect("a valid metric");
                r.register(Box::new(metric.clone())).expect("registered once");
                metric
            },
            ready,
            health: Arc::new(Health::default()),
            registry,
        };
        for operation in DbOp::ALL {
            metrics
                .database_errors
                .with_label_values(&[operation.label()]);
        }
        for operation in ["finish", "heartbeat"] {
            metrics.fenced_writes.with_label_values(&[operation]);
        }
        for result in ["produced", "failed"] {
            metrics.parked.with_label_values(&[result]);
        }
        for purpose in PRODUCE_PURPOSES {
            for result in ["ok", "error"] {
                metrics.produced.with_label_values(&[purpose, result]);
            }
        }
        for status in ["resolved", "discarded", "permanent_failure"] {
            metrics.retention_deleted.with_label_values(&[status]);
        }
        // Error codes are open-ended; the ones an outage brings exist from the start.
        for code in CANNOT_CONSUME_CODES.iter().chain(&CONSUMER_ERROR_CODES) {
            metrics.consumer_errors.with_label_values(&[code]);
        }
        // process_* series: resident memory, CPU seconds, open file descriptors.
        #[cfg(target_os = "linux")]
        (metrics.registry)
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("registered once");
        for state in ["in_use", "idle"] {
            metrics.pool_connections.with_label_values(&[state]);
        }
        metrics
    }

    /// Creates the labelled series of `handlers` and `routes`, so that dashboards and
    /// alerts see them (at zero) from start-up.
    pub fn prepare<'a>(
        &self,
        handlers: impl IntoIterator<Item = &'a str>,
        routes: impl IntoIterator<Item = &'a str>,
    ) {
        for handler in handlers {
            for outcome in ATTEMPT_OUTCOMES {
                self.attempts.with_label_values(&[handler, outcome]);
            }
            self.retries_scheduled.with_label_values(&[handler]);
            self.permanent_failures.with_label_values(&[handler]);
            self.handler_seconds.with_label_values(&[handler]);
            for status in STATUSES {
                self.tasks.with_label_values(&[status, handler]);
            }
            self.tasks_due.with_label_values(&[handler]);
            self.oldest_due_seconds.with_label_values(&[handler]);
        }
        for route in routes {
            for outcome in INGEST_OUTCOMES {
                self.ingested.with_label_values(&[route, outcome]);
            }
            for lineage in ["linked", "loop_stopped"] {
                self.refailures.with_label_values(&[route, lineage]);
            }
        }
    }

    /// Counts an attempt's outcome under `handler`; an attempt that ended its task
    /// without a call counts as a permanent failure.
    pub fn attempt_finished(&self, handler: &str, outcome: FinishOutcome) {
        let label = match outcome {
            FinishOutcome::Resolved => "resolved",
            FinishOutcome::Retry { .. } => {
                self.retries_scheduled.with_label_values(&[handler]).inc();
                "retry"
            }
            FinishOutcome::PermanentFailure | FinishOutcome::NotCalled => {
                self.permanent_failures.with_label_values(&[handler]).inc();
                "permanent_failure"
            }
        };
        self.attempts.with_label_values(&[handler, label]).inc();
    }

    /// Counts one message produced for `purpose` (republish, parking, replay).
    pub fn count_produced(&self, purpose: &str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.produced.with_label_values(&[purpose, result]).inc();
    }

    /// The registry in Prometheus' text format.
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }
}
