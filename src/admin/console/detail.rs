//! A task's detail: what an operator needs first (status, handler, route, attempts of
//! those allowed, why it waits or how it ended, the last error), then the message (key,
//! value, headers: text, or hex with the size), every other stored field (folded),
//! where it is republished and parked, its attempt history and its compensation. Every
//! byte of the payload is escaped; nothing of it is markup.
//!
//! For an operate caller, Retry / Discard / Resolve of this task go under the headline,
//! leading to the same confirm page as the list's ([`super::actions`]).

use axum::extract::{Path, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};
use serde_json::Value;

use super::chart::outcome_class;
use super::error::PageError;
use super::filter;
use super::layout::{self, Nav};
use super::Shared;
use crate::config::Target;
use crate::operations::Actor;
use crate::store::{Attempt, CompensationView, HeaderView, TaskDetail, TaskFilter, WaitingState};
use crate::task::{Status, TaskId};

/// Fields the headline and the message sections show; the rest are listed below them.
const SHOWN_ABOVE: [&str; 9] = [
    "id",
    "status",
    "handler",
    "route",
    "last_error",
    "attempts",
    "max_attempts",
    "next_attempt_at",
    "lease_owner",
];

/// `GET /console/tasks/{id}`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    let id = id
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .map(TaskId)
        .ok_or_else(|| {
            PageError::bad_request(format!("{id:?} is not a task id (a positive integer)"))
        })?;
    let detail = console.app.show(id.0).await?;
    let title = format!("Task {id}");
    let operate = caller.role == crate::config::Role::Operate;
    let body = html! {
        @if operate { (actions(id)) }
        (body(id, &detail, operate))
    };
    Ok(layout::page(&caller, Nav::Tasks, &title, body))
}

/// This task's action form (a replay selects by filter: the list offers it).
fn actions(id: TaskId) -> Markup {
    html! {
        form.task-actions method="post" action="/console/actions/preview" {
            input type="hidden" name="id" value=(id);
            @for (verb, label) in super::form::VERBS.iter().filter(|(v, _)| *v != "replay") {
                button type="submit" name="verb" value=(verb)
                    class=[(*verb == "discard").then_some("danger")] { (label) "…" }
            }
        }
    }
}

fn field<'a>(detail: &'a TaskDetail, name: &str) -> Option<&'a Value> {
    detail.task.get(name).filter(|v| !v.is_null())
}

fn field_text<'a>(detail: &'a TaskDetail, name: &str) -> Option<&'a str> {
    field(detail, name).and_then(Value::as_str)
}

fn body(id: TaskId, detail: &TaskDetail, operate: bool) -> Markup {
    let status = field_text(detail, "status").and_then(|s| s.parse::<Status>().ok());
    let done = field(detail, "attempts").map_or("0".to_owned(), Value::to_string);
    let attempts = match detail.attempts_allowed {
        Some(allowed) => format!("{done} of {allowed}"),
        None => done,
    };
    let refailures = filter::list_url(
        &TaskFilter {
            previous_task: Some(id),
            ..TaskFilter::default()
        },
        &[],
    );
    html! {
        section.headline aria-label="Summary" {
            dl {
                dt { "Status" }
                dd { @if let Some(status) = status { (layout::status(status)) } @else { (layout::dash()) } }
                dt { "Handler" } dd { (layout::text_opt(field_text(detail, "handler"))) }
                dt { "Route" } dd { (layout::text_opt(field_text(detail, "route"))) }
                dt { "Cause" }
                dd.cause {
                    @match &detail.cause {
                        Some(cause) => {
                            code.class { (layout::visible(&cause.class)) } ": "
                            @if cause.fingerprint.trim().is_empty() {
                                span.none { (super::broke::EMPTY_MESSAGE) }
                            } @else {
                                span.fingerprint { (layout::visible(&cause.fingerprint)) }
                            }
                            " "
                            a href=(super::broke::cause_url(cause.id)) {
                                "tasks of cause " (cause.id) " →"
                            }
                        }
                        None => span.none { "none set yet (stored before causes)" },
                    }
                }
                dt { "Attempts" } dd { (attempts) }
                dt { @if status.is_some_and(Status::is_final) { "Ended" } @else { "Now" } }
                dd.waiting {
                    (layout::words(&detail.waiting.words))
                    (what_to_do(&detail.waiting.state, operate))
                }
            }
            h2 { "Last error" }
            (last_error(detail))
        }
        @if let Some(why) = &detail.unreadable {
            p.warning role="alert" { "This task's stored row cannot be read whole: " (why) }
        }
        section aria-labelledby="message" {
            h2 #message { "Message" }
            h3 { "Key" }
            @match &detail.key { Some(key) => (layout::payload(key)), None => p { "No key." } }
            h3 {
                "Value"
                @if detail.payload_version > 1 { " (version " (detail.payload_version) ", transformed)" }
            }
            @match &detail.value { Some(value) => (layout::payload(value)), None => p { "No value (a tombstone, or not stored: see payload_stored)." } }
            @if let Some(original) = &detail.original_value {
                h3 { "Value as it came" }
                (layout::payload(original))
            }
            h3 { "Headers" }
            (headers(&detail.headers))
        }
        section aria-labelledby="fields" {
            h2 #fields { "Every other field" }
            details {
                summary { "The task's stored fields" }
                dl {
                    @if let Some(object) = detail.task.as_object() {
                        @for (name, value) in object.iter().filter(|(n, _)| !SHOWN_ABOVE.contains(&n.as_str())) {
                            dt { (name) }
                            dd { (json(value)) }
                        }
                    }
                }
            }
            p { a href=(refailures) { "Re-failures of this task" } }
        }
        @if let Some(targets) = &detail.targets {
            section aria-labelledby="targets" {
                h2 #targets { "Where it goes" }
                dl {
                    dt { "Republished to" } dd { (target(targets.republish.as_ref())) }
                    dt { "Parked at (if it fails for good)" } dd { (target(targets.parking.as_ref())) }
                }
            }
        }
        section aria-labelledby="history" {
            h2 #history { "Attempt history" }
            (history(&detail.history))
        }
        @if let Some(compensation) = &detail.compensation {
            (compensation_section(compensation))
        }
    }
}

/// The last attempt's error; before any attempt failed, the error the task was
/// reported with (its dead letter's), said to be that.
fn last_error(detail: &TaskDetail) -> Markup {
    if let Some(error) = field_text(detail, "last_error") {
        return html! { pre.error { (layout::long_text(error)) } };
    }
    let class = field_text(detail, "error_class");
    match field_text(detail, "error_message") {
        Some(message) => html! {
            p.meta.reported {
                "No attempt has failed yet: the error it was reported with"
                @if let Some(class) = class { ", " code { (layout::visible(class)) } }
                ":"
            }
            pre.error.reported {
                @if message.trim().is_empty() { (super::broke::EMPTY_MESSAGE) }
                @else { (layout::long_text(message)) }
            }
        },
        None => match class {
            Some(class) => html! {
                p.meta.reported {
                    "No attempt has failed yet: it was reported with "
                    code { (layout::visible(class)) } ", without a message."
                }
            },
            None => html! { p { (layout::dash()) } },
        },
    }
}

/// What the words tell an operator to run, done here: a forced-open breaker's release
/// (`redrive breakers release NAME`) is a button with its reason for an operate
/// caller, and a link to the breakers for a read one.
fn what_to_do(state: &WaitingState, operate: bool) -> Markup {
    match state {
        WaitingState::BreakerOpen {
            handler,
            forced: true,
            ..
        } => {
            let action = format!("/console/breakers/{}/release", layout::segment(handler));
            html! {
                @if operate {
                    form.inline-command method="post" action=(action) {
                        label for="release-breaker" { "Reason to release the breaker of " (handler) }
                        input #release-breaker type="text" name="reason" required autocomplete="off";
                        button #release-breaker-button type="submit" { "Release the breaker" }
                    }
                } @else {
                    " " a href="/console/fleet#breakers" { "The breakers" }
                }
            }
        }
        _ => html! {},
    }
}

fn json(value: &Value) -> Markup {
    match value {
        Value::Null => layout::dash(),
        Value::String(text) => match chrono::DateTime::parse_from_rfc3339(text) {
            Ok(at) => layout::when(at.with_timezone(&chrono::Utc)),
            Err(_) => layout::long_text(text),
        },
        Value::Bool(_) | Value::Number(_) => html! { (value.to_string()) },
        _ => html! { code { (layout::visible(&value.to_string())) } },
    }
}

fn target(target: Option<&Target>) -> Markup {
    match target {
        Some(t) => html! { code { (t.topic) } " (" (t.from) ")" },
        None => html! { "nowhere" },
    }
}

fn headers(headers: &[HeaderView]) -> Markup {
    if headers.is_empty() {
        return html! { p { "No headers." } };
    }
    let readable = |r: &crate::readable::Readable| -> Markup {
        match r.encoding {
            "utf8" => html! { code { (layout::visible(&r.data)) } },
            _ => html! { code.hex { "hex " (r.data) } " (" (r.size) " bytes, not UTF-8)" },
        }
    };
    html! {
        table.headers {
            caption {
                @if headers.len() == 1 { "1 header" } @else { (headers.len()) " headers, in order" }
            }
            thead { tr { th scope="col" { "Name" } th scope="col" { "Value" } } }
            tbody {
                @for header in headers {
                    tr {
                        th scope="row" { (readable(&header.name)) }
                        td {
                            @match &header.value {
                                Some(value) => (readable(value)),
                                None => span.none { "(no value)" },
                            }
                        }
                    }
                }
            }
        }
    }
}

fn history(attempts: &[Attempt]) -> Markup {
    if attempts.is_empty() {
        return html! { p { "No attempt yet." } };
    }
    html! {
        table.history {
            thead {
                tr {
                    @for heading in ["Attempt", "Version", "Worker", "Started", "Took", "Outcome", "Error"] {
                        th scope="col" { (heading) }
                    }
                }
            }
            tbody {
                @for a in attempts {
                    tr {
                        td.number { (a.attempt) }
                        td.number { (a.lease_version) }
                        td { (a.worker) }
                        td { (layout::when(a.started_at)) }
                        td.number { (a.duration_ms) " ms" }
                        td { span class={ "outcome outcome-" (outcome_class(&a.outcome)) } { (a.outcome) } }
                        td.error { (layout::text_opt(a.error.as_deref())) }
                    }
                }
            }
        }
    }
}

fn compensation_section(c: &CompensationView) -> Markup {
    html! {
        section aria-labelledby="compensation" {
            h2 #compensation { "Compensation" }
            dl {
                dt { "State" } dd { (c.state) }
                dt { "Attempts" } dd { (c.attempts) }
                dt { "Due" } dd { (layout::when_opt(c.due_at)) }
                dt { "Finished" } dd { (layout::when_opt(c.finished_at)) }
                dt { "Last error" } dd { (layout::text_opt(c.last_error.as_deref())) }
            }
            (history(&c.history))
        }
    }
}
