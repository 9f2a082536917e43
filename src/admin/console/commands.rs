//! The console's one-click commands, each a form posting to one operations verb:
//! pause, cancel and resume a redrive job (resume hands it to the fleet, at a new rate
//! if given), force a breaker open
//! or closed or release it, engage a route's brake or release it (with a reason where
//! the layer asks for one). Each answers by going back to the page it came from; a
//! refusal (a read-only session: 403, a missing reason: 400) is an error page and
//! changes nothing.

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::response::Redirect;
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use super::error::PageError;
use super::Shared;
use crate::operations::{Actor, EngageRequest, ReasonRequest, Runner};
use crate::store::BreakerCommand;

/// The fields of a command form (each command reads those it needs).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct CommandForm {
    reason: Option<String>,
    route: Option<String>,
    #[serde(rename = "for")]
    hold: Option<String>,
    rate: Option<String>,
}

fn read(form: Result<Form<CommandForm>, FormRejection>) -> Result<CommandForm, PageError> {
    let Form(form) = form.map_err(|e| PageError::bad_request(e.body_text()))?;
    Ok(form)
}

fn given(text: Option<String>) -> Option<String> {
    text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

fn job_id(id: &str) -> Result<i64, PageError> {
    id.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| PageError::bad_request(format!("{id:?} is not a replay job id")))
}

/// `POST /console/replays/{id}/cancel`.
pub(crate) async fn cancel_replay(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Redirect, PageError> {
    let job = console.app.cancel_replay(&actor, job_id(&id)?).await?;
    Ok(Redirect::to(&format!("/console/replays#job-{}", job.id)))
}

/// `POST /console/replays/{id}/pause`: its runner stops after its current batch.
pub(crate) async fn pause_replay(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Redirect, PageError> {
    let job = console.app.pause_replay(&actor, job_id(&id)?).await?;
    Ok(Redirect::to(&format!("/console/replays#job-{}", job.id)))
}

/// `POST /console/replays/{id}/resume`: the fleet's members take it, at the form's
/// `rate` if one is given (slowing it down).
pub(crate) async fn resume_replay(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    form: Result<Form<CommandForm>, FormRejection>,
) -> Result<Redirect, PageError> {
    let id = job_id(&id)?;
    let rate = match given(read(form)?.rate) {
        None => None,
        Some(rate) => Some(rate.parse::<f64>().map_err(|_| {
            PageError::bad_request(format!("rate: {rate:?} is not a number a second"))
        })?),
    };
    let job = (console.app)
        .resume_replay(&actor, id, Runner::Fleet, None, rate)
        .await?;
    Ok(Redirect::to(&format!("/console/replays#job-{}", job.id)))
}

/// `POST /console/breakers/{handler}/{open,close,release}`.
pub(crate) async fn breaker(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path((handler, command)): Path<(String, String)>,
    form: Result<Form<CommandForm>, FormRejection>,
) -> Result<Redirect, PageError> {
    let command = match command.as_str() {
        "open" => BreakerCommand::Open,
        "close" => BreakerCommand::Close,
        "release" => BreakerCommand::Release,
        other => {
            return Err(PageError::not_found(format!(
                "no breaker command {other:?}"
            )))
        }
    };
    let request = ReasonRequest {
        reason: given(read(form)?.reason),
    };
    (console.app)
        .command_breaker(&actor, &handler, command, &request)
        .await?;
    Ok(Redirect::to("/console/fleet#breakers"))
}

/// `POST /console/brakes/engage`: the route is a field (any configured route).
pub(crate) async fn engage_brake(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    form: Result<Form<CommandForm>, FormRejection>,
) -> Result<Redirect, PageError> {
    let form = read(form)?;
    let route = given(form.route).ok_or_else(|| PageError::bad_request("route is required"))?;
    let request = EngageRequest {
        reason: given(form.reason),
        hold: given(form.hold),
    };
    console.app.engage_brake(&actor, &route, &request).await?;
    Ok(Redirect::to("/console/fleet#brakes"))
}

/// `POST /console/brakes/{route}/release`.
pub(crate) async fn release_brake(
    State(console): Shared,
    Extension(actor): Extension<Actor>,
    Path(route): Path<String>,
    form: Result<Form<CommandForm>, FormRejection>,
) -> Result<Redirect, PageError> {
    let request = ReasonRequest {
        reason: given(read(form)?.reason),
    };
    console.app.release_brake(&actor, &route, &request).await?;
    Ok(Redirect::to("/console/fleet#brakes"))
}

/// A small form posting to `action` with a required reason (labelled) and one button.
pub(crate) fn reason_form(action: &str, id: &str, button: &str, label: &str) -> Markup {
    html! {
        form.command method="post" action=(action) {
            label for=(id) { "Reason to " (label) }
            input id=(id) type="text" name="reason" required autocomplete="off";
            button type="submit" { (button) }
        }
    }
}
