//! Failure context from the headers of known dead-letter formats: Spring Kafka, Kafka
//! Connect, Karafka and redrive's own (what parking writes).

use crate::headers::Header;
use crate::task::SourceCoordinates;

/// redrive's own context headers (written when parking, read when capturing).
pub mod own {
    /// Topic the message came from originally.
    pub const ORIGINAL_TOPIC: &str = "redrive-original-topic";
    /// Partition, decimal.
    pub const ORIGINAL_PARTITION: &str = "redrive-original-partition";
    /// Offset, decimal.
    pub const ORIGINAL_OFFSET: &str = "redrive-original-offset";
    /// Error class.
    pub const ERROR_CLASS: &str = "redrive-error-class";
    /// Error message.
    pub const ERROR_MESSAGE: &str = "redrive-error-message";
    /// Attempts made.
    pub const ATTEMPTS: &str = "redrive-attempts";
    /// Task id.
    pub const TASK_ID: &str = "redrive-task-id";
    /// Attempt number of a republish.
    pub const ATTEMPT: &str = "redrive-attempt";
    /// `<job>:<task id>` of a replayed message: how a resumed replay finds what it
    /// already produced.
    pub const REPLAY: &str = "redrive-replay";
}

/// Header names of one format.
struct Format {
    name: &'static str,
    topic: &'static str,
    partition: &'static str,
    offset: &'static str,
    class: Option<&'static str>,
    message: Option<&'static str>,
    stacktrace: Option<&'static str>,
}

const FORMATS: [Format; 4] = [
    Format {
        name: "redrive",
        topic: own::ORIGINAL_TOPIC,
        partition: own::ORIGINAL_PARTITION,
        offset: own::ORIGINAL_OFFSET,
        class: Some(own::ERROR_CLASS),
        message: Some(own::ERROR_MESSAGE),
        stacktrace: None,
    },
    Format {
        name: "spring",
        topic: "kafka_dlt-original-topic",
        partition: "kafka_dlt-original-partition",
        offset: "kafka_dlt-original-offset",
        class: Some("kafka_dlt-exception-fqcn"),
        message: Some("kafka_dlt-exception-message"),
        stacktrace: Some("kafka_dlt-exception-stacktrace"),
    },
    Format {
        name: "kafka-connect",
        topic: "__connect.errors.topic",
        partition: "__connect.errors.partition",
        offset: "__connect.errors.offset",
        class: Some("__connect.errors.exception.class.name"),
        message: Some("__connect.errors.exception.message"),
        stacktrace: Some("__connect.errors.exception.stacktrace"),
    },
    Format {
        name: "karafka",
        topic: "original_topic",
        partition: "original_partition",
        offset: "original_offset",
        class: None,
        message: None,
        stacktrace: None,
    },
];

/// Whether a header is failure context from an earlier hop (stripped on republish).
pub fn is_context_header(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok_and(is_context_name)
}

/// [`is_context_header`] for a UTF-8 name.
fn is_context_name(name: &str) -> bool {
    name.starts_with("redrive-")
        || name.starts_with("kafka_dlt-")
        || name.starts_with("__connect.errors.")
        || FORMATS[3].topic == name
        || FORMATS[3].partition == name
        || FORMATS[3].offset == name
}

/// What the headers told about the failure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureContext {
    /// The format recognised, if any.
    pub format: Option<&'static str>,
    /// Where the message lived before it was dead-lettered.
    pub original: Option<SourceCoordinates>,
    /// Error class.
    pub error_class: Option<String>,
    /// Error message.
    pub error_message: Option<String>,
    /// Stack trace, cut to the configured size.
    pub stacktrace: Option<String>,
    /// What could not be read.
    pub notes: Vec<String>,
}

/// Reads the failure context of the first format whose topic header is present.
pub fn read(headers: &[Header], stacktrace_max_bytes: usize) -> FailureContext {
    let find = |name: &str| headers.iter().rev().find(|h| h.name_is(name));
    let Some((format, topic)) = FORMATS.iter().find_map(|f| find(f.topic).map(|h| (f, h))) else {
        return FailureContext::default();
    };
    let mut ctx = FailureContext {
        format: Some(format.name),
        ..FailureContext::default()
    };
    let text = |name: Option<&str>| -> Option<String> {
        let value = find(name?)?.value.as_deref()?;
        Some(clean_text(value))
    };
    let topic = topic
        .value
        .as_deref()
        .map(clean_text)
        .filter(|t| !t.is_empty());
    let partition = find(format.partition).and_then(|h| h.value.as_deref());
    let offset = find(format.offset).and_then(|h| h.value.as_deref());
    let partition = partition.and_then(|v| integer(v).and_then(|n| i32::try_from(n).ok()));
    let offset = offset.and_then(integer);
    match (topic, partition, offset) {
        (Some(topic), Some(partition), Some(offset)) => {
            ctx.original = Some(SourceCoordinates {
                topic,
                partition,
                offset,
            })
        }
        (topic, partition, offset) => ctx.notes.push(format!(
            "{} headers incomplete or malformed: topic {}, partition {}, offset {}",
            format.name,
            if topic.is_some() {
                "read"
            } else {
                "unreadable"
            },
            if partition.is_some() {
                "read"
            } else {
                "unreadable"
            },
            if offset.is_some() {
                "read"
            } else {
                "unreadable"
            },
        )),
    }
    ctx.error_class = text(format.class);
    ctx.error_message = text(format.message);
    ctx.stacktrace = text(format.stacktrace).map(|s| truncate(s, stacktrace_max_bytes));
    ctx
}

/// An integer header: Spring writes 4- or 8-byte big-endian numbers, others decimal text.
fn integer(value: &[u8]) -> Option<i64> {
    if let Some(n) = std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return Some(n);
    }
    match value.len() {
        4 => Some(i64::from(i32::from_be_bytes(value.try_into().ok()?))),
        8 => Some(i64::from_be_bytes(value.try_into().ok()?)),
        _ => None,
    }
}

/// Header bytes as text PostgreSQL accepts: invalid UTF-8 replaced, NUL removed.
pub fn clean_text(value: &[u8]) -> String {
    String::from_utf8_lossy(value).replace('\0', "")
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("\n... (truncated)");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, value: &[u8]) -> Header {
        Header::new(name, value.to_vec())
    }

    #[test]
    fn spring_headers_with_binary_numbers() {
        let headers = [
            h("kafka_dlt-original-topic", b"orders"),
            h("kafka_dlt-original-partition", &3i32.to_be_bytes()),
            h("kafka_dlt-original-offset", &1234i64.to_be_bytes()),
            h(
                "kafka_dlt-exception-fqcn",
                b"java.lang.IllegalStateException",
            ),
            h("kafka_dlt-exception-message", b"bad\0 state"),
            h(
                "kafka_dlt-exception-stacktrace",
                "at a.b.C(\u{e9}.java)\n".repeat(100).as_bytes(),
            ),
        ];
        let ctx = read(&headers, 50);
        assert_eq!(ctx.format, Some("spring"));
        assert_eq!(
            ctx.original,
            Some(SourceCoordinates {
                topic: "orders".into(),
                partition: 3,
                offset: 1234
            })
        );
        assert_eq!(
            ctx.error_class.as_deref(),
            Some("java.lang.IllegalStateException")
        );
        assert_eq!(ctx.error_message.as_deref(), Some("bad state"));
        let trace = ctx.stacktrace.unwrap();
        assert!(trace.len() <= 50 + "\n... (truncated)".len() && trace.ends_with("(truncated)"));
        assert!(ctx.notes.is_empty());
    }

    #[test]
    fn kafka_connect_and_karafka_headers_with_decimal_numbers() {
        let connect = [
            h("__connect.errors.topic", b"payments"),
            h("__connect.errors.partition", b"0"),
            h("__connect.errors.offset", b"77"),
            h(
                "__connect.errors.exception.class.name",
                b"org.apache.kafka.connect.errors.DataException",
            ),
            h(
                "__connect.errors.exception.message",
                b"Converting byte[] to Kafka Connect data failed",
            ),
            h("__connect.errors.exception.stacktrace", b"trace"),
        ];
        let ctx = read(&connect, 1000);
        assert_eq!(ctx.format, Some("kafka-connect"));
        assert_eq!(ctx.original.unwrap().offset, 77);
        assert_eq!(ctx.stacktrace.as_deref(), Some("trace"));

        let karafka = [
            h("original_topic", b"events"),
            h("original_partition", b"5"),
            h("original_offset", b"9"),
        ];
        let ctx = read(&karafka, 1000);
        assert_eq!(ctx.format, Some("karafka"));
        assert_eq!(
            ctx.original,
            Some(SourceCoordinates {
                topic: "events".into(),
                partition: 5,
                offset: 9
            })
        );
        assert_eq!(ctx.error_class, None);
    }

    #[test]
    fn redrive_headers_round_trip_and_malformed_headers_are_noted() {
        let own_headers = [
            h(own::ORIGINAL_TOPIC, b"orders"),
            h(own::ORIGINAL_PARTITION, b"1"),
            h(own::ORIGINAL_OFFSET, b"2"),
            h(own::ERROR_MESSAGE, b"gave up"),
        ];
        assert_eq!(read(&own_headers, 10).format, Some("redrive"));

        let broken = [
            h("kafka_dlt-original-topic", b"orders"),
            h("kafka_dlt-original-partition", b"\x01\x02"),
        ];
        let ctx = read(&broken, 10);
        assert_eq!(ctx.original, None);
        assert!(
            ctx.notes[0].contains("partition unreadable")
                && ctx.notes[0].contains("offset unreadable"),
            "{:?}",
            ctx.notes
        );

        assert_eq!(read(&[h("trace-id", b"x")], 10), FailureContext::default());
    }

    #[test]
    fn context_headers_are_recognised_for_stripping() {
        assert!(is_context_header(b"kafka_dlt-exception-message"));
        assert!(is_context_header(b"__connect.errors.offset"));
        assert!(is_context_header(b"redrive-task-id"));
        assert!(is_context_header(b"original_topic"));
        assert!(!is_context_header(b"traceparent"));
    }
}
