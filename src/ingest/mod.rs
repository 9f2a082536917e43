//! Ingest: consume the routes' topics in one consumer group and persist failures as
//! tasks. An offset is committed only after the rows recording its messages are
//! committed; redelivered messages find their task by source coordinates.

mod flush;
mod routes;

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{IngestSettings, KafkaSettings, RouteSettings};
use crate::handlers::Registered;
use crate::kafka::client_config;
use crate::store::Store;
use crate::telemetry::Metrics;
use flush::{Flusher, Offsets};
use routes::RouteTable;

/// Logs rebalances; commits are explicit, so a revocation needs no work here.
struct IngestContext;

impl ClientContext for IngestContext {}

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
            },
            kafka,
            limits,
            progress: Arc::default(),
        }
    }

    /// Shared progress of this ingest.
    pub fn progress(&self) -> Arc<IngestProgress> {
        self.progress.clone()
    }

    /// Consumes until `shutdown` fires; then persists what was consumed and commits it.
    pub async fn run(self, shutdown: CancellationToken) -> KafkaResult<()> {
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
            .create_with_context(IngestContext)?;
        let subscriptions = self.flusher.routes.subscriptions();
        let topics: Vec<&str> = subscriptions.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        tracing::info!(?topics, group = %self.kafka.group_id, "ingest started");

        let batch_size = self.limits.batch_size as usize;
        let mut batch: Vec<OwnedMessage> = Vec::with_capacity(batch_size);
        let mut linger_until = None;
        let mut in_flight: Option<JoinHandle<Option<Offsets>>> = None;
        loop {
            let linger = async {
                match linger_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let flushed = async {
                match in_flight.as_mut() {
                    Some(handle) => handle.await.ok().flatten(),
                    None => std::future::pending().await,
                }
            };
            let full = tokio::select! {
                _ = shutdown.cancelled() => break,
                offsets = flushed => {
                    in_flight = None;
                    commit(&consumer, offsets, CommitMode::Async);
                    false
                }
                _ = linger => true,
                received = consumer.recv() => match received {
                    Ok(message) => {
                        self.progress.first_consumed.get_or_init(Instant::now);
                        batch.push(message.detach());
                        linger_until.get_or_insert_with(|| tokio::time::Instant::now() + self.limits.linger);
                        batch.len() >= batch_size
                    }
                    Err(error) => {
                        tracing::warn!(%error, "consumer error");
                        false
                    }
                },
            };
            if full && !batch.is_empty() {
                // One flush in flight: the next batch fills while the previous one is written.
                if let Some(previous) = in_flight.take() {
                    commit(&consumer, previous.await.ok().flatten(), CommitMode::Async);
                }
                let messages = std::mem::replace(&mut batch, Vec::with_capacity(batch_size));
                linger_until = None;
                in_flight = Some(tokio::spawn(
                    self.flusher.clone().flush(messages, shutdown.clone()),
                ));
            }
        }

        // Shutdown: finish what was consumed; a flush cut short by an outage commits nothing.
        if let Some(previous) = in_flight.take() {
            commit(&consumer, previous.await.ok().flatten(), CommitMode::Sync);
        }
        if !batch.is_empty() {
            let offsets = self.flusher.clone().flush(batch, CancellationToken::new());
            let offsets = tokio::time::timeout(
                self.limits.linger.max(std::time::Duration::from_secs(10)),
                offsets,
            )
            .await;
            commit(&consumer, offsets.ok().flatten(), CommitMode::Sync);
        }
        consumer.unsubscribe();
        tracing::info!("ingest stopped");
        Ok(())
    }
}

/// Commits `offsets` for the partitions still assigned to this consumer; offsets of
/// partitions lost in a rebalance are left to their new owner.
fn commit(consumer: &StreamConsumer<IngestContext>, offsets: Option<Offsets>, mode: CommitMode) {
    let Some(offsets) = offsets else { return };
    let assignment = match consumer.assignment() {
        Ok(assignment) => assignment,
        Err(error) => {
            tracing::warn!(%error, "cannot read the assignment; not committing");
            return;
        }
    };
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), next) in offsets {
        if assignment.find_partition(&topic, partition).is_some() {
            if let Err(error) = tpl.add_partition_offset(&topic, partition, Offset::Offset(next)) {
                tracing::warn!(%error, "bad offset");
            }
        }
    }
    if tpl.count() == 0 {
        return;
    }
    if let Err(error) = consumer.commit(&tpl, mode) {
        tracing::warn!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
    }
}
