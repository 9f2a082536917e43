//! Ingest: consume the routes' topics in one consumer group and persist failures as
//! tasks. An offset is committed only after the rows recording its messages are
//! committed; redelivered messages find their task by source coordinates.

mod context;
mod flush;
mod routes;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{IngestSettings, KafkaSettings, RouteSettings};
use crate::handlers::Registered;
use crate::kafka::consumer_config;
use crate::kafka::message::Consumed;
use crate::store::Store;
use crate::telemetry::Metrics;
use context::IngestContext;
use flush::{Flusher, Offsets};
use routes::RouteTable;

/// Why ingest stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The consumer could not be created or subscribed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Writing a batch failed unexpectedly (a bug): later offsets must not be committed.
    #[error("a batch could not be persisted ({0}); no later offset is committed")]
    FlushFailed(String),
}

/// Batches being written at once: enough to overlap one insert's commit with the next
/// batch's round trip.
const FLUSHES_IN_FLIGHT: usize = 3;

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
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), IngestError> {
        let consumer: StreamConsumer<IngestContext> =
            consumer_config(&self.kafka).create_with_context(IngestContext::default())?;
        let subscriptions = self.flusher.routes.subscriptions();
        let topics: Vec<&str> = subscriptions.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        tracing::info!(?topics, group = %self.kafka.group_id, "ingest started");

        let batch_size = self.limits.batch_size as usize;
        let mut batch: Vec<Consumed> = Vec::with_capacity(batch_size);
        let mut linger_until = None;
        // Flushes run concurrently; their offsets are committed strictly in order.
        let mut in_flight: VecDeque<JoinHandle<Option<Offsets>>> = VecDeque::new();
        let mut failure = None;
        loop {
            let linger = async {
                match linger_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let oldest_flushed = async {
                match in_flight.front_mut() {
                    Some(handle) => handle.await,
                    None => std::future::pending().await,
                }
            };
            let full = tokio::select! {
                _ = shutdown.cancelled() => break,
                outcome = oldest_flushed => {
                    in_flight.pop_front();
                    match outcome {
                        Ok(offsets) => commit(&consumer, offsets, CommitMode::Async),
                        Err(panic) => {
                            failure = Some(IngestError::FlushFailed(panic.to_string()));
                            break;
                        }
                    }
                    false
                }
                _ = linger => true,
                received = consumer.recv() => match received {
                    Ok(message) => {
                        self.progress.first_consumed.get_or_init(Instant::now);
                        batch.push(Consumed::new(&message));
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
                if in_flight.len() >= FLUSHES_IN_FLIGHT {
                    let oldest = in_flight.pop_front().expect("non-empty");
                    match oldest.await {
                        Ok(offsets) => commit(&consumer, offsets, CommitMode::Async),
                        Err(panic) => {
                            failure = Some(IngestError::FlushFailed(panic.to_string()));
                            break;
                        }
                    }
                }
                let messages = std::mem::replace(&mut batch, Vec::with_capacity(batch_size));
                linger_until = None;
                in_flight.push_back(tokio::spawn(
                    self.flusher.clone().flush(messages, shutdown.clone()),
                ));
            }
        }

        if let Some(failure) = failure {
            // Nothing after a batch that was not persisted may be committed: stop, and let
            // the group redeliver from the last committed offsets.
            for handle in in_flight {
                handle.abort();
            }
            tracing::error!(%failure, "ingest stopped");
            return Err(failure);
        }
        // Shutdown: finish what was consumed, in order. A flush cut short by an outage
        // commits nothing, and nothing after it is committed either.
        let final_flush = (!batch.is_empty()).then(|| {
            let flush = self.flusher.clone().flush(batch, CancellationToken::new());
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(10), flush)
                    .await
                    .ok()
                    .flatten()
            })
        });
        in_flight.extend(final_flush);
        for handle in in_flight {
            let Some(offsets) = handle.await.ok().flatten() else {
                break;
            };
            commit(&consumer, Some(offsets), CommitMode::Sync);
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
    consumer.context().committing(&tpl);
    if let Err(error) = consumer.commit(&tpl, mode) {
        tracing::warn!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
    }
}
