//! Ingest: consume the routes' topics in one consumer group and persist failures as
//! tasks. An offset is committed only after the rows recording its messages are
//! committed; redelivered messages find their task by source coordinates.

mod consume;
mod flush;
mod routes;

pub use flush::FlushError;

use rdkafka::consumer::{Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{IngestSettings, KafkaSettings, RouteSettings};
use crate::finals::Finals;
use crate::handlers::Registered;
use crate::kafka::context::QuietContext;
use crate::kafka::{client_config, redact_error};
use crate::store::Store;
use crate::telemetry::Metrics;
use flush::Flusher;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use routes::RouteTable;

/// Why ingest stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The consumer could not be created or subscribed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A batch cannot be persisted: neither its offsets nor any later are committed.
    #[error(transparent)]
    Flush(#[from] FlushError),
    /// Writing a batch failed unexpectedly (a bug): later offsets must not be committed.
    #[error("a batch could not be persisted ({0}); no later offset is committed")]
    FlushFailed(String),
}

/// Logs rebalances; commits are explicit, so a revocation needs no work here.
/// librdkafka's own reports are logged once per change, not per repeat.
#[derive(Default)]
struct IngestContext {
    quiet: QuietContext,
}

impl ClientContext for IngestContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.quiet.log_line(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.quiet.client_error(&error, reason);
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(
        &self,
        _consumer: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &Rebalance<'_>,
    ) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions revoked")
            }
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions assigned")
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(error) = result {
            tracing::debug!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
        }
    }
}

/// Ingest progress visible from outside (for the benchmark and the demo).
#[derive(Debug, Default)]
pub struct IngestProgress {
    /// When the first message arrived.
    pub first_consumed: OnceLock<Instant>,
}

/// The consumer of every route of this process.
pub struct Ingest {
    flusher: Flusher,
    kafka: KafkaSettings,
    limits: IngestSettings,
    progress: Arc<IngestProgress>,
}

impl Ingest {
    /// An ingest for validated `routes` whose handlers are in `handlers`.
    pub fn new(
        store: Store,
        kafka: KafkaSettings,
        limits: IngestSettings,
        routes: Vec<RouteSettings>,
        handlers: Arc<BTreeMap<String, Registered>>,
        metrics: Metrics,
        worker_id: String,
    ) -> Ingest {
        Ingest {
            flusher: Flusher {
                store,
                routes: Arc::new(RouteTable::new(routes)),
                handlers,
                limits: limits.clone(),
                metrics,
                worker_id,
                finals: Finals::default(),
            },
            kafka,
            limits,
            progress: Arc::default(),
        }
    }

    /// Reports process-mode tasks stored as permanent failures (parking).
    pub(crate) fn with_finals(mut self, finals: Finals) -> Ingest {
        self.flusher.finals = finals;
        self
    }

    /// Shared progress of this ingest.
    #[cfg(feature = "bench")]
    pub fn progress(&self) -> Arc<IngestProgress> {
        self.progress.clone()
    }

    /// Consumes until `shutdown` fires; then persists what was consumed and commits it.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), IngestError> {
        let consumer: StreamConsumer<IngestContext> = client_config(&self.kafka)
            .set("group.id", &self.kafka.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                self.kafka
                    .properties
                    .get("auto.offset.reset")
                    .map_or("earliest", String::as_str),
            )
            .create_with_context(IngestContext::default())
            .map_err(|e| redact_error(e, &self.kafka))?;
        let subscriptions = self.flusher.routes.subscriptions();
        let topics: Vec<&str> = subscriptions.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        tracing::info!(?topics, group = %self.kafka.group_id, "ingest started");
        let outcome = consume::consume(
            &consumer,
            &self.flusher,
            &self.limits,
            &self.progress,
            &shutdown,
        )
        .await;
        consumer.unsubscribe();
        match &outcome {
            Ok(()) => tracing::info!("ingest stopped"),
            Err(error) => {
                tracing::error!(%error, "ingest stopped: nothing after the failed batch is committed")
            }
        }
        outcome
    }
}
