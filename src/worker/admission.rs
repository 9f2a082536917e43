//! What a pool may claim of each handler right now: nothing while its breaker is open,
//! a few probes while it is half-open (as the member's [`BreakerFollower`] last read
//! them), and within its bulkhead and its share of the fleet's rate limit otherwise.

use governor::DefaultDirectRateLimiter;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::{BreakerSettings, HandlerSettings};
use crate::handlers::breakers::BreakerFollower;
use crate::resilience::breaker::BreakerState;
use crate::store::Store;
use crate::task::Verdict;

/// How often a member recounts the live workers its rate shares divide by.
pub(crate) const RATE_SHARE_EVERY: Duration = Duration::from_secs(2);

/// Handlers whose limits or breaker leave them nothing to claim are looked at again
/// this soon by an idle claim loop (a finished call frees a bulkhead slot silently).
pub(crate) const BLOCKED_RECHECK: Duration = Duration::from_millis(100);

/// The breakers, bulkheads and rate shares of the served handlers.
pub(crate) struct Admission {
    store: Store,
    breakers: Arc<BreakerFollower>,
    limits: BTreeMap<String, Limits>,
}

/// A served handler's bulkhead and rate share, if it has either.
struct Limits {
    bulkhead: Option<Arc<Semaphore>>,
    rate: Option<RateShare>,
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
    /// The limits `settings` gives the `served` handlers, their breakers as `breakers`
    /// follows them.
    pub(crate) fn new(
        store: Store,
        breakers: Arc<BreakerFollower>,
        settings: &BTreeMap<String, HandlerSettings>,
        served: &[String],
    ) -> Admission {
        let limits = served
            .iter()
            .filter_map(|name| Some((name.clone(), settings.get(name)?)))
            .map(|(name, s)| {
                let limits = Limits {
                    bulkhead: s
                        .max_concurrency
                        .map(|n| Arc::new(Semaphore::new(n as usize))),
                    rate: s.rate_limit.map(RateShare::new),
                };
                (name, limits)
            })
            .collect();
        Admission {
            store,
            breakers,
            limits,
        }
    }

    /// Sorts the served handlers by how they may be claimed now.
    pub(crate) fn plan(&self, served: &[String]) -> Plan {
        let mut plan = Plan::default();
        for name in served {
            if let Some(settings) = self.breakers.guarding(name) {
                match self.breakers.state(name) {
                    BreakerState::Closed => {}
                    BreakerState::HalfOpen => {
                        plan.probing.push((name.clone(), settings.clone()));
                        plan.blocked = true;
                        continue;
                    }
                    BreakerState::Open => {
                        plan.blocked = true;
                        continue;
                    }
                }
            }
            let limited =
                (self.limits.get(name)).is_some_and(|l| l.bulkhead.is_some() || l.rate.is_some());
            if limited {
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
    pub(crate) fn count(&self, handler: &str, verdict: Verdict) {
        self.breakers.count_answer(handler, verdict);
    }

    /// Follows the fleet's size for the rate shares until `stop` fires.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        if !self.limits.values().any(|l| l.rate.is_some()) {
            return;
        }
        let mut ticks = tokio::time::interval(RATE_SHARE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => self.share_rates().await,
            }
        }
    }

    /// Divides each fleet rate among the live members that serve its handler.
    async fn share_rates(&self) {
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
