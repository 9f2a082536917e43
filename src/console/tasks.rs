//! The task list: the filter form, one page of the tasks it selects (newest first), and
//! keyset paging (`after` = the last id of the page before).
//!
//! **Actions, next round**: for an operate caller, a checkbox per row, "select all that
//! match the filter" (with the exact count), and the bulk retry / discard / resolve /
//! replay form (count and sample before confirming, a required reason) go above the
//! table, over the operations layer. A read caller gets the same page without them.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};

use super::error::PageError;
use super::filter::{self, ListParams, DEFAULT_LIMIT};
use super::layout::{self, Nav};
use super::Shared;
use crate::operations::Actor as Caller;
use crate::operations::Page;
use crate::store::TaskSummary;

/// `GET /console/tasks`: the list.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Caller>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(pairs) = query.map_err(|e| PageError::bad_request(e.body_text()))?;
    let params = filter::parse(&pairs, chrono::Utc::now()).map_err(PageError::bad_request)?;
    let tasks = (console.app.store())
        .list(&params.filter, params.after, params.limit)
        .await?;
    let page = Page::after(tasks, params.limit, |task| task.id.0);
    let body = html! {
        (filter::form(&params))
        (results(&params, &page))
    };
    Ok(layout::page(&caller, Nav::Tasks, "Tasks", body))
}

fn results(params: &ListParams, page: &Page<TaskSummary>) -> Markup {
    let mut more = Vec::new();
    if params.limit != DEFAULT_LIMIT {
        more.push(("limit", params.limit.to_string()));
    }
    let first = filter::list_url(&params.filter, &more);
    let next = page.next_cursor.map(|cursor| {
        let mut with_cursor = more.clone();
        with_cursor.push(("after", cursor.to_string()));
        filter::list_url(&params.filter, &with_cursor)
    });
    html! {
        section aria-labelledby="results" {
            h2 #results {
                @if params.filter.is_everything() { "Every task" } @else { "Tasks that match" }
                @if let Some(after) = params.after { ", older than task " (after) }
            }
            @if page.items.is_empty() {
                p.empty { "No task matches." }
            } @else {
                table.tasks {
                    caption { (page.items.len()) " tasks, newest first" }
                    thead {
                        tr {
                            @for heading in ["Task", "Status", "Handler", "Route", "Source", "Key",
                                             "Attempts", "Next attempt", "Last error", "Changed"] {
                                th scope="col" { (heading) }
                            }
                        }
                    }
                    tbody {
                        @for task in &page.items { (row(task)) }
                    }
                }
            }
            nav.paging aria-label="Pages" {
                @if params.after.is_some() { a href=(first) { "First page" } }
                @if let Some(next) = next { a href=(next) rel="next" { "Next page" } }
            }
        }
    }
}

fn row(task: &TaskSummary) -> Markup {
    let source = task.topic.as_ref().map(|topic| {
        let at = |n: Option<i64>| n.map_or("?".to_owned(), |n| n.to_string());
        format!(
            "{topic}[{}]@{}",
            at(task.partition.map(i64::from)),
            at(task.offset)
        )
    });
    html! {
        tr {
            td { a href=(format!("/console/tasks/{}", task.id)) { (task.id) } }
            td { (layout::status(task.status)) }
            td { (task.handler) }
            td { (layout::text_opt(task.route.as_deref())) }
            td { (layout::text_opt(source.as_deref())) }
            td.key { (layout::text_opt(task.key.as_deref())) }
            td.number { (task.attempts) }
            td {
                @if task.status.is_final() { (layout::dash()) }
                @else { (layout::when(task.next_attempt_at)) }
            }
            td.error { (layout::text_opt(task.last_error.as_deref())) }
            td { (layout::when(task.updated_at)) }
        }
    }
}
