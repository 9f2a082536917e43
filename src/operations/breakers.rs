//! Circuit breakers: list them, force one open or closed, release it (audited).

use serde::Deserialize;

use super::actor::{required_reason, Actor};
use super::error::{OperationError, Result};
use super::page::Page;
use super::Operations;
use crate::resilience::breaker::Breaker;
use crate::store::BreakerCommand;

/// Why an operator changes a breaker or a brake (written to the audit log): the body of
/// the breaker and brake commands.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReasonRequest {
    /// Why (required).
    pub reason: Option<String>,
}

impl Operations {
    /// Every configured breaker (closed if it never counted a call), then the stored
    /// breakers of handlers this configuration does not know (another member's).
    pub async fn breakers(&self) -> Result<Page<Breaker>> {
        let stored = self.store.breakers(None).await?;
        let now = chrono::Utc::now();
        let mut breakers: Vec<Breaker> = (self.breakers.keys())
            .map(|handler| {
                (stored.iter().find(|b| &b.handler == handler).cloned())
                    .unwrap_or_else(|| Breaker::new(handler.clone(), now))
            })
            .collect();
        breakers.extend((stored.into_iter()).filter(|b| !self.breakers.contains_key(&b.handler)));
        Ok(Page::whole(
            breakers.into_iter().map(Breaker::for_people).collect(),
        ))
    }

    /// Forces `handler`'s breaker open or closed, or releases a forced state, for
    /// `actor`, audited: the breaker as it is now.
    pub async fn command_breaker(
        &self,
        actor: &Actor,
        handler: &str,
        command: BreakerCommand,
        request: &ReasonRequest,
    ) -> Result<Breaker> {
        actor.must_operate()?;
        let reason = required_reason(request.reason.as_deref())?;
        let Some(settings) = self.breakers.get(handler) else {
            return Err(OperationError::NotFound(format!(
                "handler {handler:?} has no breaker: configure [handlers.{handler}.breaker]"
            )));
        };
        let operator = actor.operator(Some(reason));
        let (breaker, _) = (self.store)
            .command_breaker(handler, command, settings, &operator)
            .await?;
        Ok(breaker.for_people())
    }
}
