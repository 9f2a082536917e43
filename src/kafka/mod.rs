//! Kafka plumbing shared by ingest, republish and parking.

pub mod context;
pub mod dlt;
pub mod message;
pub mod produce;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use rdkafka::ClientConfig;

use crate::config::KafkaSettings;

/// What stands in for a property value in any message.
pub const REDACTED: &str = "<redacted>";

/// Values shorter than this are redacted only where they stand alone (not inside a
/// longer word), so that a property set to `1` or `all` does not garble every message.
const SHORT_VALUE: usize = 6;

/// A client configuration with the bootstrap servers and every pass-through property.
pub fn client_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.bootstrap_servers);
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
}

/// Room for a record batch's framing and headers above the message itself.
const RECORD_OVERHEAD_BYTES: u32 = 64 * 1024;

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
}
