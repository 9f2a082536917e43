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
/// route or `republish.target_topic` configures) with an idempotent producer, created on
/// first use. The attempt succeeds when the broker acknowledged the write. Context
/// headers of earlier hops are replaced by `redrive-task-id` and `redrive-attempt`.
///
/// A target that a route of this fleet takes back as new work (a dead letter whose
/// original topic is its own dead-letter topic, or another capture route's) is refused
/// here, at every attempt, as a permanent failure naming the topic and the route
/// ([`Targets::republish_target`]): this is the one place every republish passes
/// through, pool attempts, process-mode inline attempts and operators' retries alike,
/// and it judges by the configuration of the member that would produce.
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
        let original = task.failure.original.as_ref().map(|o| o.topic.as_str());
        let target = self
            .targets
            .republish_target(task.failure.route.as_deref(), original)
            .map_err(HandlerError::permanent)?;
        let topic = target.topic.as_str();
        let mut extra = vec![
            (own::TASK_ID, task.id.to_string()),
            (own::ATTEMPT, ctx.attempt.to_string()),
            (own::GENERATION, task.failure.generation.to_string()),
        ];
        if let Some(job) = ctx.redrive_job {
            extra.push((own::JOB, job.to_string()));
        }
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

    /// An operator's retry after a capture route of the task's original topic was
    /// added: refused, not produced, with the topic and the route in the error.
    #[tokio::test]
    async fn a_task_whose_original_topic_a_capture_route_consumes_is_refused() {
        let mut settings = Settings::default();
        settings.kafka.bootstrap_servers = "127.0.0.1:1".into();
        let mut orders = crate::config::RouteSettings::new(
            &["orders"],
            crate::config::RouteMode::Capture,
            "log",
        );
        orders.name = "orders-capture".into();
        settings.routes = vec![orders];
        let handler = RepublishHandler::new(&settings);
        let mut task = crate::task::NewTask::new("republish", b"v".to_vec()).unsaved();
        task.failure.original = Some(crate::task::OriginalCoordinates {
            topic: "orders".into(),
            partition: None,
            offset: None,
        });
        let ctx = HandlerContext::new("w", 1, Default::default());
        let refused = handler.handle(&ctx, &task).await;
        assert!(
            matches!(&refused, Err(HandlerError::Permanent(error))
                if error.starts_with("republish to \"orders\" refused: it is consumed by \
                    capture route \"orders-capture\" (routes[0].topics)")),
            "{refused:?}"
        );
        assert!(!handler.producer.is_created(), "nothing produced");
    }
}
