//! The sliding window the bad-deploy brake counts a route's inline outcomes in, what
//! counts in it ([`brake_vote`]), and the threshold that trips the brake.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::BrakeSettings;
use crate::task::Verdict;

/// What an inline attempt says about the deploy of its route's handler: `Some(true)` a
/// failure of the handler's own, `Some(false)` a success, `None` nothing. The brake is
/// for a new version that fails messages itself; a downstream that is away is the
/// circuit breaker's business. So a permanent verdict and a panic always count as
/// failures; a transient failure (an error, a timeout, a Retry-After) counts only when
/// the handler has no breaker to count it (`breaker`: one is configured); an attempt that
/// did not call the handler says nothing.
pub(crate) fn brake_vote(verdict: Verdict, resolved: bool, breaker: bool) -> Option<bool> {
    match verdict {
        Verdict::NotCalled => None,
        Verdict::Answered => Some(!resolved),
        Verdict::Panicked => Some(true),
        Verdict::Transient => (!breaker).then_some(true),
    }
}

/// Buckets per window: the window slides by a tenth of its length.
const BUCKETS: u32 = 10;

/// Inline outcomes over the last `span`, in buckets.
#[derive(Debug)]
pub(crate) struct SlidingWindow {
    span: Duration,
    buckets: VecDeque<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    start: Instant,
    succeeded: u32,
    failed: u32,
}

impl SlidingWindow {
    pub(crate) fn new(span: Duration) -> SlidingWindow {
        SlidingWindow {
            span,
            buckets: VecDeque::new(),
        }
    }

    /// Counts one outcome at `now`.
    pub(crate) fn record(&mut self, now: Instant, failed: bool) {
        self.expire(now);
        let width = self.span / BUCKETS;
        let current = match self.buckets.back_mut() {
            Some(bucket) if now.saturating_duration_since(bucket.start) < width => bucket,
            _ => {
                self.buckets.push_back(Bucket {
                    start: now,
                    succeeded: 0,
                    failed: 0,
                });
                self.buckets.back_mut().expect("just pushed")
            }
        };
        if failed {
            current.failed += 1;
        } else {
            current.succeeded += 1;
        }
    }

    /// `(failed, total)` within the window ending at `now`.
    pub(crate) fn counts(&mut self, now: Instant) -> (u32, u32) {
        self.expire(now);
        self.buckets.iter().fold((0, 0), |(failed, total), b| {
            (failed + b.failed, total + b.failed + b.succeeded)
        })
    }

    /// Forgets everything (after a trip, and when the route resumes).
    pub(crate) fn clear(&mut self) {
        self.buckets.clear();
    }

    fn expire(&mut self, now: Instant) {
        while self
            .buckets
            .front()
            .is_some_and(|b| now.saturating_duration_since(b.start) >= self.span)
        {
            self.buckets.pop_front();
        }
    }
}

/// Whether `(failed, total)` passes `settings`' threshold.
pub(crate) fn passes(settings: &BrakeSettings, failed: u32, total: u32) -> bool {
    total >= settings.min_messages && f64::from(failed) >= settings.failure_ratio * f64::from(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_slides_and_forgets_old_outcomes() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut window = SlidingWindow::new(Duration::from_secs(10));
        for i in 0..10 {
            window.record(start + second * i, i % 2 == 0);
        }
        assert_eq!(window.counts(start + second * 9), (5, 10));
        // Ten seconds after the first outcome it has left the window.
        assert_eq!(window.counts(start + second * 10), (4, 9));
        assert_eq!(window.counts(start + second * 19), (0, 0));
        window.record(start + second * 20, true);
        assert_eq!(window.counts(start + second * 20), (1, 1));
        window.clear();
        assert_eq!(window.counts(start + second * 20), (0, 0));
    }

    #[test]
    fn a_downstream_failure_is_the_breakers_and_the_handlers_own_failure_the_brakes() {
        for breaker in [false, true] {
            assert_eq!(brake_vote(Verdict::Answered, true, breaker), Some(false));
            assert_eq!(brake_vote(Verdict::Answered, false, breaker), Some(true));
            assert_eq!(brake_vote(Verdict::Panicked, false, breaker), Some(true));
            assert_eq!(brake_vote(Verdict::NotCalled, false, breaker), None);
        }
        assert_eq!(brake_vote(Verdict::Transient, false, false), Some(true));
        assert_eq!(brake_vote(Verdict::Transient, false, true), None);
    }

    #[test]
    fn the_threshold_needs_enough_messages_and_a_large_enough_share() {
        let settings = BrakeSettings {
            failure_ratio: 0.5,
            min_messages: 10,
            ..BrakeSettings::default()
        };
        assert!(!passes(&settings, 9, 9), "too few messages");
        assert!(passes(&settings, 5, 10));
        assert!(!passes(&settings, 4, 10));
        let all = BrakeSettings {
            failure_ratio: 1.0,
            min_messages: 1,
            ..BrakeSettings::default()
        };
        assert!(passes(&all, 1, 1));
        assert!(!passes(&all, 99, 100));
    }
}
