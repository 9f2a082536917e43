//! What broke: the tasks a filter selects, grouped by cause (or class, handler, route,
//! topic), for `redrive tasks groups`, `GET /api/v1/groups` and the console's overview.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{OperationError, Result};
use super::selection::FilterParams;
use super::Operations;
use crate::config::parse_duration;
use crate::store::{GroupBy, GroupQuery, Groups, MAX_GROUPS};

/// The longest trend (and `since`): 30 days.
const LONGEST: Duration = Duration::from_secs(30 * 24 * 3600);
/// Most trend buckets.
const MOST_BUCKETS: u32 = 288;

/// How to group, as an operator writes it.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema, utoipa::IntoParams,
)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GroupParams {
    /// What to group by: cause (the default), class, handler, route or topic.
    pub by: Option<String>,
    /// Only tasks that failed within this long ("1h", "30m").
    pub since: Option<String>,
    /// The trend's span ("1h", the default; "1d").
    pub trend: Option<String>,
    /// Buckets the trend is cut into (1 to 288; default 12).
    pub buckets: Option<u32>,
    /// Most groups listed (1 to 500; default 50).
    pub limit: Option<i64>,
}

/// The names of [`GroupParams`]' fields, which a query string shares with a filter's.
pub const GROUP_PARAMS: [&str; 5] = ["by", "since", "trend", "buckets", "limit"];

impl GroupParams {
    /// The store's query for the tasks `filter` selects, checked.
    pub fn query(&self, filter: &FilterParams) -> Result<GroupQuery> {
        let defaults = GroupQuery::default();
        let duration = |name: &str, text: &Option<String>| -> Result<Option<Duration>> {
            let Some(text) = text.as_deref() else {
                return Ok(None);
            };
            let duration = parse_duration(text.trim()).map_err(|_| {
                bad(format!(
                    "{name} must be a duration like \"1h\" (got {text:?})"
                ))
            })?;
            if duration.is_zero() || duration > LONGEST {
                return Err(bad(format!(
                    "{name} must be more than 0 and at most 30 days (got {text:?})"
                )));
            }
            Ok(Some(duration))
        };
        let by = match self.by.as_deref() {
            None => GroupBy::Cause,
            Some(by) => by.trim().parse().map_err(bad)?,
        };
        let buckets = self.buckets.unwrap_or(defaults.buckets);
        if !(1..=MOST_BUCKETS).contains(&buckets) {
            return Err(bad(format!(
                "buckets must be between 1 and {MOST_BUCKETS} (got {buckets})"
            )));
        }
        let limit = self.limit.unwrap_or(defaults.limit);
        if !(1..=MAX_GROUPS).contains(&limit) {
            return Err(bad(format!(
                "limit must be between 1 and {MAX_GROUPS} (got {limit})"
            )));
        }
        let filter = filter.filter()?;
        if filter.search.is_some() {
            return Err(bad(
                "search lists tasks; it does not group them (leave it out)",
            ));
        }
        let trend = duration("trend", &self.trend)?.unwrap_or(defaults.trend);
        // A bucket is whole seconds: a shorter trend was read as buckets of a second
        // each, a span the operator did not ask for (found by a review).
        if trend.as_secs() < u64::from(buckets) || trend.subsec_nanos() != 0 {
            return Err(bad(format!(
                "trend must be whole seconds, at least one per bucket ({buckets} s for \
                 {buckets} buckets; got {:?})",
                self.trend.as_deref().unwrap_or_default()
            )));
        }
        Ok(GroupQuery {
            filter,
            by,
            since: duration("since", &self.since)?,
            trend,
            buckets,
            limit,
        })
    }
}

fn bad(message: impl Into<String>) -> OperationError {
    OperationError::bad_request(message)
}

/// How long a grouping is shared: every caller of this process asking the same within
/// this long gets the same answer, counted once (its `counted_at` says when). The fleet's
/// sample counts the overview's other figures as often.
pub const GROUPS_SHARED_FOR: Duration = crate::store::SAMPLE_EVERY;
/// Most groupings kept at once (an answer of 500 groups with their trends and examples
/// holds a few megabytes); a new one takes the place of the one counted longest ago.
const MOST_SHARED: usize = 16;
/// How long after an action through this process [`Operations::sampled_groups`] counts
/// itself rather than show the fleet's sample: the longest a sampling turn waits for
/// the next (two minutes) and half a minute for its count, so that the sample it shows
/// after was counted after the action.
const COUNTED_HERE_AFTER_ACTION: Duration = Duration::from_secs(150);
/// Longest query shared (a filter's texts are in it; an address holds 64 KiB at most):
/// longer ones are counted each time.
const LONGEST_SHARED_KEY: usize = 64 * 1024;

/// The groupings of this process, shared for [`GROUPS_SHARED_FOR`]: a grouping reads the
/// cause index of every task not done, which beside a drain costs a backend half a
/// second on ten million tasks, and every open console and every script polling the API
/// would otherwise pay it again. A retry, discard or resolve through this process drops
/// them all, so that whoever acted sees its effect at once; an action through another
/// member, or a replay's job as it runs, shows within [`GROUPS_SHARED_FOR`].
#[derive(Default)]
pub(super) struct SharedGroups {
    /// Bumped by every action: answers counted before it are not shared after it.
    generation: AtomicU64,
    /// When an action through this process last dropped them.
    acted: std::sync::Mutex<Option<Instant>>,
    /// One slot per query; a slot's lock makes callers of the same query wait for one
    /// count instead of each counting.
    slots: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Shared>>>>>,
}

/// A grouping as counted (or why it could not be), with when and in which generation.
struct Shared {
    counted: std::result::Result<Groups, Arc<OperationError>>,
    /// When its count began.
    started: Instant,
    /// When its count ended.
    finished: Instant,
    generation: u64,
}

impl Shared {
    /// Whether this is an answer to share with a caller asking now.
    fn fresh(&self, generation: u64) -> bool {
        self.counted.is_ok()
            && self.generation == generation
            && self.started.elapsed() < GROUPS_SHARED_FOR
    }
}

impl SharedGroups {
    /// Answers counted before this are no longer shared.
    pub(super) fn drop_all(&self) {
        *self.acted.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether an action through this process came within `within`.
    fn acted_within(&self, within: Duration) -> bool {
        let acted = *self.acted.lock().unwrap_or_else(|e| e.into_inner());
        acted.is_some_and(|at| at.elapsed() < within)
    }

    /// The slot of `key`, or none when [`MOST_SHARED`] are all in use (a count held
    /// by each, which the heavy-read slots make all but impossible). A new key first
    /// clears the stale ones, then, while as many are kept, the one counted longest ago:
    /// what is kept is what was asked lately, and a query asked now is always shared.
    fn slot(&self, key: String) -> Option<Arc<tokio::sync::Mutex<Option<Shared>>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get(&key) {
            return Some(slot.clone());
        }
        // A slot in use (its lock held) is counting: it stays.
        slots.retain(|_, slot| {
            slot.try_lock().map_or(true, |shared| {
                (shared.as_ref()).is_some_and(|s| s.started.elapsed() < GROUPS_SHARED_FOR)
            })
        });
        while slots.len() >= MOST_SHARED {
            let oldest = (slots.iter())
                .filter_map(|(key, slot)| {
                    let started = slot.try_lock().ok()?.as_ref().map(|s| s.started);
                    Some((started, key.clone()))
                })
                .min();
            let (_, oldest) = oldest?;
            slots.remove(&oldest);
        }
        Some(slots.entry(key).or_default().clone())
    }
}

impl Operations {
    /// The groups of the tasks `filter` selects (with no status given, those not done:
    /// failed and permanent_failure), biggest first. The same query within
    /// [`GROUPS_SHARED_FOR`] of its count, with no action through this process since,
    /// is answered from that count; `fresh` counts again whatever was shared.
    ///
    /// Only a count takes one of the process's heavy-read slots ([`super::HEAVY_READS`];
    /// none free: [`OperationError::Busy`]): callers answered from a shared count, or
    /// waiting on one, hold none. Callers that waited on a count that failed are all told
    /// its error ([`OperationError::Shared`]) instead of counting again one after another.
    pub async fn groups(
        &self,
        filter: &FilterParams,
        params: &GroupParams,
        fresh: bool,
    ) -> Result<Groups> {
        let query = params.query(filter)?;
        let asked = Instant::now();
        let key = format!("{filter:?}|{params:?}");
        let Some(slot) = (key.len() <= LONGEST_SHARED_KEY)
            .then(|| self.shared_groups.slot(key))
            .flatten()
        else {
            return self.count_groups(query).await;
        };
        let mut shared = slot.lock().await;
        let generation = self.shared_groups.generation.load(Ordering::SeqCst);
        if let Some(kept) = shared.as_ref() {
            match &kept.counted {
                Ok(groups) if !fresh && kept.fresh(generation) => return Ok(groups.clone()),
                Err(error) if kept.finished >= asked => {
                    return Err(OperationError::Shared(error.clone()))
                }
                _ => {}
            }
        }
        let started = Instant::now();
        let counted = match self.count_groups(query).await {
            // Refused a slot, it counted nothing: those waiting try for one themselves.
            Err(busy @ OperationError::Busy(_)) => return Err(busy),
            counted => counted.map_err(Arc::new),
        };
        let answer = match &counted {
            Ok(groups) => Ok(groups.clone()),
            Err(error) => Err(OperationError::Shared(error.clone())),
        };
        *shared = Some(Shared {
            counted,
            started,
            finished: Instant::now(),
            generation,
        });
        answer
    }

    /// How many retries, discards and resolves went through this process: a view keeping
    /// figures read before this changed shows them out of date to whoever acted.
    pub fn actions_taken(&self) -> u64 {
        self.shared_groups.generation.load(Ordering::SeqCst)
    }

    /// What broke for a view refreshed every few seconds (the console's overview): the
    /// `shown` biggest causes of the tasks not done as the fleet's sample counted them
    /// (`sampled`: [`crate::store::FleetFigures::broke`], counted once per turn for the
    /// whole fleet, however many consoles are open), or [`Operations::groups`]' own
    /// count when there is none, or when an action through this process came within
    /// [`COUNTED_HERE_AFTER_ACTION`]: whoever acted sees its effect at once.
    pub async fn sampled_groups(&self, sampled: Option<Groups>, shown: i64) -> Result<Groups> {
        let shown = shown.clamp(1, MAX_GROUPS);
        match sampled {
            Some(mut groups) if !self.shared_groups.acted_within(COUNTED_HERE_AFTER_ACTION) => {
                groups.groups.truncate(shown as usize);
                Ok(groups)
            }
            _ => {
                let params = GroupParams {
                    limit: Some(shown),
                    ..GroupParams::default()
                };
                self.groups(&FilterParams::default(), &params, false).await
            }
        }
    }

    /// Counts a grouping in one of the heavy-read slots, to its end.
    async fn count_groups(&self, query: GroupQuery) -> Result<Groups> {
        let store = self.store.clone();
        let counting = async move { store.groups(&query).await };
        Ok(self.heavy_reads.run(counting).await??)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most [`MOST_SHARED`] queries are kept: a new query takes the place of the one
    /// counted longest ago; only while as many are counting is a new one counted
    /// unshared; once they are done without an answer (or stale), the next new query
    /// clears them.
    #[tokio::test]
    async fn no_more_than_the_most_shared_queries_are_kept() {
        let shared = SharedGroups::default();
        let counted = |at: Instant| Shared {
            counted: Err(Arc::new(OperationError::bad_request("x"))),
            started: at,
            finished: at,
            generation: 0,
        };
        let now = Instant::now();
        for i in 0..MOST_SHARED {
            let slot = shared.slot(format!("query {i}")).expect("room for it");
            // Query 0 counted last, the others in order before it.
            let age = if i == 0 { 0 } else { 1 + MOST_SHARED - i };
            *slot.lock().await = Some(counted(now - Duration::from_millis(age as u64)));
        }
        assert!(shared.slot("one more".into()).is_some(), "a new query kept");
        let kept: Vec<String> = shared.slots.lock().unwrap().keys().cloned().collect();
        assert_eq!(kept.len(), MOST_SHARED, "{kept:?}");
        assert!(
            !kept.contains(&"query 1".to_owned()),
            "the oldest went: {kept:?}"
        );
        assert!(kept.contains(&"query 0".to_owned()), "{kept:?}");

        let shared = SharedGroups::default();
        let mut counting = Vec::new();
        for i in 0..MOST_SHARED {
            let slot = shared.slot(format!("query {i}")).expect("room for it");
            counting.push(slot.lock_owned().await);
        }
        assert!(shared.slot("one more".into()).is_none(), "a 17th was kept");
        // Already kept: the same query gets its slot.
        assert!(shared.slot("query 3".into()).is_some());
        drop(counting);
        assert!(shared.slot("one more".into()).is_some());
        let kept = shared.slots.lock().unwrap().len();
        assert_eq!(kept, 1, "the queries that ended with no answer went");
    }
}
