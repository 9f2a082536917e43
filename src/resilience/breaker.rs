//! The circuit breaker of a handler, as a pure state machine. Its state lives in
//! PostgreSQL (`recovery_breaker`) so the whole fleet shares it; the store applies these
//! rules under the row's lock.
//!
//! closed → open after `consecutive_failures` transient failures in a row, or when
//! `failure_ratio` of at least `min_calls` calls in a `window` failed; open → half-open
//! after `cool_down`; half-open → closed on a probe's success, → open on its failure.
//! Permanent errors are answers from a live downstream: they count as successes here.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

use crate::config::BreakerSettings;

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// No calls: the handler's tasks wait, still `failed`, without using attempts.
    Open,
    /// A few probe calls go through to find out whether the downstream is back.
    HalfOpen,
}

impl BreakerState {
    /// The value stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `redrive_breaker_state` gauge: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BreakerState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "closed" => Ok(BreakerState::Closed),
            "open" => Ok(BreakerState::Open),
            "half_open" => Ok(BreakerState::HalfOpen),
            other => Err(format!("unknown breaker state {other:?}")),
        }
    }
}

/// A breaker as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Breaker {
    /// The handler it protects.
    pub handler: String,
    /// Its state.
    pub state: BreakerState,
    /// The state an operator forced it into, if any: it stays there until released.
    pub forced: Option<BreakerState>,
    /// Transient failures in a row.
    pub consecutive_failures: i32,
    /// Start of the current counting window.
    pub window_started_at: DateTime<Utc>,
    /// Calls counted in the window.
    pub window_calls: i32,
    /// Transient failures counted in the window.
    pub window_failures: i32,
    /// While not closed: when the handler's tasks are due again (open: the cool-down's
    /// end; half-open: when unanswered probes are given up). Absent from operators'
    /// answers while forced open: it holds until released.
    pub hold_until: Option<DateTime<Utc>>,
    /// Probe attempts handed out in this half-open period.
    pub probes_granted: i32,
    /// Last state change.
    pub changed_at: DateTime<Utc>,
    /// Why it last changed state, or why an operator forced it ("forced open by
    /// ACTOR: REASON").
    pub reason: Option<String>,
}

/// What a member saw of a handler's calls since it last reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Calls the downstream answered (success or permanent error).
    pub successes: u32,
    /// Transient failures.
    pub failures: u32,
    /// Transient failures since the last success.
    pub trailing_failures: u32,
}

impl Tally {
    /// Counts one call.
    pub fn add(&mut self, failed: bool) {
        if failed {
            self.failures += 1;
            self.trailing_failures += 1;
        } else {
            self.successes += 1;
            self.trailing_failures = 0;
        }
    }

    /// This tally followed by `later`'s calls.
    pub fn then(self, later: Tally) -> Tally {
        Tally {
            successes: self.successes + later.successes,
            failures: self.failures + later.failures,
            trailing_failures: if later.successes > 0 {
                later.trailing_failures
            } else {
                self.trailing_failures + later.failures
            },
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.successes == 0 && self.failures == 0
    }
}

/// A state change, for the log line and the transitions counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
    /// Why, in words.
    pub reason: String,
}

impl Breaker {
    /// A closed breaker with nothing counted.
    pub fn new(handler: impl Into<String>, now: DateTime<Utc>) -> Breaker {
        Breaker {
            handler: handler.into(),
            state: BreakerState::Closed,
            forced: None,
            consecutive_failures: 0,
            window_started_at: now,
            window_calls: 0,
            window_failures: 0,
            hold_until: None,
            probes_granted: 0,
            changed_at: now,
            reason: None,
        }
    }

    /// Whether tasks of the handler may be claimed as usual (not as probes).
    pub fn lets_calls_through(&self) -> bool {
        self.state == BreakerState::Closed
    }

    /// Applies a member's tally of calls. A forced breaker only counts.
    pub fn record(
        &mut self,
        tally: Tally,
        settings: &BreakerSettings,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        if tally.is_empty() {
            return None;
        }
        match self.state {
            BreakerState::Closed => {
                if now - self.window_started_at >= chrono_duration(settings.window) {
                    self.window_started_at = now;
                    self.window_calls = 0;
                    self.window_failures = 0;
                }
                let calls = tally.successes + tally.failures;
                self.window_calls = self.window_calls.saturating_add(clamp(calls));
                self.window_failures = self.window_failures.saturating_add(clamp(tally.failures));
                self.consecutive_failures = if tally.successes > 0 {
                    clamp(tally.trailing_failures)
                } else {
                    self.consecutive_failures
                        .saturating_add(clamp(tally.failures))
                };
                if self.forced.is_some() {
                    return None;
                }
                let reason = if self.consecutive_failures >= clamp(settings.consecutive_failures) {
                    Some(format!(
                        "{} transient failures in a row",
                        self.consecutive_failures
                    ))
                } else if self.window_calls >= clamp(settings.min_calls)
                    && f64::from(self.window_failures)
                        >= settings.failure_ratio * f64::from(self.window_calls)
                {
                    Some(format!(
                        "{} of {} calls failed in the window of {}",
                        self.window_failures,
                        self.window_calls,
                        humantime::format_duration(settings.window)
                    ))
                } else {
                    None
                };
                reason.map(|reason| self.open(settings, now, reason))
            }
            BreakerState::HalfOpen if self.forced.is_none() => {
                if tally.failures > 0 {
                    Some(self.open(settings, now, "a probe failed".into()))
                } else {
                    Some(self.close(now, "a probe succeeded".into()))
                }
            }
            // Late results of calls started before it opened, or a forced state.
            _ => None,
        }
    }

    /// Moves on once `hold_until` has passed: open → half-open; a forced open, or a
    /// half-open whose probes never answered, holds for another cool-down. Returns
    /// whether the hold was renewed (the store then pushes the waiting tasks again),
    /// and the transition if there was one.
    pub fn advance(
        &mut self,
        settings: &BreakerSettings,
        now: DateTime<Utc>,
    ) -> (bool, Option<Transition>) {
        let Some(hold_until) = self.hold_until else {
            return (false, None);
        };
        if hold_until > now {
            return (false, None);
        }
        self.hold_until = Some(now + chrono_duration(settings.cool_down));
        self.probes_granted = 0;
        if self.state == BreakerState::Open && self.forced.is_none() {
            let reason = format!(
                "cool-down of {} over: probing",
                humantime::format_duration(settings.cool_down)
            );
            return (true, Some(self.change(BreakerState::HalfOpen, now, reason)));
        }
        (true, None)
    }

    /// Probe attempts that may start now, out of `wanted`.
    pub fn probes_available(&self, settings: &BreakerSettings, wanted: u32) -> u32 {
        if self.state != BreakerState::HalfOpen || self.forced.is_some() {
            return 0;
        }
        let left = clamp(settings.probes).saturating_sub(self.probes_granted);
        wanted.min(u32::try_from(left).unwrap_or(0))
    }

    /// Forces a state (an operator's command), or releases a forced state (`None`),
    /// which leaves the breaker closed with nothing counted.
    pub fn force(
        &mut self,
        state: Option<BreakerState>,
        settings: &BreakerSettings,
        now: DateTime<Utc>,
        reason: String,
    ) -> Option<Transition> {
        self.forced = state;
        match state {
            Some(BreakerState::Open) if self.state != BreakerState::Open => {
                Some(self.open(settings, now, reason))
            }
            // Already open (a failure or a probe opened it): the operator's command is
            // now why it stays open.
            Some(BreakerState::Open) => {
                self.reason = Some(reason);
                None
            }
            _ if self.state != BreakerState::Closed => Some(self.close(now, reason)),
            _ => {
                self.reset_counts(now);
                self.reason = Some(reason);
                None
            }
        }
    }

    /// Whether an operator forced it open: it holds until released, whatever its
    /// `hold_until` (renewed every cool-down) says.
    pub fn forced_open(&self) -> bool {
        self.forced == Some(BreakerState::Open)
    }

    /// The breaker as a person reads it: while forced open its hold, renewed every
    /// cool-down, is no end of anything and is left out (it holds until released).
    pub fn for_people(mut self) -> Breaker {
        if self.forced_open() {
            self.hold_until = None;
        }
        self
    }

    fn open(
        &mut self,
        settings: &BreakerSettings,
        now: DateTime<Utc>,
        reason: String,
    ) -> Transition {
        self.hold_until = Some(now + chrono_duration(settings.cool_down));
        self.probes_granted = 0;
        self.reset_counts(now);
        self.change(BreakerState::Open, now, reason)
    }

    fn close(&mut self, now: DateTime<Utc>, reason: String) -> Transition {
        self.hold_until = None;
        self.probes_granted = 0;
        self.reset_counts(now);
        self.change(BreakerState::Closed, now, reason)
    }

    fn reset_counts(&mut self, now: DateTime<Utc>) {
        self.consecutive_failures = 0;
        self.window_started_at = now;
        self.window_calls = 0;
        self.window_failures = 0;
    }

    fn change(&mut self, to: BreakerState, now: DateTime<Utc>, reason: String) -> Transition {
        let from = self.state;
        self.state = to;
        self.changed_at = now;
        self.reason = Some(reason.clone());
        Transition { from, to, reason }
    }
}

fn clamp(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn chrono_duration(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::time::Duration;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            consecutive_failures: 3,
            failure_ratio: 0.5,
            window: Duration::from_secs(60),
            min_calls: 10,
            cool_down: Duration::from_secs(30),
            probes: 2,
        }
    }

    fn tally(successes: u32, failures: u32, trailing: u32) -> Tally {
        Tally {
            successes,
            failures,
            trailing_failures: trailing,
        }
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn opens_on_consecutive_failures_probes_after_the_cool_down_and_closes_on_success() {
        let s = settings();
        let mut b = Breaker::new("h", at(0));
        assert_eq!(b.record(tally(0, 2, 2), &s, at(1)), None);
        // A success resets the run.
        assert_eq!(b.record(tally(1, 1, 1), &s, at(2)), None);
        assert_eq!(b.consecutive_failures, 1);
        let opened = b.record(tally(0, 2, 2), &s, at(3)).unwrap();
        assert_eq!(
            (opened.from, opened.to),
            (BreakerState::Closed, BreakerState::Open)
        );
        assert_eq!(b.hold_until, Some(at(33)));
        assert_eq!(b.probes_available(&s, 5), 0);
        // Late results while open change nothing.
        assert_eq!(b.record(tally(5, 0, 0), &s, at(10)), None);
        assert_eq!(b.advance(&s, at(20)), (false, None));
        let (renewed, probing) = b.advance(&s, at(33));
        assert!(renewed);
        assert_eq!(probing.unwrap().to, BreakerState::HalfOpen);
        assert_eq!(b.probes_available(&s, 5), 2);
        b.probes_granted = 2;
        assert_eq!(b.probes_available(&s, 5), 0);
        let closed = b.record(tally(1, 0, 0), &s, at(34)).unwrap();
        assert_eq!(closed.to, BreakerState::Closed);
        assert_eq!((b.hold_until, b.consecutive_failures), (None, 0));
    }

    #[test]
    fn a_failed_probe_reopens_and_unanswered_probes_are_granted_again() {
        let s = settings();
        let mut b = Breaker::new("h", at(0));
        b.record(tally(0, 3, 3), &s, at(0)).unwrap();
        b.advance(&s, at(30));
        b.probes_granted = 2;
        // No answer within a cool-down: new probes.
        assert_eq!(b.advance(&s, at(60)), (true, None));
        assert_eq!((b.state, b.probes_granted), (BreakerState::HalfOpen, 0));
        let reopened = b.record(tally(0, 1, 1), &s, at(61)).unwrap();
        assert_eq!(
            (reopened.from, reopened.to),
            (BreakerState::HalfOpen, BreakerState::Open)
        );
        assert_eq!(b.hold_until, Some(at(91)));
    }

    #[test]
    fn the_failure_ratio_needs_min_calls_within_the_window() {
        let s = settings();
        let mut b = Breaker::new("h", at(0));
        // 4 of 8 failed, interleaved: never 3 in a row, under min_calls.
        assert_eq!(b.record(tally(4, 4, 0), &s, at(1)), None);
        // The window ends: counting starts over.
        assert_eq!(b.record(tally(1, 1, 1), &s, at(70)), None);
        assert_eq!((b.window_calls, b.window_failures), (2, 1));
        let opened = b.record(tally(4, 4, 0), &s, at(71)).unwrap();
        assert!(
            opened.reason.contains("5 of 10 calls failed"),
            "{}",
            opened.reason
        );
    }

    #[test]
    fn forced_states_hold_until_released() {
        let s = settings();
        let mut b = Breaker::new("h", at(0));
        let forced = b
            .force(Some(BreakerState::Open), &s, at(0), "maintenance".into())
            .unwrap();
        assert_eq!(forced.to, BreakerState::Open);
        assert_eq!(
            b.advance(&s, at(30)),
            (true, None),
            "a forced open renews its hold"
        );
        assert_eq!(b.state, BreakerState::Open);
        assert_eq!(b.probes_available(&s, 1), 0);
        b.force(Some(BreakerState::Closed), &s, at(31), "trust me".into())
            .unwrap();
        assert_eq!(
            b.record(tally(0, 50, 50), &s, at(32)),
            None,
            "forced closed never opens"
        );
        assert_eq!(b.force(None, &s, at(33), "auto".into()), None);
        assert_eq!((b.state, b.consecutive_failures), (BreakerState::Closed, 0));
    }

    /// Random tallies and clock steps: the row stays consistent (a hold exactly when not
    /// closed, probes within the setting) and answers alone (successes, permanent errors)
    /// never open it.
    #[test]
    fn random_histories_keep_the_breaker_consistent() {
        let s = settings();
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut b = Breaker::new("h", at(0));
            let mut now = 0;
            let mut failures_since_close = 0;
            for _ in 0..200 {
                now += rng.random_range(0..20);
                match rng.random_range(0..4) {
                    0 => {
                        let (renewed, _) = b.advance(&s, at(now));
                        assert!(!renewed || b.state != BreakerState::Closed);
                    }
                    1 => b.probes_granted += b.probes_available(&s, rng.random_range(0..3)) as i32,
                    _ => {
                        let f = rng.random_range(0..4);
                        let t = tally(rng.random_range(0..4), f, rng.random_range(0..=f));
                        let was = b.state;
                        failures_since_close += t.failures;
                        if let Some(change) = b.record(t, &s, at(now)) {
                            assert_eq!(change.from, was);
                            match change.to {
                                BreakerState::Open => assert!(
                                    failures_since_close > 0,
                                    "opened without a failure (seed {seed})"
                                ),
                                BreakerState::Closed => failures_since_close = 0,
                                BreakerState::HalfOpen => {}
                            }
                        }
                    }
                }
                assert_eq!(
                    b.hold_until.is_none(),
                    b.state == BreakerState::Closed,
                    "seed {seed}"
                );
                assert!(b.probes_granted <= s.probes as i32, "seed {seed}");
            }
        }
    }
}
