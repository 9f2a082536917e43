//! Exponential backoff with jitter for tasks ([`Backoff`]), and the growing pause between
//! tries of an infrastructure call ([`Pause`]).

use rand::Rng;
use serde::Deserialize;
use std::time::Duration;

/// How randomness is applied to the exponential delay `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum Jitter {
    /// Uniform in `[0, d]`: spreads retries the most (the default).
    Full,
    /// Uniform in `[d/2, d]`: keeps at least half the delay.
    Equal,
    /// Exactly `d`.
    None,
}

impl TryFrom<String> for Jitter {
    type Error = String;

    fn try_from(mode: String) -> Result<Self, Self::Error> {
        match mode.as_str() {
            "full" => Ok(Jitter::Full),
            "equal" => Ok(Jitter::Equal),
            "none" => Ok(Jitter::None),
            other => Err(format!(
                "unknown jitter {other:?}: expected \"full\", \"equal\" or \"none\""
            )),
        }
    }
}

/// Exponential backoff: `min(cap, base * factor^(attempt-1))`, then jitter.
///
/// Defaults: base 1 s, factor 2, cap 1 h, full jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failed attempt, before jitter.
    pub base: Duration,
    /// Growth per attempt (>= 1).
    pub factor: f64,
    /// Upper bound of any delay.
    pub cap: Duration,
    /// Randomisation applied to the capped delay.
    pub jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            factor: 2.0,
            cap: Duration::from_secs(3600),
            jitter: Jitter::Full,
        }
    }
}

impl Backoff {
    /// The delay before the attempt after `failed_attempts` failures (1 = first failure),
    /// never above `cap`.
    pub fn delay(&self, failed_attempts: u32) -> Duration {
        self.delay_with(failed_attempts, &mut rand::rng())
    }

    /// [`Backoff::delay`] with a caller's random source (for tests).
    pub fn delay_with(&self, failed_attempts: u32, rng: &mut impl Rng) -> Duration {
        let exponent = failed_attempts.saturating_sub(1).min(1024) as i32;
        let cap = self.cap.as_secs_f64();
        let raw = self.base.as_secs_f64() * self.factor.powi(exponent);
        let capped = if raw.is_finite() { raw.min(cap) } else { cap };
        let jittered = match self.jitter {
            Jitter::None => capped,
            Jitter::Full => rng.random_range(0.0..=capped),
            Jitter::Equal => capped / 2.0 + rng.random_range(0.0..=capped / 2.0),
        };
        Duration::try_from_secs_f64(jittered.clamp(0.0, cap)).unwrap_or(self.cap)
    }
}

/// The pauses between tries of one infrastructure call (a statement, a connection) that
/// failed: the first, then each twice the one before up to the longest, from the first
/// again once [`Pause::reset`] after an answer. Without jitter: one member's loop waits on
/// its own call, not on tasks that failed together (those are [`Backoff`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    first: Duration,
    longest: Duration,
    next: Duration,
}

impl Pause {
    /// Pauses from `first` up to `longest`.
    pub const fn new(first: Duration, longest: Duration) -> Self {
        Pause {
            first,
            longest,
            next: first,
        }
    }

    /// The pause of a member's statements while the database fails: 100 ms up to 5 s.
    pub const fn database() -> Self {
        Pause::new(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// The pause to wait now; the next one is twice as long, up to the longest.
    pub fn next_pause(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next.saturating_mul(2)).min(self.longest);
        now
    }

    /// The pause [`Pause::next_pause`] would answer, without taking it.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// The call answered: the next failure waits the first pause again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    fn backoff(jitter: Jitter) -> Backoff {
        Backoff {
            base: Duration::from_millis(100),
            factor: 2.0,
            cap: Duration::from_secs(10),
            jitter,
        }
    }

    #[test]
    fn without_jitter_grows_exponentially_up_to_the_cap() {
        let b = backoff(Jitter::None);
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(8), Duration::from_secs(10));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(10));
        assert_eq!(b.delay(0), Duration::from_millis(100));
    }

    #[test]
    fn jittered_delays_stay_within_bounds() {
        let mut rng = StdRng::seed_from_u64(7);
        for jitter in [Jitter::Full, Jitter::Equal] {
            let b = backoff(jitter);
            for attempt in 1..64 {
                let ceiling = b.base.as_secs_f64() * 2f64.powi(attempt as i32 - 1);
                let ceiling = Duration::from_secs_f64(ceiling.min(10.0));
                let floor = if jitter == Jitter::Equal {
                    ceiling / 2
                } else {
                    Duration::ZERO
                };
                for _ in 0..200 {
                    let d = b.delay_with(attempt, &mut rng);
                    assert!(d <= ceiling && d <= b.cap, "{d:?} > {ceiling:?}");
                    assert!(d >= floor.saturating_sub(Duration::from_nanos(1)), "{d:?}");
                }
            }
        }
    }

    #[test]
    fn full_jitter_spreads_retries_that_failed_together() {
        let mut rng = StdRng::seed_from_u64(11);
        let b = backoff(Jitter::Full);
        let mut samples: Vec<f64> = (0..1000)
            .map(|_| b.delay_with(20, &mut rng).as_secs_f64())
            .collect();
        samples.sort_by(f64::total_cmp);
        // Uniform on [0, 10]: deciles near 1, 5 and 9 seconds.
        assert!((0.5..1.5).contains(&samples[100]), "{}", samples[100]);
        assert!((4.5..5.5).contains(&samples[500]), "{}", samples[500]);
        assert!((8.5..9.5).contains(&samples[900]), "{}", samples[900]);
        let distinct = samples.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(distinct > 990);
    }

    #[test]
    fn huge_factor_does_not_overflow() {
        let b = Backoff {
            factor: 1e308,
            ..backoff(Jitter::None)
        };
        assert_eq!(b.delay(10), Duration::from_secs(10));
    }

    #[test]
    fn a_pause_doubles_up_to_its_longest_and_starts_over_after_an_answer() {
        let mut pause = Pause::new(Duration::from_millis(100), Duration::from_millis(500));
        let taken: Vec<u128> = (0..5).map(|_| pause.next_pause().as_millis()).collect();
        assert_eq!(taken, [100, 200, 400, 500, 500]);
        assert_eq!(pause.peek(), Duration::from_millis(500));
        pause.reset();
        assert_eq!(pause.next_pause(), Duration::from_millis(100));
        let mut huge = Pause::new(Duration::MAX / 2 + Duration::from_secs(1), Duration::MAX);
        huge.next_pause();
        assert_eq!(huge.next_pause(), Duration::MAX, "no overflow");
    }
}
