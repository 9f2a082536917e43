//! The task list's filter as a GET form: query parameters ⇄ [`TaskFilter`], with the
//! page size and the keyset cursor. Every field of the filter has a control; a link to
//! the list (from the overview, a replay, an audit entry) is the same query string.
//!
//! Empty fields mean "any" (a GET form sends every field). An unknown or repeated
//! parameter is refused rather than ignored: a mistyped filter must not silently
//! select more tasks than meant (the selection a bulk action will act on).

use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup};

use super::layout::thousands;
use crate::operations::{FilterParams, StatusNames};
use crate::store::{TaskFilter, MAX_PAGE, SEARCH_MAX_BYTES, SEARCH_SCAN};
use crate::task::{Status, TaskId};

/// Tasks per page unless the form says otherwise.
pub(crate) const DEFAULT_LIMIT: i64 = 50;

/// The statuses, in the order of the list's tabs and the overview's columns.
pub(crate) const STATUSES: [Status; 4] = [
    Status::Failed,
    Status::PermanentFailure,
    Status::Resolved,
    Status::Discarded,
];

/// A list request: which tasks, how many, after which.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ListParams {
    /// The tasks to list.
    pub filter: TaskFilter,
    /// Page size.
    pub limit: i64,
    /// The previous page's last task id.
    pub after: Option<TaskId>,
}

/// The parameters of a list request.
const KNOWN: [&str; 21] = [
    "status",
    "search",
    "cause",
    "handler",
    "route",
    "topic",
    "key",
    "key_prefix",
    "error",
    "first_error",
    "disposition",
    "created_after",
    "created_before",
    "updated_after",
    "updated_before",
    "failed_after",
    "generation",
    "min_generation",
    "previous_task",
    "after",
    "limit",
];

/// Reads the query parameters of a list request into the operations layer's
/// [`FilterParams`], which reads the filter as every face does; times are read against
/// `now`.
pub(crate) fn parse(pairs: &[(String, String)], now: DateTime<Utc>) -> Result<ListParams, String> {
    let mut written = FilterParams::default();
    let mut statuses = Vec::new();
    let (mut limit, mut after) = (DEFAULT_LIMIT, None);
    let mut seen = std::collections::HashSet::new();
    for (name, raw) in pairs {
        if !KNOWN.contains(&name.as_str()) {
            return Err(format!("unknown filter {name:?}"));
        }
        let value = raw.trim();
        let keyed = matches!(name.as_str(), "key" | "key_prefix");
        if raw.is_empty() || (!keyed && value.is_empty()) {
            continue;
        }
        if name != "status" && !seen.insert(name.as_str()) {
            return Err(format!("give {name} once"));
        }
        let text = || Some(value.to_owned());
        match name.as_str() {
            "status" => statuses.extend(value.split(',').map(str::to_owned)),
            "handler" => written.handler = text(),
            "route" => written.route = text(),
            "topic" => written.topic = text(),
            // A key is matched byte for byte, and an error's text as typed, spaces
            // and all.
            "key" => written.key = Some(raw.clone()),
            "key_prefix" => written.key_prefix = Some(raw.clone()),
            "error" => written.error = Some(raw.clone()),
            // A search looks for the bytes typed, spaces and all.
            "search" => written.search = Some(raw.clone()),
            "cause" => match number::<i64>(name, value)? {
                id if id > 0 => written.cause = Some(id),
                _ => return Err("cause must be a cause id (a positive integer)".into()),
            },
            "first_error" => written.first_error = Some(raw.clone()),
            "disposition" => written.disposition = text(),
            "created_after" => written.created_after = text(),
            "created_before" => written.created_before = text(),
            "updated_after" => written.updated_after = text(),
            "updated_before" => written.updated_before = text(),
            "failed_after" => written.failed_after = text(),
            "generation" => written.generation = Some(number(name, value)?),
            "min_generation" => written.min_generation = Some(number(name, value)?),
            "previous_task" => written.previous_task = Some(number(name, value)?),
            "after" => after = Some(TaskId(positive(name, value)?)),
            "limit" => {
                limit = number(name, value)?;
                if !(1..=MAX_PAGE).contains(&limit) {
                    return Err(format!(
                        "limit must be between 1 and {MAX_PAGE} (got {limit})"
                    ));
                }
            }
            other => return Err(format!("unknown filter {other:?}")),
        }
    }
    written.status = (!statuses.is_empty()).then_some(StatusNames(statuses));
    let filter = written.filter_at(now).map_err(|e| e.to_string())?;
    Ok(ListParams {
        filter,
        limit,
        after,
    })
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{name} must be a whole number (got {value:?})"))
}

fn positive(name: &str, value: &str) -> Result<i64, String> {
    match number::<i64>(name, value)? {
        id if id > 0 => Ok(id),
        _ => Err(format!("{name} must be a task id (a positive integer)")),
    }
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The query parameters that select `filter`.
pub(crate) fn to_pairs(filter: &TaskFilter) -> Vec<(&'static str, String)> {
    filter.named_values()
}

/// `filter` as the operations layer reads it (times as RFC 3339), for a bulk verb.
pub(crate) fn params(filter: &TaskFilter) -> FilterParams {
    let time = |at: Option<DateTime<Utc>>| at.map(rfc3339);
    FilterParams {
        status: (!filter.status.is_empty()).then(|| {
            StatusNames(
                filter
                    .status
                    .iter()
                    .map(|s| s.as_str().to_owned())
                    .collect(),
            )
        }),
        handler: filter.handler.clone(),
        route: filter.route.clone(),
        topic: filter.topic.clone(),
        key: filter.key.clone(),
        key_prefix: filter.key_prefix.clone(),
        error: filter.error.clone(),
        first_error: filter.first_error.clone(),
        disposition: filter.disposition.clone(),
        created_after: time(filter.created_after),
        created_before: time(filter.created_before),
        updated_after: time(filter.updated_after),
        updated_before: time(filter.updated_before),
        failed_after: time(filter.failed_after),
        generation: filter.generation,
        min_generation: filter.min_generation,
        previous_task: filter.previous_task.map(|id| id.0),
        cause: filter.cause,
        search: filter.search.clone(),
    }
}

/// The query string that selects `filter` (empty for every task).
pub(crate) fn query(filter: &TaskFilter) -> String {
    serde_urlencoded::to_string(to_pairs(filter)).unwrap_or_default()
}

/// The task list's address for `filter` (and more parameters, such as a cursor).
pub(crate) fn list_url(filter: &TaskFilter, more: &[(&'static str, String)]) -> String {
    let mut pairs = to_pairs(filter);
    pairs.extend_from_slice(more);
    match serde_urlencoded::to_string(&pairs) {
        Ok(query) if !query.is_empty() => format!("/console/tasks?{query}"),
        _ => "/console/tasks".to_owned(),
    }
}

/// `filter` in a few words, for a link to the tasks it selects: `handler billing,
/// status failed`, or `every task`.
pub(crate) fn describe(filter: &TaskFilter) -> String {
    let pairs = to_pairs(filter);
    let mut words: Vec<String> = Vec::new();
    if !filter.ids.is_empty() {
        let ids: Vec<String> = filter.ids.iter().map(|id| id.0.to_string()).collect();
        words.push(format!("tasks {}", ids.join(", ")));
    }
    if pairs.is_empty() && words.is_empty() {
        return "every task".to_owned();
    }
    words.extend(pairs.iter().map(|(n, v)| format!("{n} {v}")));
    words.join(", ")
}

/// What the status tabs count, and that in words (shown beside them).
#[derive(Debug, Clone, Default)]
pub(crate) struct TabCounts {
    /// Tasks per status of [`STATUSES`]; `None` where not counted.
    pub counts: [Option<i64>; 4],
    /// What they count: every task (of a handler) and when, or the filter's.
    pub said: String,
}

/// The status tabs: every status, then each one alone, each a link to the list with the
/// rest of the filter kept (and the first page), with its count when there is one. The
/// tab of the selection shown is marked; so are the statuses of a selection of several
/// (failed and permanent_failure, as What broke links a cause), each of them.
fn tabs(params: &ListParams, counts: &TabCounts) -> Markup {
    let f = &params.filter;
    let mut more = Vec::new();
    if params.limit != DEFAULT_LIMIT {
        more.push(("limit", params.limit.to_string()));
    }
    let url = |status: Vec<Status>| {
        let filter = TaskFilter {
            status,
            ..f.clone()
        };
        list_url(&filter, &more)
    };
    // "All" keeps the rest of the filter, which may itself choose statuses (a cause's
    // tasks not done): it selects what that filter without a status does.
    let every = self::params(&TaskFilter {
        status: Vec::new(),
        ..f.clone()
    });
    let all_statuses = match every.filter() {
        Ok(filter) if !filter.status.is_empty() => filter.status,
        _ => STATUSES.to_vec(),
    };
    let all_current = f.status.is_empty() || f.status.len() > 1 && same(&f.status, &all_statuses);
    let all_count = all_statuses.iter().try_fold(0i64, |sum, status| {
        let i = STATUSES.iter().position(|s| s == status)?;
        Some(sum + counts.counts[i]?)
    });
    let shown = |count: Option<i64>| count.map_or_else(|| "?".to_owned(), thousands);
    let counted = counts.counts.iter().any(Option::is_some);
    let said = (!counts.said.is_empty()).then_some(counts.said.as_str());
    html! {
        nav.status-tabs aria-label="Status" {
            a #tab-all href=(url(Vec::new())) aria-current=[all_current.then_some("page")] title=[said] {
                @if all_statuses.len() == STATUSES.len() { "All" }
                @else { "All not done" }
                @if counted { " " span.count { (shown(all_count)) } }
            }
            @for (i, status) in STATUSES.into_iter().enumerate() {
                @let alone = f.status == [status];
                @let among = !alone && f.status.contains(&status);
                a id=(format!("tab-{}", status.as_str())) class={ "tab-" (status.as_str()) @if among { " among" } }
                    href=(url(vec![status])) aria-current=[alone.then_some("page")]
                    title=[said] {
                    (status.as_str())
                    @if counted { " " span.count { (shown(counts.counts[i])) } }
                    @if among { span.visually-hidden { " (among the statuses shown)" } }
                }
            }
            @if let Some(said) = said { span.counted { (said) } }
        }
    }
}

/// Whether `a` and `b` hold the same statuses.
fn same(a: &[Status], b: &[Status]) -> bool {
    a.len() == b.len() && a.iter().all(|s| b.contains(s))
}

/// A `<select>` of `names` (any, or one of them; the current one is kept if the list
/// lacks it).
fn choice(name: &str, label: &str, current: Option<&str>, names: &[String]) -> Markup {
    let missing = current.filter(|c| !names.iter().any(|n| n == c));
    html! {
        div.field {
            label for=(format!("f-{name}")) { (label) }
            select id=(format!("f-{name}")) name=(name) {
                option value="" selected[current.is_none()] { "any" }
                @if let Some(missing) = missing {
                    option value=(missing) selected { (missing) }
                }
                @for n in names {
                    option value=(n) selected[current == Some(n.as_str())] { (n) }
                }
            }
        }
    }
}

/// The task list's status counts and names to choose from (see [`super::overview::list_choices`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct ListChoices {
    /// Tasks per status of [`STATUSES`], and when they were counted.
    pub counts: Option<([i64; 4], DateTime<Utc>)>,
    /// Every handler with tasks, a breaker, or a member serving it by name.
    pub handlers: Vec<String>,
    /// Every configured route (and every route whose brake ever engaged).
    pub routes: Vec<String>,
    /// The handlers whose breaker an operator forced open: their tasks wait until it is
    /// released, whatever their next attempt's time says.
    pub forced_open: Vec<String>,
}

/// The filter as a compact bar: the status tabs with their counts, the search box,
/// handler and route among the fleet's names, and every other field folded under
/// "More filters" (open when one of them is set, but for the cause: the banner above the
/// list names it), filled in with `params`.
pub(crate) fn form(params: &ListParams, choices: &ListChoices, counts: &TabCounts) -> Markup {
    let f = &params.filter;
    let time = |t: Option<DateTime<Utc>>| t.map(rfc3339);
    let text_fields: [(&str, &str, Option<String>, &str); 15] = [
        ("topic", "Topic", f.topic.clone(), ""),
        ("key", "Key (exactly)", f.key.clone(), ""),
        ("key_prefix", "Key starts with", f.key_prefix.clone(), ""),
        (
            "error",
            "Error contains",
            f.error.clone(),
            "case-insensitive; the last error, or the reported one",
        ),
        (
            "first_error",
            "First error contains",
            f.first_error.clone(),
            "case-insensitive; as first reported",
        ),
        (
            "disposition",
            "Disposition",
            f.disposition.clone(),
            "rejected or delivery_count_exceeded",
        ),
        (
            "created_after",
            "Created after",
            time(f.created_after),
            "UTC time, or 2h for 2 hours ago",
        ),
        (
            "created_before",
            "Created before",
            time(f.created_before),
            "UTC time, or 2h",
        ),
        (
            "updated_after",
            "Changed after",
            time(f.updated_after),
            "UTC time, or 2h",
        ),
        (
            "updated_before",
            "Changed before",
            time(f.updated_before),
            "UTC time, or 2h",
        ),
        (
            "failed_after",
            "Failed after",
            time(f.failed_after),
            "UTC time, or 2h: last failed since then",
        ),
        (
            "generation",
            "Generation",
            f.generation.map(|g| g.to_string()),
            "1: first failures",
        ),
        (
            "min_generation",
            "Generation at least",
            f.min_generation.map(|g| g.to_string()),
            "2: re-failures",
        ),
        (
            "previous_task",
            "Re-failures of task",
            f.previous_task.map(|id| id.to_string()),
            "task id",
        ),
        (
            "cause",
            "Cause",
            f.cause.map(|id| id.to_string()),
            "a cause id, as What broke links it",
        ),
    ];
    let set = text_fields
        .iter()
        .filter(|(_, _, v, _)| v.is_some())
        .count()
        + usize::from(params.limit != DEFAULT_LIMIT);
    // The banner above a cause's list names the cause and its window.
    let named =
        usize::from(f.cause.is_some()) + usize::from(f.cause.is_some() && f.failed_after.is_some());
    let unfold = set > named;
    html! {
        (tabs(params, counts))
        form.filter method="get" action="/console/tasks" {
            @for status in &f.status {
                input type="hidden" name="status" value=(status.as_str());
            }
            div.bar {
                div.field.search {
                    label.visually-hidden for="f-search" { "Search key, value, headers" }
                    input type="search" id="f-search" name="search" value=[f.search.as_deref()]
                        placeholder="Search keys, values, headers (press /)"
                        autocomplete="off" maxlength=(SEARCH_MAX_BYTES) aria-describedby="h-search"
                        title={ "Text as typed (case-sensitive), among the newest "
                            (thousands(SEARCH_SCAN)) " tasks the rest of the filter selects" };
                    small.visually-hidden id="h-search" {
                        "Text as typed (case-sensitive), among the newest "
                        (thousands(SEARCH_SCAN)) " tasks the rest of the filter selects"
                    }
                }
                (choice("handler", "Handler", f.handler.as_deref(), &choices.handlers))
                (choice("route", "Route", f.route.as_deref(), &choices.routes))
                div.buttons {
                    button type="submit" { "Filter" }
                    a href="/console/tasks" { "Clear the filter" }
                }
            }
            details.more open[unfold] {
                summary {
                    "More filters"
                    @if set > 0 { " (" (set) " set)" }
                }
                div.fields {
                @for (name, label, value, hint) in text_fields {
                    div.field {
                        label for=(format!("f-{name}")) { (label) }
                        input type="text" id=(format!("f-{name}")) name=(name)
                            value=[value] autocomplete="off"
                            aria-describedby=[(!hint.is_empty()).then(|| format!("h-{name}"))];
                        @if !hint.is_empty() {
                            small id=(format!("h-{name}")) { (hint) }
                        }
                    }
                }
                div.field {
                    label for="f-limit" { "Per page" }
                    input type="number" id="f-limit" name="limit" min="1" max=(MAX_PAGE)
                        value=(params.limit);
                }
                }
            }
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

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn every_field_reads_and_goes_back_into_the_same_query() {
        let query = pairs(&[
            ("status", "failed"),
            ("status", "permanent_failure"),
            ("handler", " orders "),
            ("route", "r"),
            ("topic", "t"),
            ("key_prefix", " k"),
            ("error", "timeout"),
            ("created_after", "2h"),
            ("created_before", "2026-12-03 11:30"),
            ("updated_after", "2026-12-01"),
            ("updated_before", "2026-12-03T11:59:00Z"),
            ("generation", "2"),
            ("min_generation", "2"),
            ("previous_task", "7"),
            ("limit", "20"),
            ("after", "99"),
            ("key", ""),
        ]);
        let params = parse(&query, now()).unwrap();
        let f = &params.filter;
        assert_eq!(f.status, [Status::Failed, Status::PermanentFailure]);
        assert_eq!(f.handler.as_deref(), Some("orders"));
        assert_eq!(
            f.key_prefix.as_deref(),
            Some(" k"),
            "a key is taken as typed"
        );
        assert_eq!(f.key, None, "an empty field is any");
        assert_eq!(rfc3339(f.created_after.unwrap()), "2026-12-03T10:00:00Z");
        assert_eq!(rfc3339(f.created_before.unwrap()), "2026-12-03T11:30:00Z");
        assert_eq!(rfc3339(f.updated_after.unwrap()), "2026-12-01T00:00:00Z");
        assert_eq!(f.previous_task, Some(TaskId(7)));
        assert_eq!((params.limit, params.after), (20, Some(TaskId(99))));
        let again: Vec<(String, String)> = to_pairs(f)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(parse(&again, now()).unwrap().filter, *f);
        assert_eq!(
            super::params(f).filter().unwrap(),
            *f,
            "the layer reads the same filter"
        );
    }

    #[test]
    fn a_wrong_unknown_or_repeated_parameter_is_refused_by_name() {
        for (query, says) in [
            (vec![("colour", "red")], "colour"),
            (vec![("colour", "")], "colour"),
            (vec![("status", "done")], "done"),
            (vec![("handler", "a"), ("handler", "b")], "once"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "5000")], "limit"),
            (vec![("after", "-1")], "after"),
            (vec![("generation", "x")], "generation"),
            (vec![("created_after", "yesterday")], "created_after"),
            (vec![("key", "a"), ("key_prefix", "b")], "not both"),
            (
                vec![("created_after", "1h"), ("created_before", "2h")],
                "earlier",
            ),
        ] {
            let error = parse(&pairs(&query), now()).unwrap_err();
            assert!(error.contains(says), "{query:?}: {error}");
        }
    }

    #[test]
    fn list_links_carry_the_filter_and_the_cursor() {
        let filter = TaskFilter {
            status: vec![Status::Failed],
            key: Some("a&b=c".into()),
            ..TaskFilter::default()
        };
        assert_eq!(
            list_url(&filter, &[("after", "5".into())]),
            "/console/tasks?status=failed&key=a%26b%3Dc&after=5"
        );
        assert_eq!(list_url(&TaskFilter::default(), &[]), "/console/tasks");
        assert_eq!(describe(&filter), "status failed, key a&b=c");
        assert_eq!(describe(&TaskFilter::default()), "every task");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
    }

    #[test]
    fn search_and_cause_read_and_go_back_into_the_query() {
        let params = parse(
            &pairs(&[
                ("search", " order 7 "),
                ("cause", "12"),
                ("status", "failed"),
            ]),
            now(),
        )
        .unwrap();
        assert_eq!(
            params.filter.search.as_deref(),
            Some(" order 7 "),
            "as typed"
        );
        assert_eq!(params.filter.cause, Some(12));
        assert_eq!(
            list_url(&params.filter, &[]),
            "/console/tasks?status=failed&search=+order+7+&cause=12"
        );
        assert!(parse(&pairs(&[("cause", "0")]), now())
            .unwrap_err()
            .contains("cause"));
        assert_eq!(
            parse(&pairs(&[("search", "  ")]), now())
                .unwrap()
                .filter
                .search,
            None
        );
        let form = form(&params, &ListChoices::default(), &TabCounts::default()).into_string();
        assert!(
            form.contains(r#"name="search" value=" order 7 ""#),
            "{form}"
        );
        assert!(form.contains(r#"name="cause" value="12""#), "{form}");
    }
}
