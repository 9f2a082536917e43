//! librdkafka's own log lines and errors, logged once per change instead of a flood.
//!
//! With a broker down, librdkafka reports the same connection failure many times a
//! second. Each kind of report (its facility or error code) is logged when it first
//! appears and then at most once per [`REPEAT_EVERY`], with how many times it was
//! repeated meanwhile.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::ClientContext;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeated report is logged again.
pub const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// Reports seen, by kind: when last logged and how many were held back since.
#[derive(Debug, Default)]
pub struct Quiet {
    seen: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Quiet {
    /// Whether a report of `kind` is logged now, and how many were held back before it.
    pub fn admit(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().expect("quiet lock");
        match seen.get_mut(kind) {
            Some((last, held)) if now.duration_since(*last) < REPEAT_EVERY => {
                *held += 1;
                None
            }
            Some((last, held)) => {
                let repeated = std::mem::take(held);
                *last = now;
                Some(repeated)
            }
            None => {
                seen.insert(kind.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

/// The client context of redrive's producers: librdkafka's reports, deduplicated.
#[derive(Debug, Default)]
pub struct QuietContext {
    quiet: Quiet,
}

impl QuietContext {
    /// Logs a librdkafka log line, once per facility per [`REPEAT_EVERY`].
    pub fn log_line(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let Some(repeated) = self.quiet.admit(&format!("log:{fac}"), Instant::now()) else {
            return;
        };
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, repeated, "{message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, repeated, "{message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, repeated, "{message}")
            }
        }
    }

    /// Logs a librdkafka client error, once per error code per [`REPEAT_EVERY`].
    pub fn client_error(&self, error: &KafkaError, reason: &str) {
        let kind = error
            .rdkafka_error_code()
            .map_or_else(|| "other".to_owned(), |code| format!("{code:?}"));
        if let Some(repeated) = self.quiet.admit(&format!("error:{kind}"), Instant::now()) {
            tracing::warn!(target: "librdkafka", %error, repeated, "{reason}");
        }
    }
}

impl ClientContext for QuietContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.log_line(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.client_error(&error, reason);
    }
}

/// Plain consumers (replay's reader) need no rebalance callbacks.
impl rdkafka::consumer::ConsumerContext for QuietContext {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: with the broker down, librdkafka's repeated errors flooded the log
    /// (about 45 lines a second).
    #[test]
    fn a_repeated_report_is_logged_once_a_minute_with_its_count() {
        let quiet = Quiet::default();
        let start = Instant::now();
        assert_eq!(quiet.admit("error:BrokerTransportFailure", start), Some(0));
        for i in 1..=45 {
            let now = start + Duration::from_millis(i * 20);
            assert_eq!(quiet.admit("error:BrokerTransportFailure", now), None);
        }
        assert_eq!(
            quiet.admit("error:AllBrokersDown", start),
            Some(0),
            "another kind is a change: logged at once"
        );
        let later = start + REPEAT_EVERY;
        assert_eq!(quiet.admit("error:BrokerTransportFailure", later), Some(45));
        assert_eq!(quiet.admit("error:BrokerTransportFailure", later), None);
    }
}
