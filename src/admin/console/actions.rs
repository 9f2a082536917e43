//! Bulk retry / discard / resolve / replay from the task list and a task's page: the
//! confirm page (the layer's dry run: the exact count, what it leaves alone and why, a
//! sample, the reason and the verb's options) and the confirmed action (a retry,
//! discard or resolve runs in the background, see [`super::jobs`]; a replay is handed
//! to the fleet and shown on the replays page).
//!
//! Every form here posts the same fields: `verb`, the selection (`id` per ticked task,
//! or `scope=filter` for every task the list's filter selects, the filter itself in
//! `filter` as the list's query string), and on confirming the reason and options. The
//! selection may change between the preview and the confirmation: the action acts on
//! the tasks selected when it runs, and its result says what really changed.

use axum::extract::rejection::FormRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};

use super::confirm;
use super::error::PageError;
use super::form::{ActionForm, Asked};
use super::Shared;
use crate::operations::{ActAnswer, Actor, OperationError, ReplayRequest, Runner, Verb};

fn read_form(
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<ActionForm, PageError> {
    let Form(pairs) = form.map_err(|e| PageError::bad_request(e.body_text()))?;
    ActionForm::read(pairs)
}

/// `POST /console/actions/preview`: the confirm page.
pub(crate) async fn preview(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Html<String>, PageError> {
    let form = read_form(form)?.pinned(chrono::Utc::now());
    match form.asked()? {
        Asked::Act(verb) => {
            let request = form.act_request(true)?;
            let answer = (console.app).act(&actor, verb, &request, |_| {}).await?;
            let selected = (console.app)
                .count(&request.ids, request.filter.as_ref(), request.all)
                .await?;
            let cause = form.cause(console.app.store()).await;
            Ok(confirm::act_page(
                &actor,
                &form,
                cause.as_ref(),
                verb,
                &answer,
                selected,
            ))
        }
        Asked::Replay => {
            let request = form.replay_request(true)?;
            let preview = console.app.preview_replay(&actor, &request).await?;
            let cause = form.cause(console.app.store()).await;
            Ok(confirm::replay_page(
                &actor,
                &form,
                cause.as_ref(),
                &preview,
                None,
            ))
        }
    }
}

/// `POST /console/actions/run`: the confirmed action. A retry, discard or resolve
/// starts in the background and leads to its progress page; a replay is recorded for
/// the fleet and leads to the replays page.
pub(crate) async fn run(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, PageError> {
    let form = read_form(form)?;
    match form.asked()? {
        Asked::Act(verb) => {
            // The dry run checks everything (role, reason, options) before the job
            // starts, so that a refusal is this page's answer, not the job's.
            let mut request = form.act_request(true)?;
            if matches!(verb, Verb::Discard | Verb::Resolve) {
                crate::operations::actor::required_reason(request.reason.as_deref())?;
            }
            let answer = (console.app).act(&actor, verb, &request, |_| {}).await?;
            request.dry_run = false;
            // A paced retry is a job of the fleet's (the Replays page follows it); an
            // action held for a second operator waits on the Approvals page.
            if request.pace.is_some() || console.app.needs_approval(answer.matched) {
                let done = (console.app).act(&actor, verb, &request, |_| {}).await;
                return match done {
                    Ok(ActAnswer { job: Some(job), .. }) => {
                        Ok(Redirect::to(&format!("/console/replays#job-{}", job.id))
                            .into_response())
                    }
                    Ok(_) => Ok(Redirect::to("/console/replays").into_response()),
                    Err(OperationError::NeedsApproval { approval, .. }) => Ok(Redirect::to(
                        &format!("/console/approvals#approval-{}", approval.id),
                    )
                    .into_response()),
                    Err(other) => Err(other.into()),
                };
            }
            let id = console.jobs.start(
                console.app.clone(),
                actor,
                verb,
                request,
                form.describe()?,
                answer.matched,
            );
            Ok(Redirect::to(&format!("/console/jobs/{id}")).into_response())
        }
        Asked::Replay => {
            let request = form.replay_request(false)?;
            let refused = match (console.app)
                .start_replay(&actor, &request, Runner::Fleet)
                .await
            {
                Ok(job) => {
                    return Ok(
                        Redirect::to(&format!("/console/replays#job-{}", job.id)).into_response()
                    )
                }
                // Kafka could not be asked, or refused the target: the form again, as
                // typed, with the reason, rather than a bare error page.
                Err(OperationError::NeedsApproval { approval, .. }) => {
                    let to = format!("/console/approvals#approval-{}", approval.id);
                    return Ok(Redirect::to(&to).into_response());
                }
                Err(OperationError::Kafka(why)) => (StatusCode::SERVICE_UNAVAILABLE, why),
                Err(OperationError::BadRequest(why)) => (StatusCode::BAD_REQUEST, why),
                Err(other) => return Err(other.into()),
            };
            let (status, why) = refused;
            let dry_run = ReplayRequest {
                dry_run: true,
                ..request
            };
            let preview = console.app.preview_replay(&actor, &dry_run).await?;
            let cause = form.cause(console.app.store()).await;
            let page = confirm::replay_page(&actor, &form, cause.as_ref(), &preview, Some(&why));
            Ok((status, page).into_response())
        }
    }
}
