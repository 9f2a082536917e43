//! `brake` of a process-mode route: when a bad deploy makes most messages fail inline,
//! the route stops consuming instead of turning its whole topic into tasks.

use serde::Deserialize;
use std::time::Duration;

use super::checks::{within, ONE_DAY};
use super::{duration, ConfigError};

/// `[routes.brake]` (inline table `brake = { ... }` of a `[[routes]]` entry).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrakeSettings {
    /// Engages when this share of the inline attempts in the window failed...
    pub failure_ratio: f64,
    /// ... over a sliding window this long ...
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// ... with at least this many messages in it.
    pub min_messages: u32,
    /// How long the route stays paused, unless an operator releases it sooner.
    #[serde(deserialize_with = "duration")]
    pub cool_down: Duration,
}

impl Default for BrakeSettings {
    fn default() -> Self {
        BrakeSettings {
            failure_ratio: 0.9,
            window: Duration::from_secs(60),
            min_messages: 100,
            cool_down: Duration::from_secs(300),
        }
    }
}

impl BrakeSettings {
    /// Checks every field; `key` turns a field into its dotted key.
    pub(crate) fn validate(&self, key: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        let ratio = self.failure_ratio;
        if !(ratio.is_finite() && ratio > 0.0 && ratio <= 1.0) {
            return Err(ConfigError::new(
                key("brake.failure_ratio"),
                format!("must be above 0 and at most 1, got {ratio}"),
            ));
        }
        if self.min_messages == 0 {
            return Err(ConfigError::new(
                key("brake.min_messages"),
                "must be at least 1",
            ));
        }
        within(&key("brake.window"), self.window, ONE_DAY)?;
        within(&key("brake.cool_down"), self.cool_down, ONE_DAY)?;
        Ok(())
    }
}
