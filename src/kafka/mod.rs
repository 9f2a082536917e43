//! Kafka plumbing shared by ingest, republish and parking.

pub mod context;
pub mod dlt;
pub mod message;

use rdkafka::ClientConfig;

use crate::config::KafkaSettings;

/// A client configuration with the bootstrap servers and every pass-through property.
pub fn client_config(kafka: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.bootstrap_servers);
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
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
