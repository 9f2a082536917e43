//! The Kafka client layer shared by ingest, republish, parking and replays: clients, the
//! byte-safe read of consumed messages, produce, the dead-letter header dialects, and
//! reading topics back for a replay ([`reader`]).

pub mod context;
pub mod dlt;
pub mod fetch;
pub mod message;
pub mod produce;
pub mod reader;
pub mod roles;

use rdkafka::error::KafkaError;
use rdkafka::ClientConfig;

use crate::config::librdkafka::{redact_value, REDACTED};
use crate::config::{KafkaSettings, ASSIGNMENT_STRATEGY, HEARTBEAT_INTERVAL, SESSION_TIMEOUT};
pub use roles::ClientRole;

/// A client configuration with the bootstrap servers and every pass-through property
/// that a client of `role` takes ([`ClientRole::takes`]).
pub fn client_config(kafka: &KafkaSettings, role: ClientRole) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.bootstrap_servers);
    for (key, value) in &kafka.properties {
        if role.takes(key) {
            config.set(key, value);
        }
    }
    config
}

/// How often librdkafka reports consumer statistics, unless `kafka.properties` says.
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Room for a record batch's framing and headers above the message itself.
const RECORD_OVERHEAD_BYTES: u32 = 64 * 1024;

/// The ingest consumer's configuration: [`client_config`], the group defaults above
/// where `kafka.properties` does not set them, then what ingest's guarantees rest on
/// (the group, explicit commits of stored offsets only), which no property overrides.
pub fn consumer_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = client_config(kafka, ClientRole::Consumer);
    let property = |key: &str| kafka.properties.get(key).map(String::as_str);
    // Statistics feed the consumer-lag gauges and the brokers' reachability (/readyz).
    let mut defaults = vec![
        ("auto.offset.reset", "earliest".to_owned()),
        ("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_owned()),
    ];
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
/// `message.max.bytes` admits every message redrive captures (up to
/// `max_message_bytes`), unless `kafka.properties` sets it.
pub fn producer_config(kafka: &KafkaSettings, max_message_bytes: u32) -> ClientConfig {
    let mut config = client_config(kafka, ClientRole::Producer);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000");
    if !kafka.properties.contains_key("message.max.bytes") {
        let limit = max_message_bytes
            .saturating_add(RECORD_OVERHEAD_BYTES)
            .max(1_000_000);
        config.set("message.max.bytes", limit.to_string());
    }
    config
}

/// A client-creation error with every configured property value taken out: wrap every
/// `create()` of a client with it before the error is shown or logged.
pub fn redact_error(error: KafkaError, kafka: &KafkaSettings) -> KafkaError {
    match error {
        KafkaError::ClientConfig(res, description, key, _) => {
            KafkaError::ClientConfig(res, redact(&description, kafka), key, REDACTED.into())
        }
        KafkaError::ClientCreation(message) => KafkaError::ClientCreation(redact(&message, kafka)),
        KafkaError::Nul(_) => {
            KafkaError::ClientCreation("a property name or value holds a NUL byte".into())
        }
        other => other,
    }
}

/// `message` with every value of `kafka.properties` replaced by [`REDACTED`].
pub fn redact(message: &str, kafka: &KafkaSettings) -> String {
    let mut values: Vec<&str> = kafka.properties.values().map(String::as_str).collect();
    // Longest first, so that a value inside another is not half-replaced.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values
        .into_iter()
        .fold(message.to_owned(), |text, value| redact_value(&text, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(properties: &[(&str, &str)]) -> KafkaSettings {
        KafkaSettings {
            properties: properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..KafkaSettings::default()
        }
    }

    #[test]
    fn every_property_value_is_taken_out_of_a_message() {
        let kafka = kafka(&[
            ("sasl.password", "hunter2-long"),
            ("acks", "all"),
            ("x", ""),
        ]);
        assert_eq!(
            redact("auth with hunter2-long failed: \"all\" for call", &kafka),
            "auth with <redacted> failed: \"<redacted>\" for call"
        );
    }

    /// A member with the republish handler warned at every start that
    /// `session.timeout.ms` "will be ignored by this producer instance".
    #[test]
    fn a_producer_is_not_given_the_consumers_properties_nor_the_other_way_round() {
        let kafka = kafka(&[
            ("session.timeout.ms", "6000"),
            ("linger.ms", "5"),
            ("client.id", "x"),
        ]);
        let producer = producer_config(&kafka, 1000);
        assert_eq!(producer.get("session.timeout.ms"), None);
        assert_eq!(producer.get("linger.ms"), Some("5"));
        assert_eq!(producer.get("client.id"), Some("x"));
        let consumer = consumer_config(&kafka);
        assert_eq!(consumer.get("session.timeout.ms"), Some("6000"));
        assert_eq!(consumer.get("linger.ms"), None);
        assert_eq!(consumer.get("client.id"), Some("x"));
    }

    #[test]
    fn client_errors_lose_their_values() {
        let kafka = kafka(&[("sasl.pasword", "hunter2")]);
        let err = client_config(&kafka, ClientRole::Producer)
            .create::<rdkafka::producer::BaseProducer>()
            .err()
            .expect("misspelt property");
        let text = format!("{0} {0:?}", redact_error(err, &kafka));
        assert!(
            !text.contains("hunter2") && text.contains("sasl.pasword"),
            "{text}"
        );
        let err = KafkaError::ClientCreation("bad value hunter2, again hunter2".into());
        let text = redact_error(err, &kafka).to_string();
        assert_eq!(
            text,
            "Client creation error: bad value <redacted>, again <redacted>"
        );
    }

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
