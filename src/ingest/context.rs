//! The ingest consumer's context: rebalance logging, and the latest commits repeated
//! once a rebalance is over.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::kafka::context::QuietContext;
use crate::telemetry::Metrics;

/// Logs rebalances, and commits the latest offsets again after each one. rdkafka's
/// default `rebalance` applies each change (incrementally when the protocol is
/// cooperative).
///
/// With the cooperative protocol a member keeps consuming through a rebalance, but the
/// group refuses its commits until the rebalance is over, and librdkafka reports no
/// result for an asynchronous manual commit. Its partitions are not read again, so an
/// idle partition would keep a stale committed offset. Committing the latest offsets
/// again (all of stored rows, for the partitions still assigned) settles them.
/// librdkafka's own reports are logged once per change, not per repeat.
pub(super) struct IngestContext {
    /// The latest offset handed to a commit, per (topic, partition) held.
    committing: Mutex<BTreeMap<(String, i32), i64>>,
    quiet: QuietContext,
    /// Where statistics go: consumer lag, and the brokers' reachability.
    metrics: Metrics,
}

impl IngestContext {
    /// A context reporting statistics to `metrics`.
    pub(super) fn new(metrics: Metrics) -> IngestContext {
        metrics.health.ingest_started();
        IngestContext {
            committing: Mutex::default(),
            quiet: QuietContext::default(),
            metrics,
        }
    }

    /// Remembers `offsets`, about to be committed, to commit them again after a rebalance.
    pub(super) fn committing(&self, offsets: &TopicPartitionList) {
        let mut committing = self.committing.lock().expect("not poisoned");
        for element in offsets.elements() {
            if let Offset::Offset(next) = element.offset() {
                let latest = committing
                    .entry((element.topic().to_owned(), element.partition()))
                    .or_insert(next);
                *latest = (*latest).max(next);
            }
        }
    }

    /// Forgets the offsets of `revoked` partitions: their new owner commits them.
    fn forget(&self, revoked: &TopicPartitionList) {
        let mut committing = self.committing.lock().expect("not poisoned");
        for element in revoked.elements() {
            committing.remove(&(element.topic().to_owned(), element.partition()));
            // Its lag is the new owner's to report.
            let _ = self
                .metrics
                .consumer_lag
                .remove_label_values(&[element.topic(), &element.partition().to_string()]);
        }
    }

    /// Commits the remembered offsets of the partitions in `held`; forgets the others.
    fn commit_again(&self, consumer: &BaseConsumer<Self>, held: &TopicPartitionList) {
        let mut tpl = TopicPartitionList::new();
        {
            let mut committing = self.committing.lock().expect("not poisoned");
            committing
                .retain(|(topic, partition), _| held.find_partition(topic, *partition).is_some());
            for ((topic, partition), next) in committing.iter() {
                if let Err(error) =
                    tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                {
                    tracing::warn!(%error, "bad offset");
                }
            }
        }
        if tpl.count() == 0 {
            return;
        }
        tracing::debug!(partitions = %describe(&tpl), "committing the latest offsets again after the rebalance");
        if let Err(error) = consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
        }
    }
}

impl ClientContext for IngestContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.quiet.log_line(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.quiet.client_error(&error, reason);
    }

    /// Consumer lag per assigned partition, and whether any broker is up.
    fn stats(&self, statistics: Statistics) {
        for (topic, stats) in &statistics.topics {
            for (partition, stats) in &stats.partitions {
                // Partition -1 is librdkafka's internal one; a lag of -1 is unknown.
                if *partition >= 0 && stats.consumer_lag >= 0 {
                    self.metrics
                        .consumer_lag
                        .with_label_values(&[topic.as_str(), &partition.to_string()])
                        .set(stats.consumer_lag);
                }
            }
        }
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        self.metrics.health.kafka_seen(up);
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let protocol = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => "cooperative",
            RebalanceProtocol::Eager => "eager",
            RebalanceProtocol::None => "none",
        };
        match rebalance {
            Rebalance::Revoke(tpl) => {
                tracing::info!(
                    protocol = %protocol,
                    lost = consumer.assignment_lost(),
                    partitions = %describe(tpl),
                    "partitions revoked"
                );
                self.forget(tpl);
            }
            Rebalance::Assign(tpl) => {
                tracing::info!(protocol = %protocol, partitions = %describe(tpl), "partitions assigned")
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Error(_)) {
            return;
        }
        let held = match consumer.assignment() {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(%error, "cannot read the assignment");
                return;
            }
        };
        tracing::info!(count = held.count(), partitions = %describe(&held), "partitions held");
        if matches!(rebalance, Rebalance::Assign(_)) {
            self.commit_again(consumer, &held);
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(error) = result {
            tracing::debug!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
        }
    }
}

/// `topic[0,1,2] other[5]`: a partition list in a line of log.
fn describe(tpl: &TopicPartitionList) -> String {
    let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for element in tpl.elements() {
        topics
            .entry(element.topic().to_owned())
            .or_default()
            .push(element.partition());
    }
    let parts: Vec<String> = topics
        .into_iter()
        .map(|(topic, mut partitions)| {
            partitions.sort_unstable();
            let list: Vec<String> = partitions.iter().map(i32::to_string).collect();
            format!("{topic}[{}]", list.join(","))
        })
        .collect();
    parts.join(" ")
}
