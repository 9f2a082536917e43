//! Four eyes: the actions waiting for a second operator (`operations.approval_over`),
//! newest first, then the latest decided ones with what they answered. For an operate
//! caller each waiting one has Approve (not its requester's: the layer refuses) and
//! Reject, each with an optional reason.

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::response::{Html, Redirect};
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use super::error::PageError;
use super::layout::{self, Nav};
use super::Shared;
use crate::config::Role;
use crate::operations::{Actor, PageRequest};
use crate::store::Approval;

/// Approvals listed, of each kind.
const LISTED: i64 = 50;

/// `GET /console/approvals`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let page = PageRequest {
        limit: Some(LISTED),
        after: None,
    };
    let pending = console.app.approvals(true, &page).await?.items;
    let recent: Vec<Approval> = (console.app.approvals(false, &page).await?.items)
        .into_iter()
        .filter(|a| a.status != "pending")
        .collect();
    let operate = caller.role == Role::Operate;
    let body = html! {
        section aria-labelledby="waiting" {
            h2 #waiting { "Waiting for a second operator (" (pending.len()) ")" }
            @if pending.is_empty() {
                p.empty { "No action waits. An action selecting more tasks than operations.approval_over waits here." }
            } @else {
                (table(&pending, operate, &caller.name))
            }
        }
        section aria-labelledby="decided" {
            h2 #decided { "Decided" }
            @if recent.is_empty() { p.empty { "None yet." } } @else { (table(&recent, false, &caller.name)) }
        }
    };
    Ok(layout::page(&caller, Nav::Approvals, "Approvals", body))
}

fn table(approvals: &[Approval], operate: bool, me: &str) -> Markup {
    html! {
        table.approvals {
            thead {
                tr {
                    @for heading in ["Approval", "Action", "Tasks", "Asked by", "Asked", "Reason", "Status", "Outcome"] {
                        th scope="col" { (heading) }
                    }
                    @if operate { th scope="col" { "Decide" } }
                }
            }
            tbody {
                @for a in approvals {
                    tr id=(format!("approval-{}", a.id)) {
                        th scope="row" { (a.id) }
                        td { (a.verb) br; small { code { (crate::readable::visible(&asked(&a.request).to_string())) } } }
                        td { (a.selected) }
                        td { (a.requested_by) }
                        td { (layout::when(a.created_at)) }
                        td { (layout::text_opt(a.reason.as_deref())) }
                        td {
                            span class={ "badge approval-" (a.status) } { (a.status) }
                            @if let Some(by) = &a.decided_by { br; small { "by " (by) } }
                            @if let Some(why) = &a.decision_reason { br; small { (why) } }
                        }
                        td { @if let Some(outcome) = &a.outcome { (outcome_words(outcome)) } }
                        @if operate {
                            td.actions {
                                form method="post" action=(format!("/console/approvals/{}/approve", a.id)) {
                                    input type="text" name="reason" placeholder="why (optional)" aria-label=(format!("Reason to approve {}", a.id));
                                    @if a.requested_by == me {
                                        button type="submit" disabled title="a second operator must approve it" { "Approve" }
                                    } @else {
                                        button.approve type="submit" aria-label=(format!("Approve {}", a.id)) { "Approve" }
                                    }
                                }
                                form method="post" action=(format!("/console/approvals/{}/reject", a.id)) {
                                    input type="text" name="reason" placeholder="why (optional)" aria-label=(format!("Reason to reject {}", a.id));
                                    button.danger type="submit" aria-label=(format!("Reject {}", a.id)) { "Reject" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The fields of a decision form.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct DecisionForm {
    reason: Option<String>,
}

/// `POST /console/approvals/{id}/{approve|reject}`.
pub(crate) async fn decide(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path((id, decision)): Path<(String, String)>,
    form: Result<Form<DecisionForm>, FormRejection>,
) -> Result<Redirect, PageError> {
    let Form(form) = form.map_err(|e| PageError::bad_request(e.body_text()))?;
    let id = (id.parse::<i64>().ok())
        .filter(|id| *id > 0)
        .ok_or_else(|| PageError::bad_request(format!("{id:?} is not an approval id")))?;
    let reason = form
        .reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    match decision.as_str() {
        "approve" => console.app.approve(&actor, id, reason.as_deref()).await?,
        "reject" => console.app.reject(&actor, id, reason.as_deref()).await?,
        other => return Err(PageError::bad_request(format!("no decision {other:?}"))),
    };
    Ok(Redirect::to(&format!("/console/approvals#approval-{id}")))
}

/// What a request asks for, without its defaults (null, false, empty) and its reason
/// (shown in its own column).
fn asked(request: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    fn given(value: &Value) -> Option<Value> {
        match value {
            Value::Null | Value::Bool(false) => None,
            Value::Array(items) if items.is_empty() => None,
            Value::Object(fields) => {
                let kept: serde_json::Map<String, Value> = (fields.iter())
                    .filter_map(|(name, value)| Some((name.clone(), given(value)?)))
                    .collect();
                (!kept.is_empty()).then_some(Value::Object(kept))
            }
            other => Some(other.clone()),
        }
    }
    let mut request = request.clone();
    if let Some(fields) = request.as_object_mut() {
        fields.remove("reason");
    }
    given(&request).unwrap_or(Value::Null)
}

/// What an approved action answered, in words: an error, a job, or what it changed.
fn outcome_words(outcome: &serde_json::Value) -> Markup {
    if let Some(error) = outcome.get("error").and_then(|e| e.as_str()) {
        return html! { span.warning { "failed: " (crate::readable::visible(error)) } };
    }
    if let Some(job) = outcome
        .get("job")
        .and_then(|j| j.get("id"))
        .and_then(|i| i.as_i64())
    {
        return html! { a href=(format!("/console/replays#job-{job}")) { "job " (job) } };
    }
    if let Some(job) = outcome
        .get("kind")
        .and(outcome.get("id"))
        .and_then(|i| i.as_i64())
    {
        return html! { a href=(format!("/console/replays#job-{job}")) { "job " (job) } };
    }
    let count = |name: &str| outcome.get(name).and_then(|n| n.as_i64()).unwrap_or(0);
    html! {
        (count("changed")) " changed"
        @if let Some(audit) = outcome.get("audit_id").and_then(|a| a.as_i64()) {
            " (audit entry " (audit) ")"
        }
    }
}
