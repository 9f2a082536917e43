//! Parking: permanent failures are also produced to a topic (their route's
//! `parking_topic`, else `parking.topic`), with their context as headers, for teams that
//! live in Kafka. A parking failure never loses the task: it
//! stays recorded in PostgreSQL.

use rdkafka::error::KafkaError;

use crate::config::{KafkaSettings, Targets};
use crate::kafka::context::QuietContext;
use crate::kafka::dlt::own;
use crate::kafka::produce::{produce_task, Producer};
use crate::kafka::{producer_config, redact_error};
use crate::task::Task;
use crate::telemetry::Metrics;

/// Producer of the parking topics.
#[derive(Clone)]
pub struct Parking {
    producer: Producer,
    targets: Targets,
    metrics: Metrics,
}

impl Parking {
    /// A parking producer for the parking topics of `targets`, for messages up to
    /// `max_message_bytes`.
    pub fn new(
        kafka: &KafkaSettings,
        max_message_bytes: u32,
        targets: Targets,
        metrics: Metrics,
    ) -> Result<Self, KafkaError> {
        Ok(Parking {
            producer: producer_config(kafka, max_message_bytes)
                .create_with_context(QuietContext::default())
                .map_err(|e| redact_error(e, kafka))?,
            targets,
            metrics,
        })
    }

    /// Produces `task`, which just became a permanent failure with `error`, to its
    /// parking topic; a task whose route parks nowhere is left alone.
    pub async fn park(&self, task: &Task, error: Option<&str>) {
        let Some(topic) = self.targets.parking_topic(task.failure.route.as_deref()) else {
            return;
        };
        let origin = task
            .failure
            .original
            .clone()
            .or_else(|| task.failure.source.clone().map(Into::into));
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
            context.push((own::ORIGINAL_TOPIC, origin.topic));
            // What is not known is left out, as the dead letter that came left it out.
            if let Some(partition) = origin.partition {
                context.push((own::ORIGINAL_PARTITION, partition.to_string()));
            }
            if let Some(offset) = origin.offset {
                context.push((own::ORIGINAL_OFFSET, offset.to_string()));
            }
        }
        context.extend(lineage(task));
        let produced = produce_task(&self.producer, topic, task, &context).await;
        self.metrics.count_produced("parking", produced.is_ok());
        match produced {
            Ok(()) => self.metrics.parked.with_label_values(&["produced"]).inc(),
            Err(error) => {
                self.metrics.parked.with_label_values(&["failed"]).inc();
                tracing::warn!(task = %task.id, %topic, %error,
                    "could not park the permanent failure; it stays recorded in PostgreSQL");
            }
        }
    }
}

/// The headers of a re-failure: its generation, the task it came from, that task's error
/// and the error its own dead letter reported (beside the final error).
fn lineage(task: &Task) -> Vec<(&'static str, String)> {
    let failure = &task.failure;
    let Some(previous) = failure.previous_task else {
        return Vec::new();
    };
    let mut headers = vec![
        (own::GENERATION, failure.generation.to_string()),
        (own::PREVIOUS_TASK_ID, previous.to_string()),
    ];
    headers.extend((failure.previous_error.clone()).map(|error| (own::PREVIOUS_ERROR, error)));
    headers.extend((failure.error_message.clone()).map(|error| (own::REPORTED_ERROR, error)));
    headers
}

#[async_trait::async_trait]
impl crate::finals::FinalSink for Parking {
    async fn permanent_failure(&self, task: &Task, error: Option<&str>) {
        self.park(task, error).await;
    }
}
