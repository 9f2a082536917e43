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
    /// Generation of a parked re-failure or of a replayed task (1 for a first failure).
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
    /// The redrive job (a replay) that produced a record.
    pub const JOB: &str = "redrive-job";
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
    /// The consumer group that gave up on the message (share groups, Karafka).
    group: Option<&'static str>,
    /// How many times the message was delivered or attempted (share groups, Karafka).
    delivery_count: Option<&'static str>,
    /// The original record's key, where the dead letter's own key is something else
    /// (Karafka before 2.5 keyed its dead letters by the original partition).
    key: Option<&'static str>,
    /// How the group and the count are said: `share group G, delivered N times`.
    gave_up: GaveUpWords,
    /// Whether numbers may come as 4- or 8-byte big-endian integers (Spring's), not
    /// only as decimal text.
    binary_numbers: bool,
}

/// The headers a Kafka share group's dead-letter queue writes (KIP-1191, Kafka 4.4):
/// the broker (`ShareGroupDLQStateManager`, later `ShareGroupDLQRecordHelper`) writes
/// every value as UTF-8 text (numbers in decimal); it copies the original's key and
/// value only with the group's `errors.deadletterqueue.copy.record.enable`. Releases
/// differ on the original's headers: the first copied none, a later one copies them
/// ahead of its own. A produce it retries after a timeout writes the record twice: the
/// group and the original coordinates identify it ([`FailureContext::dedup_key`]).
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
    /// Why: [`REJECTED`] or [`DELIVERY_COUNT_EXCEEDED`].
    pub const MESSAGE: &str = "__dlq.errors.message";
    /// The message of a record the consumer rejected (`AcknowledgeType.REJECT`).
    pub const REJECTED: &str = "Offset rejected by client.";
    /// The message of a record delivered more often than the group allows.
    pub const DELIVERY_COUNT_EXCEEDED: &str = "Offset delivery count exceeded the threshold.";
}

/// Karafka's dead-letter headers (Karafka Pro's DLQ and piping; values are text). 2.5
/// renamed the `original_*` headers `source_*` and dropped `original_key` (the dead
/// letter keeps the original key); both generations are read, `source_*` first.
pub mod karafka {
    /// Every header either generation writes: context, stripped on republish.
    pub const HEADERS: [&str; 12] = [
        "source_topic",
        "source_partition",
        "source_offset",
        "source_consumer_group",
        "source_attempts",
        "source_trace_id",
        "original_topic",
        "original_partition",
        "original_offset",
        "original_consumer_group",
        "original_attempts",
        "original_key",
    ];
}

/// How a Kafka share group gave a record up, from its `__dlq.errors.message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The consumer rejected it.
    Rejected,
    /// It was delivered more often than the group allows.
    DeliveryCountExceeded,
    /// The message is missing or says something else.
    Unknown,
}

impl Disposition {
    /// Its stored name (the `disposition` filter of every face).
    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::Rejected => "rejected",
            Disposition::DeliveryCountExceeded => "delivery_count_exceeded",
            Disposition::Unknown => "unknown",
        }
    }

    /// From the message exactly as the broker writes it.
    fn from_message(message: Option<&str>) -> Disposition {
        match message {
            Some(share_group::REJECTED) => Disposition::Rejected,
            Some(share_group::DELIVERY_COUNT_EXCEEDED) => Disposition::DeliveryCountExceeded,
            _ => Disposition::Unknown,
        }
    }
}

/// How a format says who gave a message up and how often it was tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GaveUpWords {
    /// `share group G, delivered N times`.
    ShareGroup,
    /// `consumer group G, N attempts`.
    ConsumerGroup,
}

/// The format names [`FailureContext::format`] takes.
const SHARE_GROUP: &str = "kafka-share-group";

const FORMATS: [Format; 6] = [
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
        key: None,
        gave_up: GaveUpWords::ShareGroup,
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
        key: None,
        gave_up: GaveUpWords::ShareGroup,
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
        key: None,
        gave_up: GaveUpWords::ShareGroup,
        binary_numbers: false,
    },
    Format {
        name: "karafka",
        topic: "source_topic",
        partition: "source_partition",
        offset: "source_offset",
        class: None,
        message: None,
        stacktrace: None,
        group: Some("source_consumer_group"),
        delivery_count: Some("source_attempts"),
        key: None,
        gave_up: GaveUpWords::ConsumerGroup,
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
        group: Some("original_consumer_group"),
        delivery_count: Some("original_attempts"),
        key: Some("original_key"),
        gave_up: GaveUpWords::ConsumerGroup,
        binary_numbers: false,
    },
    Format {
        name: SHARE_GROUP,
        topic: share_group::TOPIC,
        partition: share_group::PARTITION,
        offset: share_group::OFFSET,
        class: None,
        message: Some(share_group::MESSAGE),
        stacktrace: None,
        group: Some(share_group::GROUP),
        delivery_count: Some(share_group::DELIVERY_COUNT),
        key: None,
        gave_up: GaveUpWords::ShareGroup,
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
        || karafka::HEADERS.contains(&name)
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
    /// The group that gave the message up (a share group's, Karafka's consumer group).
    pub group: Option<String>,
    /// The original record's key, when a header carries it (Karafka 2.4.4 to 2.4.x,
    /// whose dead letters' own key is the original partition): `Some(None)` when the
    /// header said the record had no key (or an empty one).
    pub key: Option<Option<Vec<u8>>>,
    /// How a share group gave the record up; `None` for the other formats.
    pub disposition: Option<Disposition>,
    /// What could not be read, and copies of a header that disagreed.
    pub notes: Vec<String>,
}

impl FailureContext {
    /// The dedup key of a share group's dead letter: its group and original
    /// coordinates, not the dead letter's own (the broker may write one record twice,
    /// at two offsets); `None` for other formats, or when one of them is not readable.
    pub fn dedup_key(&self) -> Option<String> {
        if self.format != Some(SHARE_GROUP) {
            return None;
        }
        let group = self.group.as_deref()?;
        let original = self.original.as_ref()?.complete()?;
        // A group is as long as its writer made it: a long one is named by its digest,
        // so that the key stays within what PostgreSQL indexes (a 2,700-byte group made
        // the key unstorable and stopped the member's ingest).
        let group = match group.len() > MAX_KEYED_GROUP_BYTES {
            true => format!("sha256-{}", digest(group)),
            false => group.to_owned(),
        };
        Some(format!(
            "kafka-share-dlq:{group}:{}:{}:{}",
            original.topic, original.partition, original.offset
        ))
    }
}

/// Longest group named as it is in a share group's dedup key (Kafka's own names are
/// short; a longer one is named by its digest).
const MAX_KEYED_GROUP_BYTES: usize = 255;

/// The first 16 bytes of `text`'s SHA-256, in hex.
fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    crate::readable::hex(&Sha256::digest(text.as_bytes())[..16])
}

/// Reads the failure context of the first format whose topic header is present. What
/// is missing or unreadable is said in `notes`, in the words the stored error uses.
///
/// A header may come more than once. Of the original coordinates (and a share group's
/// group and delivery count) the first copy is taken (see `first_copy`): a record that
/// went through several dead-letter topics carries its first origin first. Of the error
/// class, message and stack trace the last copy is: the latest failure (Spring's
/// recoverer appends the current exception's headers after earlier ones when told to
/// keep those).
pub fn read(headers: &[Header], stacktrace_max_bytes: usize) -> FailureContext {
    // Known by its original topic header; without one, by its error's (the failure
    // still says what broke, though there is no record to fetch).
    let has = |name: &str| headers.iter().any(|h| h.name_is(name));
    let Some(format) = (FORMATS.iter().find(|f| has(f.topic)))
        .or_else(|| (FORMATS.iter()).find(|f| [f.class, f.message].into_iter().flatten().any(has)))
    else {
        return FailureContext::default();
    };
    let mut notes = Vec::new();
    let mut first = |name: &str| {
        let (header, disagreement) = first_copy(headers, name)?;
        notes.extend(disagreement);
        Some(header)
    };
    let topic = first(format.topic).and_then(|h| topic_name(h.value.as_deref()?));
    let number = |header: Option<&Header>| Field::read(header, format.binary_numbers);
    let partition = number(first(format.partition)).check(|n| i32::try_from(n).ok());
    let offset = number(first(format.offset)).check(Some);
    let mut malformed = Vec::new();
    let mut unreadable = |header: &Header| {
        malformed.push(format!(
            "{} header {} unreadable ({}): left out",
            format.name,
            String::from_utf8_lossy(&header.name),
            quoted(header.value.as_deref())
        ));
    };
    let group_header = format.group.and_then(&mut first);
    let group = group_header.and_then(|h| {
        let text = h.value.as_deref().and_then(|v| std::str::from_utf8(v).ok());
        if text.is_none() {
            unreadable(h);
        }
        Some(clean_text(text?.as_bytes())).filter(|g| !g.is_empty())
    });
    let count_header = format.delivery_count.and_then(&mut first);
    let delivery_count = number(count_header).check(Some);
    if let (Field::Unreadable, Some(header)) = (&delivery_count, count_header) {
        unreadable(header);
    }
    let key = format
        .key
        .and_then(&mut first)
        .map(|h| match h.value.as_deref() {
            Some(key) if !key.is_empty() => Some(key.to_vec()),
            _ => None,
        });
    let mut ctx = FailureContext {
        format: Some(format.name),
        group,
        key,
        notes,
        ..FailureContext::default()
    };
    if topic.is_none() || !partition.is_read() || !offset.is_read() {
        ctx.notes.push(format!(
            "{} headers incomplete: original topic {}, partition {}, offset {}",
            format.name,
            if topic.is_some() {
                "read"
            } else {
                "unreadable"
            },
            partition.state(),
            offset.state(),
        ));
    }
    ctx.notes.extend(malformed);
    ctx.original = topic.map(|topic| OriginalCoordinates {
        topic,
        partition: partition.value(),
        offset: offset.value(),
    });
    let last = |name: Option<&str>| -> Option<String> {
        let name = name?;
        let value = headers
            .iter()
            .rev()
            .find(|h| h.name_is(name))?
            .value
            .as_deref()?;
        Some(clean_text(value))
    };
    ctx.error_class = last(format.class).map(|s| truncate(s, ERROR_TEXT_MAX_BYTES));
    ctx.error_message = last(format.message);
    ctx.stacktrace = last(format.stacktrace).map(|s| truncate(s, stacktrace_max_bytes));
    if format.name == SHARE_GROUP {
        ctx.disposition = Some(Disposition::from_message(ctx.error_message.as_deref()));
    }
    if let Some(said) = gave_up(format.gave_up, ctx.group.as_deref(), delivery_count.value()) {
        ctx.error_message = Some(match ctx.error_message.take() {
            Some(message) => format!("{message} ({said})"),
            None => said,
        });
    }
    ctx.error_message = (ctx.error_message.take()).map(|s| truncate(s, ERROR_TEXT_MAX_BYTES));
    ctx
}

/// Longest error class or message kept from a dead letter's headers (the stack trace
/// has `ingest.stacktrace_max_bytes`). A header may be as large as the message allows,
/// and these texts are stored even when the message is not (minimal form), printed by
/// `tasks list` and copied into every parked record's headers.
const ERROR_TEXT_MAX_BYTES: usize = 8 * 1024;

/// A topic header's value when it is a name Kafka accepts as it came (UTF-8, at most
/// 249 characters of ASCII letters, digits, `.`, `_`, `-`): nothing else can be fetched
/// from or republished to.
fn topic_name(value: &[u8]) -> Option<String> {
    let topic = std::str::from_utf8(value).ok()?;
    crate::config::topic_problem(topic)
        .is_none()
        .then(|| topic.to_owned())
}

/// The first header named `name`, and a note when a later copy carries another value.
///
/// The first copy is the one that counts, in every format and for `redrive-task-id`: a
/// record that passed through several dead-letter topics carries its first origin
/// first (Spring's `DeadLetterPublishingRecoverer` appends a later hop's "original"
/// headers after the earlier ones, or with `appendOriginalHeaders = false` keeps only
/// the first), and redrive writes each of its headers once, after removing those of
/// earlier hops. Two copies that disagree are not resolved silently: the note quotes
/// both.
pub(crate) fn first_copy<'a>(
    headers: &'a [Header],
    name: &str,
) -> Option<(&'a Header, Option<String>)> {
    let mut copies = headers.iter().filter(|h| h.name_is(name));
    let first = copies.next()?;
    let disagreement = copies.find(|h| h.value != first.value).map(|other| {
        format!(
            "two {name} headers disagree ({}, then {}): the first is taken",
            quoted(first.value.as_deref()),
            quoted(other.value.as_deref())
        )
    });
    Some((first, disagreement))
}

/// Longest part of a header value quoted in a note.
const QUOTED_BYTES: usize = 64;

/// A header value quoted for a note: its first [`QUOTED_BYTES`] bytes, anything but
/// printable ASCII escaped (`\xff`), `...` when cut; `no value` for a null value.
pub(crate) fn quoted(value: Option<&[u8]>) -> String {
    let Some(value) = value else {
        return "no value".to_owned();
    };
    let shown = &value[..value.len().min(QUOTED_BYTES)];
    let cut = if shown.len() < value.len() { "..." } else { "" };
    format!("\"{}{cut}\"", shown.escape_ascii())
}

/// `share group G, delivered N times` (or `consumer group G, N attempts`), from what
/// is known.
fn gave_up(words: GaveUpWords, group: Option<&str>, count: Option<i64>) -> Option<String> {
    let (who, count) = match words {
        GaveUpWords::ShareGroup => (
            group.map(|g| format!("share group {g}")),
            count.map(|n| format!("delivered {n} times")),
        ),
        GaveUpWords::ConsumerGroup => (
            group.map(|g| format!("consumer group {g}")),
            count.map(|n| format!("{n} attempts")),
        ),
    };
    match (who, count) {
        (Some(who), Some(count)) => Some(format!("{who}, {count}")),
        (one, other) => one.or(other),
    }
}

/// A numeric header: absent, present but unreadable, or read.
enum Field<T> {
    Missing,
    Unreadable,
    Read(T),
}

impl Field<i64> {
    /// Reads `header` with [`number`].
    fn read(header: Option<&Header>, binary: bool) -> Field<i64> {
        let Some(header) = header else {
            return Field::Missing;
        };
        match header.value.as_deref().and_then(|v| number(v, binary)) {
            Some(value) => Field::Read(value),
            None => Field::Unreadable,
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

/// The number in a header value, read strictly: the one parser of every numeric
/// header redrive reads (partitions, offsets, delivery counts, `redrive-task-id`, the
/// task in `redrive-replay`). Every number there is a partition, an offset, a count or
/// a task id, never negative, so only non-negative numbers are read:
///
/// - decimal text exactly as Java's `Long.toString` and Rust's `to_string` write a
///   non-negative number: ASCII digits, no sign, no blank, no leading zero (`0` aside),
///   within `i64`. Every writer of these headers writes that (Spring's text form,
///   Kafka Connect, Karafka, the broker's share-group DLQ, redrive). `+1`, ` 1`, `01`,
///   `-0` or `1e3` came from something else: it is unreadable, not guessed at;
/// - with `binary` (Spring's headers only): also the big-endian `int` (4 bytes) or
///   `long` (8 bytes) Spring writes, if not negative. Text is tried first: 4 or 8
///   bytes that are all digits would be a partition over 808 million or an offset over
///   3.4 × 10^18 as binary, which no topic has.
pub fn number(value: &[u8], binary: bool) -> Option<i64> {
    if let Some(n) = decimal(value) {
        return Some(n);
    }
    if !binary {
        return None;
    }
    let n = match value.len() {
        4 => i64::from(i32::from_be_bytes(value.try_into().ok()?)),
        8 => i64::from_be_bytes(value.try_into().ok()?),
        _ => return None,
    };
    (n >= 0).then_some(n)
}

/// Canonical non-negative decimal text (see [`number`]).
fn decimal(value: &[u8]) -> Option<i64> {
    // 19 digits hold every i64: a longer value is not even looked at.
    if value.len() > 19 {
        return None;
    }
    let canonical = match value {
        [b'0'] => true,
        [first, rest @ ..] => (b'1'..=b'9').contains(first) && rest.iter().all(u8::is_ascii_digit),
        [] => false,
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
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
                 offset missing"
            ]
        );

        assert_eq!(read(&[h("trace-id", b"x")], 10), FailureContext::default());
    }

    /// Regression: a dead letter with the original topic alone (hand-made ones often
    /// are, like the compose quickstart's samples) kept no original at all, so
    /// republish said "no known dead-letter headers" while the note said "topic read".
    /// Found by an attack: a dead letter without its original topic header lost the
    /// error its other headers gave (the task showed no class and no message).
    #[test]
    fn a_dead_letter_without_its_original_topic_still_says_what_broke() {
        let cases = [
            (
                "spring",
                "kafka_dlt-exception-fqcn",
                "kafka_dlt-exception-message",
            ),
            (
                "kafka-connect",
                "__connect.errors.exception.class.name",
                "__connect.errors.exception.message",
            ),
            ("redrive", own::ERROR_CLASS, own::ERROR_MESSAGE),
        ];
        for (format, class, message) in cases {
            let ctx = read(&[h(class, b"x.Boom"), h(message, b"order 7 failed")], 10);
            assert_eq!(ctx.format, Some(format));
            assert_eq!(ctx.error_class.as_deref(), Some("x.Boom"), "{format}");
            assert_eq!(
                ctx.error_message.as_deref(),
                Some("order 7 failed"),
                "{format}"
            );
            assert_eq!(ctx.original, None, "{format}");
            assert!(
                ctx.notes
                    .iter()
                    .any(|n| n.contains("original topic unreadable")),
                "{format}: {:?}",
                ctx.notes
            );
            let alone = read(&[h(message, b"order 7 failed")], 10);
            assert_eq!(
                alone.error_message.as_deref(),
                Some("order 7 failed"),
                "{format}"
            );
        }
        let share = read(
            &[h(share_group::MESSAGE, share_group::REJECTED.as_bytes())],
            10,
        );
        assert_eq!(share.format, Some(SHARE_GROUP));
        assert_eq!(share.disposition, Some(Disposition::Rejected));
        // A topic header decides the dialect over another dialect's error headers.
        let both = read(
            &[
                h("__connect.errors.exception.message", b"from connect"),
                h("kafka_dlt-original-topic", b"orders"),
            ],
            10,
        );
        assert_eq!(both.format, Some("spring"));
        assert!(read(&[h("exception", b"boom")], 10).format.is_none());
    }

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
            no_topic.notes[0].contains("topic unreadable"),
            "{:?}",
            no_topic.notes
        );
    }

    /// What broke, per dialect: the cause a dead letter is stored with, before any
    /// attempt, is its own exception class (or how a share group gave it up) and its
    /// message's fingerprint, the same for failures that differ only in ids.
    #[test]
    fn each_dialects_dead_letters_give_one_cause_per_failure_whatever_their_ids() {
        use crate::task::Cause;
        let cause = |headers: &[Header]| {
            let ctx = read(headers, 100);
            let disposition = ctx.disposition.map(Disposition::as_str);
            Cause::reported(
                ctx.error_class.as_deref(),
                disposition,
                ctx.error_message.as_deref(),
            )
        };
        let spring = |order: &str| {
            cause(&[
                h("kafka_dlt-original-topic", b"orders"),
                h(
                    "kafka_dlt-exception-fqcn",
                    b"java.lang.IllegalStateException",
                ),
                h(
                    "kafka_dlt-exception-message",
                    format!("order {order} not found").as_bytes(),
                ),
            ])
        };
        assert_eq!(spring("4711").class, "java.lang.IllegalStateException");
        assert_eq!(spring("4711").fingerprint, "order <n> not found");
        assert_eq!(
            (spring("4711").class, spring("4711").fingerprint),
            (spring("8").class, spring("8").fingerprint)
        );

        let connect = |host: &str| {
            cause(&[
                h("__connect.errors.topic", b"payments"),
                h(
                    "__connect.errors.exception.class.name",
                    b"org.apache.kafka.connect.errors.ConnectException",
                ),
                h(
                    "__connect.errors.exception.message",
                    format!("JDBC sink: connection to {host}:5432 refused").as_bytes(),
                ),
            ])
        };
        let a = connect("warehouse-db");
        assert_eq!(a.class, "org.apache.kafka.connect.errors.ConnectException");
        assert_eq!(
            a.fingerprint,
            "JDBC sink: connection to warehouse-db:<n> refused"
        );
        assert_ne!(a.fingerprint, connect("billing-db").fingerprint);

        let karafka = |attempts: &[u8]| {
            cause(&[
                h("source_topic", b"events"),
                h("source_partition", b"1"),
                h("source_offset", b"9"),
                h("source_consumer_group", b"shipping"),
                h("source_attempts", attempts),
            ])
        };
        assert_eq!(karafka(b"3").class, crate::task::cause::UNCLASSIFIED);
        assert_eq!(karafka(b"3").fingerprint, karafka(b"12").fingerprint);

        let share = |message: &[u8], count: &[u8]| {
            cause(&[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"2"),
                h(share_group::OFFSET, b"41"),
                h(share_group::GROUP, b"billing-workers"),
                h(share_group::DELIVERY_COUNT, count),
                h(share_group::MESSAGE, message),
            ])
        };
        let exceeded = share(b"Offset delivery count exceeded the threshold.", b"5");
        assert_eq!(exceeded.class, "share-group.delivery_count_exceeded");
        assert_eq!(
            exceeded.fingerprint,
            share(b"Offset delivery count exceeded the threshold.", b"9").fingerprint
        );
        assert_eq!(
            share(b"Offset rejected by client.", b"1").class,
            "share-group.rejected"
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

    /// Karafka 2.5 renamed its headers `source_*`: today's Karafka dead letters were not
    /// recognised at all. Both generations are read; `source_*` wins where both are.
    #[test]
    fn karafka_dead_letters_of_both_generations() {
        let today = read(
            &[
                h("source_topic", b"events"),
                h("source_partition", b"5"),
                h("source_offset", b"9"),
                h("source_consumer_group", b"karafka_app"),
                h("source_attempts", b"4"),
                h("source_trace_id", b"0f8e3b6c-5d0a-4c71-9a4e-1c2b3d4e5f60"),
            ],
            1000,
        );
        assert_eq!(today.format, Some("karafka"));
        assert_eq!(today.original, at("events", 5, 9));
        assert_eq!(today.group.as_deref(), Some("karafka_app"));
        assert_eq!(
            today.error_message.as_deref(),
            Some("consumer group karafka_app, 4 attempts")
        );
        assert_eq!(
            (&today.key, today.disposition, today.dedup_key()),
            (&None, None, None)
        );
        assert!(today.notes.is_empty(), "{:?}", today.notes);

        // 2.4.4 to 2.4.x: the dead letter is keyed by the original partition, and
        // `original_key` carries the original key ("" for none).
        let before = read(
            &[
                h("original_topic", b"events"),
                h("original_partition", b"5"),
                h("original_offset", b"10"),
                h("original_consumer_group", b"karafka_app"),
                h("original_attempts", b"2"),
                h("original_key", b"customer-7"),
            ],
            1000,
        );
        assert_eq!(before.format, Some("karafka"));
        assert_eq!(before.original, at("events", 5, 10));
        assert_eq!(before.key, Some(Some(b"customer-7".to_vec())));
        let no_key = read(
            &[h("original_topic", b"events"), h("original_key", b"")],
            1000,
        );
        assert_eq!(no_key.key, Some(None));

        let both = read(
            &[
                h("original_topic", b"old"),
                h("source_topic", b"new"),
                h("source_partition", b"1"),
                h("source_offset", b"2"),
            ],
            1000,
        );
        assert_eq!(both.original, at("new", 1, 2));
        for name in karafka::HEADERS {
            assert!(is_context_name(name), "{name} is stripped on republish");
        }
    }

    /// A share group's dead letter says how it was given up (its disposition, a filter),
    /// and is identified by its group and original coordinates: the broker may write it
    /// twice, at two offsets of the dead-letter topic.
    #[test]
    fn a_share_group_dead_letter_has_a_disposition_and_a_dedup_key_of_its_origin() {
        let letter = |message: Option<&[u8]>| {
            let mut headers = vec![
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"2"),
                h(share_group::OFFSET, b"41"),
                h(share_group::GROUP, b"billing:workers"),
            ];
            headers.extend(message.map(|m| h(share_group::MESSAGE, m)));
            read(&headers, 100)
        };
        let cases: [(Option<&[u8]>, Disposition); 5] = [
            (Some(b"Offset rejected by client."), Disposition::Rejected),
            (
                Some(b"Offset delivery count exceeded the threshold."),
                Disposition::DeliveryCountExceeded,
            ),
            (Some(b"offset rejected by client"), Disposition::Unknown),
            (Some(b"Acquisition lock timed out."), Disposition::Unknown),
            (None, Disposition::Unknown),
        ];
        for (message, disposition) in cases {
            let ctx = letter(message);
            assert_eq!(ctx.disposition, Some(disposition), "{message:?}");
            assert_eq!(
                ctx.dedup_key().as_deref(),
                Some("kafka-share-dlq:billing:workers:orders:2:41")
            );
        }
        let no_group = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"2"),
                h(share_group::OFFSET, b"41"),
            ],
            100,
        );
        assert_eq!(no_group.dedup_key(), None, "only a whole identity dedups");
        // Found by an attack: a 2,700-byte group made a key PostgreSQL cannot index,
        // and the member's ingest stopped at that dead letter.
        let long = "g".repeat(300);
        let long_group = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"2"),
                h(share_group::OFFSET, b"41"),
                h(share_group::GROUP, long.as_bytes()),
            ],
            100,
        );
        let key = long_group.dedup_key().unwrap();
        assert!(key.len() < 100, "{key}");
        assert!(key.starts_with("kafka-share-dlq:sha256-") && key.ends_with(":orders:2:41"));
        assert_eq!(long_group.group.as_deref(), Some(long.as_str()));
        assert_eq!(
            Disposition::DeliveryCountExceeded.as_str(),
            "delivery_count_exceeded"
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
                    h(share_group::TOPIC, b"orders"),
                    h(share_group::PARTITION, partition),
                    h(share_group::OFFSET, offset),
                    h(share_group::DELIVERY_COUNT, b"-3"),
                    h(share_group::GROUP, b"\xff"),
                ],
                100,
            );
            let original = ctx.original.expect("the topic is readable");
            assert_eq!(original.topic, "orders");
            assert!(original.complete().is_none(), "{partition:?} {offset:?}");
            assert!(ctx.notes[0].contains(said), "{said}: {:?}", ctx.notes);
            assert_eq!(
                ctx.error_message, None,
                "a negative delivery count and a group that is not UTF-8 are left out"
            );
        }
    }

    /// Regression: a share group's delivery count that is not a number was dropped, and
    /// a group that is not UTF-8 was shown as `share group \u{fffd}`, both without a note.
    #[test]
    fn malformed_share_group_group_and_delivery_count_are_noted() {
        for (count, group) in [
            (&b"-5"[..], &b"\xff\xfe"[..]),
            (b"99999999999999999999999", b"g\xc3\x28"),
        ] {
            let ctx = read(
                &[
                    h(share_group::TOPIC, b"orders"),
                    h(share_group::PARTITION, b"0"),
                    h(share_group::OFFSET, b"1"),
                    h(share_group::DELIVERY_COUNT, count),
                    h(share_group::GROUP, group),
                    h(share_group::MESSAGE, b"Offset rejected by client."),
                ],
                100,
            );
            assert_eq!(ctx.original, at("orders", 0, 1));
            assert_eq!(
                ctx.error_message.as_deref(),
                Some("Offset rejected by client."),
                "neither the count nor the group is shown"
            );
            assert_eq!(
                ctx.notes,
                [
                    format!(
                        "kafka-share-group header __dlq.errors.group unreadable ({}): left out",
                        quoted(Some(group))
                    ),
                    format!(
                        "kafka-share-group header __dlq.errors.delivery.count unreadable ({}): \
                         left out",
                        quoted(Some(count))
                    ),
                ]
            );
        }
        let null_group = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"0"),
                h(share_group::OFFSET, b"1"),
                Header {
                    name: share_group::GROUP.into(),
                    value: None,
                },
            ],
            100,
        );
        assert_eq!(
            null_group.notes,
            ["kafka-share-group header __dlq.errors.group unreadable (no value): left out"]
        );
    }

    /// Regression: share-group numbers went through `trim().parse()`, so `" 1"` and
    /// `"+1"` were offsets while `redrive-task-id` refused them. One strict parser now
    /// reads every numeric header.
    #[test]
    fn numbers_are_read_strictly_in_every_format() {
        let hostile: [&[u8]; 14] = [
            b"",
            b" 1",
            b"1 ",
            b"+1",
            b"+",
            b"-",
            b"-0",
            b"-1",
            b"1e3",
            b"0x10",
            b"01",
            b"99999999999999999999",
            b"\xff\xfe",
            b"\xd9\xa1",
        ];
        for value in hostile {
            let ctx = read(
                &[
                    h(share_group::TOPIC, b"orders"),
                    h(share_group::PARTITION, value),
                    h(share_group::OFFSET, value),
                ],
                100,
            );
            assert!(
                ctx.notes[0].contains("partition unreadable, offset unreadable"),
                "{value:?}: {:?}",
                ctx.notes
            );
        }
        // Spring's binary forms are 4 or 8 bytes, never negative.
        for value in [
            &[0u8; 9][..],
            &[0, 0, 1],
            &(-1i32).to_be_bytes(),
            &(-5i64).to_be_bytes(),
        ] {
            let ctx = read(
                &[
                    h("kafka_dlt-original-topic", b"orders"),
                    h("kafka_dlt-original-partition", value),
                    h("kafka_dlt-original-offset", value),
                ],
                100,
            );
            assert_eq!(ctx.original.unwrap().complete(), None, "{value:?}");
        }
        let read_back = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"0"),
                h(share_group::OFFSET, b"9223372036854775807"),
            ],
            100,
        );
        assert_eq!(read_back.original, at("orders", 0, i64::MAX));

        // The parser itself, as every numeric header uses it.
        for value in hostile {
            assert_eq!(number(value, false), None, "{value:?}");
        }
        assert_eq!(number(b"0", false), Some(0));
        assert_eq!(number(b"42", false), Some(42));
        assert_eq!(number(b"9223372036854775808", false), None, "i64::MAX + 1");
        assert_eq!(number(&"9".repeat(100_000).into_bytes(), false), None);
        assert_eq!(
            number(&7i32.to_be_bytes(), false),
            None,
            "binary only for Spring"
        );
        assert_eq!(number(&7i32.to_be_bytes(), true), Some(7));
        assert_eq!(number(&7i64.to_be_bytes(), true), Some(7));
        assert_eq!(number(&[0; 9], true), None, "9 bytes");
        assert_eq!(number(&[0; 3], true), None);
        assert_eq!(number(&i32::MIN.to_be_bytes(), true), None);
        assert_eq!(number(b"1234", true), Some(1234), "text first");
    }

    /// Regression: of two copies of a header the last was taken, silently. A record
    /// that went through several dead-letter topics carries its first origin first
    /// (Spring's recoverer appends the later hops' "original" headers, or keeps only the
    /// first with `appendOriginalHeaders = false`): the first copy of a coordinate is
    /// taken, the latest error is, and a disagreement is noted.
    #[test]
    fn the_first_copy_of_a_coordinate_is_taken_and_a_disagreement_noted() {
        let ctx = read(
            &[
                h("kafka_dlt-original-topic", b"orders"),
                h("kafka_dlt-original-partition", &1i32.to_be_bytes()),
                h("kafka_dlt-original-offset", &5i64.to_be_bytes()),
                h("kafka_dlt-exception-message", b"first failure"),
                h("kafka_dlt-original-topic", b"orders.retry-0"),
                h("kafka_dlt-original-partition", &1i32.to_be_bytes()),
                h("kafka_dlt-original-offset", &7i64.to_be_bytes()),
                h("kafka_dlt-exception-message", b"second failure"),
            ],
            100,
        );
        assert_eq!(ctx.original, at("orders", 1, 5));
        assert_eq!(ctx.error_message.as_deref(), Some("second failure"));
        assert_eq!(
            ctx.notes,
            [
                "two kafka_dlt-original-topic headers disagree (\"orders\", then \"orders.retry-0\"): \
                 the first is taken",
                "two kafka_dlt-original-offset headers disagree (\"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x05\", \
                 then \"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x07\"): the first is taken",
            ]
        );
        let same = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"0"),
                h(share_group::OFFSET, b"3"),
                h(share_group::OFFSET, b"3"),
            ],
            100,
        );
        assert!(
            same.notes.is_empty(),
            "identical copies agree: {:?}",
            same.notes
        );
        let offsets = read(
            &[
                h(share_group::TOPIC, b"orders"),
                h(share_group::PARTITION, b"0"),
                h(share_group::OFFSET, b"3"),
                h(share_group::OFFSET, b"4"),
            ],
            100,
        );
        assert_eq!(offsets.original, at("orders", 0, 3));
        assert_eq!(offsets.notes.len(), 1, "{:?}", offsets.notes);
    }

    /// Regression: a topic header was kept whatever its bytes (invalid UTF-8 replaced,
    /// blanks, any length), then fetched from and republished to. Only a name Kafka
    /// accepts is a topic.
    #[test]
    fn only_a_topic_name_kafka_accepts_is_an_original_topic() {
        let long = "t".repeat(250);
        for topic in [
            &b"orders\xff"[..],
            b"orders\0",
            b" orders",
            b"or ders",
            b"..",
            long.as_bytes(),
        ] {
            let ctx = read(
                &[
                    h(share_group::TOPIC, topic),
                    h(share_group::PARTITION, b"0"),
                    h(share_group::OFFSET, b"1"),
                ],
                100,
            );
            assert_eq!(ctx.original, None, "{topic:?}");
            assert!(
                ctx.notes[0].contains("original topic unreadable"),
                "{:?}",
                ctx.notes
            );
        }
        let longest = "t".repeat(249);
        let ctx = read(&[h(share_group::TOPIC, longest.as_bytes())], 100);
        assert_eq!(ctx.original.unwrap().topic, longest);
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
