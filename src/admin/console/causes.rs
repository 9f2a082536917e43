//! Every cause: the page the overview's What broke leads to when it lists only the
//! biggest ("all N causes →"). The tasks not done (failed and given up), grouped by
//! cause, class, handler, route or topic, failed within the last hour, day, week or any
//! time; up to [`MAX_GROUPS`] groups, biggest first, in What broke's table
//! ([`super::broke::table`]). A class's row leads to its causes (`?class=`), every
//! other row to its tasks.
//!
//! A grouping reads every task not done: it is shared for a few seconds by every page
//! and API caller asking the same, and its count takes one of the member's heavy-read
//! slots (all busy: 429), as the overview's does.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};

use super::broke;
use super::cause_query::{parse, url, CausesParams, SINCE};
use super::error::PageError;
use super::layout::{self, counted, thousands, Nav};
use super::Shared;
use crate::operations::{Actor, FilterParams, GroupParams};
use crate::store::{GroupBy, Groups, MAX_GROUPS};

/// `GET /console/causes`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(pairs) = query.map_err(|e| PageError::bad_request(e.body_text()))?;
    let params = parse(&pairs).map_err(PageError::bad_request)?;
    let (_, _, trend, buckets) = SINCE
        .iter()
        .find(|(s, ..)| *s == params.since)
        .copied()
        .unwrap_or(SINCE[3]);
    let group = GroupParams {
        by: Some(params.by.as_str().to_owned()),
        since: (params.since != "all").then(|| params.since.to_owned()),
        trend: Some(trend.to_owned()),
        buckets: Some(buckets),
        limit: Some(MAX_GROUPS),
    };
    let groups = (console.app)
        .groups(&FilterParams::default(), &group, false)
        .await?;
    let now = chrono::Utc::now();
    let title = match (&params.class, params.by) {
        (Some(class), _) => format!("What broke: the causes of {}", layout::visible(class)),
        (None, GroupBy::Cause) => "What broke: every cause".to_owned(),
        (None, by) => format!("What broke, by {}", by.as_str()),
    };
    let body = html! {
        (choices(&params))
        section.broke.every aria-labelledby="groups" {
            h2 #groups.visually-hidden { "Groups" }
            (listed(&params, groups, now))
        }
    };
    Ok(layout::page(&caller, Nav::Causes, &title, body))
}

/// The groupings and the spans, each a link (the current one marked).
fn choices(params: &CausesParams) -> Markup {
    let groupings = GroupBy::ALL.map(|(name, by)| {
        let to = CausesParams {
            by,
            class: None,
            ..params.clone()
        };
        (name, url(&to), by == params.by && params.class.is_none())
    });
    let spans = SINCE.map(|(since, words, ..)| {
        let to = CausesParams {
            since,
            ..params.clone()
        };
        (words, url(&to), since == params.since)
    });
    html! {
        nav.group-choices aria-label="Grouping" {
            span.label { "Group by" }
            @for (name, href, current) in groupings {
                a id=(format!("by-{name}")) href=(href) aria-current=[current.then_some("page")] { (name) }
            }
        }
        nav.group-choices aria-label="Failed within" {
            span.label { "Failed within" }
            @for (words, href, current) in spans {
                @let id = format!("since-{}", words.replace(' ', "-"));
                a id=(id) href=(href) aria-current=[current.then_some("page")] { (words) }
            }
        }
        @if let Some(class) = &params.class {
            p.meta.class-only {
                "The causes of class " code { (layout::visible(class)) } " only. "
                a href=(url(&CausesParams { class: None, ..params.clone() })) { "Every cause" }
            }
        }
    }
}

/// What was read, and the table.
fn listed(params: &CausesParams, mut groups: Groups, now: chrono::DateTime<chrono::Utc>) -> Markup {
    let within = SINCE
        .iter()
        .find(|(s, ..)| *s == params.since)
        .map_or("", |(_, words, ..)| *words);
    let looked_through = groups.total_groups;
    if let Some(class) = &params.class {
        groups
            .groups
            .retain(|g| g.cause.as_ref().is_some_and(|c| &c.class == class));
        groups.total_groups = groups.groups.len() as i64;
        groups.total_tasks = groups.groups.iter().map(|g| g.tasks).sum();
    }
    let name = match params.by {
        GroupBy::Cause => ("cause", "causes"),
        GroupBy::Class => ("class", "classes"),
        GroupBy::Handler => ("handler", "handlers"),
        GroupBy::Route => ("route", "routes"),
        GroupBy::Topic => ("topic", "topics"),
    };
    html! {
        p.meta {
            (counted(groups.total_tasks, "task", "tasks")) " failed or given up"
            @if params.since != "all" { " within the " (within) }
            ", " (thousands(groups.total_groups)) " "
            @if groups.total_groups == 1 { (name.0) } @else { (name.1) }
            @if groups.total_groups > groups.groups.len() as i64 {
                "; the " (thousands(groups.groups.len() as i64)) " biggest (at most " (MAX_GROUPS) ")"
            }
            ". " span.counted { "Counted " (layout::ago(groups.counted_at, now)) "." }
            @if params.class.is_some() && looked_through > MAX_GROUPS {
                " Looked for among the " (MAX_GROUPS) " biggest causes of " (thousands(looked_through)) "."
            }
        }
        @if groups.groups.is_empty() {
            p.empty {
                @if params.since == "all" { "Nothing is broken: no task is failed or given up." }
                @else { "No task failed within the " (within) " is failed or given up now." }
            }
        } @else {
            (broke::table(&groups, now))
        }
    }
}
