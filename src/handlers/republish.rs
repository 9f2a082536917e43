//! The built-in `republish` handler: produce the task back to Kafka, byte for byte.

use async_trait::async_trait;
use std::sync::Arc;

use super::{Handler, HandlerContext, HandlerError};
use crate::config::{Settings, Targets};
use crate::kafka::dlt::own;
use crate::kafka::produce::{is_permanent, produce_task, LazyProducer};
use crate::task::Task;
use crate::telemetry::Metrics;

/// Produces the task's key, value and headers to its original topic (or the target its
/// route or `republish.target_topic` configures) with an idempotent producer, created on first use. The attempt succeeds when
/// the broker acknowledged the write. Context headers of earlier hops are replaced by
/// `redrive-task-id` and `redrive-attempt`.
#[derive(Clone)]
pub struct RepublishHandler {
    producer: Arc<LazyProducer>,
    targets: Targets,
    metrics: Metrics,
}

impl RepublishHandler {
    /// A handler for the cluster of `settings.kafka`; its producer admits messages up
    /// to `ingest.max_message_bytes`, the largest redrive captures.
    pub fn new(settings: &Settings) -> Self {
        RepublishHandler {
            producer: Arc::new(LazyProducer::new(
                &settings.kafka,
                settings.ingest.max_message_bytes,
            )),
            targets: Targets::new(settings),
            metrics: Metrics::new(),
        }
    }

    /// Counts what it produces in `metrics` (`redrive_produced_messages_total`).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }
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
            .targets
            .republish_topic(task.failure.route.as_deref())
            .or(task.failure.original.as_ref().map(|o| o.topic.as_str()))
            .ok_or_else(|| {
                HandlerError::permanent(
                    "no topic to republish to: the message carried no readable original \
                     topic header (see ingest_note) and neither its route's republish_topic \
                     nor republish.target_topic is set",
                )
            })?;
        let extra = [
            (own::TASK_ID, task.id.to_string()),
            (own::ATTEMPT, ctx.attempt.to_string()),
        ];
        let producer = self.producer.get().map_err(|error| {
            HandlerError::transient(format!("cannot create the republish producer: {error}"))
        })?;
        let produced = produce_task(producer, topic, task, &extra).await;
        self.metrics.count_produced("republish", produced.is_ok());
        match produced {
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

    /// Regression: every member built with the built-in handlers created a producer,
    /// which connected (and logged broker errors) even when nothing used Kafka.
    #[tokio::test]
    async fn the_producer_is_created_only_when_a_task_is_republished() {
        let mut settings = Settings::default();
        settings.kafka.bootstrap_servers = "127.0.0.1:1".into();
        let handler = RepublishHandler::new(&settings);
        assert!(!handler.producer.is_created());
        let mut task = crate::task::NewTask::new("republish", b"v".to_vec()).unsaved();
        task.failure.original = None;
        let ctx = HandlerContext::new("w", 1, Default::default());
        let refused = handler.handle(&ctx, &task).await;
        assert!(
            matches!(refused, Err(HandlerError::Permanent(_))),
            "no topic"
        );
        assert!(
            !handler.producer.is_created(),
            "nothing to produce, no producer"
        );
    }
}
