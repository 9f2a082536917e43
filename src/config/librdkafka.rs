//! librdkafka's properties as configuration sees them: each pass-through property
//! checked with librdkafka itself, values kept out of every message, and the consumer
//! group defaults redrive sets unless `kafka.properties` does.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use rdkafka::ClientConfig;
use std::time::Duration;

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

/// `message` with `value` replaced by [`REDACTED`].
pub(crate) fn redact_value(message: &str, value: &str) -> String {
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
