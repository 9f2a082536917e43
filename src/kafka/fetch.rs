//! Fetching one record by its coordinates: what a dead letter that carries only headers
//! (a Kafka share group's, by default) left out. The fetch is bounded: a consumer of
//! the fleet's Kafka settings, assigned to that one partition at that offset, no group
//! membership and no commit, a deadline, and a fetch size of the largest message
//! redrive stores.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

use super::client_config;
use super::message::Consumed;
use crate::config::KafkaSettings;
use crate::task::SourceCoordinates;

/// Why an original record could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The topic does not exist (deleted, or never there).
    #[error("topic {0:?} does not exist")]
    NoTopic(String),
    /// The topic has fewer partitions.
    #[error("the topic has no partition {partition} ({partitions} partitions)")]
    NoPartition {
        /// The partition asked for.
        partition: i32,
        /// How many the topic has.
        partitions: usize,
    },
    /// The offset is below the partition's first: retention deleted the record.
    #[error("offset {offset} is gone: the partition now starts at {low} (deleted by retention)")]
    Deleted {
        /// The offset asked for.
        offset: i64,
        /// The partition's first offset.
        low: i64,
    },
    /// The offset is not written yet (or the topic was recreated and is shorter).
    #[error("offset {offset} is past the partition's end ({high}): the topic was recreated or the coordinates are wrong")]
    Beyond {
        /// The offset asked for.
        offset: i64,
        /// The partition's next offset.
        high: i64,
    },
    /// Compaction removed the record: the partition goes on at a later offset.
    #[error("offset {offset} is gone: the next record is at {next} (removed by compaction)")]
    Compacted {
        /// The offset asked for.
        offset: i64,
        /// The next offset present.
        next: i64,
    },
    /// The batch's fetch time ran out first (the broker unreachable or slow); the last
    /// thing seen.
    #[error("not fetched within ingest.original_fetch_timeout (last: {0})")]
    TimedOut(String),
    /// The client could not be created.
    #[error("cannot create the fetching consumer: {0}")]
    Client(String),
}

/// A consumer for fetching original records, one per batch that needs any.
pub struct OriginalFetcher {
    consumer: BaseConsumer,
}

impl OriginalFetcher {
    /// A consumer of `kafka`'s cluster and client settings that reads at most about
    /// `max_bytes` per fetch (librdkafka still returns one record larger than that).
    pub fn new(kafka: &KafkaSettings, max_bytes: u32) -> Result<Self, FetchError> {
        let mut config = client_config(kafka, crate::kafka::ClientRole::Consumer);
        config
            .set("group.id", format!("{}.original-fetch", kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            .set("max.partition.fetch.bytes", max_bytes.max(1024).to_string());
        let consumer = config
            .create()
            .map_err(|e| FetchError::Client(super::redact_error(e, kafka).to_string()))?;
        Ok(OriginalFetcher { consumer })
    }

    /// The record at `at`, if it is there and reached before `deadline`. Blocking: run
    /// it off the async runtime.
    pub fn fetch(&self, at: &SourceCoordinates, deadline: Instant) -> Result<Consumed, FetchError> {
        let left = |doing: &str| {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| timed_out(doing))
        };
        let metadata = self
            .consumer
            .fetch_metadata(Some(&at.topic), left("reading the topic's metadata")?)
            .map_err(|e| timed_out(&format!("metadata: {e}")))?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == at.topic)
            .ok_or_else(|| FetchError::NoTopic(at.topic.clone()))?;
        match topic.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                return Err(FetchError::NoTopic(at.topic.clone()))
            }
            Some(code) => return Err(timed_out(&format!("metadata: {code}"))),
            None => {}
        }
        let partitions = topic.partitions().len();
        if !topic.partitions().iter().any(|p| p.id() == at.partition) {
            return Err(FetchError::NoPartition {
                partition: at.partition,
                partitions,
            });
        }
        let (low, high) = self
            .consumer
            .fetch_watermarks(&at.topic, at.partition, left("reading the watermarks")?)
            .map_err(|e| timed_out(&format!("watermarks: {e}")))?;
        if at.offset < low {
            return Err(FetchError::Deleted {
                offset: at.offset,
                low,
            });
        }
        if at.offset >= high {
            return Err(FetchError::Beyond {
                offset: at.offset,
                high,
            });
        }
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&at.topic, at.partition, Offset::Offset(at.offset))
            .map_err(|e| timed_out(&e.to_string()))?;
        self.consumer
            .assign(&assignment)
            .map_err(|e| timed_out(&format!("assign: {e}")))?;
        let fetched = self.poll_for(at, deadline, low);
        // Nothing stays assigned between fetches; an error here changes nothing fetched.
        let _ = self.consumer.unassign();
        fetched
    }

    fn poll_for(
        &self,
        at: &SourceCoordinates,
        deadline: Instant,
        low: i64,
    ) -> Result<Consumed, FetchError> {
        let mut last_error = "no record yet".to_owned();
        loop {
            let Some(wait) = deadline.checked_duration_since(Instant::now()) else {
                return Err(timed_out(&last_error));
            };
            match self.consumer.poll(wait.min(Duration::from_millis(200))) {
                Some(Ok(message))
                    if message.topic() == at.topic && message.partition() == at.partition =>
                {
                    return match message.offset() {
                        offset if offset == at.offset => Ok(Consumed::new(&message)),
                        next if next > at.offset => Err(FetchError::Compacted {
                            offset: at.offset,
                            next,
                        }),
                        // An earlier record of a compressed batch: read on.
                        _ => continue,
                    };
                }
                Some(Ok(_)) => {}
                Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                    return Err(FetchError::Deleted {
                        offset: at.offset,
                        low,
                    })
                }
                Some(Err(error)) => last_error = error.to_string(),
                None => {}
            }
        }
    }
}

/// Fetches each of `places` with one consumer of `kafka`'s settings, all before one
/// deadline `timeout` from now. Blocking: run it off the async runtime.
pub fn fetch_each(
    kafka: &KafkaSettings,
    max_bytes: u32,
    timeout: Duration,
    places: &[SourceCoordinates],
) -> Vec<Result<Consumed, FetchError>> {
    let fetcher = match OriginalFetcher::new(kafka, max_bytes) {
        Ok(fetcher) => fetcher,
        Err(error) => return vec![Err(error); places.len()],
    };
    let deadline = Instant::now() + timeout;
    places
        .iter()
        .map(|at| fetcher.fetch(at, deadline))
        .collect()
}

/// [`fetch_each`] on a blocking thread, for async callers; should that thread panic,
/// every place answers [`FetchError::TimedOut`] saying so.
pub async fn fetch_each_off_runtime(
    kafka: KafkaSettings,
    max_bytes: u32,
    timeout: Duration,
    places: Vec<SourceCoordinates>,
) -> Vec<Result<Consumed, FetchError>> {
    let count = places.len();
    tokio::task::spawn_blocking(move || fetch_each(&kafka, max_bytes, timeout, &places))
        .await
        .unwrap_or_else(|panic| {
            vec![Err(timed_out(&format!("the fetch panicked: {panic}"))); count]
        })
}

fn timed_out(doing: &str) -> FetchError {
    FetchError::TimedOut(doing.to_owned())
}
