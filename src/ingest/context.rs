//! The ingest consumer's context: rebalance logging, revoked partitions given up only
//! after their flushes, the latest commits repeated once a rebalance is over, and
//! statistics exported for the partitions held only.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::in_flight::{FlushesInFlight, REVOKED_FLUSH_WAIT};
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
    /// The partitions assigned and not revoked since: librdkafka's statistics go on
    /// reporting a partition after it is revoked, and only these are exported.
    held: Mutex<BTreeSet<(String, i32)>>,
    /// The flushes running per partition: a revoked partition waits for its own.
    pub(super) in_flight: Arc<FlushesInFlight>,
}

impl IngestContext {
    /// A context reporting statistics to `metrics`.
    pub(super) fn new(metrics: Metrics) -> IngestContext {
        metrics.health.ingest_started();
        IngestContext {
            committing: Mutex::default(),
            quiet: QuietContext::default(),
            metrics,
            held: Mutex::default(),
            in_flight: Arc::default(),
        }
    }

    /// Commits the latest offsets of the partitions still held again. librdkafka reports
    /// no result for the consume loop's asynchronous commits, and a refused one is not
    /// retried; an idle partition has no later batch whose commit would cover it, so
    /// the loop calls this now and then (as Kafka's auto-commit repeats its commits).
    /// Never an older offset than one sent before: the latest is the highest.
    pub(super) fn commit_latest_again(&self, consumer: &impl Consumer<Self>) {
        match consumer.assignment() {
            Ok(held) => self.commit_again(consumer, &held),
            Err(error) => tracing::debug!(%error, "cannot read the assignment to commit again"),
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

    /// Forgets the offsets of `revoked` partitions (their new owner commits them), and
    /// stops exporting their lag and offset (the new owner's to report).
    fn forget(&self, revoked: &TopicPartitionList) {
        let mut committing = self.committing.lock().expect("not poisoned");
        let mut held = self.held.lock().expect("not poisoned");
        for element in revoked.elements() {
            let partition = (element.topic().to_owned(), element.partition());
            committing.remove(&partition);
            held.remove(&partition);
            self.unexport(&partition);
        }
    }

    /// Exports the statistics of the `assigned` partitions too, from now on.
    fn hold(&self, assigned: &TopicPartitionList) {
        let mut held = self.held.lock().expect("not poisoned");
        for element in assigned.elements() {
            held.insert((element.topic().to_owned(), element.partition()));
        }
    }

    /// Removes the lag and committed-offset series of `partition`.
    fn unexport(&self, (topic, partition): &(String, i32)) {
        let labels = [topic.as_str(), &partition.to_string()];
        let _ = self.metrics.consumer_lag.remove_label_values(&labels);
        let _ = (self.metrics.consumer_committed_offset).remove_label_values(&labels);
    }

    /// Commits the remembered offsets of the partitions in `held`; forgets the others.
    fn commit_again(&self, consumer: &impl Consumer<Self>, held: &TopicPartitionList) {
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
        tracing::debug!(partitions = %describe(&tpl), "committing the latest offsets again");
        if let Err(error) = consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
        }
    }
}

impl IngestContext {
    /// Waits (bounded) for the flushes holding `revoked` partitions, then commits what
    /// they stored before the partitions go to their next owner.
    fn commit_flushed(&self, consumer: &BaseConsumer<Self>, revoked: &TopicPartitionList) {
        let partitions: Vec<(String, i32)> = revoked
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let wait = if self.in_flight.holds_any(&partitions) {
            tracing::info!(partitions = %describe(revoked), "waiting for the revoked partitions' batches to be stored");
            REVOKED_FLUSH_WAIT
        } else {
            std::time::Duration::ZERO
        };
        let committable = give_up_blocking(&self.in_flight, &partitions, wait);
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in committable {
            if let Err(error) = tpl.add_partition_offset(&topic, partition, Offset::Offset(next)) {
                tracing::warn!(%error, "bad offset");
            }
        }
        if tpl.count() == 0 {
            return;
        }
        if let Err(error) = consumer.commit(&tpl, CommitMode::Sync) {
            tracing::warn!(%error, "committing the revoked partitions' offsets failed; their new owner gets the messages again and deduplicates them");
        }
    }
}

/// [`FlushesInFlight::give_up`] from the consume loop's thread, which the flushes do not
/// need: on a multi-threaded runtime its other tasks move to another thread while it
/// blocks. A current-thread runtime cannot run the flushes meanwhile, so there it does
/// not wait (as in tests that run a member inside one).
fn give_up_blocking(
    in_flight: &FlushesInFlight,
    partitions: &[(String, i32)],
    wait: std::time::Duration,
) -> BTreeMap<(String, i32), i64> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => {
            tokio::task::block_in_place(|| in_flight.give_up(partitions, wait))
        }
        Ok(_) => in_flight.give_up(partitions, std::time::Duration::ZERO),
        Err(_) => in_flight.give_up(partitions, wait),
    }
}

impl ClientContext for IngestContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.quiet.log_line(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.quiet.client_error(&error, reason);
    }

    /// Consumer lag per partition held, and whether any broker is up.
    fn stats(&self, statistics: Statistics) {
        // Held across the export, so that a revoke in between cannot leave a series.
        let held = self.held.lock().expect("not poisoned");
        for (topic, stats) in &statistics.topics {
            for (partition, stats) in &stats.partitions {
                // Partition -1 is librdkafka's internal one; revoked ones are reported too.
                if !held.contains(&(topic.clone(), *partition)) {
                    continue;
                }
                let labels = [topic.as_str(), &partition.to_string()];
                if let Some(lag) = lag(stats) {
                    self.metrics
                        .consumer_lag
                        .with_label_values(&labels)
                        .set(lag);
                }
                if stats.committed_offset >= 0 {
                    (self.metrics.consumer_committed_offset)
                        .with_label_values(&labels)
                        .set(stats.committed_offset);
                }
            }
        }
        drop(held);
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        self.metrics.health.kafka_seen(up);
    }
}

/// A partition's consumer lag in messages, if its end is known: librdkafka's figure
/// (the end minus the committed offset) once the group has committed one; before that
/// (a new group, or a partition nothing was committed on), every message the partition
/// still holds (its end minus its start), which is what the consumer reads from
/// `auto.offset.reset = earliest`. Unknown (`None`) until the partition's end is read.
fn lag(stats: &rdkafka::statistics::Partition) -> Option<i64> {
    if stats.consumer_lag >= 0 {
        return Some(stats.consumer_lag);
    }
    if stats.committed_offset >= 0 || stats.hi_offset < 0 {
        return None;
    }
    Some(stats.hi_offset - stats.lo_offset.max(0))
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
                if !consumer.assignment_lost() {
                    self.commit_flushed(consumer, tpl);
                }
                self.forget(tpl);
            }
            Rebalance::Assign(tpl) => {
                tracing::info!(protocol = %protocol, partitions = %describe(tpl), "partitions assigned");
                self.hold(tpl);
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

#[cfg(test)]
mod tests {
    use super::lag;
    use rdkafka::statistics::Partition;

    fn partition(lo: i64, hi: i64, committed: i64, consumer_lag: i64) -> Partition {
        Partition {
            lo_offset: lo,
            hi_offset: hi,
            committed_offset: committed,
            consumer_lag,
            ..Partition::default()
        }
    }

    #[test]
    fn lag_is_a_real_number_before_anything_was_committed() {
        // librdkafka's own figure once an offset is committed.
        assert_eq!(lag(&partition(0, 50, 20, 30)), Some(30));
        // Nothing committed: every message the partition holds.
        assert_eq!(lag(&partition(10, 50, -1001, -1)), Some(40));
        assert_eq!(lag(&partition(-1001, 50, -1001, -1)), Some(50));
        // The end not read yet: unknown, not 0.
        assert_eq!(lag(&partition(-1001, -1001, -1001, -1)), None);
    }
}
