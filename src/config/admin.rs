//! `[admin]` (the admin HTTP API and its tokens) and `[retention]`.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::checks::{within, ONE_DAY, ONE_HOUR, TEN_YEARS};
use super::{optional_duration, ConfigError};

/// Shortest admin token accepted: a guessable bearer token is no protection.
pub const MIN_TOKEN_CHARS: usize = 16;

/// `[admin]`: the admin HTTP API.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    /// Address to serve the API on, e.g. `"127.0.0.1:9465"`; none turns it off.
    pub listen: Option<SocketAddr>,
    /// Bearer tokens by name; the name is the actor in the audit log. Without any, the
    /// API is open, which is allowed on a loopback address only.
    pub tokens: BTreeMap<String, AdminToken>,
    /// Longest a database statement of an API request runs before PostgreSQL cancels it
    /// (the request is answered 504).
    #[serde(deserialize_with = "super::duration")]
    pub statement_timeout: Duration,
}

impl Default for AdminSettings {
    fn default() -> Self {
        AdminSettings {
            listen: None,
            tokens: BTreeMap::new(),
            statement_timeout: Duration::from_secs(30),
        }
    }
}

/// One bearer token of the admin API.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminToken {
    /// What it may do.
    pub role: Role,
    /// The secret (`REDRIVE__ADMIN__TOKENS__<NAME>__TOKEN` sets it from the environment).
    pub token: SecretString,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("role", &self.role)
            .field("token", &"[hidden]")
            .finish()
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read tasks, stats, audit, members, replays.
    Read,
    /// Read, and act: retry, discard, resolve, replay, cancel.
    Operate,
}

impl AdminSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        within("admin.statement_timeout", self.statement_timeout, ONE_HOUR)?;
        for (name, token) in &self.tokens {
            let key = format!("admin.tokens.{name}");
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(ConfigError::new(
                    key,
                    "a token name is letters, digits, '_' and '-' (it is the audit actor)",
                ));
            }
            if token.token.expose_secret().chars().count() < MIN_TOKEN_CHARS {
                return Err(ConfigError::new(
                    format!("{key}.token"),
                    format!("must be at least {MIN_TOKEN_CHARS} characters"),
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (name, token) in &self.tokens {
            if !seen.insert(token.token.expose_secret()) {
                return Err(ConfigError::new(
                    format!("admin.tokens.{name}.token"),
                    "is the same as another token's (each name must have its own, or the audit cannot tell them apart)",
                ));
            }
        }
        if let Some(listen) = self.listen {
            if self.tokens.is_empty() && !listen.ip().is_loopback() {
                return Err(ConfigError::new(
                    "admin.tokens",
                    format!(
                        "none configured, and admin.listen ({listen}) is not a loopback address: \
                         the API would be open to the network; add admin.tokens.<name> \
                         with role and token"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `[operations]`: rules of operators' actions.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OperationsSettings {
    /// Four eyes: an action (retry, discard, resolve, replay, transform) selecting more
    /// tasks than this waits for a second operator's approval; absent: none does.
    pub approval_over: Option<u64>,
}

/// Largest `approval_over`.
const MOST_APPROVAL_OVER: u64 = 1_000_000_000;

impl OperationsSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match self.approval_over {
            Some(n) if n > MOST_APPROVAL_OVER => Err(ConfigError::new(
                "operations.approval_over",
                format!("must be at most {MOST_APPROVAL_OVER} tasks (got {n}); leave it out for no approvals"),
            )),
            _ => Ok(()),
        }
    }
}

/// `[retention]`: how long final tasks are kept, per status; absent keeps them.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Delete expired tasks in this member.
    pub enabled: bool,
    /// Keep resolved tasks this long after they finished.
    #[serde(deserialize_with = "optional_duration")]
    pub resolved: Option<Duration>,
    /// Keep discarded tasks this long.
    #[serde(deserialize_with = "optional_duration")]
    pub discarded: Option<Duration>,
    /// Keep permanent failures this long (by default they are kept until an operator
    /// acts on them).
    #[serde(deserialize_with = "optional_duration")]
    pub permanent_failure: Option<Duration>,
    /// How often a member looks for expired tasks.
    #[serde(deserialize_with = "super::duration")]
    pub interval: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);
        RetentionSettings {
            enabled: true,
            resolved: Some(WEEK),
            discarded: Some(WEEK),
            permanent_failure: None,
            interval: Duration::from_secs(60),
        }
    }
}

impl RetentionSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, age) in [
            ("retention.resolved", self.resolved),
            ("retention.discarded", self.discarded),
            ("retention.permanent_failure", self.permanent_failure),
        ] {
            if let Some(age) = age {
                within(key, age, TEN_YEARS)?;
            }
        }
        within("retention.interval", self.interval, ONE_DAY)
    }
}
