//! Kafka plumbing shared by ingest, republish and parking.

pub mod dlt;
pub mod message;

use rdkafka::ClientConfig;
use std::time::Duration;

use crate::config::KafkaSettings;

/// Consumer group session timeout unless `kafka.properties` sets `session.timeout.ms`.
/// librdkafka's 45 s leaves a killed member's partitions unconsumed for that long; a
/// recovery fleet wants them moved within seconds. Short enough for that, long enough
/// that a garbage-collected broker or a busy host does not cause needless rebalances.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Consumer heartbeat interval unless `kafka.properties` sets `heartbeat.interval.ms`:
/// three heartbeats fit in a session (capped at a third of a configured session timeout).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);

/// Partition assignment unless `kafka.properties` sets `partition.assignment.strategy`:
/// cooperative incremental rebalancing, so a join or a death moves only the partitions
/// that must move, and every other member keeps consuming through the rebalance.
pub const ASSIGNMENT_STRATEGY: &str = "cooperative-sticky";

/// A client configuration with the bootstrap servers and every pass-through property.
pub fn client_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.bootstrap_servers);
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
}

/// The ingest consumer's configuration: [`client_config`], the group defaults above
/// where `kafka.properties` does not set them, then what ingest's guarantees rest on
/// (the group, explicit commits of stored offsets only), which no property overrides.
pub fn consumer_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = client_config(kafka);
    let property = |key: &str| kafka.properties.get(key).map(String::as_str);
    let mut defaults = vec![("auto.offset.reset", "earliest".to_owned())];
    // The KIP-848 protocol (`group.protocol=consumer`) is incremental by design and
    // refuses these three: the broker decides them.
    if property("group.protocol") != Some("consumer") {
        let session_ms = property("session.timeout.ms")
            .and_then(|ms| ms.parse::<u128>().ok())
            .unwrap_or(SESSION_TIMEOUT.as_millis());
        let heartbeat_ms = HEARTBEAT_INTERVAL.as_millis().min(session_ms / 3).max(1);
        defaults.extend([
            (
                "session.timeout.ms",
                SESSION_TIMEOUT.as_millis().to_string(),
            ),
            ("heartbeat.interval.ms", heartbeat_ms.to_string()),
            (
                "partition.assignment.strategy",
                ASSIGNMENT_STRATEGY.to_owned(),
            ),
        ]);
    }
    for (key, value) in defaults {
        if property(key).is_none() {
            config.set(key, value);
        }
    }
    config
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    config
}

/// An idempotent producer configuration: the broker's acknowledgement means written once.
pub fn producer_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = client_config(kafka);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000");
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(properties: &[(&str, &str)]) -> ClientConfig {
        let mut kafka = KafkaSettings::default();
        for (key, value) in properties {
            kafka.properties.insert(key.to_string(), value.to_string());
        }
        consumer_config(&kafka)
    }

    #[test]
    fn the_consumer_defaults_suit_a_recovery_fleet() {
        let config = consumer(&[]);
        assert_eq!(config.get("session.timeout.ms"), Some("10000"));
        assert_eq!(config.get("heartbeat.interval.ms"), Some("3000"));
        assert_eq!(
            config.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(config.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(config.get("group.id"), Some("redrive"));
    }

    #[test]
    fn kafka_properties_override_the_consumer_defaults() {
        let config = consumer(&[
            ("session.timeout.ms", "45000"),
            ("heartbeat.interval.ms", "15000"),
            ("partition.assignment.strategy", "range,roundrobin"),
            ("auto.offset.reset", "latest"),
        ]);
        assert_eq!(config.get("session.timeout.ms"), Some("45000"));
        assert_eq!(config.get("heartbeat.interval.ms"), Some("15000"));
        assert_eq!(
            config.get("partition.assignment.strategy"),
            Some("range,roundrobin")
        );
        assert_eq!(config.get("auto.offset.reset"), Some("latest"));
    }

    #[test]
    fn a_short_session_timeout_gets_a_heartbeat_that_fits_three_times() {
        let config = consumer(&[("session.timeout.ms", "6000")]);
        assert_eq!(config.get("heartbeat.interval.ms"), Some("2000"));
    }

    #[test]
    fn the_guarantees_of_ingest_are_not_overridden() {
        let config = consumer(&[
            ("enable.auto.commit", "true"),
            ("enable.auto.offset.store", "true"),
            ("group.id", "elsewhere"),
        ]);
        assert_eq!(config.get("enable.auto.commit"), Some("false"));
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(config.get("group.id"), Some("redrive"));
    }

    #[test]
    fn the_consumer_group_protocol_gets_no_classic_group_settings() {
        let config = consumer(&[("group.protocol", "consumer")]);
        for key in [
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "partition.assignment.strategy",
        ] {
            assert_eq!(config.get(key), None, "{key}");
        }
    }
}
