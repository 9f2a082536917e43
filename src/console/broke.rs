//! The overview's "What broke": the biggest causes of the tasks not done (failed and
//! given up), one compact row each: class, fingerprint, tasks, first and last seen, a
//! trend (inline SVG bars, classes only), handlers, and a link to the cause's tasks.
//!
//! The groups are read with the overview's other figures; a refused or failed reading
//! is said in the section, and the rest of the overview shows as usual.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::filter::{list_url, thousands};
use super::layout;
use crate::operations::GroupParams;
use crate::store::{Group, Groups, TaskFilter};
use crate::task::Status;

/// Causes the overview lists, biggest first.
pub(crate) const SHOWN: i64 = 10;
/// Characters of a fingerprint shown in the row (all of it in its title).
const FINGERPRINT_SHOWN: usize = 90;
/// A trend bar's width and the trend's height, in SVG units.
const BAR: i64 = 6;
const HEIGHT: i64 = 18;

/// How the overview groups: by cause, the tasks not done, the last hour's trend.
pub(crate) fn params() -> GroupParams {
    GroupParams {
        limit: Some(SHOWN),
        ..GroupParams::default()
    }
}

/// The task list of one cause's tasks not done.
pub(crate) fn cause_url(cause: i64) -> String {
    let filter = TaskFilter {
        status: vec![Status::Failed, Status::PermanentFailure],
        cause: Some(cause),
        ..TaskFilter::default()
    };
    list_url(&filter, &[])
}

/// The section, for `groups` read at `now` (or why they could not be).
pub(crate) fn section(groups: &Result<Groups, String>, now: DateTime<Utc>) -> Markup {
    html! {
        section.broke aria-labelledby="broke" {
            h2 #broke { "What broke" }
            @match groups {
                Err(error) => p.error role="alert" { "The causes could not be read: " (error) }
                Ok(groups) if groups.groups.is_empty() => {
                    p.empty { "Nothing is broken: no task is failed or given up." }
                }
                Ok(groups) => (table(groups, now)),
            }
        }
    }
}

fn table(groups: &Groups, now: DateTime<Utc>) -> Markup {
    let span = groups.bucket_seconds * groups.groups[0].trend.len() as u64;
    html! {
        p.meta {
            (thousands(groups.total_tasks)) " tasks failed or given up, "
            (thousands(groups.total_groups))
            @if groups.total_groups == 1 { " cause" } @else { " causes" }
            @if groups.total_groups > groups.groups.len() as i64 {
                "; the " (groups.groups.len()) " biggest:"
            }
        }
        table.broke {
            thead {
                tr {
                    th scope="col" { "Class" }
                    th scope="col" { "Fingerprint" }
                    th scope="col" class="number" { "Tasks" }
                    th scope="col" { (span_words(span)) }
                    th scope="col" { "First seen" }
                    th scope="col" { "Last seen" }
                    th scope="col" { "Handlers" }
                    th scope="col" { span.visually-hidden { "Tasks of the cause" } }
                }
            }
            tbody {
                @for group in &groups.groups { (row(group, groups.bucket_seconds, now)) }
            }
        }
    }
}

fn row(group: &Group, bucket_seconds: u64, now: DateTime<Utc>) -> Markup {
    html! {
        tr {
            @match &group.cause {
                Some(cause) => {
                    td.class { code { (layout::visible(&cause.class)) } }
                    td.fingerprint title=(layout::visible(&cause.fingerprint)) {
                        (cut(&layout::visible(&cause.fingerprint), FINGERPRINT_SHOWN))
                    }
                }
                None => {
                    td.class { (layout::dash()) }
                    td.fingerprint { span.none { "no cause yet (stored before causes)" } }
                }
            }
            td.number { (thousands(group.tasks)) }
            td.trend { (trend(&group.trend, bucket_seconds)) }
            td.seen { (ago_opt(group.first_seen.or(group.cause.as_ref().and_then(|c| c.first_seen)), now)) }
            td.seen { (ago_opt(group.last_seen, now)) }
            td.handlers {
                @if group.handlers.is_empty() { (layout::dash()) }
                @else { (group.handlers.join(", ")) }
            }
            td.go {
                @if let Some(cause) = &group.cause {
                    a href=(cause_url(cause.id)) aria-label=(format!("Tasks of cause {}", cause.id)) { "tasks →" }
                }
            }
        }
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

/// The trend as bars, oldest first, scaled to its busiest bucket; an empty bucket is a
/// baseline tick.
fn trend(counts: &[i64], bucket_seconds: u64) -> Markup {
    let highest = counts.iter().copied().max().unwrap_or(0).max(1);
    let width = BAR * counts.len() as i64;
    let said: Vec<String> = counts.iter().map(i64::to_string).collect();
    let label = format!(
        "Tasks failing per {}, oldest first: {}",
        layout::age(bucket_seconds as f64),
        said.join(", ")
    );
    html! {
        svg.spark viewBox={ "0 0 " (width) " " (HEIGHT) } width=(width * 2) height=(HEIGHT)
            preserveAspectRatio="none" role="img" aria-label=(label) {
            title { (label) }
            @for (i, count) in counts.iter().enumerate() {
                @let x = i as i64 * BAR;
                @if *count > 0 {
                    @let height = (count * (HEIGHT - 1) / highest).max(2);
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
        }
    }

    #[test]
    fn a_cause_row_escapes_cuts_and_links() {
        let long = format!("<script>alert(1)</script> {}", "y".repeat(200));
        let html = section(&Ok(groups(&long)), at("2026-12-03T12:00:00Z")).into_string();
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
        assert!(html.contains("…</td>"), "cut with an ellipsis: {html}");
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
