//! The built-in `republish` handler: produce the task back to Kafka, byte for byte.

use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use std::time::Duration;

use super::{Handler, HandlerContext, HandlerError};
use crate::config::{KafkaSettings, RepublishSettings};
use crate::kafka::dlt::{is_context_header, own};
use crate::kafka::{producer_config, redact_error};
use crate::task::Task;

/// Produces the task's key, value and headers to its original topic (or the configured
/// target) with an idempotent producer. The attempt succeeds when the broker acknowledged
/// the write. Context headers of earlier hops are replaced by `redrive-task-id` and
/// `redrive-attempt`.
#[derive(Clone)]
pub struct RepublishHandler {
    producer: FutureProducer,
    target_topic: Option<String>,
}

impl RepublishHandler {
    /// A handler with its own idempotent producer.
    pub fn new(kafka: &KafkaSettings, settings: &RepublishSettings) -> Result<Self, KafkaError> {
        Ok(RepublishHandler {
            producer: producer_config(kafka)
                .create()
                .map_err(|e| redact_error(e, kafka))?,
            target_topic: settings.target_topic.clone(),
        })
    }
}

/// The headers to produce: the task's own minus context headers of earlier hops, then
/// `extra`.
fn outgoing_headers(task: &Task, extra: &[(&str, String)]) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(task.failure.headers.len() + extra.len());
    for h in task
        .failure
        .headers
        .iter()
        .filter(|h| !is_context_header(&h.name))
    {
        headers = headers.insert(KafkaHeader {
            key: &h.name,
            value: h.value.as_deref(),
        });
    }
    for (key, value) in extra {
        headers = headers.insert(KafkaHeader {
            key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// Produces the task's key, value and headers (context headers of earlier hops replaced
/// by `extra`) to `topic`, returning once the broker acknowledged the write.
pub async fn produce_task(
    producer: &FutureProducer,
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

/// Broker refusals that a retry cannot fix.
pub fn is_permanent(error: &KafkaError) -> bool {
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

#[async_trait]
impl Handler for RepublishHandler {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        if !task.failure.payload_stored {
            // Producing the absent payload would write an empty record: on a compacted
            // topic, a delete.
            return Err(HandlerError::permanent(
                "the payload was not stored (minimal form, see ingest_note); \
                 republishing it would produce an empty record",
            ));
        }
        let topic = self
            .target_topic
            .as_deref()
            .or(task.failure.original.as_ref().map(|o| o.topic.as_str()))
            .ok_or_else(|| {
                HandlerError::permanent(
                    "no topic to republish to: the message carried no known dead-letter \
                     headers and republish.target_topic is not set",
                )
            })?;
        let extra = [
            (own::TASK_ID, task.id.to_string()),
            (own::ATTEMPT, ctx.attempt.to_string()),
        ];
        match produce_task(&self.producer, topic, task, &extra).await {
            Ok(()) => Ok(()),
            Err(error) if is_permanent(&error) => Err(HandlerError::permanent(format!(
                "republish to {topic} refused: {error}"
            ))),
            Err(error) => Err(HandlerError::transient(format!(
                "republish to {topic} failed: {error}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
