//! Members, breakers and brakes: the tables the overview shows live, and the page that
//! shows them whole.
//!
//! **Actions, next round**: for an operate caller, force open / force closed / release
//! on each breaker and release on each engaged brake (with a reason), over the
//! operations layer, go in these tables' last column.

use axum::extract::State;
use axum::response::Html;
use axum::Extension;
use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::error::PageError;
use super::layout::{self, Nav};
use super::Shared;
use crate::operations::Actor;
use crate::resilience::breaker::{Breaker, BreakerState};
use crate::store::{Brake, Member};

/// `GET /console/fleet`.
pub(crate) async fn page(
    State(console): Shared,
    Extension(caller): Extension<Actor>,
) -> Result<Html<String>, PageError> {
    let store = &console.app.store();
    let members = store.live_members().await?;
    let breakers = store.breakers(None).await?;
    let brakes = store.brakes().await?;
    let now = Utc::now();
    let body = html! {
        section aria-labelledby="members" {
            h2 #members { "Live members" }
            (members_table(&members))
        }
        section aria-labelledby="breakers" {
            h2 #breakers { "Circuit breakers" }
            (breakers_table(&breakers))
        }
        section aria-labelledby="brakes" {
            h2 #brakes { "Brakes" }
            (brakes_table(&brakes, now))
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
pub(crate) fn breakers_table(breakers: &[Breaker]) -> Markup {
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
                }
            }
            tbody {
                @for b in sorted {
                    tr {
                        th scope="row" { (b.handler) }
                        td { span class={ "badge breaker-" (b.state.as_str()) } { (b.state.as_str()) } }
                        td { (layout::text_opt(b.forced.map(BreakerState::as_str))) }
                        td.number { (b.consecutive_failures) }
                        td.number { (b.window_failures) " / " (b.window_calls) }
                        td { (layout::when_opt(b.hold_until)) }
                        td { (layout::when(b.changed_at)) }
                        td { (layout::text_opt(b.reason.as_deref())) }
                    }
                }
            }
        }
    }
}

/// Every brake that ever engaged; "engaged" as of `now` (this member's clock).
pub(crate) fn brakes_table(brakes: &[Brake], now: DateTime<Utc>) -> Markup {
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
                }
            }
            tbody {
                @for b in brakes {
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
                    }
                }
            }
        }
    }
}
