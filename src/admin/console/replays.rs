//! Redrive jobs (replays and paced retries), newest first, with their progress, their
//! pace (the step under way and the next checkpoint) and why a paused job paused; the
//! table reloads every few seconds while the tab is visible.
//!
//! For an operate caller, the last column holds Pause (a job not ended), Cancel, and
//! Resume (a paused job, or one whose runner stopped or that failed: the fleet's members
//! take it, at a new rate if one is given), see [`super::commands`]; a job starts from
//! the task list's selection.

use axum::extract::State;
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};

use super::error::PageError;
use super::filter::{describe, list_url};
use super::layout::{self, Nav};
use super::Shared;
use crate::config::Role;
use crate::operations::{Actor, PageRequest};
use crate::store::{ReplayJob, REPLAY_STALE_AFTER};

/// Jobs listed.
const JOBS: i64 = 100;

/// How often the page reloads the table, in seconds.
const REFRESH_SECONDS: u64 = 3;

/// `GET /console/replays`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let jobs = read(&console).await?;
    let operate = caller.role == Role::Operate;
    let body = html! {
        div.live-bar {
            p.live-status data-live-status aria-live="polite" { "Updates every " (REFRESH_SECONDS) " s." }
            button type="button" data-live-toggle aria-pressed="false" { "Pause live updates" }
        }
        section aria-label="Jobs" {
            div data-live="/console/live/replays" data-every=(REFRESH_SECONDS) {
                (table(&jobs, operate))
            }
        }
    };
    Ok(layout::page(
        &caller,
        Nav::Replays,
        "Redrive jobs: replays and paced retries",
        body,
    ))
}

/// `GET /console/live/replays`: the table alone, for the page's script.
pub(crate) async fn live(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let jobs = read(&console).await?;
    Ok(Html(
        table(&jobs, caller.role == Role::Operate).into_string(),
    ))
}

async fn read(console: &super::Console) -> Result<Vec<ReplayJob>, PageError> {
    let page = PageRequest {
        limit: Some(JOBS),
        after: None,
    };
    Ok(console.app.replays(&page).await?.items)
}

fn table(jobs: &[ReplayJob], operate: bool) -> Markup {
    if jobs.is_empty() {
        return html! { p.empty { "No replay or paced retry has been started." } };
    }
    html! {
        table.replays {
            caption { "The " (jobs.len()) " newest jobs" }
            thead {
                tr {
                    @for heading in ["Job", "Status", "Progress", "Tasks", "To", "Pace", "Started", "By",
                                     "Runner", "Finished", "Error"] {
                        th scope="col" { (heading) }
                    }
                    @if operate { th scope="col" { "Actions" } }
                }
            }
            tbody {
                @for job in jobs { (row(job, operate)) }
            }
        }
    }
}

/// Whether the layer would let an operator resume `job` now: it failed, or it runs
/// with no runner beating.
fn resumable(job: &ReplayJob) -> bool {
    let stale =
        chrono::Utc::now() - chrono::TimeDelta::from_std(REPLAY_STALE_AFTER).unwrap_or_default();
    job.status == "failed"
        || job.status == "paused"
        || job.status == "running" && !job.heartbeat_at.is_some_and(|beat| beat >= stale)
}

fn row(job: &ReplayJob, operate: bool) -> Markup {
    let done = job.produced + job.skipped;
    let label = format!("progress of replay {}", job.id);
    html! {
        tr id=(format!("job-{}", job.id)) {
            th scope="row" { (job.id) br; small { (job.kind) } }
            td {
                span class={ "badge replay-" (job.status) } { (job.status) }
                @if let Some(reason) = &job.paused_reason { br; small.paused-reason { (reason) } }
            }
            td.progress {
                @match job.total {
                    Some(total) if total > 0 => {
                        progress value=(done.min(total)) max=(total) aria-label=(label) { (done) " of " (total) }
                        " " (done) " of " (total)
                    }
                    Some(_) => "nothing selected",
                    None => { (done) " so far" }
                }
                br;
                @if job.kind == "retry" {
                    small { (job.produced) " made due again, " (job.skipped) " left alone" }
                } @else {
                    small { (job.produced) " produced, " (job.skipped) " skipped" }
                }
                @if matches!(job.status.as_str(), "cancelled" | "failed") {
                    @if let Some(words) = job.uncounted() { br; small.uncounted { (words) } }
                }
            }
            td { a href=(list_url(&job.filter, &[])) { (describe(&job.filter)) } }
            td {
                @match (&job.target_topic, job.kind.as_str()) {
                    (_, "retry") => "the fleet's workers",
                    (Some(topic), _) => code { (topic) },
                    (None, _) => "each task's original topic",
                }
                @if job.mark_resolved { br; small { "marks them resolved" } }
                @if let Some(rate) = job.rate { br; small { "at most " (rate) " a second" } }
            }
            td.pace { (pace(job)) }
            td { (layout::when(job.created_at)) }
            td { (job.actor) }
            td {
                (layout::text_opt(job.runner.as_deref()))
                @if let Some(beat) = job.heartbeat_at { br; small { "last beat " (layout::when(beat)) } }
            }
            td { (layout::when_opt(job.finished_at)) }
            td.error { (layout::text_opt(job.error.as_deref())) }
            @if operate {
                td.actions {
                    @if matches!(job.status.as_str(), "pending" | "running" | "failed") {
                        form method="post" action=(format!("/console/replays/{}/pause", job.id)) {
                            button.pause type="submit" aria-label=(format!("Pause job {}", job.id)) { "Pause" }
                        }
                    }
                    @if matches!(job.status.as_str(), "pending" | "running" | "paused" | "failed") {
                        form method="post" action=(format!("/console/replays/{}/cancel", job.id)) {
                            button.cancel.danger type="submit" aria-label=(format!("Cancel replay {}", job.id)) { "Cancel" }
                        }
                    }
                    @if resumable(job) {
                        form.resume method="post" action=(format!("/console/replays/{}/resume", job.id)) {
                            label { "Rate " input type="text" name="rate" inputmode="decimal" size="6" placeholder=(current_rate(job)) aria-label=(format!("New rate of job {}", job.id)); }
                            button.resume type="submit" aria-label=(format!("Resume replay {}", job.id)) { "Resume" }
                        }
                    }
                }
            }
        }
    }
}

/// The rate a job runs at now (a placeholder for a new one).
fn current_rate(job: &ReplayJob) -> String {
    match (&job.pace, job.rate) {
        (Some(pace), _) => format!("{}", pace.rate),
        (None, Some(rate)) => format!("{rate}"),
        (None, None) => "unlimited".into(),
    }
}

/// A paced job's ramp, the step under way and its next checkpoint.
fn pace(job: &ReplayJob) -> Markup {
    let Some(pace) = &job.pace else {
        return html! { @match job.rate { Some(rate) => { "at most " (rate) " a second" } None => "unpaced" } };
    };
    let step_done = job.produced + job.skipped - job.step_base;
    html! {
        "step " (job.step.max(0) + 1) " of " (pace.steps()) ", " (format!("{:.3}", pace.rate_of(job.step)).trim_end_matches('0').trim_end_matches('.')) "/s"
        br;
        small {
            "ramp " (pace.ramp_text()) " of " (pace.rate) "/s"
            @if !pace.is_last(job.step) {
                "; checkpoint after " (step_done.max(0)) " of " (pace.step_tasks)
            }
            "; pauses above " (format!("{:.0}", pace.pause_ratio * 100.0)) "% failed of at least " (pace.min_outcomes)
        }
    }
}
