//! Kafka plumbing shared by ingest, republish and parking.

pub mod context;
pub mod dlt;
pub mod message;
pub mod produce;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use rdkafka::ClientConfig;
use std::time::Duration;

use crate::config::KafkaSettings;

/// What stands in for a property value in any message.
pub const REDACTED: &str = "<redacted>";

/// Values shorter than this are redacted only where they stand alone (not inside a
/// longer word), so that a property set to `1` or `all` does not garble every message.
const SHORT_VALUE: usize = 6;

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

/// How often librdkafka reports consumer statistics, unless `kafka.properties` says.
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Room for a record batch's framing and headers above the message itself.
const RECORD_OVERHEAD_BYTES: u32 = 64 * 1024;

/// The ingest consumer's configuration: [`client_config`], the group defaults above
/// where `kafka.properties` does not set them, then what ingest's guarantees rest on
/// (the group, explicit commits of stored offsets only), which no property overrides.
pub fn consumer_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = client_config(kafka);
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
    let mut config = client_config(kafka);
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

/// librdkafka checks the SASL mechanism only when a client is created, and producers
/// are created on first use: check it here, against the mechanisms this build has.
fn check_sasl_mechanism(value: &str) -> Result<(), String> {
    let features = ClientConfig::new()
        .create_native_config()
        .and_then(|config| config.get("builtin.features"))
        .unwrap_or_default();
    let supported: Vec<&str> = [
        ("GSSAPI", "sasl_gssapi"),
        ("PLAIN", "sasl_plain"),
        ("SCRAM-SHA-256", "sasl_scram"),
        ("SCRAM-SHA-512", "sasl_scram"),
        ("OAUTHBEARER", "sasl_oauthbearer"),
    ]
    .into_iter()
    .filter(|(_, feature)| features.split(',').any(|f| f == *feature))
    .map(|(mechanism, _)| mechanism)
    .collect();
    if supported.contains(&value.trim()) {
        Ok(())
    } else {
        Err(format!(
            "not a SASL mechanism this build supports (supported: {})",
            supported.join(", ")
        ))
    }
}

/// Checks one librdkafka property by setting it on a native configuration (no client
/// is started). The reason never holds the value.
pub fn check_property(key: &str, value: &str) -> Result<(), String> {
    if key == "sasl.mechanisms" || key == "sasl.mechanism" {
        check_sasl_mechanism(value)?;
    }
    let mut config = ClientConfig::new();
    config.set(key, value);
    match config.create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..)) => Err(
            "not a librdkafka property (see librdkafka's CONFIGURATION.md for the names)".into(),
        ),
        Err(KafkaError::ClientConfig(_, description, ..)) => Err(redact_value(&description, value)),
        Err(KafkaError::Nul(_)) => Err("the name or the value holds a NUL byte".into()),
        Err(other) => Err(redact_value(&other.to_string(), value)),
    }
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

/// `message` with `value` replaced by [`REDACTED`].
fn redact_value(message: &str, value: &str) -> String {
    if value.is_empty() {
        return message.to_owned();
    }
    if value.len() >= SHORT_VALUE {
        return message.replace(value, REDACTED);
    }
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let mut out = String::with_capacity(message.len());
    let mut rest = 0;
    for (at, _) in message.match_indices(value) {
        let end = at + value.len();
        if word(message[..at].chars().next_back()) || word(message[end..].chars().next()) {
            continue;
        }
        out.push_str(&message[rest..at]);
        out.push_str(REDACTED);
        rest = end;
    }
    out.push_str(&message[rest..]);
    out
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

    #[test]
    fn client_errors_lose_their_values() {
        let kafka = kafka(&[("sasl.pasword", "hunter2")]);
        let err = client_config(&kafka)
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

    #[test]
    fn property_checks_name_the_problem_without_the_value() {
        assert!(check_property("sasl.password", "hunter2").is_ok());
        let unknown = check_property("sasl.pasword", "hunter2").unwrap_err();
        assert!(unknown.contains("not a librdkafka property"), "{unknown}");
        let invalid = check_property("session.timeout.ms", "hunter2").unwrap_err();
        assert!(
            !invalid.contains("hunter2") && invalid.contains("session.timeout.ms"),
            "{invalid}"
        );
        assert!(check_property("sasl.password", "a\0b").is_err());
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
