//! What broke: the tasks a filter selects, grouped by cause (or class, handler, route,
//! topic), for `redrive tasks groups`, `GET /api/v1/groups` and the console's overview.

use serde::{Deserialize, Serialize};
use std::time::Duration;

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

impl Operations {
    /// The groups of the tasks `filter` selects (with no status given, those not done:
    /// failed and permanent_failure), biggest first.
    pub async fn groups(&self, filter: &FilterParams, params: &GroupParams) -> Result<Groups> {
        let query = params.query(filter)?;
        Ok(self.store.groups(&query).await?)
    }
}
