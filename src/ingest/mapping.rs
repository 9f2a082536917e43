//! A consumed Kafka message as a task: the route decides the handler, the mode the
//! failure context (dead-letter headers in capture mode, the message itself in process
//! mode), the limits whether its bytes are stored.

use chrono::{DateTime, Utc};
use rdkafka::message::{Message, Timestamp};

use crate::config::{IngestSettings, Ordering, RouteMode, RouteSettings};
use crate::kafka::dlt;
use crate::kafka::message::Consumed;
use crate::task::{order_key, Failure, NewTask, SourceCoordinates};

/// The task recording `message` for `route`, before any inline attempt. A message over
/// `ingest.max_message_bytes` is kept in minimal form: coordinates, size and the reason,
/// with `payload_stored` false.
pub(crate) fn to_task(
    consumed: &Consumed,
    route: &RouteSettings,
    limits: &IngestSettings,
) -> NewTask {
    let message = &consumed.message;
    let source = coordinates_of(message);
    let headers = consumed.headers.clone();
    let (timestamp, timestamp_type) = timestamp_of(message.timestamp());
    let key = message.key().map(<[u8]>::to_vec);
    let value = message.payload().map(<[u8]>::to_vec);
    let value_size = value.as_ref().map_or(0, Vec::len);
    let mut task = NewTask {
        handler: route.handler.clone(),
        max_attempts: route.max_attempts.and_then(|m| i32::try_from(m).ok()),
        failure: Failure {
            route: Some(route.name.clone()),
            event_type: route.event_type.clone(),
            source_timestamp: timestamp,
            source_timestamp_type: timestamp_type,
            value_size: i32::try_from(value_size).ok(),
            ..Failure::default()
        },
        order_key: match (route.ordering, message.key()) {
            (Ordering::Key, Some(key)) => Some(order_key(&route.name, key)),
            _ => None,
        },
        ..NewTask::default()
    };
    let mut notes: Vec<String> = Vec::new();
    match route.mode {
        RouteMode::Capture => {
            let ctx = dlt::read(&headers, limits.stacktrace_max_bytes as usize);
            task.failure.original = ctx.original;
            task.failure.error_class = ctx.error_class;
            task.failure.error_message = ctx.error_message;
            task.failure.error_stacktrace = ctx.stacktrace;
            notes.extend(ctx.notes);
        }
        RouteMode::Process => {
            task.failure.original = Some(source.clone());
            task.failure.error_class = Some("redrive.ProcessModeFailure".into());
        }
    }
    let size = consumed.size();
    if size > limits.max_message_bytes as usize {
        notes.push(format!(
            "message of {size} bytes exceeds ingest.max_message_bytes ({}); key, value and headers not stored",
            limits.max_message_bytes
        ));
        task.failure.payload_stored = false;
    } else {
        task.failure.key = key;
        task.failure.value = value;
        task.failure.headers = headers;
    }
    task.failure.source = Some(source);
    if !notes.is_empty() {
        task.failure.ingest_note = Some(notes.join("; "));
    }
    task
}

/// `task` with the whole message's key, value and headers, even where they are too
/// large to store: what a process-mode handler sees.
pub(crate) fn with_payload(task: &NewTask, consumed: &Consumed) -> NewTask {
    let mut full = task.clone();
    full.failure.key = consumed.message.key().map(<[u8]>::to_vec);
    full.failure.value = consumed.message.payload().map(<[u8]>::to_vec);
    full.failure.headers = consumed.headers.clone();
    full.failure.payload_stored = true;
    full
}

/// The minimal form of a task the database refused: coordinates, size and the reason.
pub(crate) fn minimal_form(task: &NewTask, reason: &str) -> NewTask {
    let failure = &task.failure;
    NewTask {
        failure: Failure {
            payload_stored: false,
            original: failure.original.clone(),
            source: failure.source.clone(),
            source_timestamp: failure.source_timestamp,
            route: failure.route.clone(),
            event_type: failure.event_type.clone(),
            correlation_id: failure.correlation_id.clone(),
            value_size: failure.value_size,
            error_message: failure.error_message.clone(),
            error_class: Some("redrive.IngestRejected".into()),
            ingest_note: Some(format!(
                "the database refused the message, stored without payload: {reason}"
            )),
            ..Failure::default()
        },
        handler: task.handler.clone(),
        dedup_key: task.dedup_key.clone(),
        attempts: task.attempts,
        max_attempts: task.max_attempts,
        next_attempt_at: task.next_attempt_at,
        status: task.status,
        inline_attempt: task.inline_attempt.clone(),
        order_key: task.order_key.clone(),
    }
}

fn timestamp_of(timestamp: Timestamp) -> (Option<DateTime<Utc>>, Option<String>) {
    let (millis, kind) = match timestamp {
        Timestamp::NotAvailable => return (None, None),
        Timestamp::CreateTime(ms) => (ms, "create_time"),
        Timestamp::LogAppendTime(ms) => (ms, "log_append_time"),
    };
    (
        DateTime::from_timestamp_millis(millis),
        Some(kind.to_owned()),
    )
}

/// The message's own coordinates.
fn coordinates_of(message: &impl Message) -> SourceCoordinates {
    SourceCoordinates {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
    }
}

/// `note` with `more` appended: an ingest note gathers every remark on a message.
pub(crate) fn append_note(note: Option<String>, more: &str) -> String {
    match note {
        Some(note) => format!("{note}; {more}"),
        None => more.to_owned(),
    }
}
