//! Members, breakers and brakes: the tables the overview shows live, and the page that
//! shows them whole.
//!
//! For an operate caller (on this page, not the overview): force open / force closed /
//! release on each breaker and release on each engaged brake, each with a reason, in
//! the tables' last column, and a form that engages the brake of any route (reason,
//! optional duration); see [`super::commands`].

use axum::extract::State;
use axum::response::Html;
use axum::Extension;
use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::commands::reason_form;
use super::error::PageError;
use super::layout::{self, thousands, Nav};
use super::Shared;
use crate::config::Role;
use crate::operations::Actor;
use crate::resilience::breaker::{Breaker, BreakerState};
use crate::store::{Brake, Member};

/// `GET /console/fleet`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let members = console.app.members().await?.items;
    let breakers = console.app.breakers().await?.items;
    let brakes = console.app.brakes().await?.items;
    let now = Utc::now();
    let operate = caller.role == Role::Operate;
    let body = html! {
        section aria-labelledby="members" {
            h2 #members { "Live members" }
            (members_table(&members))
        }
        section aria-labelledby="breakers" {
            h2 #breakers { "Circuit breakers" }
            (breakers_table(&breakers, operate))
        }
        section aria-labelledby="brakes" {
            h2 #brakes { "Brakes" }
            (brakes_table(&brakes, now, operate))
            @if operate { (engage_form(&brakes)) }
        }
    };
    Ok(layout::page(
        &caller,
        Nav::Fleet,
        "Members, breakers and brakes",
        body,
    ))
}

/// The live members.
pub(crate) fn members_table(members: &[Member]) -> Markup {
    if members.is_empty() {
        return html! { p.empty { "No member has recorded itself in the last 30 s." } };
    }
    html! {
        table.members {
            caption { (members.len()) " live" }
            thead {
                tr {
                    @for heading in ["Member", "Host", "Version", "Roles", "Handlers", "Started", "Last seen"] {
                        th scope="col" { (heading) }
                    }
                }
            }
            tbody {
                @for m in members {
                    tr {
                        th scope="row" { (m.id) }
                        td { (m.host) }
                        td { (m.version) }
                        td { (m.roles.join(", ")) }
                        td {
                            @if m.handlers.is_empty() { "every handler" } @else { (m.handlers.join(", ")) }
                        }
                        td { (layout::when(m.started_at)) }
                        td { (layout::when(m.last_seen)) }
                    }
                }
            }
        }
    }
}

/// Every stored breaker, the ones not closed first.
pub(crate) fn breakers_table(breakers: &[Breaker], operate: bool) -> Markup {
    if breakers.is_empty() {
        return html! { p.empty { "No breaker has been recorded (no handler with [handlers.NAME.breaker] has been called)." } };
    }
    let mut sorted: Vec<&Breaker> = breakers.iter().collect();
    sorted.sort_by_key(|b| (b.state == BreakerState::Closed, b.handler.clone()));
    html! {
        table.breakers {
            thead {
                tr {
                    @for heading in ["Handler", "State", "Forced", "Failures in a row", "Window (failures / calls)",
                                     "Held until", "Changed", "Why"] {
                        th scope="col" { (heading) }
                    }
                    @if operate { th scope="col" { "Actions" } }
                }
            }
            tbody {
                @for (row, b) in sorted.into_iter().enumerate() {
                    tr {
                        th scope="row" { (b.handler) }
                        td { span class={ "badge breaker-" (b.state.as_str()) } { (b.state.as_str()) } }
                        td { (layout::text_opt(b.forced.map(BreakerState::as_str))) }
                        td.number { (thousands(i64::from(b.consecutive_failures))) }
                        td.number { (thousands(i64::from(b.window_failures))) " / " (thousands(i64::from(b.window_calls))) }
                        td {
                            @if b.forced_open() { "until released" }
                            @else { (layout::when_opt(b.hold_until)) }
                        }
                        td { (layout::when(b.changed_at)) }
                        td { (layout::text_opt(b.reason.as_deref())) }
                        @if operate {
                            td.actions {
                                @for (command, button) in [("open", "Force open"), ("close", "Force closed"), ("release", "Release")] {
                                    (reason_form(
                                        &format!("/console/breakers/{}/{command}", layout::segment(&b.handler)),
                                        &format!("breaker-{command}-{row}"),
                                        button,
                                        &format!("{} breaker {}", button.to_lowercase(), b.handler),
                                    ))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Every brake that ever engaged; "engaged" as of `now` (this member's clock).
pub(crate) fn brakes_table(brakes: &[Brake], now: DateTime<Utc>, operate: bool) -> Markup {
    if brakes.is_empty() {
        return html! { p.empty { "No brake has ever engaged." } };
    }
    html! {
        table.brakes {
            thead {
                tr {
                    @for heading in ["Route", "Now", "Engaged until", "Engaged", "By", "Why", "Trips", "Released", "By"] {
                        th scope="col" { (heading) }
                    }
                    @if operate { th scope="col" { "Actions" } }
                }
            }
            tbody {
                @for (row, b) in brakes.iter().enumerate() {
                    tr {
                        th scope="row" { (b.route) }
                        td {
                            @if b.engaged(now) { span.badge.brake-engaged { "engaged" } }
                            @else { span.badge.brake-released { "released" } }
                        }
                        td { (layout::when_opt(b.engaged_until)) }
                        td { (layout::when_opt(b.engaged_at)) }
                        td { (layout::text_opt(b.engaged_by.as_deref())) }
                        td { (layout::text_opt(b.reason.as_deref())) }
                        td.number { (b.trips) }
                        td { (layout::when_opt(b.released_at)) }
                        td { (layout::text_opt(b.released_by.as_deref())) }
                        @if operate {
                            td.actions {
                                @if b.engaged(now) {
                                    (reason_form(
                                        &format!("/console/brakes/{}/release", layout::segment(&b.route)),
                                        &format!("brake-release-{row}"),
                                        "Release",
                                        &format!("release the brake of {}", b.route),
                                    ))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The form that engages a route's brake: any route the brakes table lists (every
/// configured route is there).
fn engage_form(brakes: &[Brake]) -> Markup {
    if brakes.is_empty() {
        return html! {};
    }
    html! {
        form.engage method="post" action="/console/brakes/engage" {
            h3 { "Engage a brake" }
            div.field {
                label for="engage-route" { "Route" }
                select #engage-route name="route" {
                    @for b in brakes { option value=(b.route) { (b.route) } }
                }
            }
            div.field {
                label for="engage-reason" { "Reason (required)" }
                input #engage-reason type="text" name="reason" required autocomplete="off";
            }
            div.field {
                label for="engage-for" { "For (optional)" }
                input #engage-for type="text" name="for" autocomplete="off" aria-describedby="h-engage-for";
                small #h-engage-for { "a duration up to 7 days, e.g. 30m; empty: 1h" }
            }
            button #engage type="submit" { "Engage the brake" }
        }
    }
}
