//! Brakes of routes: list them, engage one on purpose (an operator pausing a route's
//! consumption during an incident, on any route), release one (both audited). Every
//! member follows the fleet's brakes: an engaged route consumes nothing until released.

use serde::Deserialize;
use std::time::Duration;

use super::actor::{required_reason, Actor};
use super::breakers::ReasonRequest;
use super::error::{OperationError, Result};
use super::page::Page;
use super::Operations;
use crate::config::parse_duration;
use crate::store::Brake;

/// How long an operator's brake holds when the request does not say.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(3600);

/// Longest an operator's brake may hold at once (engage it again to hold it longer):
/// a route paused for longer may lose messages to its topic's retention.
pub const LONGEST_HOLD: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why and for how long to engage a brake: the body of `POST
/// /api/v1/brakes/{route}/engage`, and what `redrive brakes engage` reads.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EngageRequest {
    /// Why (required; written to the audit log and shown on the brake).
    pub reason: Option<String>,
    /// How long the route stays paused unless released sooner: a duration ("30m"), at
    /// most 7 days (default 1h). A brake engaged already is held this long from now.
    #[serde(rename = "for")]
    pub hold: Option<String>,
}

impl EngageRequest {
    fn hold(&self) -> Result<Duration> {
        let Some(text) = &self.hold else {
            return Ok(DEFAULT_HOLD);
        };
        let hold = parse_duration(text).map_err(|e| format!("for: {e}"));
        match hold.map_err(OperationError::BadRequest)? {
            Duration::ZERO => Err(OperationError::bad_request("for: must be longer than 0s")),
            hold if hold > LONGEST_HOLD => Err(OperationError::bad_request(format!(
                "for: {text:?} is longer than 7 days; engage it again later to hold it longer"
            ))),
            hold => Ok(hold),
        }
    }
}

impl Operations {
    /// Every configured route's brake (off if it never engaged) and every stored one,
    /// by route.
    pub async fn brakes(&self) -> Result<Page<Brake>> {
        let mut brakes = self.store.brakes().await?;
        for route in &self.routes {
            if !brakes.iter().any(|b| b.route == route.name) {
                brakes.push(Brake::never_engaged(&route.name));
            }
        }
        brakes.sort_by(|a, b| a.route.cmp(&b.route));
        Ok(Page::whole(brakes))
    }

    /// Engages `route`'s brake for `actor`, audited: every member pauses the route
    /// (fetches and commits nothing of it) within a second or so, until the hold ends or
    /// it is released.
    pub async fn engage_brake(
        &self,
        actor: &Actor,
        route: &str,
        request: &EngageRequest,
    ) -> Result<Brake> {
        actor.must_operate()?;
        let reason = required_reason(request.reason.as_deref())?;
        let hold = request.hold()?;
        self.known_route(route).await?;
        let operator = actor.operator(Some(reason));
        Ok(self.store.engage_brake_by(route, hold, &operator).await?)
    }

    /// Releases `route`'s engaged brake for `actor`, audited: every member resumes the
    /// route within a second or so.
    pub async fn release_brake(
        &self,
        actor: &Actor,
        route: &str,
        request: &ReasonRequest,
    ) -> Result<Brake> {
        actor.must_operate()?;
        let reason = required_reason(request.reason.as_deref())?;
        self.known_route(route).await?;
        let operator = actor.operator(Some(reason));
        Ok(self.store.release_brake(route, &operator).await?)
    }

    /// Refuses a route neither configured here nor braked before (a typo).
    async fn known_route(&self, route: &str) -> Result<()> {
        let configured = self.routes.iter().any(|r| r.name == route);
        if configured || self.store.brakes().await?.iter().any(|b| b.route == route) {
            return Ok(());
        }
        let names: Vec<&str> = self.routes.iter().map(|r| r.name.as_str()).collect();
        Err(OperationError::NotFound(format!(
            "no route {route:?} in this configuration (routes: {}) and no brake of it \
             stored; run with the fleet's configuration file",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_a_duration_up_to_a_week() {
        let hold = |text: &str| {
            EngageRequest {
                reason: None,
                hold: Some(text.into()),
            }
            .hold()
        };
        assert_eq!(EngageRequest::default().hold().unwrap(), DEFAULT_HOLD);
        assert_eq!(hold("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(hold("7days").unwrap(), LONGEST_HOLD);
        for (bad, says) in [
            ("0s", "longer than 0s"),
            ("8days", "7 days"),
            ("soon", "for: "),
        ] {
            let error = hold(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
