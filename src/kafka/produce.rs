//! Producing a task back to Kafka, byte for byte: shared by republish and parking.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka_sys as rdsys;
use std::sync::OnceLock;
use std::time::Duration;

use super::context::QuietContext;
use super::dlt::is_context_header;
use super::{producer_config, redact_error};
use crate::config::KafkaSettings;
use crate::task::Task;

/// redrive's producers: librdkafka's reports logged once per change.
pub(crate) type Producer = FutureProducer<QuietContext>;

/// An idempotent producer created on first use, so a member that never produces never
/// connects to Kafka (and never logs its absence).
pub(crate) struct LazyProducer {
    kafka: KafkaSettings,
    max_message_bytes: u32,
    producer: OnceLock<Producer>,
}

impl LazyProducer {
    /// A producer for messages up to `max_message_bytes` (key, value and headers).
    pub(crate) fn new(kafka: &KafkaSettings, max_message_bytes: u32) -> LazyProducer {
        LazyProducer {
            kafka: kafka.clone(),
            max_message_bytes,
            producer: OnceLock::new(),
        }
    }

    /// The producer, created now if it was not yet. An error never holds a property
    /// value.
    pub(crate) fn get(&self) -> Result<&Producer, KafkaError> {
        if let Some(producer) = self.producer.get() {
            return Ok(producer);
        }
        let producer = producer_config(&self.kafka, self.max_message_bytes)
            .create_with_context(QuietContext::default())
            .map_err(|e| redact_error(e, &self.kafka))?;
        // Two first callers may race: one producer wins, the other is dropped.
        Ok(self.producer.get_or_init(|| producer))
    }

    /// Whether the producer was created.
    #[cfg(test)]
    pub(crate) fn is_created(&self) -> bool {
        self.producer.get().is_some()
    }
}

/// Produces the task's key, value and headers (context headers of earlier hops replaced
/// by `extra`) to `topic`, returning once the broker acknowledged the write.
pub(crate) async fn produce_task(
    producer: &Producer,
    topic: &str,
    task: &Task,
    extra: &[(&str, String)],
) -> Result<(), KafkaError> {
    let mut record: FutureRecord<'_, [u8], [u8]> =
        FutureRecord::to(topic).headers(outgoing_headers(task, extra));
    if let Some(key) = task.failure.key.as_deref() {
        record = record.key(key);
    }
    if let Some(value) = task.failure.value.as_deref() {
        record = record.payload(value);
    }
    let acknowledged = producer
        .send(record, Timeout::After(Duration::from_secs(30)))
        .await;
    acknowledged.map(|_| ()).map_err(|(error, _)| error)
}

/// The headers to produce: the task's own minus context headers of earlier hops, then
/// `extra`; names as the bytes that came.
fn outgoing_headers(task: &Task, extra: &[(&str, String)]) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(task.failure.headers.len() + extra.len());
    let kept = task
        .failure
        .headers
        .iter()
        .filter(|h| !is_context_header(&h.name));
    for header in kept {
        add_header(&mut headers, &header.name, header.value.as_deref());
    }
    for (name, value) in extra {
        add_header(&mut headers, name.as_bytes(), Some(value.as_bytes()));
    }
    headers
}

/// Adds a header whose name is any bytes. rdkafka's `OwnedHeaders::insert` takes names
/// as `&str`; librdkafka's `rd_kafka_header_add` takes bytes.
fn add_header(headers: &mut OwnedHeaders, name: &[u8], value: Option<&[u8]>) {
    // `as_borrowed` views the native list: the reference's address is the
    // `rd_kafka_headers_t *` that `headers` owns.
    let native = std::ptr::from_ref(headers.as_borrowed())
        .cast_mut()
        .cast::<rdsys::rd_kafka_headers_t>();
    let (value_ptr, value_len) = match value {
        Some(v) => (v.as_ptr().cast(), v.len() as isize),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: `native` is the live, writable header list owned by `headers`, borrowed
    // mutably here, so no one reads it meanwhile; librdkafka copies name and value.
    let err = unsafe {
        rdsys::rd_kafka_header_add(
            native,
            name.as_ptr().cast(),
            name.len() as isize,
            value_ptr,
            value_len,
        )
    };
    // An OwnedHeaders list is never read-only, the one reason for an error.
    debug_assert_eq!(err, rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
}

/// Broker refusals that a retry cannot fix.
pub(crate) fn is_permanent(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        error.rdkafka_error_code(),
        Some(
            UnknownTopicOrPartition
                | UnknownTopic
                | InvalidTopic
                | MessageSizeTooLarge
                | InvalidMessageSize
                | MessageBatchTooLarge
                | TopicAuthorizationFailed
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Header;
    use rdkafka::message::Headers;

    #[test]
    fn header_names_go_out_byte_for_byte() {
        let mut task = crate::task::NewTask::new("republish", b"v".to_vec()).unsaved();
        task.failure.headers = vec![
            Header::new(b"bad\xff\xfe".to_vec(), b"x".to_vec()),
            Header {
                name: b"absent".to_vec(),
                value: None,
            },
            Header::new("kafka_dlt-original-topic", b"orders".to_vec()),
        ];
        let headers = outgoing_headers(&task, &[("redrive-attempt", "2".into())]);
        assert_eq!(headers.count(), 3, "the context header is replaced");
        // SAFETY: reading the list `headers` owns, while it lives.
        let read = unsafe {
            crate::kafka::message::read_native_headers(
                std::ptr::from_ref(headers.as_borrowed()).cast(),
            )
        };
        assert_eq!(read[0], task.failure.headers[0]);
        assert_eq!(read[1], task.failure.headers[1]);
        assert_eq!(read[2], Header::new("redrive-attempt", b"2".to_vec()));
    }

    #[test]
    fn unknown_topics_and_oversized_messages_are_permanent_other_errors_transient() {
        let produce = |code| KafkaError::MessageProduction(code);
        assert!(is_permanent(&produce(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
        assert!(is_permanent(&produce(RDKafkaErrorCode::UnknownTopic)));
        assert!(is_permanent(&produce(
            RDKafkaErrorCode::MessageSizeTooLarge
        )));
        assert!(!is_permanent(&produce(RDKafkaErrorCode::MessageTimedOut)));
        assert!(!is_permanent(&produce(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!is_permanent(&produce(RDKafkaErrorCode::NotEnoughReplicas)));
    }
}
