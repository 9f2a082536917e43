//! `[handlers.NAME]`: how redrive protects the system a handler calls (and itself):
//! a bulkhead, a fleet-wide rate limit and a fleet-wide circuit breaker.

use serde::Deserialize;
use std::time::Duration;

use super::checks::{within, ONE_DAY};
use super::{duration, ConfigError};

/// `[handlers.NAME]`: limits and the breaker of one handler. All off by default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HandlerSettings {
    /// Bulkhead: most calls of this handler running at once in one process (within
    /// `worker.concurrency`), so a slow downstream cannot take every slot.
    pub max_concurrency: Option<u32>,
    /// Calls per second for the whole fleet, shared evenly among live worker members.
    pub rate_limit: Option<f64>,
    /// `[handlers.NAME.breaker]`: a circuit breaker shared by the fleet.
    pub breaker: Option<BreakerSettings>,
}

/// `[handlers.NAME.breaker]`: when to stop calling a failing downstream, and how to
/// find out that it is back.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerSettings {
    /// Opens after this many transient failures in a row (fleet-wide).
    pub consecutive_failures: u32,
    /// Or opens when this share of the calls in a window failed transiently...
    pub failure_ratio: f64,
    /// ... over a window this long ...
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// ... with at least this many calls in it.
    pub min_calls: u32,
    /// How long it stays open before probing.
    #[serde(deserialize_with = "duration")]
    pub cool_down: Duration,
    /// Attempts let through while half-open; one success closes it, one failure opens it.
    pub probes: u32,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            consecutive_failures: 10,
            failure_ratio: 0.5,
            window: Duration::from_secs(60),
            min_calls: 20,
            cool_down: Duration::from_secs(30),
            probes: 1,
        }
    }
}

impl HandlerSettings {
    /// Checks every key; errors name `handlers.NAME.KEY`.
    pub(crate) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("handlers.{name}.{k}");
        if self.max_concurrency == Some(0) {
            return Err(ConfigError::new(
                key("max_concurrency"),
                "must be at least 1",
            ));
        }
        if let Some(rate) = self.rate_limit {
            if let Some(refusal) = crate::rate::refusal(rate) {
                return Err(ConfigError::new(key("rate_limit"), refusal));
            }
        }
        if let Some(breaker) = &self.breaker {
            let key = |k: &str| format!("handlers.{name}.breaker.{k}");
            for (field, value) in [
                ("consecutive_failures", breaker.consecutive_failures),
                ("min_calls", breaker.min_calls),
                ("probes", breaker.probes),
            ] {
                if value == 0 {
                    return Err(ConfigError::new(key(field), "must be at least 1"));
                }
                if value > i32::MAX as u32 {
                    return Err(ConfigError::new(key(field), "is too large"));
                }
            }
            let ratio = breaker.failure_ratio;
            if !(ratio.is_finite() && ratio > 0.0 && ratio <= 1.0) {
                return Err(ConfigError::new(
                    key("failure_ratio"),
                    format!("must be above 0 and at most 1, got {ratio}"),
                ));
            }
            within(&key("window"), breaker.window, ONE_DAY)?;
            within(&key("cool_down"), breaker.cool_down, ONE_DAY)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_thresholds_and_rates_are_refused_naming_the_key() {
        let error = |s: HandlerSettings| s.validate("billing").unwrap_err().to_string();
        let breaker = |f: fn(&mut BreakerSettings)| {
            let mut b = BreakerSettings::default();
            f(&mut b);
            HandlerSettings {
                breaker: Some(b),
                ..HandlerSettings::default()
            }
        };
        assert!(error(breaker(|b| b.consecutive_failures = 0))
            .contains("handlers.billing.breaker.consecutive_failures: must be at least 1"));
        assert!(error(breaker(|b| b.probes = 0)).contains("handlers.billing.breaker.probes"));
        assert!(error(breaker(|b| b.failure_ratio = 1.5))
            .contains("handlers.billing.breaker.failure_ratio"));
        assert!(error(breaker(|b| b.cool_down = Duration::ZERO))
            .contains("handlers.billing.breaker.cool_down"));
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let s = HandlerSettings {
                rate_limit: Some(rate),
                ..HandlerSettings::default()
            };
            assert!(error(s).contains("handlers.billing.rate_limit"), "{rate}");
        }
        let s = HandlerSettings {
            max_concurrency: Some(0),
            ..HandlerSettings::default()
        };
        assert!(error(s).contains("handlers.billing.max_concurrency"));
        HandlerSettings {
            max_concurrency: Some(4),
            rate_limit: Some(0.5),
            breaker: Some(BreakerSettings::default()),
        }
        .validate("billing")
        .unwrap();
    }
}
