//! Bulk actions running in the background on this member, and their progress page.
//!
//! A confirmed retry / discard / resolve runs as a tokio task over
//! [`Operations::act`], whose progress callback (told after every committed batch)
//! writes into an in-memory registry keyed by a random job id; its page shows the tasks
//! changed so far of those matched, reloaded by the console's script (and by a plain
//! link without it), and at the end the counts and the audit entry. Entries are
//! forgotten an hour after they started.
//!
//! **If the member dies mid-action**, the registry goes with it, but nothing half-done
//! stays: every batch commits whole, the audit entry is written with the first batch
//! (so it exists as soon as anything changed), and the tasks already changed are in
//! their new status. Running the same filter again selects what is left (a discard or
//! resolve changes only failed and permanent_failure tasks; a retry run again also
//! retries those the first run retried and have failed since).

use axum::extract::{Path, State};
use axum::response::Html;
use axum::Extension;
use maud::{html, Markup};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error::PageError;
use super::layout::{self, Nav};
use super::Shared;
use crate::operations::{ActAnswer, ActRequest, Actor, Operations, Verb};
use crate::store::ActionReport;

/// How long a finished (or abandoned) job's progress stays to be read.
const KEPT_FOR: Duration = Duration::from_secs(3600);

/// How often the progress page reloads its figures, in seconds.
const REFRESH_SECONDS: u64 = 2;

/// One bulk action's progress.
#[derive(Debug, Clone)]
struct Job {
    /// `retry`, `discard` or `resolve`.
    action: &'static str,
    /// What it acts on, in words.
    selection: String,
    /// Tasks its dry run matched when it was confirmed.
    matched: i64,
    /// What its committed batches did so far.
    done: Option<ActionReport>,
    /// How it ended: its answer, or why it failed.
    outcome: Option<Result<ActAnswer, String>>,
    started: Instant,
}

/// The bulk actions this member runs or ran in the last hour, by job id.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: Mutex<HashMap<String, Job>>,
}

impl Jobs {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Job>) -> T) -> T {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut jobs)
    }

    fn get(&self, id: &str) -> Option<Job> {
        self.with(|jobs| jobs.get(id).cloned())
    }

    /// Starts `verb` on `request` for `actor` in the background; answers the job id.
    pub(crate) fn start(
        self: &Arc<Self>,
        app: Arc<Operations>,
        actor: Actor,
        verb: Verb,
        request: ActRequest,
        selection: String,
        matched: i64,
    ) -> String {
        let id = crate::readable::hex(&rand::random::<[u8; 16]>());
        let job = Job {
            action: verb_name(verb),
            selection,
            matched,
            done: None,
            outcome: None,
            started: Instant::now(),
        };
        self.with(|jobs| {
            jobs.retain(|_, job| job.started.elapsed() < KEPT_FOR);
            jobs.insert(id.clone(), job);
        });
        let (jobs, key) = (self.clone(), id.clone());
        let progress = {
            let (jobs, key) = (jobs.clone(), key.clone());
            move |report: ActionReport| {
                jobs.with(|all| all.get_mut(&key).map(|job| job.done = Some(report)));
            }
        };
        let running = app.act_to_end(actor, verb, request, progress);
        tokio::spawn(async move {
            let outcome = match running.await {
                Ok(answer) => answer.map_err(|e| e.to_string()),
                Err(failed) => Err(format!("the action failed: {failed}")),
            };
            if let Err(error) = &outcome {
                tracing::warn!(%error, job = %key, "console: a bulk action failed");
            }
            jobs.with(|all| all.get_mut(&key).map(|job| job.outcome = Some(outcome)));
        });
        id
    }
}

/// The verb's name, as the audit log writes it.
pub(crate) fn verb_name(verb: Verb) -> &'static str {
    match verb {
        Verb::Retry => "retry",
        Verb::Discard => "discard",
        Verb::Resolve => "resolve",
    }
}

fn find(jobs: &Jobs, id: &str) -> Result<Job, PageError> {
    jobs.get(id).ok_or_else(|| {
        PageError::not_found(
            "no such bulk action on this member (its progress is kept for an hour, on the \
             member that ran it); the audit log has every action",
        )
    })
}

/// `GET /console/jobs/{id}`: a bulk action's progress.
pub(crate) async fn page(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    let job = find(&console.jobs, &id)?;
    let live = format!("/console/live/jobs/{id}");
    let body = html! {
        div.live-bar {
            p.live-status data-live-status aria-live="polite" { "Updates every " (REFRESH_SECONDS) " s." }
            a href=(format!("/console/jobs/{id}")) { "Reload" }
        }
        div data-live=(live) data-every=(REFRESH_SECONDS) { (figures(&job)) }
    };
    let title = format!("Bulk {}", job.action);
    Ok(layout::page(&actor, Nav::Tasks, &title, body))
}

/// `GET /console/live/jobs/{id}`: the figures alone, for the page's script.
pub(crate) async fn live(
    State(console): Shared,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    Ok(Html(figures(&find(&console.jobs, &id)?).into_string()))
}

fn figures(job: &Job) -> Markup {
    let changed = job.done.map_or(0, |d| d.changed);
    let (state, class) = match &job.outcome {
        None => ("running", "running"),
        Some(Ok(_)) => ("done", "done"),
        Some(Err(_)) => ("failed", "failed"),
    };
    html! {
        section.job aria-label="Progress" data-job-state=(state) {
            p { "Action " b { (job.action) } " on " (job.selection) ": "
                span class={ "badge replay-" (class) } { (state) } }
            p {
                progress value=(changed.min(job.matched.max(1))) max=(job.matched.max(1))
                    aria-label="tasks changed so far" { (changed) " of " (job.matched) }
                " " span.changed { (changed) } " changed of " (job.matched) " matched"
            }
            @match &job.outcome {
                Some(Ok(answer)) => {
                    p.done {
                        "Done: " span.final-changed { (answer.changed) } " changed"
                        @if answer.refused > 0 { ", " (answer.refused) " left alone (their compensation has started)" }
                        "."
                    }
                    @if let Some(audit) = answer.audit_id {
                        p { "Audit entry " a.audit-id href=(format!("/console/audit?before={}", audit + 1)) { (audit) } "." }
                    } @else {
                        p { "Nothing matched any more: nothing changed, nothing was audited." }
                    }
                }
                Some(Err(error)) => {
                    p.error role="alert" { "It failed: " (error) }
                    p { "Every batch before the failure was committed; the audit log shows the entry. "
                        "Running the same action again selects what is left." }
                }
                None => {
                    @if let Some(done) = job.done {
                        p { "Audit entry " (done.audit_id) " (written with the first batch)." }
                    }
                }
            }
            p { a href="/console/tasks" { "Back to the tasks" } }
        }
    }
}
