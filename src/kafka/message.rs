//! A consumed Kafka message as a task, bytes kept exactly as they came.

use chrono::{DateTime, Utc};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage, Timestamp};
use rdkafka_sys as rdsys;

use super::dlt;
use crate::config::{IngestSettings, Ordering, RouteMode, RouteSettings};
use crate::headers::Header;
use crate::task::{order_key, Failure, NewTask, SourceCoordinates};

/// A consumed message, detached from the consumer, with its headers read byte-safely.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Key, value, coordinates and timestamp.
    pub message: OwnedMessage,
    /// Every header, in order, duplicates and absent values kept, names as bytes.
    pub headers: Vec<Header>,
}

impl Consumed {
    /// Copies what redrive needs out of the consumer's buffer.
    pub fn new(message: &BorrowedMessage<'_>) -> Consumed {
        let mut native: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: `message.ptr()` is a live message; librdkafka returns a header list
        // owned by the message (or an error and no list), valid while `message` is.
        let found = unsafe { rdsys::rd_kafka_message_headers(message.ptr(), &mut native) };
        let headers = if found == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            && !native.is_null()
        {
            // SAFETY: `native` is the message's live header list.
            unsafe { read_native_headers(native) }
        } else {
            Vec::new()
        };
        Consumed {
            message: message.detach(),
            headers,
        }
    }
}

/// Reads a native header list, names and values as raw bytes. (rdkafka's safe
/// accessors panic on a header name that is not UTF-8.) librdkafka hands names out as
/// C strings: a name with a NUL byte arrives cut at its first NUL.
///
/// # Safety
/// `native` must point to a live `rd_kafka_headers_t`.
pub(crate) unsafe fn read_native_headers(native: *const rdsys::rd_kafka_headers_t) -> Vec<Header> {
    let mut headers = Vec::new();
    for index in 0.. {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::os::raw::c_void = std::ptr::null();
        let mut size = 0usize;
        let err = rdsys::rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size);
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        let name = std::ffi::CStr::from_ptr(name).to_bytes().to_vec();
        let value = (!value.is_null())
            .then(|| std::slice::from_raw_parts(value.cast::<u8>(), size).to_vec());
        headers.push(Header { name, value });
    }
    headers
}

/// The message's own coordinates.
pub fn coordinates_of(message: &impl Message) -> SourceCoordinates {
    SourceCoordinates {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
    }
}

impl Consumed {
    /// Bytes of key, value and headers: what the message weighs in a batch and a row.
    pub fn size(&self) -> usize {
        let message = &self.message;
        message.key().map_or(0, <[u8]>::len)
            + message.payload().map_or(0, <[u8]>::len)
            + self
                .headers
                .iter()
                .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }

    /// A message of `size` value bytes on `test`/0, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_test(size: usize) -> Consumed {
        let message = OwnedMessage::new(
            Some(vec![0; size]),
            None,
            "test".into(),
            Timestamp::NotAvailable,
            0,
            0,
            None,
        );
        Consumed {
            message,
            headers: Vec::new(),
        }
    }
}

/// The task recording `message` for `route`, before any inline attempt. A message over
/// `ingest.max_message_bytes` is kept in minimal form: coordinates, size and the reason,
/// with `payload_stored` false.
pub fn to_task(consumed: &Consumed, route: &RouteSettings, limits: &IngestSettings) -> NewTask {
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
pub fn with_payload(task: &NewTask, consumed: &Consumed) -> NewTask {
    let mut full = task.clone();
    full.failure.key = consumed.message.key().map(<[u8]>::to_vec);
    full.failure.value = consumed.message.payload().map(<[u8]>::to_vec);
    full.failure.headers = consumed.headers.clone();
    full.failure.payload_stored = true;
    full
}

/// The minimal form of a task the database refused: coordinates, size and the reason.
pub fn minimal_form(task: &NewTask, reason: &str) -> NewTask {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_that_are_not_utf8_are_kept_byte_for_byte() {
        let entries: [(&[u8], Option<&[u8]>); 3] = [
            (b"ok", Some(b"\x00\xff")),
            (b"bad\xff\xfe", Some(b"v")),
            (b"absent", None),
        ];
        // SAFETY: a header list created, read and destroyed here.
        unsafe {
            let native = rdsys::rd_kafka_headers_new(4);
            for (name, value) in entries {
                let (ptr, len) = match value {
                    Some(v) => (v.as_ptr().cast(), v.len() as isize),
                    None => (std::ptr::null(), 0),
                };
                rdsys::rd_kafka_header_add(
                    native,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    ptr,
                    len,
                );
            }
            let headers = read_native_headers(native);
            rdsys::rd_kafka_headers_destroy(native);
            assert_eq!(headers.len(), 3);
            assert_eq!(headers[0], Header::new("ok", vec![0x00, 0xff]));
            assert_eq!(headers[1].name, b"bad\xff\xfe");
            assert_eq!(
                headers[2],
                Header {
                    name: "absent".into(),
                    value: None
                }
            );
        }
    }
}
