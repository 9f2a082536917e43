//! Parking: permanent failures are also produced to a topic, with their context as
//! headers, for teams that live in Kafka. A parking failure never loses the task: it
//! stays recorded in PostgreSQL.

use rdkafka::error::KafkaError;

use crate::config::KafkaSettings;
use crate::kafka::context::QuietContext;
use crate::kafka::dlt::own;
use crate::kafka::produce::{produce_task, Producer};
use crate::kafka::{producer_config, redact_error};
use crate::task::Task;
use crate::telemetry::Metrics;

/// Producer of the parking topic.
#[derive(Clone)]
pub struct Parking {
    producer: Producer,
    topic: String,
    metrics: Metrics,
}

impl Parking {
    /// A parking producer for `topic`, for messages up to `max_message_bytes`.
    pub fn new(
        kafka: &KafkaSettings,
        max_message_bytes: u32,
        topic: String,
        metrics: Metrics,
    ) -> Result<Self, KafkaError> {
        Ok(Parking {
            producer: producer_config(kafka, max_message_bytes)
                .create_with_context(QuietContext::default())
                .map_err(|e| redact_error(e, kafka))?,
            topic,
            metrics,
        })
    }

    /// Produces `task`, which just became a permanent failure with `error`.
    pub async fn park(&self, task: &Task, error: Option<&str>) {
        let origin = task
            .failure
            .original
            .as_ref()
            .or(task.failure.source.as_ref());
        let mut context = vec![
            (own::TASK_ID, task.id.to_string()),
            (own::ATTEMPTS, task.attempts.to_string()),
            (
                own::ERROR_MESSAGE,
                error
                    .or(task.failure.error_message.as_deref())
                    .unwrap_or_default()
                    .to_owned(),
            ),
        ];
        if let Some(class) = &task.failure.error_class {
            context.push((own::ERROR_CLASS, class.clone()));
        }
        if let Some(origin) = origin {
            context.push((own::ORIGINAL_TOPIC, origin.topic.clone()));
            context.push((own::ORIGINAL_PARTITION, origin.partition.to_string()));
            context.push((own::ORIGINAL_OFFSET, origin.offset.to_string()));
        }
        let produced = produce_task(&self.producer, &self.topic, task, &context).await;
        self.metrics.count_produced("parking", produced.is_ok());
        match produced {
            Ok(()) => self.metrics.parked.with_label_values(&["produced"]).inc(),
            Err(error) => {
                self.metrics.parked.with_label_values(&["failed"]).inc();
                tracing::warn!(task = %task.id, topic = %self.topic, %error,
                    "could not park the permanent failure; it stays recorded in PostgreSQL");
            }
        }
    }
}

#[async_trait::async_trait]
impl crate::finals::FinalSink for Parking {
    async fn permanent_failure(&self, task: &Task, error: Option<&str>) {
        self.park(task, error).await;
    }
}
