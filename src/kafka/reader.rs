//! Reading what is on Kafka's topics for a replay (blocking calls, run off the async
//! threads): a topic's partitions and where each ends, and the records a replay job
//! already produced past its marks.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use super::context::QuietContext;
use super::dlt::own;
use super::message::Consumed;
use super::{client_config, redact_error};
use crate::config::KafkaSettings;

/// Longest wait for Kafka metadata, watermarks or a read-back.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a target partition ended before a replay's batch was produced: topic →
/// partition → the high watermark. A resume reads from there to learn what the batch
/// already wrote.
pub type Marks = BTreeMap<String, BTreeMap<i32, i64>>;

/// Why Kafka could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Kafka refused or could not be reached.
    #[error("kafka: {0}")]
    Kafka(String),
    /// A topic does not exist.
    #[error("topic {0:?} does not exist")]
    UnknownTopic(String),
}

/// Reads Kafka metadata and partitions.
pub struct Reader {
    consumer: BaseConsumer<QuietContext>,
    kafka: KafkaSettings,
}

impl Reader {
    /// A reader of `kafka`'s cluster.
    pub fn new(kafka: &KafkaSettings) -> Result<Reader, ReadError> {
        let consumer = client_config(kafka, super::ClientRole::Consumer)
            .set("group.id", "redrive-replay-reader")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("allow.auto.create.topics", "false")
            .set("enable.partition.eof", "true")
            .create_with_context(QuietContext::default())
            .map_err(|e| ReadError::Kafka(redact_error(e, kafka).to_string()))?;
        Ok(Reader {
            consumer,
            kafka: kafka.clone(),
        })
    }

    fn kafka_error(&self, error: rdkafka::error::KafkaError) -> ReadError {
        ReadError::Kafka(redact_error(error, &self.kafka).to_string())
    }

    /// The partitions of `topic`; an error when it does not exist.
    pub fn partitions(&self, topic: &str) -> Result<Vec<i32>, ReadError> {
        self.partitions_within(topic, KAFKA_TIMEOUT)
    }

    /// [`Reader::partitions`], waiting at most `timeout` for the metadata.
    pub fn partitions_within(&self, topic: &str, timeout: Duration) -> Result<Vec<i32>, ReadError> {
        let metadata = self
            .consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| self.kafka_error(e))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(ReadError::UnknownTopic(topic.to_owned()));
        };
        if found.error().is_some() || found.partitions().is_empty() {
            return Err(ReadError::UnknownTopic(topic.to_owned()));
        }
        Ok(found.partitions().iter().map(|p| p.id()).collect())
    }

    /// Where partition `partition` of `topic` ends (its high watermark).
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Result<i64, ReadError> {
        let (_, high) = self
            .consumer
            .fetch_watermarks(topic, partition, KAFKA_TIMEOUT)
            .map_err(|e| self.kafka_error(e))?;
        Ok(high)
    }

    /// Task ids of replay job `job` (its `redrive-replay: <job>:<task id>` headers) found
    /// on the marked partitions (topic, partition, offset) past their marks.
    pub fn replayed_since(&self, job: i64, marks: &Marks) -> Result<HashSet<i64>, ReadError> {
        let mut assignment = TopicPartitionList::new();
        let mut remaining = 0;
        let mut ends = std::collections::HashMap::new();
        for (topic, partitions) in marks {
            for (&partition, &mark) in partitions {
                let end = self.high_watermark(topic, partition)?;
                if end > mark {
                    assignment
                        .add_partition_offset(topic, partition, Offset::Offset(mark))
                        .map_err(|e| self.kafka_error(e))?;
                    ends.insert((topic.clone(), partition), end);
                    remaining += 1;
                }
            }
        }
        let mut found = HashSet::new();
        if remaining == 0 {
            return Ok(found);
        }
        self.consumer
            .assign(&assignment)
            .map_err(|e| self.kafka_error(e))?;
        let prefix = format!("{job}:");
        let deadline = Instant::now() + KAFKA_TIMEOUT;
        let mut finished = HashSet::new();
        while finished.len() < remaining {
            if Instant::now() > deadline {
                return Err(ReadError::Kafka(
                    "timed out reading back the pending batch from the target topics".into(),
                ));
            }
            let Some(polled) = self.consumer.poll(Duration::from_millis(500)) else {
                continue;
            };
            let message = match polled {
                Ok(message) => message,
                Err(rdkafka::error::KafkaError::PartitionEOF(_)) => continue,
                Err(error) => return Err(self.kafka_error(error)),
            };
            let place = (message.topic().to_owned(), message.partition());
            // Read byte-safely: rdkafka's own accessors panic on a name that is not UTF-8.
            for header in Consumed::new(&message).headers {
                if !header.name_is(own::REPLAY) {
                    continue;
                }
                let task = header
                    .value
                    .as_deref()
                    .and_then(|v| v.strip_prefix(prefix.as_bytes()))
                    .and_then(|v| super::dlt::number(v, false));
                if let Some(task) = task {
                    found.insert(task);
                }
            }
            if ends
                .get(&place)
                .is_some_and(|&end| message.offset() + 1 >= end)
            {
                finished.insert(place);
            }
        }
        Ok(found)
    }
}
