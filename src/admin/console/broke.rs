//! What broke: the biggest causes of the tasks not done (failed and given up), one
//! compact row each: class, fingerprint (and an example message, muted, under it),
//! tasks, a trend (inline SVG bars, classes only, on one scale for every row), first
//! and last seen, handlers, and a link to the cause's tasks. The overview shows the
//! [`SHOWN`] biggest ([`section`]); the causes page ([`super::causes`]) shows them all,
//! or the groups by class, handler, route or topic, with the same [`table`].
//!
//! The groups are read with the overview's other figures; a refused or failed reading
//! is said in the section, and the rest of the overview shows as usual.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::filter::list_url;
use super::layout::{self, counted, thousands};
use crate::store::{Group, GroupBy, Groups, TaskFilter};
use crate::task::Status;

/// Causes the overview lists, biggest first.
pub(crate) const SHOWN: i64 = 10;
/// Characters of a fingerprint shown in the row (all of it in its title).
const FINGERPRINT_SHOWN: usize = 90;
/// Characters of an example message shown under it (all of it in its title).
const EXAMPLE_SHOWN: usize = 120;
/// A trend bar's width and the trend's height, in SVG units.
const BAR: i64 = 6;
const HEIGHT: i64 = 18;
/// What a blank message is shown as.
pub(crate) const EMPTY_MESSAGE: &str = "(empty message)";

/// The task list of one cause's tasks not done.
pub(crate) fn cause_url(cause: i64) -> String {
    list_url(&not_done(cause_filter(cause)), &[])
}

fn cause_filter(cause: i64) -> TaskFilter {
    TaskFilter {
        cause: Some(cause),
        ..TaskFilter::default()
    }
}

/// `filter`'s tasks not done.
fn not_done(filter: TaskFilter) -> TaskFilter {
    TaskFilter {
        status: vec![Status::Failed, Status::PermanentFailure],
        ..filter
    }
}

/// Where a group's row leads: its tasks not done (a cause, a handler, a route, a
/// topic), or a class's causes; nowhere for tasks without one (no route, a cause not
/// yet set), which no filter selects alone. A list keeps the groups' `filter` (the
/// window, the handler, ...), so that it lists what the row counts.
fn group_url(by: GroupBy, group: &Group, filter: &TaskFilter) -> Option<(String, &'static str)> {
    let key = group.key.clone()?;
    let listed = |narrowed: TaskFilter| list_url(&narrowed, &[]);
    Some(match by {
        GroupBy::Cause => (
            listed(TaskFilter {
                cause: Some(group.cause.as_ref()?.id),
                ..filter.clone()
            }),
            "tasks →",
        ),
        // A blank class (a row written by hand: ingest says `unclassified`) has no
        // address of its own: `?class=` is every class.
        GroupBy::Class if key.trim().is_empty() => return None,
        GroupBy::Class => (super::cause_query::class_url(&key), "causes →"),
        GroupBy::Handler => (
            listed(TaskFilter {
                handler: Some(key),
                ..filter.clone()
            }),
            "tasks →",
        ),
        GroupBy::Route => (
            listed(TaskFilter {
                route: Some(key),
                ..filter.clone()
            }),
            "tasks →",
        ),
        GroupBy::Topic => (
            listed(TaskFilter {
                topic: Some(key),
                ..filter.clone()
            }),
            "tasks →",
        ),
    })
}

/// The overview's section, for `groups` read at `now` (or why they could not be), with
/// a link to every cause when it lists only the biggest.
pub(crate) fn section(groups: &Result<Groups, String>, now: DateTime<Utc>) -> Markup {
    html! {
        section.broke aria-labelledby="broke" {
            h2 #broke { "What broke" }
            @match groups {
                Err(error) => p.error role="alert" { "The causes could not be read: " (error) }
                Ok(groups) if groups.groups.is_empty() => {
                    p.empty { "Nothing is broken: no task is failed or given up." }
                }
                Ok(groups) => {
                    p.meta {
                        (counted(groups.total_tasks, "task", "tasks")) " failed or given up, "
                        (thousands(groups.total_groups))
                        @if groups.total_groups == 1 { " cause. " } @else { " causes. " }
                        span.counted { "Counted " (layout::ago(groups.counted_at, now)) ". " }
                        @if groups.total_groups > groups.groups.len() as i64 {
                            "The biggest " (groups.groups.len()) " below; "
                            a.all-causes href="/console/causes" {
                                "all " (thousands(groups.total_groups)) " causes →"
                            }
                        } @else {
                            a.all-causes href="/console/causes?by=class" {
                                "By class, handler, route or topic →"
                            }
                        }
                    }
                    (table(groups, now))
                }
            }
        }
    }
}

/// The heading of a grouping's key column.
fn key_heading(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Cause | GroupBy::Class => "Class",
        GroupBy::Handler => "Handler",
        GroupBy::Route => "Route",
        GroupBy::Topic => "Topic",
    }
}

/// The groups as a table, one row each, their trends on one scale.
pub(crate) fn table(groups: &Groups, now: DateTime<Utc>) -> Markup {
    let buckets = groups.groups.first().map_or(0, |g| g.trend.len()) as u64;
    let span = groups.bucket_seconds * buckets;
    let highest = groups
        .groups
        .iter()
        .flat_map(|g| g.trend.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let by = groups.by;
    let scale = format!(
        "Tasks failing per {}; every row's bars on one scale, the tallest {}",
        layout::age(groups.bucket_seconds as f64),
        thousands(highest)
    );
    html! {
        table.broke data-by=(by.as_str()) {
            thead {
                tr {
                    @if by == GroupBy::Cause { th scope="col" class="number" title="What --cause and ?cause= take" { "ID" } }
                    th scope="col" { (key_heading(by)) }
                    @if by == GroupBy::Cause { th scope="col" { "Fingerprint" } }
                    th scope="col" class="number" { "Tasks" }
                    th scope="col" title=(scale) { (span_words(span)) }
                    th scope="col" { "First seen" }
                    th scope="col" { "Last seen" }
                    th scope="col" { @if by == GroupBy::Handler { "Routes" } @else { "Handlers" } }
                    th scope="col" { span.visually-hidden { "Tasks of the group" } }
                }
            }
            tbody {
                @for group in &groups.groups {
                    (row(by, group, groups.bucket_seconds, highest, &groups.filter, now))
                }
            }
        }
    }
}

/// A message's text, or [`EMPTY_MESSAGE`] when it is blank.
fn message(text: &str, most: usize) -> Markup {
    if text.trim().is_empty() {
        return html! { span.none.empty-message { (EMPTY_MESSAGE) } };
    }
    html! { (cut(&layout::visible(text), most)) }
}

/// An example message, muted under the group's name (whole in its title); none when
/// it says no more than the fingerprint.
fn example(text: Option<&str>, fingerprint: Option<&str>) -> Markup {
    match text {
        Some(text) if !matches!(fingerprint, Some(f) if f.trim() == text.trim()) => html! {
            span.example title=(layout::visible(text)) {
                span.visually-hidden { "For example: " }
                (message(text, EXAMPLE_SHOWN))
            }
        },
        _ => html! {},
    }
}

fn row(
    by: GroupBy,
    group: &Group,
    bucket_seconds: u64,
    highest: i64,
    filter: &TaskFilter,
    now: DateTime<Utc>,
) -> Markup {
    let spans = match by {
        GroupBy::Handler => &group.routes,
        _ => &group.handlers,
    };
    html! {
        tr {
            @match (by, &group.cause) {
                (GroupBy::Cause, Some(cause)) => {
                    td.id.number { (cause.id) }
                    td.class { code { (layout::visible(&cause.class)) } }
                    td.fingerprint title=[(!cause.fingerprint.trim().is_empty()).then(|| layout::visible(&cause.fingerprint))] {
                        span.print { (message(&cause.fingerprint, FINGERPRINT_SHOWN)) }
                        (example(Some(&cause.example), Some(&cause.fingerprint)))
                    }
                }
                (GroupBy::Cause, None) => {
                    td.id.number { (layout::dash()) }
                    td.class { (layout::dash()) }
                    td.fingerprint { span.none { "no cause yet (stored before causes)" } }
                }
                (_, _) => {
                    td.class {
                        @match &group.key {
                            Some(key) if by == GroupBy::Class => code { (layout::visible(key)) },
                            Some(key) => span.name { (layout::visible(key)) },
                            None => span.none { (none_words(by)) },
                        }
                        (example(group.example_error.as_deref(), None))
                    }
                }
            }
            td.number { (thousands(group.tasks)) }
            td.trend { (trend(&group.trend, bucket_seconds, highest)) }
            td.seen { (ago_opt(group.first_seen.or(group.cause.as_ref().and_then(|c| c.first_seen)), now)) }
            td.seen { (ago_opt(group.last_seen, now)) }
            td.handlers {
                @if spans.is_empty() { (layout::dash()) }
                @else { (layout::visible(&spans.join(", "))) }
            }
            td.go {
                @if let Some((url, words)) = group_url(by, group, filter) {
                    a href=(url) aria-label=(go_label(by, group)) { (words) }
                }
            }
        }
    }
}

/// What a group without a key holds.
fn none_words(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Cause | GroupBy::Class => "no cause yet (stored before causes)",
        GroupBy::Handler => "no handler",
        GroupBy::Route => "no route",
        GroupBy::Topic => "no topic",
    }
}

/// The link's words for a reader that hears them out of the row.
fn go_label(by: GroupBy, group: &Group) -> String {
    let key = layout::visible(group.key.as_deref().unwrap_or_default());
    match by {
        GroupBy::Cause => format!(
            "Tasks of cause {}",
            group.cause.as_ref().map_or(0, |c| c.id)
        ),
        GroupBy::Class => format!("Causes of class {key}"),
        other => format!("Tasks of {} {key}", other.as_str()),
    }
}

/// The trend's span as a column heading: `Last hour`, `Last 6 h`, `Last day`.
fn span_words(seconds: u64) -> String {
    match seconds {
        3600 => "Last hour".to_owned(),
        86_400 => "Last day".to_owned(),
        s if s % 86_400 == 0 => format!("Last {} d", s / 86_400),
        s if s % 3600 == 0 => format!("Last {} h", s / 3600),
        s => format!("Last {}", layout::age(s as f64)),
    }
}

fn ago_opt(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Markup {
    match at {
        Some(at) => layout::ago(at, now),
        None => layout::dash(),
    }
}

/// `text` cut to `most` characters, with an ellipsis when cut.
fn cut(text: &str, most: usize) -> String {
    match text.char_indices().nth(most) {
        Some((end, _)) => format!("{}…", text[..end].trim_end()),
        None => text.to_owned(),
    }
}

/// The trend as bars, oldest first, scaled to `highest` (the busiest bucket of every
/// row shown, so that rows compare); an empty bucket is a baseline tick.
fn trend(counts: &[i64], bucket_seconds: u64, highest: i64) -> Markup {
    let highest = highest.max(1);
    let width = BAR * counts.len() as i64;
    let said: Vec<String> = counts.iter().map(|n| thousands(*n)).collect();
    let label = format!(
        "Tasks failing per {}, oldest first: {} (every row on one scale, the tallest {})",
        layout::age(bucket_seconds as f64),
        said.join(", "),
        thousands(highest)
    );
    html! {
        svg.spark viewBox={ "0 0 " (width) " " (HEIGHT) } width=(width * 2) height=(HEIGHT)
            preserveAspectRatio="none" role="img" aria-label=(label) {
            title { (label) }
            @for (i, count) in counts.iter().enumerate() {
                @let x = i as i64 * BAR;
                @if *count > 0 {
                    @let height = (count.saturating_mul(HEIGHT - 1) / highest).clamp(2, HEIGHT - 1);
                    rect.bar x=(x + 1) y=(HEIGHT - height) width=(BAR - 2) height=(height) {}
                } @else {
                    rect.zero x=(x + 1) y=(HEIGHT - 1) width=(BAR - 2) height="1" {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CauseView, GroupBy};

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn groups(fingerprint: &str) -> Groups {
        Groups {
            by: GroupBy::Cause,
            statuses: vec![Status::Failed, Status::PermanentFailure],
            groups: vec![Group {
                key: Some("7".into()),
                cause: Some(CauseView {
                    id: 7,
                    class: "<b>Timeout</b>".into(),
                    fingerprint: fingerprint.into(),
                    example: "x".into(),
                    first_seen: Some(at("2026-12-03T10:00:00Z")),
                }),
                tasks: 1234,
                first_seen: None,
                last_seen: Some(at("2026-12-03T11:57:00Z")),
                trend: vec![0, 0, 3, 1],
                handlers: vec!["orders".into(), "billing".into()],
                routes: vec![],
                example_task: None,
                example_error: None,
            }],
            total_groups: 1,
            total_tasks: 1234,
            trend_start: at("2026-12-03T11:00:00Z"),
            bucket_seconds: 900,
            filter: not_done(TaskFilter::default()),
            counted_at: at("2026-12-03T11:59:00Z"),
        }
    }

    /// Found by an attack: under a window, a row counted the tasks that failed within it
    /// and linked to every task of its cause.
    #[test]
    fn a_row_under_a_window_links_the_tasks_it_counts() {
        let mut windowed = groups("order <n> not found");
        windowed.filter.failed_after = Some(at("2026-12-03T11:00:00.250Z"));
        let html = table(&windowed, at("2026-12-03T12:00:00Z")).into_string();
        let link = html.split("td class=\"go\"><a href=\"").nth(1).unwrap();
        let link = &link[..link.find('"').unwrap()];
        assert!(link.contains("cause=7"), "{link}");
        assert!(
            link.contains("failed_after=2026-12-03T11%3A00%3A00.250Z"),
            "{link}"
        );
    }

    #[test]
    fn a_cause_row_escapes_cuts_and_links() {
        let long = format!("<script>alert(1)</script> {}", "y".repeat(200));
        let html = section(&Ok(groups(&long)), at("2026-12-03T12:00:00Z")).into_string();
        // The id an operator types (`--cause 7`) is in its own column.
        assert!(html.contains("<td class=\"id number\">7</td>"), "{html}");
        assert!(
            !html.contains("<script>") && !html.contains("<b>"),
            "{html}"
        );
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(html.contains(&format!(
            "title=\"&lt;script&gt;alert(1)&lt;/script&gt; {}\"",
            "y".repeat(200)
        )));
        assert!(html.contains("…</span>"), "cut with an ellipsis: {html}");
        assert!(
            html.contains(
                "href=\"/console/tasks?status=failed&amp;status=permanent_failure&amp;cause=7\""
            ),
            "{html}"
        );
        assert!(html.contains("1,234"), "{html}");
        assert!(
            html.contains("3 min ago") && html.contains("2 h ago"),
            "{html}"
        );
        assert!(html.contains("orders, billing"), "{html}");
        assert_eq!(html.matches("<rect class=\"bar\"").count(), 2, "{html}");
        assert!(!html.contains("style="), "colours come from the stylesheet");
    }

    /// Found by a review: a 1-task cause's bars were as tall as a 605-task one's.
    #[test]
    fn every_rows_bars_are_on_one_scale() {
        let mut two = groups("x");
        two.groups[0].trend = vec![0, 605];
        let mut small = two.groups[0].clone();
        small.trend = vec![1, 0];
        small.tasks = 1;
        two.groups.push(small);
        let html = table(&two, at("2026-12-03T12:00:00Z")).into_string();
        let heights: Vec<&str> = html
            .split("<rect class=\"bar\"")
            .skip(1)
            .map(|r| {
                r.split("height=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
            })
            .collect();
        assert_eq!(heights, ["17", "2"], "{html}");
        assert!(html.contains("the tallest 605"), "{html}");
    }

    /// Found by a review: a blank message was an empty cell, and the example message a
    /// cause was named after was nowhere.
    #[test]
    fn a_blank_message_is_said_and_the_example_is_under_the_fingerprint() {
        let now = at("2026-12-03T12:00:00Z");
        let mut blank = groups("  ");
        blank.groups[0].cause.as_mut().unwrap().example = " ".into();
        let html = section(&Ok(blank), now).into_string();
        assert!(html.contains("(empty message)"), "{html}");
        assert!(!html.contains("class=\"example\""), "{html}");

        let mut example = groups("timed out after <n> ms");
        example.groups[0].cause.as_mut().unwrap().example = "timed out after 30001 ms".into();
        let html = section(&Ok(example.clone()), now).into_string();
        assert!(
            html.contains("title=\"timed out after 30001 ms\"")
                && html.contains("For example: </span>timed out after 30001 ms</span>"),
            "{html}"
        );
        example.groups[0].cause.as_mut().unwrap().example = "timed out after <n> ms".into();
        let html = section(&Ok(example), now).into_string();
        assert!(!html.contains("For example"), "the same words once: {html}");
    }

    /// Found by a review: "16 causes; the 10 biggest:" led nowhere.
    #[test]
    fn the_overview_links_every_cause_when_it_lists_the_biggest() {
        let now = at("2026-12-03T12:00:00Z");
        let mut many = groups("x");
        many.total_groups = 1_616;
        let html = section(&Ok(many), now).into_string();
        assert!(
            html.contains("The biggest 1 below; <a class=\"all-causes\" href=\"/console/causes\">all 1,616 causes →</a>"),
            "{html}"
        );
    }

    #[test]
    fn other_groupings_name_their_key_and_link_its_tasks() {
        let now = at("2026-12-03T12:00:00Z");
        let mut by = groups("x");
        by.by = GroupBy::Handler;
        by.groups[0].cause = None;
        by.groups[0].key = Some("orders".into());
        by.groups[0].routes = vec!["r1".into()];
        by.groups[0].example_error = Some("boom 7".into());
        let html = table(&by, now).into_string();
        assert!(html.contains("<th scope=\"col\">Handler</th>"), "{html}");
        assert!(html.contains("<th scope=\"col\">Routes</th>"), "{html}");
        assert!(
            html.contains("href=\"/console/tasks?status=failed&amp;status=permanent_failure&amp;handler=orders\""),
            "{html}"
        );
        assert!(html.contains("boom 7"), "{html}");
        // Found by an attack: an escape character reached the link's spoken label.
        by.groups[0].key = Some("ord\u{1b}[31mers".into());
        let html = table(&by, now).into_string();
        assert!(!html.contains('\u{1b}'), "{html}");
        assert!(
            html.contains("aria-label=\"Tasks of handler ord\\u{001B}[31mers\""),
            "{html}"
        );
        by.by = GroupBy::Class;
        by.groups[0].key = Some("java.io.IOException".into());
        let html = table(&by, now).into_string();
        assert!(
            html.contains("href=\"/console/causes?class=java.io.IOException\""),
            "{html}"
        );
        by.groups[0].key = Some(" ".into());
        let html = table(&by, now).into_string();
        assert!(
            !html.contains("causes →"),
            "a blank class links nowhere: {html}"
        );
        by.by = GroupBy::Route;
        by.groups[0].key = None;
        let html = table(&by, now).into_string();
        assert!(
            html.contains("no route") && !html.contains("tasks →"),
            "{html}"
        );
    }

    #[test]
    fn no_cause_or_an_error_is_said() {
        let mut none = groups("x");
        none.groups.clear();
        let now = at("2026-12-03T12:00:00Z");
        assert!(section(&Ok(none), now)
            .into_string()
            .contains("Nothing is broken"));
        let failed = section(&Err("timeout <x>".into()), now).into_string();
        assert!(
            failed.contains("could not be read: timeout &lt;x&gt;"),
            "{failed}"
        );
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(span_words(3600), "Last hour");
        assert_eq!(span_words(6 * 3600), "Last 6 h");
        assert_eq!(span_words(90), "Last 1 min 30 s");
    }
}
