//! The fleet overview: what broke (the biggest causes, [`super::broke`]), backlog by
//! status and handler, due work and the oldest due per
//! handler, the last hour's outcomes (a table and a per-minute chart), live members,
//! breakers and brakes. The page's script reloads the figures every
//! [`REFRESH`] from `/console/live/overview` while the tab is visible.
//!
//! A member reads the figures at most once per [`REFRESH`] however many consoles are
//! open; when What broke is counted here (see below) the count takes one of the
//! member's heavy-read slots, and when they are all taken its last count is shown again
//! with its time. What each reading costs is bounded by the backlog, not by the store
//! or the drain: the counts by status and handler are the fleet's sample (counted once
//! per turn for the whole fleet, resolved tasks every few minutes), the outcomes are the
//! per-minute counts the history table's trigger keeps, and What broke is the sample's
//! too (counted by this member only for a while after an action through it, so that
//! whoever acted sees its effect at once). Read from the tasks themselves, a console
//! open on ten million tasks cost a draining fleet seconds of a core every refresh.

use axum::extract::State;
use axum::response::Html;
use axum::Extension;
use chrono::{DateTime, Utc};
use maud::{html, Markup};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::PageError;
use super::filter::list_url;
use super::filter::ListChoices;
use super::fleet::{brakes_table, breakers_table, members_table};
use super::layout::{self, thousands, Nav};
use super::{broke, chart, Console, Shared};
use crate::operations::{Actor, OperationError};
use crate::resilience::breaker::{Breaker, BreakerState};
use crate::store::{Brake, Groups, OutcomeMinute, Stats, TaskFilter};
use crate::task::Status;

// The fleet's sample holds as many causes as What broke shows, or more.
const _: () = assert!(broke::SHOWN <= crate::store::SAMPLED_CAUSES);

/// How often the overview's figures are read (and the page asks for them).
pub(crate) const REFRESH: Duration = Duration::from_secs(5);

/// The figures of one reading.
struct Snapshot {
    /// What broke, or why it could not be read (the rest shows either way).
    groups: Result<Groups, String>,
    /// Counts by status and handler and due work as the fleet last sampled them, the
    /// last hour's outcomes and the live members.
    stats: Stats,
    /// When the fleet's sample counted the tasks.
    counted_at: Option<DateTime<Utc>>,
    minutes: Vec<OutcomeMinute>,
    breakers: Vec<Breaker>,
    brakes: Vec<Brake>,
    read_at: DateTime<Utc>,
    read: Instant,
    /// [`crate::operations::Operations::actions_taken`] as the reading began: an action
    /// through this member since makes the next page read again.
    actions: u64,
}

/// The last reading of this member.
#[derive(Default)]
pub(crate) struct Cache {
    last: tokio::sync::Mutex<Option<Arc<Snapshot>>>,
}

async fn snapshot(console: &Console) -> Result<Arc<Snapshot>, PageError> {
    let mut last = console.overview.last.lock().await;
    let operations = &console.app;
    let actions = operations.actions_taken();
    let fresh = |s: &&Arc<Snapshot>| s.read.elapsed() < REFRESH && s.actions == actions;
    if let Some(fresh) = last.as_ref().filter(fresh) {
        return Ok(fresh.clone());
    }
    let sampled = operations.sampled_stats().await?;
    let groups = match operations.sampled_groups(sampled.broke, broke::SHOWN).await {
        Ok(groups) => Ok(groups),
        // Every heavy-read slot busy: the last count shows again, with its time.
        Err(OperationError::Busy(why)) => (last.as_ref())
            .and_then(|last| last.groups.clone().ok())
            .ok_or(why),
        Err(error) => Err(error.to_string()),
    };
    let snapshot = Arc::new(Snapshot {
        groups,
        stats: sampled.stats,
        counted_at: sampled.counted_at,
        minutes: operations.outcome_minutes().await?,
        breakers: operations.breakers().await?.items,
        brakes: operations.brakes().await?.items,
        read_at: Utc::now(),
        read: Instant::now(),
        actions,
    });
    *last = Some(snapshot.clone());
    Ok(snapshot)
}

/// What the task list's filter bar offers, from the overview's figures: the tasks of
/// each status (of the filter's handler when it has one), and the fleet's handler and
/// route names.
///
/// The counts are the overview's reading of the fleet's sample (by status and handler,
/// at most a sampling turn old, resolved tasks a few minutes), read at most once per
/// [`REFRESH`] per member however many consoles list tasks: a list page never counts a
/// million tasks itself. When the figures cannot be read, the tabs show without counts.
pub(crate) async fn list_choices(console: &Console, handler: Option<&str>) -> ListChoices {
    let Ok(s) = snapshot(console).await else {
        return ListChoices::default();
    };
    let mut counts = [0i64; 4];
    let mut handlers = std::collections::BTreeSet::new();
    for count in &s.stats.tasks {
        handlers.insert(count.handler.clone());
        if handler.is_some_and(|h| h != count.handler) {
            continue;
        }
        if let Some(i) = super::filter::STATUSES
            .iter()
            .position(|c| *c == count.status)
        {
            counts[i] += count.count;
        }
    }
    handlers.extend(s.breakers.iter().map(|b| b.handler.clone()));
    handlers.extend(
        s.stats
            .members
            .iter()
            .flat_map(|m| m.handlers.iter().cloned()),
    );
    ListChoices {
        forced_open: s
            .breakers
            .iter()
            .filter(|b| b.forced == Some(BreakerState::Open))
            .map(|b| b.handler.clone())
            .collect(),
        counts: Some((counts, s.counted_at.unwrap_or(s.read_at))),
        handlers: handlers.into_iter().collect(),
        routes: s.brakes.iter().map(|b| b.route.clone()).collect(),
    }
}

/// `GET /console/`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let snapshot = snapshot(&console).await?;
    let body = html! {
        div.live-bar {
            p.live-status data-live-status aria-live="polite" { "Updates every " (REFRESH.as_secs()) " s." }
            button type="button" data-live-toggle aria-pressed="false" { "Pause live updates" }
        }
        div data-live="/console/live/overview" data-every=(REFRESH.as_secs()) {
            (figures(&snapshot))
        }
    };
    Ok(layout::page(&caller, Nav::Overview, "Overview", body))
}

/// `GET /console/live/overview`: the figures alone, for the page's script.
pub(crate) async fn live(State(console): Shared) -> Result<Html<String>, PageError> {
    let snapshot = snapshot(&console).await?;
    Ok(Html(figures(&snapshot).into_string()))
}

fn filtered(status: Option<Status>, handler: Option<&str>) -> String {
    let filter = TaskFilter {
        status: status.into_iter().collect(),
        handler: handler.map(str::to_owned),
        ..TaskFilter::default()
    };
    list_url(&filter, &[])
}

fn figures(s: &Snapshot) -> Markup {
    const COLUMNS: [Status; 4] = [
        Status::Failed,
        Status::PermanentFailure,
        Status::Resolved,
        Status::Discarded,
    ];
    let mut backlog: BTreeMap<&str, [i64; 4]> = BTreeMap::new();
    for count in &s.stats.tasks {
        let row = backlog.entry(count.handler.as_str()).or_default();
        if let Some(i) = COLUMNS.iter().position(|c| *c == count.status) {
            row[i] += count.count;
        }
    }
    let mut totals = [0i64; 4];
    for row in backlog.values() {
        for (total, n) in totals.iter_mut().zip(row) {
            *total += n;
        }
    }
    let due: i64 = s.stats.due.iter().map(|d| d.due).sum();
    let open_breakers = s
        .breakers
        .iter()
        .filter(|b| b.state != BreakerState::Closed)
        .count();
    let engaged = s.brakes.iter().filter(|b| b.engaged(s.read_at)).count();
    html! {
        (broke::section(&s.groups, Utc::now()))
        p.as-of {
            "Figures as of " (layout::when(s.read_at)) "; tasks counted "
            (layout::when(s.counted_at.unwrap_or(s.read_at)))
            " by the fleet's sample (every 15 s; resolved tasks less often on a large store)."
        }
        ul.cards aria-label="At a glance" {
            li { a href=(filtered(Some(Status::Failed), None)) { span.figure { (thousands(totals[0])) } " waiting or in an attempt" } }
            li { span.figure { (thousands(due)) } " due now" }
            li { a href=(filtered(Some(Status::PermanentFailure), None)) { span.figure { (thousands(totals[1])) } " failed for good" } }
            li { a href="/console/fleet" { span.figure { (thousands(s.stats.members.len() as i64)) } " live members" } }
            li.alarm[open_breakers > 0] { a href="/console/fleet" { span.figure { (thousands(open_breakers as i64)) } " breakers not closed" } }
            li.alarm[engaged > 0] { a href="/console/fleet" { span.figure { (thousands(engaged as i64)) } " brakes engaged" } }
        }
        section aria-labelledby="backlog" {
            h2 #backlog { "Tasks by handler and status" }
            @if backlog.is_empty() {
                p.empty { "No tasks." }
            } @else {
                table.backlog {
                    thead {
                        tr {
                            th scope="col" { "Handler" }
                            @for status in COLUMNS { th scope="col" { (status.as_str()) } }
                        }
                    }
                    tbody {
                        @for (handler, row) in &backlog {
                            tr {
                                th scope="row" { a href=(filtered(None, Some(handler))) { (layout::visible(handler)) } }
                                @for (status, n) in COLUMNS.iter().zip(row) {
                                    td.number { a href=(filtered(Some(*status), Some(handler))) { (thousands(*n)) } }
                                }
                            }
                        }
                    }
                    tfoot {
                        tr {
                            th scope="row" { "All handlers" }
                            @for n in totals { td.number { (thousands(n)) } }
                        }
                    }
                }
            }
        }
        section aria-labelledby="due" {
            h2 #due { "Due now" }
            @if s.stats.due.is_empty() {
                p.empty { "Nothing is due." }
            } @else {
                table.due {
                    thead {
                        tr {
                            th scope="col" { "Handler" } th scope="col" { "Due" }
                            th scope="col" { "Oldest due for" } th scope="col" { "Live members serving it" }
                        }
                    }
                    tbody {
                        @for d in &s.stats.due {
                            @let serving = s.stats.members.iter().filter(|m| m.serves(&d.handler)).count();
                            tr {
                                th scope="row" { a href=(filtered(Some(Status::Failed), Some(&d.handler))) { (layout::visible(&d.handler)) } }
                                td.number { (thousands(d.due)) }
                                td { (layout::age(d.oldest_due_seconds)) }
                                td {
                                    @if serving == 0 { span.warning { "none: nothing works these tasks" } }
                                    @else { (thousands(serving as i64)) }
                                }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="outcomes" {
            h2 #outcomes { "Attempt outcomes, last hour" }
            div.outcomes {
                (chart::outcomes(&s.minutes))
                @if !s.stats.last_hour.is_empty() {
                    table.last-hour {
                        thead { tr { th scope="col" { "Outcome" } th scope="col" { "Attempts" } } }
                        tbody {
                            @for o in &s.stats.last_hour {
                                tr { th scope="row" { (o.outcome) } td.number { (thousands(o.count)) } }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="members-now" {
            h2 #members-now { "Live members" }
            (members_table(&s.stats.members))
        }
        section aria-labelledby="breakers-now" {
            h2 #breakers-now { "Breakers" }
            (breakers_table(&s.breakers, false))
        }
        section aria-labelledby="brakes-now" {
            h2 #brakes-now { "Brakes" }
            (brakes_table(&s.brakes, s.read_at, false))
        }
    }
}
