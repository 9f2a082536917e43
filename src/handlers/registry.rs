//! Handlers registered by a stable name, each with its resolved policy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::Handler;
use crate::backoff::Backoff;
use crate::config::{RetrySettings, RouteSettings};

/// Registration problems; each stops the process at start-up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// Two handlers under one name.
    #[error("handler {0:?} is registered twice")]
    Duplicate(String),
    /// A name no handler was registered under.
    #[error("unknown handler {name:?} (registered: {registered})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names that exist, comma-separated.
        registered: String,
    },
    /// A name that is not stable-looking.
    #[error("handler name {0:?} must be 1 to 100 characters of a-z, 0-9, '.', '_' and '-'")]
    InvalidName(String),
}

/// The retry policy of one handler: its own choices, else the `[retry]` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Longest a call may run.
    pub timeout: Duration,
    /// Attempts before a permanent failure.
    pub max_attempts: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
}

impl Policy {
    /// This policy with a route's overrides applied.
    pub fn for_route(mut self, route: &RouteSettings) -> Policy {
        self.timeout = route.timeout.unwrap_or(self.timeout);
        self.max_attempts = route.max_attempts.unwrap_or(self.max_attempts);
        self.backoff.base = route.backoff_base.unwrap_or(self.backoff.base);
        self.backoff.cap = route.backoff_cap.unwrap_or(self.backoff.cap);
        self.backoff.factor = route.backoff_factor.unwrap_or(self.backoff.factor);
        self.backoff.jitter = route.jitter.unwrap_or(self.backoff.jitter);
        self
    }

    fn resolve(handler: &dyn Handler, defaults: &RetrySettings) -> Policy {
        Policy {
            timeout: handler.timeout().unwrap_or(defaults.timeout),
            max_attempts: handler
                .max_attempts()
                .unwrap_or(defaults.max_attempts)
                .max(1),
            backoff: handler.backoff().unwrap_or_else(|| defaults.backoff()),
        }
    }
}

/// A registered handler with its policy.
#[derive(Clone)]
pub struct Registered {
    /// The handler.
    pub handler: Arc<dyn Handler>,
    /// Its resolved policy.
    pub policy: Policy,
}

/// Handlers by name.
#[derive(Clone, Default)]
pub struct HandlerRegistry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl HandlerRegistry {
    /// Adds `handler` under `name`; a second handler under one name is refused.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        handler: impl Handler,
    ) -> Result<(), RegistryError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= 100
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
        if !valid {
            return Err(RegistryError::InvalidName(name));
        }
        if self.handlers.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        self.handlers.insert(name, Arc::new(handler));
        Ok(())
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// The handlers named in `wanted` (all of them when empty), with policies resolved
    /// against `defaults`. An unknown name is refused.
    pub fn select(
        &self,
        wanted: &[String],
        defaults: &RetrySettings,
    ) -> Result<BTreeMap<String, Registered>, RegistryError> {
        let names = if wanted.is_empty() {
            self.names()
        } else {
            wanted.to_vec()
        };
        names
            .into_iter()
            .map(|name| {
                let handler = self
                    .handlers
                    .get(&name)
                    .ok_or_else(|| RegistryError::Unknown {
                        name: name.clone(),
                        registered: self.names().join(", "),
                    })?;
                let policy = Policy::resolve(handler.as_ref(), defaults);
                let registered = Registered {
                    handler: Arc::clone(handler),
                    policy,
                };
                Ok((name, registered))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::LogHandler;

    #[test]
    fn duplicate_invalid_and_unknown_names_are_refused() {
        let mut registry = HandlerRegistry::default();
        registry.register("log", LogHandler).unwrap();
        assert_eq!(
            registry.register("log", LogHandler),
            Err(RegistryError::Duplicate("log".into()))
        );
        assert!(matches!(
            registry.register("Bad Name", LogHandler),
            Err(RegistryError::InvalidName(_))
        ));
        let err = registry
            .select(&["nope".into()], &RetrySettings::default())
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "unknown handler \"nope\" (registered: log)"
        );
    }

    #[test]
    fn policy_falls_back_to_retry_settings() {
        let mut registry = HandlerRegistry::default();
        registry.register("log", LogHandler).unwrap();
        let defaults = RetrySettings {
            max_attempts: 3,
            timeout: Duration::from_secs(7),
            ..RetrySettings::default()
        };
        let selected = registry.select(&[], &defaults).unwrap();
        let policy = selected["log"].policy;
        assert_eq!(policy.max_attempts, 3);
        assert_eq!(policy.timeout, Duration::from_secs(7));
        assert_eq!(policy.backoff, defaults.backoff());
    }
}
