//! Which of `kafka.properties` a client takes: librdkafka warns at every start when a
//! producer is given a consumer's property ("will be ignored by this producer
//! instance"), and the other way round, so each client takes only what applies to it.
//! The lists are librdkafka's (2.12, `CONFIGURATION.md`: the properties marked `C`
//! and `P`); a property in neither applies to both.

/// A Kafka client's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRole {
    /// Reads: the ingest consumer, a replay's reader, the fetch of an original record.
    Consumer,
    /// Writes: republish, parking, replays.
    Producer,
}

impl ClientRole {
    /// Whether a client of this role takes `property`.
    pub fn takes(self, property: &str) -> bool {
        let others = match self {
            ClientRole::Consumer => PRODUCER_ONLY,
            ClientRole::Producer => CONSUMER_ONLY,
        };
        !others.contains(&property)
    }
}

/// Properties only a consumer reads.
const CONSUMER_ONLY: &[&str] = &[
    "group.id",
    "group.instance.id",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
    "group.protocol",
    "group.remote.assignor",
    "coordinator.query.interval.ms",
    "max.poll.interval.ms",
    "enable.auto.commit",
    "auto.commit.enable",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "fetch.wait.max.ms",
    "fetch.queue.backoff.ms",
    "fetch.message.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.error.backoff.ms",
    "offset.store.method",
    "offset.store.path",
    "offset.store.sync.interval.ms",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "auto.offset.reset",
    "consume.callback.max.messages",
];

/// Properties only a producer reads.
const PRODUCER_ONLY: &[&str] = &[
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "linger.ms",
    "message.send.max.retries",
    "retries",
    "queue.buffering.backpressure.threshold",
    "compression.codec",
    "compression.type",
    "compression.level",
    "batch.num.messages",
    "batch.size",
    "delivery.report.only.error",
    "sticky.partitioning.linger.ms",
    "request.required.acks",
    "acks",
    "request.timeout.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queuing.strategy",
    "produce.offset.report",
    "partitioner",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_leaves_out_the_other_roles_properties_only() {
        assert!(!ClientRole::Producer.takes("session.timeout.ms"));
        assert!(ClientRole::Consumer.takes("session.timeout.ms"));
        assert!(!ClientRole::Consumer.takes("linger.ms"));
        assert!(ClientRole::Producer.takes("linger.ms"));
        for both in [
            "sasl.password",
            "security.protocol",
            "client.id",
            "message.max.bytes",
        ] {
            assert!(ClientRole::Producer.takes(both) && ClientRole::Consumer.takes(both));
        }
    }
}
