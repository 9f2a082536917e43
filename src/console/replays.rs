//! Replay jobs, newest first, with their progress; the table reloads every few seconds
//! while the tab is visible.
//!
//! **Actions, next round**: for an operate caller, cancel (a job pending or running)
//! and resume (a job whose runner stopped) in the last column, and "start a replay"
//! from the task list's selection, over the operations layer.

use axum::extract::State;
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};

use super::error::PageError;
use super::filter::{describe, list_url};
use super::layout::{self, Nav};
use super::Shared;
use crate::operations::Actor;
use crate::store::ReplayJob;

/// Jobs listed.
const JOBS: i64 = 100;

/// How often the page reloads the table, in seconds.
const REFRESH_SECONDS: u64 = 3;

/// `GET /console/replays`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let jobs = console.app.store().replays(JOBS, None).await?;
    let body = html! {
        div.live-bar {
            p.live-status data-live-status aria-live="polite" { "Updates every " (REFRESH_SECONDS) " s." }
            button type="button" data-live-toggle aria-pressed="false" { "Pause live updates" }
        }
        section aria-label="Jobs" {
            div data-live="/console/live/replays" data-every=(REFRESH_SECONDS) {
                (table(&jobs))
            }
        }
    };
    Ok(layout::page(&caller, Nav::Replays, "Replay jobs", body))
}

/// `GET /console/live/replays`: the table alone, for the page's script.
pub(crate) async fn live(State(console): Shared) -> Result<Html<String>, PageError> {
    let jobs = console.app.store().replays(JOBS, None).await?;
    Ok(Html(table(&jobs).into_string()))
}

fn table(jobs: &[ReplayJob]) -> Markup {
    if jobs.is_empty() {
        return html! { p.empty { "No replay job has been started." } };
    }
    html! {
        table.replays {
            caption { "The " (jobs.len()) " newest jobs" }
            thead {
                tr {
                    @for heading in ["Job", "Status", "Progress", "Tasks", "To", "Started", "By",
                                     "Runner", "Finished", "Error"] {
                        th scope="col" { (heading) }
                    }
                }
            }
            tbody {
                @for job in jobs { (row(job)) }
            }
        }
    }
}

fn row(job: &ReplayJob) -> Markup {
    let done = job.produced + job.skipped;
    let label = format!("progress of replay {}", job.id);
    html! {
        tr {
            th scope="row" { (job.id) }
            td { span class={ "badge replay-" (job.status) } { (job.status) } }
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
                small { (job.produced) " produced, " (job.skipped) " skipped" }
            }
            td { a href=(list_url(&job.filter, &[])) { (describe(&job.filter)) } }
            td {
                @match &job.target_topic {
                    Some(topic) => code { (topic) },
                    None => "each task's original topic",
                }
                @if job.mark_resolved { br; small { "marks them resolved" } }
                @if let Some(rate) = job.rate { br; small { "at most " (rate) " a second" } }
            }
            td { (layout::when(job.created_at)) }
            td { (job.actor) }
            td {
                (layout::text_opt(job.runner.as_deref()))
                @if let Some(beat) = job.heartbeat_at { br; small { "last beat " (layout::when(beat)) } }
            }
            td { (layout::when_opt(job.finished_at)) }
            td.error { (layout::text_opt(job.error.as_deref())) }
        }
    }
}
