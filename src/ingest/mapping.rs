//! A consumed Kafka message as a task: the route decides the handler, the mode the
//! failure context (dead-letter headers in capture mode, the message itself in process
//! mode), the limits whether its bytes are stored.

use chrono::{DateTime, Utc};
use rdkafka::message::{Message, Timestamp};

use crate::config::{IngestSettings, Ordering, RouteMode, RouteSettings};
use crate::kafka::dlt;
use crate::kafka::message::Consumed;
use crate::task::{
    order_key, Failure, NewTask, OriginalCoordinates, SourceCoordinates, Status, TaskId,
};

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
    let (timestamp, timestamp_type, timestamp_note) = timestamp_of(message.timestamp());
    let key = message.key().map(<[u8]>::to_vec);
    let value = message.payload().map(<[u8]>::to_vec);
    let value_size = value.as_ref().map_or(0, Vec::len);
    let ordered_by = |key: Option<&[u8]>| match (route.ordering, key) {
        (Ordering::Key, Some(key)) => Some(order_key(&route.name, key)),
        _ => None,
    };
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
        order_key: ordered_by(message.key()),
        ..NewTask::default()
    };
    let mut notes: Vec<String> = timestamp_note.into_iter().collect();
    let mut recognised = false;
    let mut key_from_header = None;
    match route.mode {
        RouteMode::Capture => {
            let ctx = dlt::read(&headers, limits.stacktrace_max_bytes as usize);
            recognised = ctx.format.is_some();
            task.dedup_key = ctx.dedup_key();
            task.failure.disposition = ctx.disposition.map(|d| d.as_str().to_owned());
            if let Some(original_key) = ctx.key {
                // The dead letter's own key is something else (Karafka before 2.5: the
                // original partition): the original's is what orders and republishes.
                task.order_key = ordered_by(original_key.as_deref());
                key_from_header = Some(original_key);
            }
            task.failure.original = ctx.original;
            task.failure.error_class = ctx.error_class;
            task.failure.error_message = ctx.error_message;
            task.failure.error_stacktrace = ctx.stacktrace;
            notes.extend(ctx.notes);
        }
        RouteMode::Process => {
            task.failure.original = Some(source.clone().into());
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
        task.failure.key = key_from_header.unwrap_or(key);
        task.failure.value = value;
        task.failure.headers = headers;
    }
    task.failure.source = Some(source);
    if !notes.is_empty() {
        task.failure.ingest_note = Some(notes.join("; "));
    }
    if !(recognised && left_out(consumed, route, &task)) {
        return task;
    }
    match task.failure.original.clone() {
        Some(original) if original.complete().is_none() => {
            let error = format!(
                "the original record at {original} could not be fetched: its partition or \
                 offset is not readable"
            );
            original_unavailable(task, error)
        }
        None => {
            let error = "the dead letter carried no key, no value and no readable original \
                         topic: there is no record to fetch";
            original_unavailable(task, error.to_owned())
        }
        Some(_) => task,
    }
}

/// Whether `consumed` is a dead letter that left its record out: no key and no value
/// (a Kafka share group's, by default). A tombstone with a key is a real delete, taken
/// as it came.
fn left_out(consumed: &Consumed, route: &RouteSettings, task: &NewTask) -> bool {
    let message = &consumed.message;
    route.mode == RouteMode::Capture
        && message.key().is_none()
        && message.payload().is_none()
        && task.failure.payload_stored
}

/// The original record's coordinates when `consumed` is a dead letter that left the
/// record out ([`left_out`]) and its original is to be fetched.
pub(crate) fn original_to_fetch(
    consumed: &Consumed,
    route: &RouteSettings,
    task: &NewTask,
) -> Option<SourceCoordinates> {
    left_out(consumed, route, task)
        .then(|| task.failure.original.as_ref()?.complete())
        .flatten()
}

/// `task` holding the `original` record fetched from `at`, as if the dead letter had
/// come whole: its key, value and headers (the dead letter's failure-context headers
/// after them; its others, not the original's, are left out and noted), or its minimal form when that is over `ingest.max_message_bytes`. A
/// record with no key and no value (another headers-only dead letter, say) is no
/// original: the task is [`original_unavailable`], never republished empty.
pub(crate) fn with_original(
    mut task: NewTask,
    original: &Consumed,
    at: &SourceCoordinates,
    route: &RouteSettings,
    limits: &IngestSettings,
) -> NewTask {
    let message = &original.message;
    if message.key().is_none() && message.payload().is_none() {
        let error = format!(
            "the original record at {} holds no key and no value (a headers-only record, \
             such as another dead letter): there is nothing to republish",
            OriginalCoordinates::from(at.clone())
        );
        return original_unavailable(task, error);
    }
    // The dead letter's failure context follows the original's headers; any other
    // header of the dead letter is not the original's, and is not kept.
    let (context, others): (Vec<_>, Vec<_>) = std::mem::take(&mut task.failure.headers)
        .into_iter()
        .partition(|h| dlt::is_context_header(&h.name));
    let mut headers = original.headers.clone();
    headers.extend(context);
    let value_size = message.payload().map_or(0, <[u8]>::len);
    task.failure.value_size = i32::try_from(value_size).ok();
    let size = message.key().map_or(0, <[u8]>::len)
        + value_size
        + (headers.iter())
            .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    let note = if size > limits.max_message_bytes as usize {
        task.failure.payload_stored = false;
        format!(
            "the original record at {} is {size} bytes with the dead letter's headers, over \
             ingest.max_message_bytes ({}); key, value and headers not stored",
            OriginalCoordinates::from(at.clone()),
            limits.max_message_bytes
        )
    } else {
        task.failure.key = message.key().map(<[u8]>::to_vec);
        task.failure.value = message.payload().map(<[u8]>::to_vec);
        task.failure.headers = headers;
        format!(
            "the dead letter carried no key and no value: key, value and headers fetched \
             from the original record at {}",
            OriginalCoordinates::from(at.clone())
        )
    };
    if let (Ordering::Key, Some(key)) = (route.ordering, message.key()) {
        task.order_key = Some(order_key(&route.name, key));
    }
    task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), &note));
    if !others.is_empty() {
        let names: Vec<String> = (others.iter().take(5))
            .map(|h| String::from_utf8_lossy(&h.name).into_owned())
            .collect();
        let more = match others.len() > names.len() {
            true => format!(" and {} more", others.len() - names.len()),
            false => String::new(),
        };
        let note = format!(
            "the dead letter's other headers are not kept ({}{more}): they are not the \
             original's",
            names.join(", ")
        );
        task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), &note));
    }
    task
}

/// `task`, a dead letter that left its record out, whose original record is not to be
/// had (`error` says where and why): stored PERMANENT_FAILURE without a payload
/// (republishing nothing would write an empty record), error class
/// `redrive.OriginalUnavailable`, and parked like any permanent failure. The dead
/// letter itself stays in its topic.
pub(crate) fn original_unavailable(mut task: NewTask, error: String) -> NewTask {
    task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), &error));
    // What the dead letter said stays in the message: its class and its own message.
    let failure = &mut task.failure;
    let said = match (failure.error_class.take(), failure.error_message.take()) {
        (Some(class), Some(message)) => Some(format!("{class}: {message}")),
        (class, message) => class.or(message),
    };
    failure.error_message = Some(match said {
        Some(dead_lettered) => format!("{error} (dead-lettered: {dead_lettered})"),
        None => error,
    });
    task.failure.error_class = Some("redrive.OriginalUnavailable".into());
    task.failure.payload_stored = false;
    task.status = Status::PermanentFailure;
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

/// The minimal form of a task the database refused: coordinates, size and the reason,
/// under its reserved id; an inline attempt's checkpoint is left out (it may be what
/// was refused), and the note says so.
pub(crate) fn minimal_form(task: &NewTask, reason: &str) -> NewTask {
    let failure = &task.failure;
    let left_out = match task.checkpoint {
        Some(_) => " and the inline attempt's checkpoint",
        None => "",
    };
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
            generation: failure.generation,
            previous_task: failure.previous_task,
            previous_error: failure.previous_error.clone(),
            disposition: failure.disposition.clone(),
            error_class: Some("redrive.IngestRejected".into()),
            ingest_note: Some(format!(
                "the database refused the message, stored without payload{left_out}: {reason}"
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
        final_error: task.final_error.clone(),
        // What broke is the message's failure, not that its row was refused.
        cause: Some(task.cause()),
        id: task.id,
        checkpoint: None,
    }
}

/// The first millisecond PostgreSQL's `timestamptz` holds (4714-11-24 BC, UTC). chrono
/// holds earlier ones: a message stamped with one failed its whole batch's insert, and
/// the partition's ingest retried it for ever.
const FIRST_STORABLE_MILLIS: i64 = -210_866_803_200_000;

/// The message's time and its kind; a time a task cannot hold (any i64 of milliseconds
/// is a valid stamp to a producer) is left out, with a note saying so.
fn timestamp_of(timestamp: Timestamp) -> (Option<DateTime<Utc>>, Option<String>, Option<String>) {
    let (millis, kind) = match timestamp {
        Timestamp::NotAvailable => return (None, None, None),
        Timestamp::CreateTime(ms) => (ms, "create_time"),
        Timestamp::LogAppendTime(ms) => (ms, "log_append_time"),
    };
    let at = (millis >= FIRST_STORABLE_MILLIS)
        .then(|| DateTime::from_timestamp_millis(millis))
        .flatten();
    let note = at.is_none().then(|| {
        format!(
            "the message's {kind} of {millis} ms is beyond the times a task can hold; not stored"
        )
    });
    (at, Some(kind.to_owned()), note)
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

/// `task`, whose coordinates already belong to task `existing` with other content, under
/// a dedup key that also carries its content digest: its redelivery still finds it.
pub(crate) fn collision(mut task: NewTask, existing: TaskId) -> NewTask {
    let key = task.effective_dedup_key().unwrap_or_default();
    task.dedup_key = Some(format!("{key}#{}", task.failure.content_digest()));
    let note = format!(
        "task {existing} already records these coordinates with other content \
         (topic recreated, or another cluster); stored under the content digest"
    );
    task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), &note));
    task
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by an attack: a dead letter whose original could not be fetched lost the
    /// exception class its headers named.
    #[test]
    fn an_unavailable_original_keeps_what_the_dead_letter_said() {
        let reported = |class: Option<&str>, message: Option<&str>| {
            let mut task = NewTask::default();
            task.failure.error_class = class.map(str::to_owned);
            task.failure.error_message = message.map(str::to_owned);
            let task = original_unavailable(task, "no record to fetch".into());
            assert_eq!(task.status, Status::PermanentFailure);
            assert_eq!(
                task.failure.error_class.as_deref(),
                Some("redrive.OriginalUnavailable")
            );
            task.failure.error_message.unwrap()
        };
        assert_eq!(
            reported(Some("com.x.Boom"), Some("order 7 failed")),
            "no record to fetch (dead-lettered: com.x.Boom: order 7 failed)"
        );
        assert_eq!(
            reported(Some("com.x.Boom"), None),
            "no record to fetch (dead-lettered: com.x.Boom)"
        );
        assert_eq!(
            reported(None, Some("rejected")),
            "no record to fetch (dead-lettered: rejected)"
        );
        assert_eq!(reported(None, None), "no record to fetch");
    }
}
