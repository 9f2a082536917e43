//! Every cause: the page the overview's What broke leads to when it lists only the
//! biggest ("all N causes →"). The tasks not done (failed and given up), grouped by
//! cause, class, handler, route or topic, failed within the last hour, day, week or any
//! time; up to [`MAX_GROUPS`] groups, biggest first, in What broke's table
//! ([`super::broke::table`]). A class's row leads to its causes (`?class=`), every
//! other row to its tasks.
//!
//! A grouping reads every task not done, so the page takes one of the API's heavy-read
//! slots, as the overview does.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};

use super::broke;
use super::error::PageError;
use super::layout::{self, counted, thousands, Nav};
use super::Shared;
use crate::operations::{Actor, FilterParams, GroupParams};
use crate::store::{GroupBy, Groups, MAX_GROUPS};

/// The spans offered: the parameter, its words, the trend's span and buckets.
const SINCE: [(&str, &str, &str, u32); 4] = [
    ("1h", "last hour", "1h", 12),
    ("1d", "last day", "1d", 24),
    ("7d", "last 7 days", "7d", 28),
    ("all", "any time", "1h", 12),
];

/// What the page shows: a grouping, a span, and a class whose causes alone are listed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CausesParams {
    by: GroupBy,
    since: &'static str,
    class: Option<String>,
}

impl Default for CausesParams {
    fn default() -> Self {
        CausesParams {
            by: GroupBy::Cause,
            since: "all",
            class: None,
        }
    }
}

/// Reads the query; an unknown or repeated parameter, grouping or span is refused.
fn parse(pairs: &[(String, String)]) -> Result<CausesParams, String> {
    let mut params = CausesParams::default();
    let mut seen = std::collections::HashSet::new();
    for (name, value) in pairs {
        if !seen.insert(name.as_str()) {
            return Err(format!("give {name} once"));
        }
        let value = value.trim();
        match name.as_str() {
            "by" => params.by = value.parse()?,
            "since" => {
                params.since = SINCE
                    .iter()
                    .find(|(s, ..)| *s == value)
                    .map(|(s, ..)| *s)
                    .ok_or_else(|| format!("since is 1h, 1d, 7d or all (got {value:?})"))?
            }
            "class" if !value.is_empty() => params.class = Some(value.to_owned()),
            "class" => {}
            other => return Err(format!("unknown parameter {other:?} (by, since, class)")),
        }
    }
    if params.class.is_some() && params.by != GroupBy::Cause {
        return Err("class lists the causes of a class: leave by out (or by=cause)".into());
    }
    Ok(params)
}

/// This page's address for `params`.
fn url(params: &CausesParams) -> String {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    if params.by != GroupBy::Cause {
        pairs.push(("by", params.by.as_str()));
    }
    if params.since != "all" {
        pairs.push(("since", params.since));
    }
    if let Some(class) = &params.class {
        pairs.push(("class", class));
    }
    match serde_urlencoded::to_string(&pairs) {
        Ok(query) if !query.is_empty() => format!("/console/causes?{query}"),
        _ => "/console/causes".to_owned(),
    }
}

/// The causes of class `class`.
pub(crate) fn class_url(class: &str) -> String {
    url(&CausesParams {
        class: Some(class.to_owned()),
        ..CausesParams::default()
    })
}

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
    let groups = {
        let Ok(_slot) = console.heavy.try_acquire() else {
            return Err(PageError::too_many(
                "the heavy reads (stats, check, groups) of this member are all running; \
                 try again in a few seconds",
                5,
            ));
        };
        console.app.groups(&FilterParams::default(), &group).await?
    };
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
            "."
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_query_reads_and_goes_back_into_the_same_address() {
        assert_eq!(parse(&[]).unwrap(), CausesParams::default());
        let params = parse(&pairs(&[("by", "handler"), ("since", "1d")])).unwrap();
        assert_eq!((params.by, params.since), (GroupBy::Handler, "1d"));
        assert_eq!(url(&params), "/console/causes?by=handler&since=1d");
        assert_eq!(
            parse(&pairs(&[("by", "handler"), ("since", "1d")])),
            Ok(params)
        );
        assert_eq!(url(&CausesParams::default()), "/console/causes");
        assert_eq!(class_url("a b&c"), "/console/causes?class=a+b%26c");
        let class = parse(&pairs(&[("class", "a b&c")])).unwrap();
        assert_eq!(class.class.as_deref(), Some("a b&c"));
        for (query, says) in [
            (vec![("by", "colour")], "colour"),
            (vec![("since", "2h")], "since"),
            (vec![("limit", "5")], "limit"),
            (vec![("by", "cause"), ("by", "class")], "once"),
            (vec![("by", "class"), ("class", "X")], "class"),
        ] {
            let error = parse(&pairs(&query)).unwrap_err();
            assert!(error.contains(says), "{query:?}: {error}");
        }
    }
}
