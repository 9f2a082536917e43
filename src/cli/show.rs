//! `redrive tasks show ID`: one task as a person reads it. First what matters (status,
//! handler, route, attempts used of allowed, the last error, its cause with the id
//! `--cause` takes, and why it waits or how it ended), then where it came from and
//! when, its payload (JSON re-indented, text as text, other bytes in hex with their
//! size), headers, checkpoint, compensation and attempt history. Times are UTC, with
//! how long ago or ahead they are by the database's clock. `--json` prints the store's
//! [`TaskDetail`].

use clap::Args;
use std::fmt::Write;

use super::table;
use crate::operations::Operations;
use crate::output::outln;
use crate::readable::Readable;
use crate::store::{Attempt, TaskDetail, TaskSummary};
use crate::when::{at, at_from_now};

/// Options of `tasks show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Task id.
    pub id: i64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Bytes of binary shown on one line; longer binary is dumped [`HEX_ROW`] bytes a line.
const HEX_ON_ONE_LINE: usize = 32;

/// Bytes a line of a hex dump.
const HEX_ROW: usize = 16;

/// Prints task `args.id`, with the targets of the reader's configuration and the budget
/// of the fleet's.
pub async fn run(operations: &Operations, args: ShowArgs) -> anyhow::Result<()> {
    let detail = operations.show(args.id).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&detail)?);
    } else {
        outln!("{}", render(&detail).trim_end());
    }
    Ok(())
}

/// The NEXT cell of `tasks list`: when a waiting task is due; `running`, `held`, or
/// nothing (a final task), where a time would mislead.
pub fn next_attempt(task: &TaskSummary) -> String {
    match task.next_attempt_at {
        _ if task.status.is_final() => String::new(),
        _ if task.held => "held".to_owned(),
        _ if task.lease_owner.is_some() => "running".to_owned(),
        Some(due) => at(due),
        None => String::new(),
    }
}

/// One field: its name in a column, then its value.
/// The value is written as a person should see it, on one line: no terminal obeys it.
fn field(out: &mut String, name: &str, value: impl std::fmt::Display) {
    let value = value.to_string();
    let value = crate::readable::visible(&value).replace('\n', "\\u{000A}");
    let line = format!("{name:<22} {value}");
    let _ = writeln!(out, "{}", line.trim_end());
}

/// Lines indented under a field.
fn block(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// The task as text.
fn render(detail: &TaskDetail) -> String {
    let task = detail.record();
    let now = detail.as_of;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "task {:<17} {} (as of {} UTC)",
        task.id,
        task.status,
        at(now)
    );
    let state = match task.status.is_final() {
        true => "ended",
        false => "waiting",
    };
    field(&mut out, state, &detail.waiting.words);
    field(&mut out, "handler", &task.handler);
    if let Some(route) = &task.failure.route {
        field(&mut out, "route", route);
    }
    let allowed = detail
        .attempts_allowed
        .map_or(String::new(), |allowed| format!(" of {allowed}"));
    field(&mut out, "attempts", format!("{}{allowed}", task.attempts));
    if let Some(error) = &task.last_error {
        multiline(&mut out, "last_error", error);
    }
    if let Some(cause) = &detail.cause {
        field(
            &mut out,
            "cause",
            format!("{} {}: {}", cause.id, cause.class, cause.fingerprint),
        );
    }

    out.push('\n');
    let failure = &task.failure;
    if let Some(source) = &failure.source {
        let kind = failure.source_timestamp_type.as_deref().unwrap_or("time");
        let at = failure.source_timestamp.map_or(String::new(), |t| {
            format!(", {kind} {}", at_from_now(t, now))
        });
        let place = format!("{}[{}]@{}", source.topic, source.partition, source.offset);
        field(&mut out, "source", format!("{place}{at}"));
    }
    if let Some(original) = &failure.original {
        field(&mut out, "original", original);
    }
    let texts = [
        ("dedup_key", task.dedup_key.as_deref()),
        ("event_type", failure.event_type.as_deref()),
        ("correlation_id", failure.correlation_id.as_deref()),
        ("error_class", failure.error_class.as_deref()),
        ("error_message", failure.error_message.as_deref()),
        ("error_stacktrace", failure.error_stacktrace.as_deref()),
        ("ingest_note", failure.ingest_note.as_deref()),
    ];
    for (name, text) in texts {
        if let Some(text) = text {
            multiline(&mut out, name, text);
        }
    }
    field(&mut out, "generation", failure.generation);
    if let Some(previous) = failure.previous_task {
        field(&mut out, "previous_task", previous);
    }
    if let Some(error) = &failure.previous_error {
        multiline(&mut out, "previous_error", error);
    }
    if let Some(size) = failure.value_size {
        field(&mut out, "value_size", format!("{size} bytes"));
    }
    field(&mut out, "created_at", at_from_now(task.created_at, now));
    field(&mut out, "updated_at", at_from_now(task.updated_at, now));
    if let Some(finished) = task.finished_at {
        field(&mut out, "finished_at", at_from_now(finished, now));
    }
    field(&mut out, "lease_version", task.lease_version);
    let applied = detail.targets.as_ref();
    for (name, target) in [
        ("republish_to", applied.and_then(|t| t.republish.as_ref())),
        ("parks_to", applied.and_then(|t| t.parking.as_ref())),
    ] {
        if let Some(target) = target {
            field(
                &mut out,
                name,
                format!("{} ({})", target.topic, target.from),
            );
        }
    }
    if let Some(reason) = &detail.unreadable {
        field(&mut out, "unreadable", reason);
    }

    out.push('\n');
    let absent = match failure.payload_stored {
        true => "(none)",
        false => "(not stored: the message was kept in minimal form)",
    };
    payload(&mut out, "key", detail.key.as_ref(), absent);
    payload(&mut out, "value", detail.value.as_ref(), absent);
    if let Some(original) = &detail.original_value {
        let name = format!(
            "value as it came (the value above is version {}, transformed)",
            detail.payload_version
        );
        payload(&mut out, &name, Some(original), absent);
    }
    for header in &detail.headers {
        let name = format!("header {}", printable(&header.name.line()));
        payload(&mut out, &name, header.value.as_ref(), "(no value)");
    }
    if let Some(checkpoint) = &task.checkpoint {
        out.push('\n');
        field(&mut out, "checkpoint", "");
        block(
            &mut out,
            &serde_json::to_string_pretty(checkpoint).unwrap_or_default(),
        );
    }
    if let Some(compensation) = &detail.compensation {
        out.push('\n');
        let when = match (compensation.finished_at, compensation.due_at) {
            (Some(ended), _) => format!(", ended {}", at_from_now(ended, now)),
            (None, Some(due)) => format!(", due {}", at_from_now(due, now)),
            (None, None) => String::new(),
        };
        field(
            &mut out,
            "compensation",
            format!(
                "{} after {} attempt(s){when}",
                compensation.state, compensation.attempts
            ),
        );
        if !compensation.history.is_empty() {
            out.push_str(&history(&compensation.history));
        }
    }
    out.push('\n');
    match detail.history.is_empty() {
        true => out.push_str("no attempt yet\n"),
        false => out.push_str(&history(&detail.history)),
    }
    out
}

/// A field whose text may span lines: on its line when it is one, indented below when not.
fn multiline(out: &mut String, name: &str, text: &str) {
    let text = printable(text);
    match text.contains('\n') {
        false => field(out, name, text),
        true => {
            field(out, name, "");
            block(out, &text);
        }
    }
}

/// Stored bytes: JSON re-indented below, text on its line (or below), binary in hex.
fn payload(out: &mut String, name: &str, bytes: Option<&Readable>, absent: &str) {
    let Some(bytes) = bytes else {
        field(out, name, absent);
        return;
    };
    let size = bytes.size;
    if let Some(pretty) = &bytes.pretty_json {
        field(out, name, format!("JSON, {size} bytes:"));
        block(out, pretty);
    } else if bytes.encoding == "utf8" && !bytes.data.contains(['\n', '\r']) {
        field(
            out,
            name,
            format!("{} ({size} bytes)", printable(&bytes.data)),
        );
    } else if bytes.encoding == "utf8" {
        field(out, name, format!("text, {size} bytes:"));
        block(out, &printable(&bytes.data));
    } else if size <= HEX_ON_ONE_LINE {
        field(out, name, format!("{} ({size} bytes)", bytes.line()));
    } else {
        field(out, name, format!("{size} bytes, not UTF-8, in hex:"));
        let digits = bytes.data.as_bytes();
        for (row, chunk) in digits.chunks(2 * HEX_ROW).enumerate() {
            let pairs: Vec<&str> = chunk
                .chunks(2)
                .map(|pair| std::str::from_utf8(pair).unwrap_or("??"))
                .collect();
            let _ = writeln!(out, "  {:08x}  {}", row * HEX_ROW, pairs.join(" "));
        }
    }
}

/// `text` with its [`crate::readable::hidden`] characters escaped (a terminal would obey
/// them, or hide them), lines and tabs kept.
fn printable(text: &str) -> String {
    crate::readable::visible(&text.replace("\r\n", "\n")).into_owned()
}

/// The attempt history as a table, oldest first.
fn history(history: &[Attempt]) -> String {
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                a.lease_version.to_string(),
                a.started_at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                format!("{} ms", a.duration_ms),
                a.outcome.clone(),
                a.worker.clone(),
                a.error.clone().unwrap_or_default().replace('\n', " "),
            ]
        })
        .collect();
    table::render(
        &[
            "ATTEMPT", "TOKEN", "STARTED", "TOOK", "OUTCOME", "BY", "ERROR",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_read_as_json_text_or_hex() {
        let mut out = String::new();
        payload(&mut out, "value", Some(&Readable::new(br#"{"b":[1]}"#)), "");
        payload(&mut out, "key", Some(&Readable::new(b"<script>\x1b")), "");
        payload(&mut out, "blob", Some(&Readable::new(&[0xff; 40])), "");
        payload(&mut out, "none", None, "(none)");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], format!("{:<22} JSON, 9 bytes:", "value"));
        assert_eq!(
            lines[1..6],
            ["  {", "    \"b\": [", "      1", "    ]", "  }"]
        );
        assert_eq!(
            lines[6],
            format!("{:<22} <script>\\u{{001B}} (9 bytes)", "key")
        );
        assert_eq!(
            lines[7],
            format!("{:<22} 40 bytes, not UTF-8, in hex:", "blob")
        );
        assert!(lines[8].starts_with("  00000000  ff ff"), "{}", lines[8]);
        assert!(lines[10].starts_with("  00000020  ff ff"), "{}", lines[10]);
        assert_eq!(lines[11], format!("{:<22} (none)", "none"));
    }
}
