//! The confirm page of a bulk action (a real page: it works without script): what the
//! layer's dry run says it would change, what it would leave alone and why, a sample,
//! and the form that confirms it with a reason and the verb's options.

use axum::response::Html;
use maud::{html, Markup};

use super::form::ActionForm;
use super::layout::{self, Nav};
use crate::operations::{ActAnswer, Actor, ReplayPreview, Verb};
use crate::store::{CauseView, TaskSummary};

/// The cause a selection names, said whole: what an operator confirms acting on.
fn named(cause: Option<&CauseView>) -> Markup {
    match cause {
        Some(cause) => html! {
            p.cause-named {
                "Cause " (cause.id) ": " code.class { (layout::visible(&cause.class)) } " "
                @if cause.fingerprint.trim().is_empty() { span.none { (super::broke::EMPTY_MESSAGE) } }
                @else { span.fingerprint { (layout::visible(&cause.fingerprint)) } }
            }
        },
        None => html! {},
    }
}

/// The confirm page of a retry, discard or resolve; `selected` is how many tasks the
/// selection holds in any status.
pub(crate) fn act_page(
    actor: &Actor,
    form: &ActionForm,
    cause: Option<&CauseView>,
    verb: Verb,
    answer: &ActAnswer,
    selected: i64,
) -> Html<String> {
    let name = super::jobs::verb_name(verb);
    let statuses: Vec<&str> = verb.applies_to().iter().map(|s| s.as_str()).collect();
    let other_status = (selected - answer.matched - answer.refused).max(0);
    let body = html! {
        section.confirm aria-labelledby="what" {
            h2 #what { (capitalized(name)) " " (form.describe().unwrap_or_default()) }
            (named(cause))
            p.count {
                "This would " (name) " " strong.exact-count data-count=(answer.matched) { (answer.matched) }
                @if answer.matched == 1 { " task" } @else { " tasks" } "."
            }
            @if other_status > 0 || answer.refused > 0 {
                ul.left-alone {
                    @if other_status > 0 {
                        li { (other_status) " left alone: not " (statuses.join(", ")) " (" (name) " applies to those only)." }
                    }
                    @if answer.refused > 0 {
                        li { (answer.refused) " left alone: their compensation has started (the API and CLI can force it)." }
                    }
                }
            }
            @if !answer.held_by_breakers.is_empty() {
                ul.held-by-breakers role="alert" {
                    @for held in &answer.held_by_breakers {
                        li.warning { (layout::words(&held.warning)) }
                    }
                }
            }
            (sample(answer.sample.as_deref().unwrap_or_default()))
            @if !answer.unreadable.is_empty() {
                ul.unreadable {
                    @for why in &answer.unreadable {
                        li { (layout::text_opt(Some(why))) " (counted, and changed like the others)" }
                    }
                }
            }
        }
        form.confirm method="post" action="/console/actions/run" {
            (carried(form))
            (reason_field(name))
            @if verb == Verb::Retry {
                div.field {
                    label for="c-at" { "Due at (optional)" }
                    input #c-at type="text" name="at" autocomplete="off" aria-describedby="h-at";
                    small #h-at { "empty: now; 1h: in an hour; or an RFC 3339 time" }
                }
                div.field {
                    label for="c-more" { "More attempts (optional)" }
                    input #c-more type="number" name="more_attempts" min="1" max="1000000" aria-describedby="h-more";
                    small #h-more { "empty: a whole new budget" }
                }
                (pace_fields(form, "tasks"))
            }
            div.buttons {
                button #confirm type="submit" disabled[answer.matched == 0]
                    class=[(verb == Verb::Discard).then_some("danger")] { "Confirm: " (name) " " (answer.matched) }
                a href="/console/tasks" { "Cancel" }
            }
        }
    };
    layout::page(actor, Nav::Tasks, &format!("Confirm: {name}"), body)
}

/// The confirm page of a replay.
pub(crate) fn replay_page(
    actor: &Actor,
    form: &ActionForm,
    cause: Option<&CauseView>,
    preview: &ReplayPreview,
    refused: Option<&str>,
) -> Html<String> {
    let body = html! {
        section.confirm aria-labelledby="what" {
            h2 #what { "Replay " (form.describe().unwrap_or_default()) }
            (named(cause))
            @if let Some(why) = refused {
                p.error.replay-refused role="alert" {
                    "The replay was not started: " (layout::text_opt(Some(why)))
                }
            }
            p.count {
                "This would replay the " strong.exact-count data-count=(preview.matched) { (preview.matched) }
                " tasks that match: to each task's original topic it would produce "
                (preview.produced) " messages."
            }
            ul.left-alone {
                @for skipped in preview.skipped.iter().filter(|s| s.count > 0) {
                    li { (skipped.count) " skipped: " (skipped.why)
                        @if skipped.reason == "no_original_topic" { " (give a target topic below to produce them)" }
                        "." }
                }
            }
            @if !preview.topics.is_empty() {
                p { "To: " @for (i, topic) in preview.topics.iter().enumerate() {
                    @if i > 0 { ", " } code { (topic) } } }
            }
            (sample(&preview.sample))
        }
        form.confirm method="post" action="/console/actions/run" {
            (carried(form))
            (reason_field_with("replay", form.reason.as_deref()))
            div.field {
                label for="c-to" { "Target topic" }
                input #c-to type="text" name="to" autocomplete="off" aria-describedby="h-to" value=[form.to.as_deref()];
                small #h-to { "empty: each task's original topic" }
            }
            (pace_fields(form, "messages"))
            div.field.check {
                input #c-resolved type="checkbox" name="mark_resolved" value="true" checked[form.mark_resolved];
                label for="c-resolved" { "Mark each replayed task resolved" }
            }
            div.buttons {
                button #confirm type="submit" disabled[preview.matched == 0] { "Confirm: replay" }
                a href="/console/tasks" { "Cancel" }
            }
        }
    };
    layout::page(actor, Nav::Tasks, "Confirm: replay", body)
}

/// A paced job's rate and ramp (see docs/paced-redrive.md): `what` a second.
fn pace_fields(form: &ActionForm, what: &str) -> Markup {
    html! {
        fieldset.pace {
            legend { "Pace (optional)" }
            div.field {
                label for="c-rate" { "Rate (" (what) " a second)" }
                input #c-rate type="number" name="rate" min="0.001" step="any" value=[form.rate.as_deref()] aria-describedby="h-rate";
            }
            div.field {
                label for="c-ramp" { "Ramp" }
                input #c-ramp type="text" name="ramp" autocomplete="off" placeholder="1%,5%,25%,100%" value=[form.ramp.as_deref()] aria-describedby="h-rate";
            }
            small #h-rate {
                "With a rate, a job that starts at the ramp's first share of it, checks each step of 100 tasks, "
                "and pauses itself when more than 20% of a step's outcomes fail again (Replays page)."
            }
        }
    }
}

/// The selection, carried to the confirmation as it was previewed.
fn carried(form: &ActionForm) -> Markup {
    html! {
        input type="hidden" name="verb" value=(form.verb);
        @if form.by_filter {
            input type="hidden" name="scope" value="filter";
            input type="hidden" name="filter" value=(form.filter);
        } @else {
            @for id in &form.ids { input type="hidden" name="id" value=(id); }
        }
    }
}

fn reason_field(name: &str) -> Markup {
    reason_field_with(name, None)
}

/// The reason field, holding `typed` (what the operator typed before a refusal).
fn reason_field_with(name: &str, typed: Option<&str>) -> Markup {
    html! {
        div.field {
            label for="c-reason" { "Reason (required)" }
            input #c-reason type="text" name="reason" required autocomplete="off" aria-describedby="h-reason" value=[typed];
            small #h-reason { "written to the audit log with this " (name) }
        }
    }
}

fn sample(tasks: &[TaskSummary]) -> Markup {
    if tasks.is_empty() {
        return html! {};
    }
    html! {
        table.sample {
            caption { "A sample: the first " (tasks.len()) }
            thead { tr { @for h in ["Task", "Status", "Handler", "Key", "Last error"] { th scope="col" { (h) } } } }
            tbody {
                @for t in tasks {
                    tr {
                        td { a href=(format!("/console/tasks/{}", t.id)) { (t.id) } }
                        td { (layout::status(t.status)) }
                        td { (t.handler) }
                        td.key { (layout::text_opt(t.key.as_deref())) }
                        td.error { (layout::text_opt(t.last_error.as_deref())) }
                    }
                }
            }
        }
    }
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}
