//! Whether a stored task belongs to its topic's present life. Offsets start again when a
//! topic is recreated, or when a fleet is pointed at another cluster over the same
//! database: a rule that compares offsets across time ("a newer message of this key
//! has a task", process mode's ordering) must not take a new message for an old one.
//! The record at the task's coordinates is read back (from the batch when it holds it,
//! else fetched, under `ingest.original_fetch_timeout`) and compared with the task:
//! the same message means the same life.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::config::{IngestSettings, KafkaSettings};
use crate::kafka::fetch::{fetch_each_off_runtime, FetchError};
use crate::kafka::message::Consumed;
use crate::task::{SourceCoordinates, Task};
use rdkafka::Message;

/// What is at a stored task's coordinates now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Life {
    /// The task's message: the topic is the one the task was read from.
    Present,
    /// Another record, or none (past the partition's end, no such topic): the task is
    /// from an earlier life of the topic, or another cluster.
    Past,
    /// Not known: the record could not be read (a timeout, retention or compaction
    /// took it, the task's row is unreadable).
    Unknown,
}

/// Reads what is at stored tasks' coordinates.
pub(crate) struct Lives {
    kafka: KafkaSettings,
    limits: IngestSettings,
    /// Coordinates found holding another record than their task's: such a finding
    /// does not change, so it is not fetched again.
    past: Mutex<HashSet<(String, i32, i64)>>,
}

impl Lives {
    /// Reads with the fleet's Kafka settings, within `limits`' fetch time and size.
    pub(crate) fn new(kafka: KafkaSettings, limits: IngestSettings) -> Lives {
        Lives {
            kafka,
            limits,
            past: Mutex::default(),
        }
    }

    /// For each of `tasks`, whether its message is still at its source coordinates;
    /// `batch` holds the messages consumed with it (read before anything is fetched).
    pub(crate) async fn of(&self, tasks: &[Option<&Task>], batch: &[&Consumed]) -> Vec<Life> {
        let here: HashMap<(&str, i32, i64), &Consumed> = (batch.iter())
            .map(|c| {
                let m = &c.message;
                ((m.topic(), m.partition(), m.offset()), *c)
            })
            .collect();
        let mut lives = Vec::with_capacity(tasks.len());
        let mut to_fetch: Vec<(usize, SourceCoordinates)> = Vec::new();
        for (index, task) in tasks.iter().enumerate() {
            let Some((task, at)) = task.and_then(|t| Some((t, t.failure.source.as_ref()?))) else {
                lives.push(Life::Unknown);
                continue;
            };
            let place = (at.topic.clone(), at.partition, at.offset);
            lives.push(if self.past.lock().unwrap().contains(&place) {
                Life::Past
            } else if let Some(record) = here.get(&(at.topic.as_str(), at.partition, at.offset)) {
                holds(record, task)
            } else {
                to_fetch.push((index, at.clone()));
                Life::Unknown
            });
        }
        if !to_fetch.is_empty() {
            let places: Vec<SourceCoordinates> =
                to_fetch.iter().map(|(_, at)| at.clone()).collect();
            let fetched = fetch_each_off_runtime(
                self.kafka.clone(),
                self.limits.max_message_bytes,
                self.limits.original_fetch_timeout,
                places,
            )
            .await;
            for ((index, _), outcome) in to_fetch.into_iter().zip(fetched) {
                let task = tasks[index].expect("only tasks are fetched for");
                lives[index] = match outcome {
                    Ok(record) => holds(&record, task),
                    Err(
                        FetchError::Beyond { .. }
                        | FetchError::NoTopic(_)
                        | FetchError::NoPartition { .. },
                    ) => Life::Past,
                    Err(why) => {
                        tracing::debug!(%why, "could not read back the record of an ordered key's newest task");
                        Life::Unknown
                    }
                };
            }
        }
        for (task, life) in tasks.iter().zip(&lives) {
            if let (Some(at), Life::Past) = (task.and_then(|t| t.failure.source.as_ref()), life) {
                self.past
                    .lock()
                    .unwrap()
                    .insert((at.topic.clone(), at.partition, at.offset));
            }
        }
        lives
    }
}

/// Whether `record` is `task`'s message: the same key, value and headers where they
/// were stored, else the same size and timestamp.
fn holds(record: &Consumed, task: &Task) -> Life {
    let m = &record.message;
    let failure = &task.failure;
    let same = if failure.payload_stored {
        failure.key.as_deref() == m.key()
            && failure.value.as_deref() == m.payload()
            && failure.headers == record.headers
    } else {
        failure.value_size == i32::try_from(m.payload().map_or(0, <[u8]>::len)).ok()
            && failure.source_timestamp.map(|t| t.timestamp_millis()) == m.timestamp().to_millis()
    };
    match same {
        true => Life::Present,
        false => Life::Past,
    }
}
