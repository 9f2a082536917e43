//! A consumed Kafka message as a task, bytes kept exactly as they came.

use chrono::{DateTime, Utc};
use rdkafka::message::{Headers, Message, Timestamp};

use super::dlt;
use crate::config::{IngestSettings, RouteMode, RouteSettings};
use crate::headers::Header;
use crate::task::{NewTask, SourceCoordinates};

/// Every header of `message`, in order, duplicates and absent values kept.
pub fn headers_of(message: &impl Message) -> Vec<Header> {
    let Some(headers) = message.headers() else {
        return Vec::new();
    };
    headers
        .iter()
        .map(|h| Header {
            name: h.key.to_owned(),
            value: h.value.map(<[u8]>::to_vec),
        })
        .collect()
}

/// The message's own coordinates.
pub fn coordinates_of(message: &impl Message) -> SourceCoordinates {
    SourceCoordinates {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
    }
}

/// The task recording `message` for `route`. In process mode `error` is the inline
/// attempt's failure, which counts as attempt 1.
pub fn to_task(
    message: &impl Message,
    route: &RouteSettings,
    limits: &IngestSettings,
    error: Option<String>,
) -> NewTask {
    let source = coordinates_of(message);
    let headers = headers_of(message);
    let (timestamp, timestamp_type) = timestamp_of(message.timestamp());
    let key = message.key().map(<[u8]>::to_vec);
    let value = message.payload().map(<[u8]>::to_vec);
    let value_size = value.as_ref().map_or(0, Vec::len);
    let mut task = NewTask {
        handler: route.handler.clone(),
        route: Some(route.name.clone()),
        event_type: route.event_type.clone(),
        max_attempts: route.max_attempts.map(|m| m as i32),
        source_timestamp: timestamp,
        source_timestamp_type: timestamp_type,
        value_size: i32::try_from(value_size).ok(),
        ..NewTask::default()
    };
    let mut notes = Vec::new();
    match route.mode {
        RouteMode::Capture => {
            let ctx = dlt::read(&headers, limits.stacktrace_max_bytes as usize);
            task.original = ctx.original;
            task.error_class = ctx.error_class;
            task.error_message = ctx.error_message;
            task.error_stacktrace = ctx.stacktrace;
            notes.extend(ctx.notes);
        }
        RouteMode::Process => {
            task.original = Some(source.clone());
            task.attempts = 1;
            task.error_class = Some("redrive.ProcessModeFailure".into());
            task.error_message = error;
        }
    }
    let size = key.as_ref().map_or(0, Vec::len)
        + value_size
        + headers
            .iter()
            .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    if size > limits.max_message_bytes as usize {
        notes.push(format!(
            "message of {size} bytes exceeds ingest.max_message_bytes ({}); key, value and headers not stored",
            limits.max_message_bytes
        ));
    } else {
        task.key = key;
        task.value = value;
        task.headers = headers;
    }
    task.source = Some(source);
    if !notes.is_empty() {
        task.ingest_note = Some(notes.join("; "));
    }
    task
}

/// The minimal form of a task the database refused: coordinates, size and the reason.
pub fn minimal_form(task: &NewTask, reason: &str) -> NewTask {
    NewTask {
        handler: task.handler.clone(),
        route: task.route.clone(),
        source: task.source.clone(),
        value_size: task.value_size,
        attempts: task.attempts,
        max_attempts: task.max_attempts,
        error_class: Some("redrive.IngestRejected".into()),
        ingest_note: Some(format!(
            "the database refused the message, stored without payload: {reason}"
        )),
        ..NewTask::default()
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
