//! Rates (calls or messages per second) from configuration and operators: one range for
//! all of them, and the one conversion into a limiter, which no value can make panic.

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::time::Duration;

/// Smallest rate accepted: one per 1,000 seconds.
pub const MIN_RATE: f64 = 0.001;
/// Largest rate accepted: far above what one handler or topic could take.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Longest gap a limiter waits between two admissions, whatever the rate.
const LONGEST_PERIOD: Duration = Duration::from_secs(1_000);

/// Why `rate` is refused, if it is: it must be a number from [`MIN_RATE`] to
/// [`MAX_RATE`].
pub fn refusal(rate: f64) -> Option<String> {
    (!(MIN_RATE..=MAX_RATE).contains(&rate))
        .then(|| format!("must be a number per second from {MIN_RATE} to {MAX_RATE}, got {rate}"))
}

/// A limiter admitting `rate` per second with bursts of up to `burst`. Any value is
/// safe: a rate out of range (a stored row written by hand, a share of a tiny rate)
/// admits one per [`LONGEST_PERIOD`] at the least and one per nanosecond at the most.
pub(crate) fn limiter(rate: f64, burst: u32) -> DefaultDirectRateLimiter {
    let period = Duration::try_from_secs_f64(1.0 / rate)
        .unwrap_or(LONGEST_PERIOD)
        .clamp(Duration::from_nanos(1), LONGEST_PERIOD);
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    let quota = Quota::with_period(period)
        .expect("a period of at least a nanosecond")
        .allow_burst(burst);
    RateLimiter::direct(quota)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `Duration::from_secs_f64(1.0 / rate)` panicked on a replay rate of
    /// `1e-20` and on a rate limit shared among members.
    #[test]
    fn no_rate_panics_the_limiter() {
        for rate in [
            1e-20,
            f64::MIN_POSITIVE,
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
            MIN_RATE / 3.0,
            1.0,
        ] {
            let limiter = limiter(rate, 1);
            assert!(
                limiter.check().is_ok(),
                "{rate}: the first call is admitted"
            );
        }
    }

    #[test]
    fn rates_out_of_range_are_refused() {
        for rate in [1e-20, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e7, 0.0009] {
            assert!(refusal(rate).is_some(), "{rate}");
        }
        for rate in [MIN_RATE, 0.5, 20.0, MAX_RATE] {
            assert_eq!(refusal(rate), None, "{rate}");
        }
    }
}
