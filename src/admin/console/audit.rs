//! The audit log, newest first: who did what by hand, to which tasks, and why; filtered
//! by actor, action and time, paged by entry id (`before` = the last id shown).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;

use super::error::PageError;
use super::filter::{describe, list_url};
use super::layout::{self, Nav};
use super::Shared;
use crate::operations::{Actor, AuditRequest};
use crate::store::{AuditEntry, TaskFilter};

/// Entries per page.
const PAGE: i64 = 50;

/// Task ids of an entry shown as links; the rest are counted.
const IDS_SHOWN: usize = 20;

/// The audit page's query (an empty field means "any").
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct AuditParams {
    actor: Option<String>,
    action: Option<String>,
    since: Option<String>,
    before: Option<String>,
}

fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// `GET /console/audit`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
    query: Result<Query<AuditParams>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = query.map_err(|e| PageError::bad_request(e.body_text()))?;
    let actor = given(&params.actor).map(str::to_owned);
    let action = given(&params.action).map(str::to_owned);
    let since = given(&params.since).map(str::to_owned);
    let before = given(&params.before)
        .map(|b| {
            b.parse::<i64>()
                .map_err(|_| PageError::bad_request("before must be an entry id"))
        })
        .transpose()?;
    let page = console
        .app
        .audit(&AuditRequest {
            actor: actor.clone(),
            action: action.clone(),
            since: since.clone(),
            limit: Some(PAGE),
            after: before,
        })
        .await?;
    let entries = page.items;
    let older = page.next_cursor.map(|last| {
        let mut pairs = vec![("before", last.to_string())];
        pairs.extend(actor.clone().map(|a| ("actor", a)));
        pairs.extend(action.clone().map(|a| ("action", a)));
        pairs.extend(since.clone().map(|s| ("since", s)));
        format!(
            "/console/audit?{}",
            serde_urlencoded::to_string(&pairs).unwrap_or_default()
        )
    });
    let body = html! {
        form.filter method="get" action="/console/audit" {
            div.fields {
                div.field {
                    label for="a-actor" { "Actor" }
                    input type="text" id="a-actor" name="actor" value=[actor.as_deref()] autocomplete="off";
                }
                div.field {
                    label for="a-action" { "Action" }
                    input type="text" id="a-action" name="action" value=[action.as_deref()]
                        autocomplete="off" aria-describedby="h-action";
                    small id="h-action" { "retry, discard, resolve, replay, replay_cancel, breaker_open, …" }
                }
                div.field {
                    label for="a-since" { "Since" }
                    input type="text" id="a-since" name="since" value=[since.as_deref()]
                        autocomplete="off" aria-describedby="h-since";
                    small id="h-since" { "UTC time, or 2h for 2 hours ago" }
                }
            }
            div.buttons {
                button type="submit" { "Filter" }
                a href="/console/audit" { "Clear the filter" }
            }
        }
        section aria-label="Entries" {
        @if entries.is_empty() {
            p.empty { "No entry." }
        } @else {
            table.audit {
                thead {
                    tr {
                        @for heading in ["Entry", "When", "Who", "Action", "Reason", "Tasks changed", "On", "Details"] {
                            th scope="col" { (heading) }
                        }
                    }
                }
                tbody { @for entry in &entries { (row(entry)) } }
            }
        }
        nav.paging aria-label="Pages" {
            @if before.is_some() { a href="/console/audit" { "Newest entries" } }
            @if let Some(older) = older { a href=(older) rel="next" { "Older entries" } }
        }
        }
    };
    Ok(layout::page(&caller, Nav::Audit, "Audit log", body))
}

fn row(entry: &AuditEntry) -> Markup {
    html! {
        tr {
            th scope="row" { (entry.id) }
            td { (layout::when(entry.at)) }
            td { (entry.actor) }
            td { (entry.action) }
            td { (layout::text_opt(entry.reason.as_deref())) }
            td.number { (entry.count) }
            td { (subject(entry)) }
            td {
                @match &entry.details {
                    Some(details) => code { (details.to_string()) },
                    None => (layout::dash()),
                }
            }
        }
    }
}

/// What an entry acted on: its task ids, or its filter (a link to the tasks it selects
/// now).
fn subject(entry: &AuditEntry) -> Markup {
    if let Some(ids) = &entry.ids {
        return html! {
            @for id in ids.iter().take(IDS_SHOWN) {
                a href=(format!("/console/tasks/{id}")) { (id) } " "
            }
            @if ids.len() > IDS_SHOWN { "and " (ids.len() - IDS_SHOWN) " more" }
        };
    }
    match &entry.filter {
        Some(value) => match serde_json::from_value::<TaskFilter>(value.clone()) {
            Ok(filter) => html! {
                "the filter " a href=(list_url(&filter, &[])) { (describe(&filter)) }
            },
            Err(_) => html! { code { (value.to_string()) } },
        },
        None => layout::dash(),
    }
}
