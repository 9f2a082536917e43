//! What a pool may claim of each handler right now: nothing while its breaker is open,
//! a few probes while it is half-open, and within its bulkhead and its share of the
//! fleet's rate limit otherwise.

use governor::DefaultDirectRateLimiter;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::breaker::{Breaker, BreakerState, Tally, Transition};
use crate::config::{BreakerSettings, HandlerSettings};
use crate::handlers::invoke::Verdict;
use crate::store::Store;
use crate::telemetry::Metrics;

/// How often a member reports its tallies and reads the breakers.
pub(crate) const BREAKER_TICK: Duration = Duration::from_millis(500);

/// How often a member recounts the live workers its rate shares divide by.
pub(crate) const RATE_SHARE_EVERY: Duration = Duration::from_secs(2);

/// Handlers whose limits or breaker leave them nothing to claim are looked at again
/// this soon by an idle claim loop (a finished call frees a bulkhead slot silently).
pub(crate) const BLOCKED_RECHECK: Duration = Duration::from_millis(100);

/// The limits of the served handlers that have any.
pub(crate) struct Admission {
    store: Store,
    metrics: Metrics,
    limits: BTreeMap<String, Limits>,
    /// Poked when a tally should be reported before the next tick.
    report_now: Notify,
}

#[derive(Default)]
struct Limits {
    breaker: Option<Guard>,
    bulkhead: Option<Arc<Semaphore>>,
    rate: Option<RateShare>,
}

/// One handler's breaker as this member last saw it, and its calls not yet reported.
struct Guard {
    settings: BreakerSettings,
    seen: Mutex<Option<Breaker>>,
    tally: Mutex<Tally>,
}

impl Guard {
    fn state(&self) -> BreakerState {
        self.seen
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map_or(BreakerState::Closed, |b| b.state)
    }
}

/// This member's share of a handler's fleet-wide rate: calls start no faster than
/// `fleet rate / live workers`, and at most `tickets` claimed calls wait for their turn.
struct RateShare {
    fleet_rate: f64,
    /// How many members the limiter's share divides by (1 until first counted).
    members: std::sync::atomic::AtomicUsize,
    limiter: RwLock<Arc<DefaultDirectRateLimiter>>,
    tickets: Arc<Semaphore>,
}

/// What a claim loop may claim now.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Handlers claimed together, with no limit of their own.
    pub(crate) shared: Vec<String>,
    /// Handlers with a bulkhead or a rate limit: claimed one by one, within a grant.
    pub(crate) limited: Vec<String>,
    /// Handlers whose breaker is half-open: claimed as probes.
    pub(crate) probing: Vec<(String, BreakerSettings)>,
    /// Whether some handler is held back by its bulkhead, rate or breaker.
    pub(crate) blocked: bool,
}

/// Room for `count` tasks of one handler, with the permits they hold while they run.
pub(crate) struct Grant {
    pub(crate) count: u32,
    bulkhead: Option<OwnedSemaphorePermit>,
    tickets: Option<OwnedSemaphorePermit>,
}

/// What one admitted task holds: a bulkhead slot until its result is written, and a
/// rate ticket until its call may start.
#[derive(Default)]
pub(crate) struct Permits {
    pub(crate) bulkhead: Option<OwnedSemaphorePermit>,
    pub(crate) ticket: Option<(OwnedSemaphorePermit, Arc<DefaultDirectRateLimiter>)>,
}

impl Permits {
    /// Waits for the rate limiter, then gives the ticket back.
    pub(crate) async fn wait_for_turn(&mut self) {
        if let Some((ticket, limiter)) = self.ticket.take() {
            limiter.until_ready().await;
            drop(ticket);
        }
    }
}

impl Grant {
    /// The permits of one task out of the grant.
    pub(crate) fn take_one(&mut self, rate: Option<Arc<DefaultDirectRateLimiter>>) -> Permits {
        Permits {
            bulkhead: self.bulkhead.as_mut().and_then(|p| p.split(1)),
            ticket: self.tickets.as_mut().and_then(|p| p.split(1)).zip(rate),
        }
    }
}

impl Admission {
    /// The limits `settings` gives the `served` handlers.
    pub(crate) fn new(
        store: Store,
        metrics: Metrics,
        settings: &BTreeMap<String, HandlerSettings>,
        served: &[String],
    ) -> Admission {
        let limits = served
            .iter()
            .filter_map(|name| Some((name.clone(), settings.get(name)?)))
            .map(|(name, s)| {
                let limits = Limits {
                    breaker: s.breaker.clone().map(|settings| Guard {
                        settings,
                        seen: Mutex::new(None),
                        tally: Mutex::new(Tally::default()),
                    }),
                    bulkhead: s
                        .max_concurrency
                        .map(|n| Arc::new(Semaphore::new(n as usize))),
                    rate: s.rate_limit.map(RateShare::new),
                };
                if limits.breaker.is_some() {
                    metrics.breaker_state.with_label_values(&[&name]).set(0);
                    for to in ["closed", "open", "half_open"] {
                        metrics.breaker_transitions.with_label_values(&[&name, to]);
                    }
                }
                (name, limits)
            })
            .collect();
        Admission {
            store,
            metrics,
            limits,
            report_now: Notify::new(),
        }
    }

    /// Sorts the served handlers by how they may be claimed now.
    pub(crate) fn plan(&self, served: &[String]) -> Plan {
        let mut plan = Plan::default();
        for name in served {
            let Some(limits) = self.limits.get(name) else {
                plan.shared.push(name.clone());
                continue;
            };
            if let Some(guard) = &limits.breaker {
                match guard.state() {
                    BreakerState::Closed => {}
                    BreakerState::HalfOpen => {
                        plan.probing.push((name.clone(), guard.settings.clone()));
                        plan.blocked = true;
                        continue;
                    }
                    BreakerState::Open => {
                        plan.blocked = true;
                        continue;
                    }
                }
            }
            if limits.bulkhead.is_some() || limits.rate.is_some() {
                plan.limited.push(name.clone());
                plan.blocked = true;
            } else {
                plan.shared.push(name.clone());
            }
        }
        plan
    }

    /// Room for up to `wanted` tasks of a limited handler, or `None` when it has none.
    pub(crate) fn grant(&self, handler: &str, wanted: u32) -> Option<Grant> {
        let limits = self.limits.get(handler)?;
        let mut count = wanted;
        if let Some(bulkhead) = &limits.bulkhead {
            count = count.min(bulkhead.available_permits() as u32);
        }
        if let Some(rate) = &limits.rate {
            count = count.min(rate.tickets.available_permits() as u32);
        }
        if count == 0 {
            return None;
        }
        let take =
            |semaphore: &Arc<Semaphore>| semaphore.clone().try_acquire_many_owned(count).ok();
        let bulkhead = match &limits.bulkhead {
            Some(s) => Some(take(s)?),
            None => None,
        };
        let tickets = match &limits.rate {
            Some(r) => Some(take(&r.tickets)?),
            None => None,
        };
        Some(Grant {
            count,
            bulkhead,
            tickets,
        })
    }

    /// The rate limiter `handler`'s calls wait for, if it has one.
    pub(crate) fn limiter(&self, handler: &str) -> Option<Arc<DefaultDirectRateLimiter>> {
        let rate = self.limits.get(handler)?.rate.as_ref()?;
        Some(rate.limiter.read().expect("not poisoned").clone())
    }

    /// Counts a written attempt's answer towards `handler`'s breaker.
    /// A run of failures long enough to open the breaker on this member's count alone
    /// is reported at once rather than at the next tick.
    pub(crate) fn count(&self, handler: &str, verdict: Verdict) {
        let Some(guard) = self.limits.get(handler).and_then(|l| l.breaker.as_ref()) else {
            return;
        };
        let failed = match verdict {
            Verdict::NotCalled => return,
            Verdict::Answered => false,
            Verdict::Transient => true,
        };
        let mut tally = guard.tally.lock().expect("not poisoned");
        tally.add(failed);
        if failed && tally.trailing_failures >= guard.settings.consecutive_failures {
            self.report_now.notify_one();
        }
    }

    /// Reports tallies, follows the breakers and the fleet's size until `stop` fires.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        if self.limits.is_empty() {
            return;
        }
        let mut ticks = tokio::time::interval(BREAKER_TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shared_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => {}
                _ = self.report_now.notified() => {}
            }
            if let Err(error) = self.follow_breakers().await {
                tracing::warn!(%error, "could not report to or read the circuit breakers; trying again");
            }
            if shared_at.map_or(true, |at| at.elapsed() >= RATE_SHARE_EVERY) {
                self.share_rates().await;
                shared_at = Some(tokio::time::Instant::now());
            }
        }
        // Report what was counted last.
        if let Err(error) = self.follow_breakers().await {
            tracing::warn!(%error, "could not report the last breaker tallies at shutdown");
        }
    }

    async fn follow_breakers(&self) -> crate::store::Result<()> {
        let guarded: Vec<String> = (self.limits.iter())
            .filter(|(_, l)| l.breaker.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        if guarded.is_empty() {
            return Ok(());
        }
        // One read of every breaker this member follows, per tick, with the database's
        // clock: a hold ends when PostgreSQL says so, whatever this member's clock says.
        let (stored, now) = self.store.breakers_as_of_now(&guarded).await?;
        let mut stored: std::collections::HashMap<String, Breaker> =
            stored.into_iter().map(|b| (b.handler.clone(), b)).collect();
        for (name, limits) in &self.limits {
            let Some(guard) = &limits.breaker else {
                continue;
            };
            let tally = std::mem::take(&mut *guard.tally.lock().expect("not poisoned"));
            let (breaker, transition) = if !tally.is_empty() {
                match self.store.record_calls(name, tally, &guard.settings).await {
                    Ok(answer) => answer,
                    Err(error) => {
                        // Counted again with the next tick's calls.
                        let mut kept = guard.tally.lock().expect("not poisoned");
                        *kept = tally.then(*kept);
                        return Err(error);
                    }
                }
            } else {
                let seen = guard.seen.lock().expect("not poisoned").clone();
                match seen {
                    Some(b) if b.hold_until.is_some_and(|h| h <= now) => {
                        self.store.advance_breaker(name, &guard.settings).await?
                    }
                    _ => match stored.remove(name) {
                        Some(b) => (b, None),
                        None => continue,
                    },
                }
            };
            if let Some(transition) = &transition {
                announce(&self.metrics, name, transition);
            }
            self.metrics
                .breaker_state
                .with_label_values(&[name])
                .set(breaker.state.gauge());
            *guard.seen.lock().expect("not poisoned") = Some(breaker);
        }
        Ok(())
    }

    /// Divides each fleet rate among the live members that serve its handler.
    async fn share_rates(&self) {
        if !self.limits.values().any(|l| l.rate.is_some()) {
            return;
        }
        let members = match self.store.live_members().await {
            Ok(members) => members,
            Err(error) => {
                tracing::warn!(%error, "could not count live members; rate shares unchanged");
                return;
            }
        };
        for (handler, limits) in &self.limits {
            if let Some(rate) = &limits.rate {
                let serving = members.iter().filter(|m| m.serves(handler)).count();
                rate.share_among(serving.max(1));
            }
        }
    }
}

impl RateShare {
    fn new(fleet_rate: f64) -> RateShare {
        let tickets = fleet_rate.ceil().clamp(1.0, 1024.0) as usize;
        RateShare {
            fleet_rate,
            members: std::sync::atomic::AtomicUsize::new(1),
            limiter: RwLock::new(Arc::new(limiter(fleet_rate))),
            tickets: Arc::new(Semaphore::new(tickets)),
        }
    }

    /// Divides the fleet rate among `members`. The limiter is replaced only when the
    /// count changed: a new limiter starts with a full burst, and replacing it on every
    /// recount let calls through faster than the share.
    fn share_among(&self, members: usize) {
        use std::sync::atomic::Ordering;
        if self.members.swap(members, Ordering::Relaxed) == members {
            return;
        }
        let share = self.fleet_rate / members as f64;
        *self.limiter.write().expect("not poisoned") = Arc::new(limiter(share));
    }
}

/// A limiter admitting `rate` calls per second with a burst of one second's worth.
fn limiter(rate: f64) -> DefaultDirectRateLimiter {
    crate::rate::limiter(rate, rate.ceil().clamp(1.0, 1024.0) as u32)
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
