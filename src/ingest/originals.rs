//! Dead letters that leave the original record out: a Kafka share group's DLQ record
//! carries only headers by default (the coordinates, the group, the delivery count).
//! Such a dead letter is stored with the original record fetched from its topic, as
//! if it had come whole; one whose original cannot be fetched, or is itself a record
//! with no key and no value, is stored PERMANENT_FAILURE with the reason
//! ([`original_unavailable`]).
//!
//! Whoever can write to a captured dead-letter topic chooses the coordinates, so the
//! fetch is held to a list: a route's `fetch_originals_from`, else any topic but
//! Kafka's internal ones and the fleet's own dead-letter topics ([`refusal`]). A
//! refused original is an unavailable one.
//!
//! The fetches of a batch share one deadline (`ingest.original_fetch_timeout`), so a
//! batch, and the partitions behind it, wait at most that long. A redelivered dead
//! letter is not fetched again: its task is what was recorded the first time, even if
//! the original has gone since.

use std::sync::Arc;

use super::mapping::{original_to_fetch, original_unavailable, with_original};
use super::process::Mapped;
use crate::config::{
    capture_consumer, is_internal_topic, IngestSettings, KafkaSettings, RouteSettings,
};
use crate::kafka::fetch::fetch_each_off_runtime;
use crate::store::Store;
use crate::task::{OriginalCoordinates, SourceCoordinates};

/// What fetching originals needs: the cluster's client settings, the limits and every
/// route (which topics may be fetched from).
#[derive(Clone)]
pub(crate) struct Originals {
    pub(crate) kafka: KafkaSettings,
    pub(crate) limits: IngestSettings,
    pub(crate) routes: Arc<[RouteSettings]>,
}

impl Originals {
    /// Fills in the tasks of `batch` whose dead letter left the original record out.
    pub(crate) async fn fill(&self, store: &Store, batch: &mut [Mapped]) {
        let mut wanted: Vec<(usize, SourceCoordinates)> = (batch.iter().enumerate())
            .filter_map(|(i, m)| Some((i, original_to_fetch(&m.message, &m.route, &m.task)?)))
            .collect();
        wanted.retain(|(index, at)| {
            let mapped = &mut batch[*index];
            let Some(why) = refusal(&self.routes, &mapped.route, &at.topic) else {
                return true;
            };
            let task = std::mem::take(&mut mapped.task);
            let at = OriginalCoordinates::from(at.clone());
            let error = format!("the original record at {at} is not fetched: {why}");
            mapped.task = original_unavailable(task, error);
            false
        });
        if wanted.is_empty() {
            return;
        }
        self.take_recorded(store, batch, &mut wanted).await;
        if wanted.is_empty() {
            return;
        }
        let places: Vec<SourceCoordinates> = wanted.iter().map(|(_, at)| at.clone()).collect();
        let fetched = fetch_each_off_runtime(
            self.kafka.clone(),
            self.limits.max_message_bytes,
            self.limits.original_fetch_timeout,
            places,
        )
        .await;
        for ((index, at), outcome) in wanted.into_iter().zip(fetched) {
            let mapped = &mut batch[index];
            let task = std::mem::take(&mut mapped.task);
            mapped.task = match outcome {
                Ok(original) => with_original(task, &original, &at, &mapped.route, &self.limits),
                Err(why) => {
                    tracing::warn!(original = ?at, %why, "a dead letter's original record could not be fetched; stored as a permanent failure");
                    let at = OriginalCoordinates::from(at.clone());
                    let error = format!("the original record at {at} could not be fetched: {why}");
                    original_unavailable(task, error)
                }
            };
        }
    }

    /// Takes out of `wanted` the dead letters recorded already (a redelivery): their
    /// task gets what was stored, so the insert finds it the same and stores nothing.
    async fn take_recorded(
        &self,
        store: &Store,
        batch: &mut [Mapped],
        wanted: &mut Vec<(usize, SourceCoordinates)>,
    ) {
        let keys: Vec<String> = (wanted.iter())
            .filter_map(|(i, _)| batch[*i].task.effective_dedup_key())
            .collect();
        let stored = match store.by_dedup_keys(&keys).await {
            Ok(stored) => stored,
            // The insert waits for the database anyway; fetching meanwhile is harmless.
            Err(error) => {
                tracing::debug!(%error, "cannot look for recorded dead letters; fetching their originals");
                return;
            }
        };
        wanted.retain(|(index, _)| {
            let task = &mut batch[*index].task;
            let Some(recorded) = task.effective_dedup_key().and_then(|k| stored.get(&k)) else {
                return true;
            };
            let same_dead_letter = recorded.failure.source_timestamp
                == task.failure.source_timestamp
                && recorded.failure.original == task.failure.original;
            if same_dead_letter {
                task.failure = recorded.failure.clone();
            }
            !same_dead_letter
        });
    }
}

/// Why `route` does not fetch an original from `topic`, if it does not: a topic not in
/// its `fetch_originals_from`, or, without that key, one of Kafka's internal topics or a
/// topic a capture route of `routes` consumes (a dead-letter topic).
fn refusal(routes: &[RouteSettings], route: &RouteSettings, topic: &str) -> Option<String> {
    let key = match routes.iter().position(|r| r.name == route.name) {
        Some(i) => format!("routes[{i}].fetch_originals_from"),
        None => format!("route {:?}'s fetch_originals_from", route.name),
    };
    if let Some(allowed) = &route.fetch_originals_from {
        return (!allowed.iter().any(|t| t == topic))
            .then(|| format!("topic {topic:?} is not in {key}"));
    }
    let why = if is_internal_topic(topic) {
        format!("{topic:?} is Kafka's internal topic")
    } else {
        let consumer = capture_consumer(routes, topic)?;
        format!("{topic:?} is consumed by {consumer}, a dead-letter topic")
    };
    Some(format!("{why} (list the topics to fetch from in {key})"))
}
