//! Failure context from the headers of known dead-letter formats: Spring Kafka, Kafka
//! Connect, Karafka, Kafka share groups (KIP-1191) and redrive's own (what parking
//! writes).
//!
//! Whatever original coordinates are readable are kept: a dead letter with the original
//! topic alone (hand-made ones often are) is republished to that topic.

use crate::headers::Header;
use crate::task::OriginalCoordinates;

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
    /// Generation of a parked re-failure (1 for a first failure).
    pub const GENERATION: &str = "redrive-generation";
    /// Task a parked re-failure came from.
    pub const PREVIOUS_TASK_ID: &str = "redrive-previous-task-id";
    /// The error of the task a parked re-failure came from.
    pub const PREVIOUS_ERROR: &str = "redrive-previous-error";
    /// The error a parked re-failure's own dead letter reported.
    pub const REPORTED_ERROR: &str = "redrive-reported-error";
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
    /// The consumer group that gave up on the message (share groups).
    group: Option<&'static str>,
    /// How many times the message was delivered (share groups).
    delivery_count: Option<&'static str>,
    /// Whether numbers may come as 4- or 8-byte big-endian integers (Spring's), not
    /// only as decimal text.
    binary_numbers: bool,
}

/// The headers a Kafka share group's dead-letter queue writes (KIP-1191, Kafka 4.4):
/// the broker's `ShareGroupDLQStateManager` writes every value as UTF-8 text (numbers
/// in decimal), and copies no header of the original record, nor, by default, its key
/// and value.
pub mod share_group {
    /// Topic of the original record (its topic id, as text, when the broker could not
    /// resolve the name).
    pub const TOPIC: &str = "__dlq.errors.topic";
    /// Partition of the original record.
    pub const PARTITION: &str = "__dlq.errors.partition";
    /// Offset of the original record.
    pub const OFFSET: &str = "__dlq.errors.offset";
    /// The share group that gave up on the record.
    pub const GROUP: &str = "__dlq.errors.group";
    /// How many times the record was delivered.
    pub const DELIVERY_COUNT: &str = "__dlq.errors.delivery.count";
    /// Why: "Offset rejected by client." or "Offset delivery count exceeded the threshold.".
    pub const MESSAGE: &str = "__dlq.errors.message";
}

const FORMATS: [Format; 5] = [
    Format {
        name: "redrive",
        topic: own::ORIGINAL_TOPIC,
        partition: own::ORIGINAL_PARTITION,
        offset: own::ORIGINAL_OFFSET,
        class: Some(own::ERROR_CLASS),
        message: Some(own::ERROR_MESSAGE),
        stacktrace: None,
        group: None,
        delivery_count: None,
        binary_numbers: false,
    },
    Format {
        name: "spring",
        binary_numbers: true,
        topic: "kafka_dlt-original-topic",
        partition: "kafka_dlt-original-partition",
        offset: "kafka_dlt-original-offset",
        class: Some("kafka_dlt-exception-fqcn"),
        message: Some("kafka_dlt-exception-message"),
        stacktrace: Some("kafka_dlt-exception-stacktrace"),
        group: None,
        delivery_count: None,
    },
    Format {
        name: "kafka-connect",
        topic: "__connect.errors.topic",
        partition: "__connect.errors.partition",
        offset: "__connect.errors.offset",
        class: Some("__connect.errors.exception.class.name"),
        message: Some("__connect.errors.exception.message"),
        stacktrace: Some("__connect.errors.exception.stacktrace"),
        group: None,
        delivery_count: None,
        binary_numbers: false,
    },
    Format {
        name: "karafka",
        topic: "original_topic",
        partition: "original_partition",
        offset: "original_offset",
        class: None,
        message: None,
        stacktrace: None,
        group: None,
        delivery_count: None,
        binary_numbers: false,
    },
    Format {
        name: "kafka-share-group",
        topic: share_group::TOPIC,
        partition: share_group::PARTITION,
        offset: share_group::OFFSET,
        class: None,
        message: Some(share_group::MESSAGE),
        stacktrace: None,
        group: Some(share_group::GROUP),
        delivery_count: Some(share_group::DELIVERY_COUNT),
        binary_numbers: false,
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
        || name.starts_with("__dlq.errors.")
        || FORMATS[3].topic == name
        || FORMATS[3].partition == name
        || FORMATS[3].offset == name
}

/// What the headers told about the failure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureContext {
    /// The format recognised, if any.
    pub format: Option<&'static str>,
    /// Where the message lived before it was dead-lettered: the topic, and partition
    /// and offset when readable.
    pub original: Option<OriginalCoordinates>,
    /// Error class.
    pub error_class: Option<String>,
    /// Error message.
    pub error_message: Option<String>,
    /// Stack trace, cut to the configured size.
    pub stacktrace: Option<String>,
    /// What could not be read.
    pub notes: Vec<String>,
}

/// Reads the failure context of the first format whose topic header is present. What
/// is missing or unreadable is said in `notes`, in the words the stored error uses.
pub fn read(headers: &[Header], stacktrace_max_bytes: usize) -> FailureContext {
    let find = |name: &str| headers.iter().rev().find(|h| h.name_is(name));
    let Some((format, topic)) = FORMATS.iter().find_map(|f| find(f.topic).map(|h| (f, h))) else {
        return FailureContext::default();
    };
    let text = |name: Option<&str>| -> Option<String> {
        let value = find(name?)?.value.as_deref()?;
        Some(clean_text(value))
    };
    let topic = topic
        .value
        .as_deref()
        .map(clean_text)
        .filter(|t| !t.trim().is_empty());
    let number = |header| Field::read(header, format.binary_numbers);
    let partition = number(find(format.partition)).check(|n| i32::try_from(n).ok());
    let offset = number(find(format.offset)).check(Some);
    let mut ctx = FailureContext {
        format: Some(format.name),
        ..FailureContext::default()
    };
    if topic.is_none() || !partition.is_read() || !offset.is_read() {
        ctx.notes.push(format!(
            "{} headers incomplete: original topic {}, partition {}, offset {}{}",
            format.name,
            if topic.is_some() {
                "read"
            } else {
                "unreadable"
            },
            partition.state(),
            offset.state(),
            if topic.is_some() {
                "; republished to the original topic"
            } else {
                "; no original topic to republish to"
            },
        ));
    }
    ctx.original = topic.map(|topic| OriginalCoordinates {
        topic,
        partition: partition.value(),
        offset: offset.value(),
    });
    ctx.error_class = text(format.class);
    ctx.error_message = text(format.message);
    ctx.stacktrace = text(format.stacktrace).map(|s| truncate(s, stacktrace_max_bytes));
    let group = text(format.group).filter(|g| !g.is_empty());
    let delivery_count = number(format.delivery_count.and_then(find)).check(Some);
    if let Some(said) = gave_up(group.as_deref(), delivery_count.value()) {
        ctx.error_message = Some(match ctx.error_message.take() {
            Some(message) => format!("{message} ({said})"),
            None => said,
        });
    }
    ctx
}

/// `share group G, delivered N times`, from what is known.
fn gave_up(group: Option<&str>, delivery_count: Option<i64>) -> Option<String> {
    match (group, delivery_count) {
        (Some(group), Some(count)) => Some(format!("share group {group}, delivered {count} times")),
        (Some(group), None) => Some(format!("share group {group}")),
        (None, Some(count)) => Some(format!("delivered {count} times")),
        (None, None) => None,
    }
}

/// A numeric header: absent, present but unreadable, or read.
enum Field<T> {
    Missing,
    Unreadable,
    Read(T),
}

impl Field<i64> {
    /// Reads `header` as a non-negative integer: decimal text, or with `binary` a 4- or
    /// 8-byte big-endian number.
    fn read(header: Option<&Header>, binary: bool) -> Field<i64> {
        let Some(header) = header else {
            return Field::Missing;
        };
        match header.value.as_deref().and_then(|v| integer(v, binary)) {
            Some(value) if value >= 0 => Field::Read(value),
            _ => Field::Unreadable,
        }
    }

    /// The value as a `T`, unreadable when out of its range.
    fn check<T>(self, convert: impl Fn(i64) -> Option<T>) -> Field<T> {
        match self {
            Field::Read(value) => convert(value).map_or(Field::Unreadable, Field::Read),
            Field::Missing => Field::Missing,
            Field::Unreadable => Field::Unreadable,
        }
    }
}

impl<T: Copy> Field<T> {
    fn is_read(&self) -> bool {
        matches!(self, Field::Read(_))
    }

    fn value(&self) -> Option<T> {
        match self {
            Field::Read(value) => Some(*value),
            _ => None,
        }
    }

    fn state(&self) -> &'static str {
        match self {
            Field::Missing => "missing",
            Field::Unreadable => "unreadable",
            Field::Read(_) => "read",
        }
    }
}

/// An integer header: decimal text, or (`binary`, Spring's) 4- or 8-byte big-endian.
fn integer(value: &[u8], binary: bool) -> Option<i64> {
    if let Some(n) = std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return Some(n);
    }
    if !binary {
        return None;
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
    use crate::task::SourceCoordinates;

    fn at(topic: &str, partition: i32, offset: i64) -> Option<OriginalCoordinates> {
        Some(
            SourceCoordinates {
                topic: topic.into(),
                partition,
                offset,
            }
            .into(),
        )
    }

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
        assert_eq!(ctx.original, at("orders", 3, 1234));
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
        assert_eq!(ctx.original.unwrap().offset, Some(77));
        assert_eq!(ctx.stacktrace.as_deref(), Some("trace"));

        let karafka = [
            h("original_topic", b"events"),
            h("original_partition", b"5"),
            h("original_offset", b"9"),
        ];
        let ctx = read(&karafka, 1000);
        assert_eq!(ctx.format, Some("karafka"));
        assert_eq!(ctx.original, at("events", 5, 9));
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
        assert_eq!(
            ctx.original,
            Some(OriginalCoordinates {
                topic: "orders".into(),
                partition: None,
                offset: None
            }),
            "the topic is readable, and kept"
        );
        assert_eq!(
            ctx.notes,
            [
                "spring headers incomplete: original topic read, partition unreadable, \
              offset missing; republished to the original topic"
            ]
        );

        assert_eq!(read(&[h("trace-id", b"x")], 10), FailureContext::default());
    }

    /// Regression: a dead letter with the original topic alone (hand-made ones often
    /// are, like the compose quickstart's samples) kept no original at all, so
    /// republish said "no known dead-letter headers" while the note said "topic read".
    #[test]
    fn the_original_topic_alone_is_kept() {
        let ctx = read(
            &[
                h("kafka_dlt-original-topic", b"orders"),
                h("kafka_dlt-exception-message", b"payment declined"),
            ],
            10,
        );
        let original = ctx.original.expect("the topic alone is an original");
        assert_eq!(
            (original.topic.as_str(), original.partition, original.offset),
            ("orders", None, None)
        );
        assert_eq!(ctx.error_message.as_deref(), Some("payment declined"));
        assert!(
            ctx.notes[0].contains("partition missing, offset missing"),
            "{:?}",
            ctx.notes
        );

        let no_topic = read(&[h("original_topic", b" "), h("original_offset", b"3")], 10);
        assert_eq!(no_topic.original, None);
        assert!(
            no_topic.notes[0].contains("topic unreadable")
                && no_topic.notes[0].contains("no original topic to republish to"),
            "{:?}",
            no_topic.notes
        );
    }

    /// The broker's `ShareGroupDLQStateManager` writes every `__dlq.errors.*` value as
    /// UTF-8 text, numbers in decimal.
    #[test]
    fn kafka_share_group_headers_as_the_broker_writes_them() {
        let headers = [
            h(share_group::TOPIC, b"orders"),
            h(share_group::PARTITION, b"2"),
            h(share_group::OFFSET, b"41"),
            h(share_group::GROUP, b"billing-workers"),
            h(share_group::DELIVERY_COUNT, b"5"),
            h(
                share_group::MESSAGE,
                b"Offset delivery count exceeded the threshold.",
            ),
        ];
        let ctx = read(&headers, 100);
        assert_eq!(ctx.format, Some("kafka-share-group"));
        assert_eq!(ctx.original, at("orders", 2, 41));
        assert_eq!(
            ctx.error_message.as_deref(),
            Some(
                "Offset delivery count exceeded the threshold. \
                 (share group billing-workers, delivered 5 times)"
            )
        );
        assert_eq!((ctx.error_class, ctx.stacktrace), (None, None));
        assert!(ctx.notes.is_empty(), "{:?}", ctx.notes);

        let rejected = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"0"),
                h(share_group::OFFSET, b"7"),
                h(share_group::GROUP, b"g"),
                h(share_group::MESSAGE, b"Offset rejected by client."),
            ],
            100,
        );
        assert_eq!(
            rejected.error_message.as_deref(),
            Some("Offset rejected by client. (share group g)")
        );
    }

    #[test]
    fn hostile_share_group_values_are_noted_not_trusted() {
        let cases: [(&[u8], &[u8], &str); 6] = [
            (b"zero", b"1", "partition unreadable, offset read"),
            (b"-1", b"1", "partition unreadable, offset read"),
            (b"1", b"-5", "partition read, offset unreadable"),
            (b"2147483648", b"1", "partition unreadable, offset read"),
            (
                b"1",
                b"99999999999999999999999",
                "partition read, offset unreadable",
            ),
            (
                b"\xff\xfe",
                b"\xc3\x28",
                "partition unreadable, offset unreadable",
            ),
        ];
        for (partition, offset, said) in cases {
            let ctx = read(
                &[
                    h(share_group::TOPIC, b"orders\xff\0"),
                    h(share_group::PARTITION, partition),
                    h(share_group::OFFSET, offset),
                    h(share_group::DELIVERY_COUNT, b"-3"),
                    h(share_group::GROUP, b"\xff"),
                ],
                100,
            );
            let original = ctx.original.expect("the topic is readable");
            assert_eq!(original.topic, "orders\u{fffd}");
            assert!(original.complete().is_none(), "{partition:?} {offset:?}");
            assert!(ctx.notes[0].contains(said), "{said}: {:?}", ctx.notes);
            assert_eq!(
                ctx.error_message.as_deref(),
                Some("share group \u{fffd}"),
                "a negative delivery count is left out"
            );
        }
    }

    #[test]
    fn context_headers_are_recognised_for_stripping() {
        assert!(is_context_header(b"kafka_dlt-exception-message"));
        assert!(is_context_header(b"__connect.errors.offset"));
        assert!(is_context_header(b"redrive-task-id"));
        assert!(is_context_header(b"original_topic"));
        assert!(is_context_header(b"__dlq.errors.delivery.count"));
        assert!(!is_context_header(b"traceparent"));
    }
}
