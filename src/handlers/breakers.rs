//! The one follower of the fleet's circuit breakers in a member. It reports the calls
//! this member's worker pool counted, moves on the breakers whose hold has passed, and
//! keeps the breakers' states as last read, for the claim loops (what to claim, what to
//! probe) and for process-mode ingest (whom to call inline) alike. Every time it
//! compares a hold with is PostgreSQL's: the member's clock plays no part.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{BreakerSettings, HandlerSettings};
use crate::resilience::breaker::{Breaker, BreakerState, Tally, Transition};
use crate::store::Store;
use crate::task::Verdict;
use crate::telemetry::Metrics;

/// How often a member reports its tallies and reads the breakers.
pub(crate) const BREAKER_TICK: Duration = Duration::from_millis(500);

/// The breakers a member follows.
pub(crate) struct BreakerFollower {
    store: Store,
    metrics: Metrics,
    followed: BTreeMap<String, Followed>,
    /// The followed handlers that have a breaker configured (guarded here or not).
    configured: BTreeSet<String>,
    /// Poked when a tally should be reported before the next tick.
    report_now: Notify,
    /// Whether a round has read the breakers: until then a followed breaker counts as
    /// open, so that a member starting under a breaker an operator holds open calls
    /// nothing before it has seen it.
    read: AtomicBool,
}

/// One handler's breaker as this member last saw it.
struct Followed {
    /// Set for the handlers this member's pool calls with a breaker configured: their
    /// calls are reported and their holds moved on from here. Others are only read.
    guard: Option<Guard>,
    seen: Mutex<Option<Breaker>>,
}

/// A guarded handler's breaker settings and its calls not yet reported.
struct Guard {
    settings: BreakerSettings,
    tally: Mutex<Tally>,
}

impl BreakerFollower {
    /// A follower guarding the breakers `settings` gives the `guarded` handlers (those
    /// this member calls: its worker pool's and its process-mode routes'): it counts
    /// their calls, reports the tallies and reads the breakers back.
    pub(crate) fn new(
        store: Store,
        metrics: Metrics,
        settings: &BTreeMap<String, HandlerSettings>,
        guarded: &[String],
    ) -> BreakerFollower {
        let mut followed = BTreeMap::new();
        for name in guarded {
            let Some(settings) = settings.get(name).and_then(|s| s.breaker.clone()) else {
                continue;
            };
            metrics.breaker_state.with_label_values(&[name]).set(0);
            for to in ["closed", "open", "half_open"] {
                metrics.breaker_transitions.with_label_values(&[name, to]);
            }
            let guard = Guard {
                settings,
                tally: Mutex::new(Tally::default()),
            };
            followed.insert(name.clone(), Followed::new(Some(guard)));
        }
        let configured = (followed.keys())
            .filter(|name| settings.get(*name).is_some_and(|s| s.breaker.is_some()))
            .cloned()
            .collect();
        BreakerFollower {
            store,
            metrics,
            followed,
            configured,
            report_now: Notify::new(),
            read: AtomicBool::new(false),
        }
    }

    /// `handler`'s breaker state as last read; closed when it has none, open when it
    /// has one not read yet.
    pub(crate) fn state(&self, handler: &str) -> BreakerState {
        let Some(followed) = self.followed.get(handler) else {
            return BreakerState::Closed;
        };
        if !self.read.load(Ordering::Acquire) {
            return BreakerState::Open;
        }
        (followed.seen.lock().expect("not poisoned").as_ref())
            .map_or(BreakerState::Closed, |b| b.state)
    }

    /// Whether `handler` has a breaker configured: its transient failures are the
    /// breaker's to count (and not the bad-deploy brake's).
    pub(crate) fn configured(&self, handler: &str) -> bool {
        self.configured.contains(handler)
    }

    /// Whether `handler` may be called outside a probe now: its breaker is closed.
    pub(crate) fn allows(&self, handler: &str) -> bool {
        self.state(handler) == BreakerState::Closed
    }

    /// The breaker settings of `handler` if this member guards its breaker.
    pub(crate) fn guarding(&self, handler: &str) -> Option<&BreakerSettings> {
        let guard = self.followed.get(handler)?.guard.as_ref()?;
        Some(&guard.settings)
    }

    /// Counts an attempt's answer towards a guarded `handler`'s breaker: a transient
    /// failure or a panic is a failure, any other answer a success; an attempt that did
    /// not call the handler does not count. Pool and inline attempts alike.
    pub(crate) fn count_answer(&self, handler: &str, verdict: Verdict) {
        let failed = match verdict {
            Verdict::NotCalled => return,
            Verdict::Answered => false,
            Verdict::Transient | Verdict::Panicked => true,
        };
        self.count(handler, failed);
    }

    /// Counts a call of a guarded `handler` (`failed`: a transient failure). A run of
    /// failures long enough to open the breaker on this member's count alone is
    /// reported at once rather than at the next tick.
    pub(crate) fn count(&self, handler: &str, failed: bool) {
        let Some(guard) = self.followed.get(handler).and_then(|f| f.guard.as_ref()) else {
            return;
        };
        let mut tally = guard.tally.lock().expect("not poisoned");
        tally.add(failed);
        if failed && tally.trailing_failures >= guard.settings.consecutive_failures {
            self.report_now.notify_one();
        }
    }

    /// Reports tallies and reads the breakers every [`BREAKER_TICK`] until `stop` fires,
    /// then reports what was counted last. A failed round keeps the last answers.
    pub(crate) async fn run(self: std::sync::Arc<Self>, stop: CancellationToken) {
        if self.followed.is_empty() {
            return;
        }
        let mut ticks = tokio::time::interval(BREAKER_TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => {}
                _ = self.report_now.notified() => {}
            }
            if let Err(error) = self.follow().await {
                tracing::warn!(%error, "could not report to or read the circuit breakers; trying again");
            }
        }
        if let Err(error) = self.follow().await {
            tracing::warn!(%error, "could not report the last breaker tallies at shutdown");
        }
    }

    /// One round: a read of every followed breaker with the database's clock, then per
    /// guarded handler a report of its tally or, with nothing to report, a move past a
    /// hold that has ended.
    async fn follow(&self) -> crate::store::Result<()> {
        let names: Vec<String> = self.followed.keys().cloned().collect();
        let (stored, now) = self.store.breakers_as_of_now(&names).await?;
        let mut stored: HashMap<String, Breaker> =
            stored.into_iter().map(|b| (b.handler.clone(), b)).collect();
        for (name, followed) in &self.followed {
            let (breaker, transition) = match &followed.guard {
                Some(guard) => {
                    let seen = followed.seen.lock().expect("not poisoned").clone();
                    let tally = std::mem::take(&mut *guard.tally.lock().expect("not poisoned"));
                    if !tally.is_empty() {
                        match self.store.record_calls(name, tally, &guard.settings).await {
                            Ok(answer) => answer,
                            Err(error) => {
                                // Counted again with the next tick's calls.
                                let mut kept = guard.tally.lock().expect("not poisoned");
                                *kept = tally.then(*kept);
                                return Err(error);
                            }
                        }
                    } else if seen.is_some_and(|b| b.hold_until.is_some_and(|h| h <= now)) {
                        self.store.advance_breaker(name, &guard.settings).await?
                    } else {
                        match stored.remove(name) {
                            Some(b) => (b, None),
                            None => continue,
                        }
                    }
                }
                None => match stored.remove(name) {
                    Some(b) => (b, None),
                    None => continue,
                },
            };
            if let Some(transition) = &transition {
                announce(&self.metrics, name, transition);
            }
            if followed.guard.is_some() {
                self.metrics
                    .breaker_state
                    .with_label_values(&[name])
                    .set(breaker.state.gauge());
            }
            *followed.seen.lock().expect("not poisoned") = Some(breaker);
        }
        self.read.store(true, Ordering::Release);
        Ok(())
    }
}

impl Followed {
    fn new(guard: Option<Guard>) -> Followed {
        Followed {
            guard,
            seen: Mutex::new(None),
        }
    }
}

/// The log line and counter of a state change this member made.
fn announce(metrics: &Metrics, handler: &str, transition: &Transition) {
    metrics
        .breaker_transitions
        .with_label_values(&[handler, transition.to.as_str()])
        .inc();
    let (from, to, reason) = (
        transition.from.as_str(),
        transition.to.as_str(),
        &transition.reason,
    );
    match transition.to {
        BreakerState::Open => {
            tracing::warn!(
                handler,
                from,
                to,
                reason,
                "circuit breaker opened: the handler's tasks wait"
            )
        }
        BreakerState::HalfOpen => {
            tracing::info!(
                handler,
                from,
                to,
                reason,
                "circuit breaker half-open: probing"
            )
        }
        BreakerState::Closed => {
            tracing::info!(
                handler,
                from,
                to,
                reason,
                "circuit breaker closed: calls go through"
            )
        }
    }
}
