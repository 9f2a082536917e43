//! The task list: the filter form, one page of the tasks it selects (newest first), and
//! keyset paging (`after` = the last id of the page before).
//!
//! For an operate caller the table is a form ([`super::actions`]): a checkbox per row,
//! "select all on this page" (the script ticks them), "select all N that match this
//! filter" (N exact), and Retry / Discard / Resolve / Replay, each leading to its
//! confirm page. A read caller gets the same page without any of them.
//!
//! A search (text in key, value or headers) reads the newest tasks of the rest of the
//! filter only; the page says what it read, and offers the ticked tasks alone to act
//! on (the layer refuses an action by a search's filter).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};

use super::error::PageError;
use super::filter::{self, ListParams, DEFAULT_LIMIT};
use super::layout::{self, Nav};
use super::Shared;
use crate::config::Role;
use crate::operations::{Actor, Page, PageRequest};
use crate::store::{Searched, TaskSummary};

/// `GET /console/tasks`: the list.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(pairs) = query.map_err(|e| PageError::bad_request(e.body_text()))?;
    let params = filter::parse(&pairs, chrono::Utc::now()).map_err(PageError::bad_request)?;
    let filter = filter::params(&params.filter);
    let page_request = PageRequest {
        limit: Some(params.limit),
        after: params.after.map(|id| id.0),
    };
    let page = console.app.list(&filter, &page_request).await?;
    // "All that match" is for a filter: a search finds tasks to look at, and an action
    // on what it found acts on the ticked ones.
    let searching = params.filter.search.is_some();
    let matching = match caller.role {
        Role::Operate if searching => Some(Matching::Searched),
        Role::Operate => Some(Matching::Counted(
            console
                .app
                .count_up_to(
                    &[],
                    Some(&filter),
                    filter.is_empty(),
                    MATCHING_COUNTED_MAX,
                    MATCHING_COUNTED_WITHIN,
                )
                .await?,
        )),
        Role::Read => None,
    };
    let choices = super::overview::list_choices(&console, params.filter.handler.as_deref()).await;
    let counts = tab_counts(&console, &params.filter, &choices).await?;
    let cause = match params.filter.cause {
        Some(id) => Some(cause_banner(&console, id, params.filter.failed_after).await),
        None => None,
    };
    let now = chrono::Utc::now();
    let forced = &choices.forced_open;
    let body = html! {
        @if let Some(cause) = &cause { (cause) }
        (filter::form(&params, &choices, &counts))
        @if let Some(searched) = &page.searched { (searched_line(searched)) }
        @match matching {
            Some(matching) => {
                form #act method="post" action="/console/actions/preview" {
                    (actions(&params, matching))
                    (results(&params, &page, true, forced, now))
                }
            }
            None => (results(&params, &page, false, forced, now)),
        }
    };
    let title = match params.filter.cause {
        Some(id) => format!("Tasks of cause {id}"),
        None => "Tasks".to_owned(),
    };
    Ok(layout::page(&caller, Nav::Tasks, &title, body))
}

/// What the status tabs count: the fleet's figures (of the filter's handler) when the
/// filter narrows no further, read with the overview's; else the tasks of the filter in
/// each status (without its search), each counted up to [`MATCHING_COUNTED_MAX`] within
/// [`MATCHING_COUNTED_WITHIN`], all at once.
async fn tab_counts(
    console: &super::Console,
    filter: &crate::store::TaskFilter,
    choices: &super::filter::ListChoices,
) -> Result<filter::TabCounts, PageError> {
    use crate::store::TaskFilter;
    let narrowed = TaskFilter {
        status: Vec::new(),
        handler: None,
        search: None,
        ..filter.clone()
    } != TaskFilter::default();
    if !narrowed {
        return Ok(match choices.counts {
            Some((counts, at)) => filter::TabCounts {
                counts: counts.map(Some),
                said: format!(
                    "Counts: {}, at {}{}",
                    match &filter.handler {
                        Some(handler) => format!("every task of handler {handler}"),
                        None => "every task".to_owned(),
                    },
                    at.format("%H:%M:%S UTC"),
                    if filter.search.is_some() {
                        ", without the search"
                    } else {
                        ""
                    }
                ),
            },
            None => filter::TabCounts::default(),
        });
    }
    let counted = futures::future::try_join_all(filter::STATUSES.map(|status| {
        let one = filter::params(&TaskFilter {
            status: vec![status],
            search: None,
            ..filter.clone()
        });
        async move {
            console
                .app
                .count_up_to(
                    &[],
                    Some(&one),
                    false,
                    MATCHING_COUNTED_MAX,
                    MATCHING_COUNTED_WITHIN,
                )
                .await
        }
    }))
    .await?;
    let mut counts = [None; 4];
    for (slot, count) in counts.iter_mut().zip(counted) {
        *slot = count;
    }
    Ok(filter::TabCounts {
        counts,
        said: format!(
            "Counts: the tasks of this filter in each status{}; ? is more than {}, or not counted in time",
            if filter.search.is_some() { ", without the search" } else { "" },
            layout::thousands(MATCHING_COUNTED_MAX)
        ),
    })
}

/// The banner of a cause's list: its id, class, fingerprint and tasks not done (that
/// last failed since the list's `failed_after`, when it has one), its example message
/// on demand; or that no cause has this id.
async fn cause_banner(
    console: &super::Console,
    id: i64,
    window: Option<chrono::DateTime<chrono::Utc>>,
) -> Markup {
    let cause = match console.app.store().cause(id).await {
        Ok(Some(cause)) => cause,
        Ok(None) => {
            return html! {
                section.cause-banner.unknown aria-label="Cause" role="alert" {
                    p {
                        strong { "No cause has id " (id) "." }
                        " The ids are those What broke and " code { "redrive tasks groups" } " show. "
                        a href="/console/causes" { "Every cause →" }
                    }
                }
            }
        }
        Err(error) => {
            return html! {
                section.cause-banner aria-label="Cause" {
                    p { strong { "Cause " (id) } " · " span.error { "could not be read: " (error) } }
                }
            }
        }
    };
    let of_cause = crate::operations::FilterParams {
        cause: Some(id),
        failed_after: window.map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        ..Default::default()
    };
    let one = crate::operations::GroupParams {
        limit: Some(1),
        buckets: Some(1),
        ..Default::default()
    };
    let tasks = match console.app.groups(&of_cause, &one, false).await {
        Ok(groups) => Some(groups.total_tasks),
        Err(_) => None,
    };
    html! {
        section.cause-banner aria-label="Cause" {
            p {
                strong { "Cause " (id) }
                " · " code.class { (layout::visible(&cause.class)) }
                " · " span.fingerprint {
                    @if cause.fingerprint.trim().is_empty() { span.none { (super::broke::EMPTY_MESSAGE) } }
                    @else { (layout::visible(&cause.fingerprint)) }
                }
                @if let Some(tasks) = tasks {
                    " · " span.tasks {
                        (layout::counted(tasks, "task", "tasks")) " failed or given up"
                        @if let Some(since) = window { " that last failed since " (layout::when(since)) }
                    }
                }
                " · " a href="/console/causes" { "every cause →" }
            }
            details.example {
                summary { "Its example message" }
                pre.example {
                    @if cause.example.trim().is_empty() { (super::broke::EMPTY_MESSAGE) }
                    @else { (layout::visible(&cause.example)) }
                }
                @if let Some(first) = cause.first_seen {
                    p.meta { "First seen " (layout::when(first)) "." }
                }
            }
        }
    }
}

/// The action bar of an operate caller: what to select, and the verbs.
/// Most matching tasks the list page counts, and how long it may take; past either, it
/// offers "all that match" without a number and the confirm page's dry run gives the
/// exact count. Counting every match on each load read a million tasks (175 ms a page
/// unfiltered; 0.9 s for an error text).
const MATCHING_COUNTED_MAX: i64 = 10_000;
const MATCHING_COUNTED_WITHIN: std::time::Duration = std::time::Duration::from_millis(100);

/// What the action bar offers besides the ticked tasks.
enum Matching {
    /// Every task the filter selects, counted up to [`MATCHING_COUNTED_MAX`].
    Counted(Option<i64>),
    /// Nothing more: the list is a search's.
    Searched,
}

fn actions(params: &ListParams, matching: Matching) -> Markup {
    let searched = matches!(matching, Matching::Searched);
    html! {
        input type="hidden" name="filter" value=(filter::query(&params.filter));
        fieldset.actions {
            legend { "Act on tasks" }
            span.check {
                input #select-page type="checkbox" data-select-page;
                label for="select-page" { "Select all on this page" }
            }
            @match matching {
                Matching::Counted(counted) => {
                    span.check {
                        input #select-filter type="checkbox" name="scope" value="filter";
                        label for="select-filter" {
                            @match counted {
                                Some(n) => { "Select all " span.matching { (n) } " that match this filter" }
                                None => { "Select all that match this filter (the next page counts them)" }
                            }
                            @if params.filter.is_everything() { " (every task)" }
                        }
                    }
                }
                Matching::Searched => {
                    span.meta.search-acts { "A search acts on the tasks ticked (a replay needs a filter without search)." }
                }
            }
            span.buttons {
                @for (verb, label) in super::form::VERBS {
                    @if !(searched && verb == "replay") {
                        button type="submit" name="verb" value=(verb)
                            class=[(verb == "discard").then_some("danger")] { (label) "…" }
                    }
                }
            }
        }
    }
}

/// What a search read: every task of the filter, or the newest ones down to a task.
fn searched_line(searched: &Searched) -> Markup {
    let text = html! { "“" (layout::visible(&searched.text)) "”" };
    html! {
        p.searched role="status" {
            @match (searched.bounded, searched.down_to) {
                (true, Some(oldest)) => {
                    "Searched the newest " (layout::thousands(searched.scanned))
                    " tasks of the filter for " (text) " (keys, values, headers), down to task "
                    (oldest) "; older tasks were not searched: the next page goes on below it."
                }
                _ if searched.scanned == 0 => {
                    "The filter selects no task to search for " (text) "."
                }
                _ if searched.scanned == 1 => {
                    "Searched the 1 task of the filter for " (text) " (keys, values, headers)."
                }
                _ => {
                    "Searched all " (layout::thousands(searched.scanned)) " tasks of the filter for "
                    (text) " (keys, values, headers)."
                }
            }
        }
    }
}

fn results(
    params: &ListParams,
    page: &Page<TaskSummary>,
    selectable: bool,
    forced_open: &[String],
    now: chrono::DateTime<chrono::Utc>,
) -> Markup {
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
        section.results aria-labelledby="results" {
            h2 #results {
                @if params.filter.is_everything() { "Every task" } @else { "Tasks that match" }
                @if let Some(after) = params.after { ", older than task " (after) }
            }
            @if page.items.is_empty() {
                p.empty { "No task matches." }
            } @else {
                table.tasks {
                    caption { (layout::counted(page.items.len() as i64, "task", "tasks")) ", newest first" }
                    thead {
                        tr {
                            @for heading in ["Task", "Status", "Handler", "Route", "Source", "Key",
                                             "Attempts", "Next attempt", "Last error", "Changed"] {
                                th scope="col" { (heading) }
                            }
                            @if selectable { th scope="col" { "Select" } }
                        }
                    }
                    tbody {
                        @for task in &page.items { (row(task, selectable, forced_open, now)) }
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

/// One task, on one line: a long key or error is cut with an ellipsis, whole in its
/// title, and a click on it shows it whole (the script); whole as the list reads it,
/// that is: the store's summary has an error's and a key's first bytes, the task's page
/// all of them. A task whose handler's breaker is forced open waits until it is
/// released, whatever its next attempt's time says.
fn row(
    task: &TaskSummary,
    selectable: bool,
    forced_open: &[String],
    now: chrono::DateTime<chrono::Utc>,
) -> Markup {
    let behind_breaker =
        task.status == crate::task::Status::Failed && forced_open.contains(&task.handler);
    let key = task.key.as_deref().map(layout::visible);
    let error = task.last_error.as_deref().map(layout::visible);
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
            td.key {
                @match &key {
                    Some(key) => span.cut title=(key) data-expand { (key) },
                    None => (layout::dash()),
                }
            }
            td.number { (task.attempts) }
            td {
                @if task.held { "held" }
                @else if task.lease_owner.is_some() { "running" }
                @else if behind_breaker {
                    span.held-breaker title="An operator forced its handler's breaker open: nothing runs until it is released" {
                        "held: breaker forced open (until released)"
                    }
                }
                @else if let Some(due) = task.next_attempt_at { (layout::relative(due, now)) }
                @else { (layout::dash()) }
            }
            td.error {
                @match &error {
                    Some(error) => span.cut title=(error) data-expand { (error) },
                    None => (layout::dash()),
                }
            }
            td { (layout::ago(task.updated_at, now)) }
            @if selectable {
                td.select {
                    input type="checkbox" name="id" value=(task.id)
                        id=(format!("select-{}", task.id)) aria-label=(format!("Select task {}", task.id));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskId;

    #[test]
    fn the_searched_line_says_what_was_read() {
        let mut searched = Searched {
            text: "<b>blue</b>".into(),
            scanned: 100_000,
            bound: 100_000,
            bounded: true,
            down_to: Some(TaskId(4711)),
        };
        let bounded = searched_line(&searched).into_string();
        assert!(
            bounded.contains(
                "Searched the newest 100,000 tasks of the filter for “&lt;b&gt;blue&lt;/b&gt;” \
                 (keys, values, headers), down to task 4711; older tasks were not searched"
            ),
            "{bounded}"
        );
        searched.bounded = false;
        searched.scanned = 3;
        let all = searched_line(&searched).into_string();
        assert!(all.contains("Searched all 3 tasks of the filter"), "{all}");
    }
}
