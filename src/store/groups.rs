//! What broke, grouped: the tasks a filter selects, counted by cause (or class, handler,
//! route, topic), with when each group was first and last seen, a trend, what it spans
//! and an example. By cause, counts and trend read the cause index alone
//! (`recovery_task_cause`: unfinished and given-up tasks).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::filter::{bind_selection, Selection, TaskFilter, CONDITION};
use super::{Result, Store};
use crate::task::{Status, TaskId};

/// Most groups an answer lists.
pub const MAX_GROUPS: i64 = 500;
/// Most buckets a trend is cut into.
pub const MOST_TREND_BUCKETS: u32 = 1000;
/// Newest tasks of each group read for what it spans and its example.
pub const SPAN_SAMPLE: i64 = 200;
/// How long a grouping may run before the database stops it.
const GROUPS_TIMEOUT: &str = "10s";

/// What tasks are grouped by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// The cause: error class and fingerprint.
    #[default]
    Cause,
    /// The error class alone.
    Class,
    /// The handler.
    Handler,
    /// The ingest route.
    Route,
    /// The topic consumed from.
    Topic,
}

impl GroupBy {
    /// Every grouping, by name.
    pub const ALL: [(&'static str, GroupBy); 5] = [
        ("cause", GroupBy::Cause),
        ("class", GroupBy::Class),
        ("handler", GroupBy::Handler),
        ("route", GroupBy::Route),
        ("topic", GroupBy::Topic),
    ];

    /// The grouping's name.
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, by)| *by == self)
            .map_or("cause", |(name, _)| name)
    }

    /// The column a statement groups by (class is summed from the causes).
    fn column(self) -> &'static str {
        match self {
            GroupBy::Cause | GroupBy::Class => "cause_id",
            GroupBy::Handler => "handler",
            GroupBy::Route => "route",
            GroupBy::Topic => "source_topic",
        }
    }
}

impl std::str::FromStr for GroupBy {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, by)| *by)
            .ok_or_else(|| {
                format!("unknown grouping {name:?} (cause, class, handler, route, topic)")
            })
    }
}

/// What to group and how.
#[derive(Debug, Clone)]
pub struct GroupQuery {
    /// The tasks; with no status given, those not done (failed and permanent_failure).
    pub filter: TaskFilter,
    /// What they are grouped by.
    pub by: GroupBy,
    /// Only tasks that failed (their cause set) within this long.
    pub since: Option<Duration>,
    /// The trend's span, cut into [`GroupQuery::buckets`] buckets.
    pub trend: Duration,
    /// Buckets of the trend.
    pub buckets: u32,
    /// Most groups listed (at most [`MAX_GROUPS`]).
    pub limit: i64,
}

impl Default for GroupQuery {
    fn default() -> Self {
        GroupQuery {
            filter: TaskFilter::default(),
            by: GroupBy::Cause,
            since: None,
            trend: Duration::from_secs(3600),
            buckets: 12,
            limit: 50,
        }
    }
}

/// A cause as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct CauseView {
    /// Its id (`--cause`, `?cause=`).
    pub id: i64,
    /// Error class.
    pub class: String,
    /// The message with its variable parts taken out.
    pub fingerprint: String,
    /// The first message seen with it.
    pub example: String,
    /// When it was first seen (absent when the stored time cannot be read).
    pub first_seen: Option<DateTime<Utc>>,
}

/// One group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Group {
    /// The group's value: a cause id, a class, a handler, a route or a topic; `None` for
    /// tasks without one (no route; a cause not yet set on a task stored before causes).
    pub key: Option<String>,
    /// The cause, grouped by cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<CauseView>,
    /// Tasks in the group now.
    pub tasks: i64,
    /// When it was first seen: the cause's first failure (by cause or class), else the
    /// oldest task's creation.
    pub first_seen: Option<DateTime<Utc>>,
    /// When one of its tasks last failed.
    pub last_seen: Option<DateTime<Utc>>,
    /// Its tasks by when they last failed, one count per bucket, oldest first.
    pub trend: Vec<i64>,
    /// Handlers among its newest tasks ([`SPAN_SAMPLE`] of them).
    pub handlers: Vec<String>,
    /// Routes among its newest tasks.
    pub routes: Vec<String>,
    /// Its newest task.
    #[schema(value_type = Option<i64>)]
    pub example_task: Option<TaskId>,
    /// That task's error (cut to 500 bytes).
    pub example_error: Option<String>,
}

/// The groups of a selection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Groups {
    /// What they are grouped by.
    pub by: GroupBy,
    /// The statuses grouped.
    pub statuses: Vec<Status>,
    /// The biggest groups, biggest first.
    pub groups: Vec<Group>,
    /// Groups in all (listed or not).
    pub total_groups: i64,
    /// Tasks in all groups.
    pub total_tasks: i64,
    /// Start of the trend: bucket `i` covers `trend_start + i * bucket_seconds`.
    pub trend_start: DateTime<Utc>,
    /// Width of a trend bucket, in seconds.
    pub bucket_seconds: u64,
    /// The tasks grouped: the query's filter with its statuses (tasks not done when it
    /// gave none) and its window (`failed_after`: the later of the filter's and `since`
    /// ago). A group's list is this filter and the group's key, so that it lists, and an
    /// action on it acts on, what the group counts.
    pub filter: TaskFilter,
    /// When the tasks were counted (a grouping may be shared for a few seconds: see
    /// `Operations::groups`).
    pub counted_at: DateTime<Utc>,
}

/// The groups of a selection, biggest first (`{KEY}`: the grouped column; `$20`: most
/// groups). First seen is the oldest task's creation except by cause.
const GROUPED: &str = "\
    SELECT {KEY}::text AS key, count(*) AS tasks, {READABLE(max(cause_at))} AS last_seen, {FIRST} AS first_seen, \
           count(*) OVER () AS total_groups, (sum(count(*)) OVER ())::bigint AS total_tasks \
    FROM recovery_task WHERE {CONDITION} \
    GROUP BY {KEY} ORDER BY tasks DESC, key LIMIT $20";

/// The trend of listed groups (`$20`: their keys, a NULL among them for the group
/// without one; `$21`: the trend's start in epoch seconds; `$22`: a bucket's width in
/// seconds). The group without a key is its own branch, folded away when not listed (a
/// test of `{KEY} IS NULL` beside the keys would cost the cause index its scan).
const TREND: &str = "\
    SELECT {KEY}::text AS key, {BUCKET} AS bucket, count(*) AS tasks \
    FROM recovery_task WHERE {CONDITION} AND {KEY} = ANY($20::text[]::{TYPE}[]) \
      AND cause_at >= to_timestamp($21) \
    GROUP BY 1, 2 \
    UNION ALL \
    SELECT NULL::text, {BUCKET}, count(*) \
    FROM recovery_task WHERE {CONDITION} AND {KEY} IS NULL AND {NULL_LISTED} \
      AND cause_at >= to_timestamp($21) \
    GROUP BY 1, 2";

/// The newest tasks of each listed group (`$20`: keys, a NULL among them for the group
/// without one, its own branch as in [`TREND`]; `$21`: how many of each).
const SAMPLE: &str = "\
    SELECT k::text AS key, s.handler, s.route, s.id, s.error FROM unnest($20::text[]::{TYPE}[]) k \
    CROSS JOIN LATERAL ( \
        SELECT handler, route, id, left(coalesce(last_error, error_message), 500) AS error \
        FROM recovery_task WHERE {CONDITION} AND {KEY} = k \
        ORDER BY cause_at DESC LIMIT $21) s \
    UNION ALL \
    (SELECT NULL::text, handler, route, id, left(coalesce(last_error, error_message), 500) \
     FROM recovery_task WHERE {CONDITION} AND {KEY} IS NULL AND {NULL_LISTED} \
     ORDER BY cause_at DESC LIMIT $21)";

/// `time`, or NULL where no program reads it (infinity, or beyond the years 1 to 9999: a
/// row written by hand must not stop a grouping).
pub(super) fn readable(time: &str) -> String {
    format!(
        "CASE WHEN {time} BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59+00' \
         THEN {time} END"
    )
}

fn statement(template: &str, by: GroupBy) -> String {
    let (first, kind) = match by {
        GroupBy::Cause | GroupBy::Class => ("NULL::timestamptz", "bigint"),
        _ => ("{READABLE(min(created_at))}", "text"),
    };
    template
        .replace("{FIRST}", first)
        .replace("{READABLE(max(cause_at))}", &readable("max(cause_at)"))
        .replace("{READABLE(min(created_at))}", &readable("min(created_at)"))
        .replace(
            "{BUCKET}",
            "least(floor((extract(epoch FROM cause_at) - $21) / $22), 1e9)::int",
        )
        .replace(
            "{NULL_LISTED}",
            "array_position($20::text[], NULL) IS NOT NULL",
        )
        .replace("{CONDITION}", CONDITION)
        .replace("{KEY}", by.column())
        .replace("{TYPE}", kind)
}

/// A group as counted, before the rest is filled in.
struct Counted {
    key: Option<String>,
    tasks: i64,
    last_seen: Option<DateTime<Utc>>,
    first_seen: Option<DateTime<Utc>>,
}

impl Store {
    /// The groups `query` asks for, biggest first.
    pub async fn groups(&self, query: &GroupQuery) -> Result<Groups> {
        let mut filter = query.filter.clone();
        if filter.status.is_empty() {
            filter.status = vec![Status::Failed, Status::PermanentFailure];
        }
        // The window is the filter's `failed_after`, so that a group's list, and an
        // action on it, select what the group counts.
        let since = query
            .since
            .and_then(|s| chrono::Duration::from_std(s).ok())
            .map(|s| Utc::now() - s);
        filter.failed_after = filter.failed_after.max(since);
        let statuses = filter.status.clone();
        let counted_at = Utc::now();
        let selection = Selection::Filter(filter.clone());
        let buckets = query.buckets.clamp(1, MOST_TREND_BUCKETS);
        let bucket_seconds = (query.trend.as_secs() / u64::from(buckets)).max(1);
        let trend_start =
            Utc::now() - chrono::Duration::seconds((bucket_seconds * u64::from(buckets)) as i64);
        // By class, every cause is counted and summed; by the rest, the biggest are listed.
        let limit = match query.by {
            GroupBy::Class => i64::MAX,
            _ => query.limit.clamp(1, MAX_GROUPS),
        };

        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan")
            .execute(&mut *tx)
            .await?;
        sqlx::query(&format!("SET LOCAL statement_timeout = '{GROUPS_TIMEOUT}'"))
            .execute(&mut *tx)
            .await?;
        sqlx::query(super::ONE_BACKEND).execute(&mut *tx).await?;
        let not_done =
            (statuses.iter()).all(|s| matches!(s, Status::Failed | Status::PermanentFailure));
        if matches!(query.by, GroupBy::Cause | GroupBy::Class) && not_done {
            // The cause index read alone, in its order (an index-only scan: no heap page
            // where the visibility map says so), rather than a bitmap over the statuses'
            // indexes and every heap page of the tasks not done (what a planner without
            // statistics picks) or every task (with them): measured on 1M tasks (130k not
            // done), 190 and 420 ms against 90 ms with every page still to check.
            for setting in [
                "SET LOCAL enable_bitmapscan = off",
                "SET LOCAL enable_seqscan = off",
            ] {
                sqlx::query(setting).execute(&mut *tx).await?;
            }
        }
        let rows = bind_selection(sqlx::query(&statement(GROUPED, query.by)), &selection)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let (mut total_groups, mut total_tasks) = (0, 0);
        let mut counted = Vec::with_capacity(rows.len());
        for row in &rows {
            total_groups = row.try_get("total_groups")?;
            total_tasks = row.try_get("total_tasks")?;
            counted.push(Counted {
                key: row.try_get("key")?,
                tasks: row.try_get("tasks")?,
                last_seen: row.try_get("last_seen")?,
                first_seen: row.try_get("first_seen")?,
            });
        }
        let keys: Vec<Option<&str>> = counted.iter().map(|c| c.key.as_deref()).collect();
        let (trend_rows, sample_rows, cause_rows) = if keys.is_empty() {
            (Vec::new(), Vec::new(), Vec::new())
        } else {
            let trend = bind_selection(sqlx::query(&statement(TREND, query.by)), &selection)
                .bind(&keys)
                .bind(trend_start.timestamp() as f64)
                .bind(bucket_seconds as f64)
                .fetch_all(&mut *tx)
                .await?;
            let sample = bind_selection(sqlx::query(&statement(SAMPLE, query.by)), &selection)
                .bind(&keys)
                .bind(SPAN_SAMPLE)
                .fetch_all(&mut *tx)
                .await?;
            let causes = match query.by {
                GroupBy::Cause | GroupBy::Class => {
                    sqlx::query_as::<_, CauseView>(&format!(
                        "SELECT id, class, fingerprint, example, {} AS first_seen \
                             FROM recovery_cause WHERE id = ANY($1::text[]::bigint[])",
                        readable("first_seen")
                    ))
                    .bind(&keys)
                    .fetch_all(&mut *tx)
                    .await?
                }
                _ => Vec::new(),
            };
            (trend, sample, causes)
        };
        tx.commit().await?;

        let mut causes = HashMap::new();
        for cause in cause_rows {
            causes.insert(cause.id.to_string(), cause);
        }
        let mut trends: HashMap<Option<String>, Vec<i64>> = HashMap::new();
        for row in &trend_rows {
            let key: Option<String> = row.try_get("key")?;
            let bucket: i32 = row.try_get("bucket")?;
            let tasks: i64 = row.try_get("tasks")?;
            let trend = trends
                .entry(key)
                .or_insert_with(|| vec![0; buckets as usize]);
            if let Some(slot) = usize::try_from(bucket).ok().and_then(|b| trend.get_mut(b)) {
                *slot += tasks;
            } else if bucket >= buckets as i32 {
                // Failed a moment after the trend's end was taken: the last bucket.
                if let Some(last) = trend.last_mut() {
                    *last += tasks;
                }
            }
        }
        let mut spans: HashMap<Option<String>, Span> = HashMap::new();
        for row in &sample_rows {
            let key: Option<String> = row.try_get("key")?;
            let span = spans.entry(key).or_default();
            span.handlers.insert(row.try_get("handler")?);
            if let Some(route) = row.try_get::<Option<String>, _>("route")? {
                span.routes.insert(route);
            }
            if span.example.is_none() {
                span.example = Some((TaskId(row.try_get("id")?), row.try_get("error")?));
            }
        }

        let mut groups: Vec<Group> = counted
            .into_iter()
            .map(|c| {
                let cause = c.key.as_ref().and_then(|key| causes.get(key)).cloned();
                let span = spans.remove(&c.key).unwrap_or_default();
                Group {
                    first_seen: cause.as_ref().and_then(|c| c.first_seen).or(c.first_seen),
                    cause,
                    tasks: c.tasks,
                    last_seen: c.last_seen,
                    trend: trends
                        .remove(&c.key)
                        .unwrap_or_else(|| vec![0; buckets as usize]),
                    handlers: span.handlers.into_iter().collect(),
                    routes: span.routes.into_iter().collect(),
                    example_task: span.example.as_ref().map(|(id, _)| *id),
                    example_error: span.example.and_then(|(_, error)| error),
                    key: c.key,
                }
            })
            .collect();
        if query.by == GroupBy::Class {
            groups = by_class(groups);
            total_groups = groups.len() as i64;
            groups.truncate(query.limit.clamp(1, MAX_GROUPS) as usize);
        }
        Ok(Groups {
            by: query.by,
            statuses,
            groups,
            total_groups,
            total_tasks,
            trend_start,
            bucket_seconds,
            filter,
            counted_at,
        })
    }
}

/// What a group's newest tasks span.
#[derive(Default)]
struct Span {
    handlers: BTreeSet<String>,
    routes: BTreeSet<String>,
    example: Option<(TaskId, Option<String>)>,
}

/// Groups by cause summed into groups by class, biggest first.
fn by_class(groups: Vec<Group>) -> Vec<Group> {
    let mut classes: BTreeMap<Option<String>, Group> = BTreeMap::new();
    for group in groups {
        let class = group.cause.as_ref().map(|c| c.class.clone());
        match classes.get_mut(&class) {
            None => {
                let mut first = group;
                first.key = class.clone();
                first.cause = None;
                classes.insert(class, first);
            }
            Some(sum) => {
                sum.tasks += group.tasks;
                sum.first_seen = match (sum.first_seen, group.first_seen) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                sum.last_seen = sum.last_seen.max(group.last_seen);
                for (total, more) in sum.trend.iter_mut().zip(&group.trend) {
                    *total += more;
                }
                let handlers: BTreeSet<String> =
                    sum.handlers.drain(..).chain(group.handlers).collect();
                sum.handlers = handlers.into_iter().collect();
                let routes: BTreeSet<String> = sum.routes.drain(..).chain(group.routes).collect();
                sum.routes = routes.into_iter().collect();
            }
        }
    }
    let mut groups: Vec<Group> = classes.into_values().collect();
    groups.sort_by(|a, b| b.tasks.cmp(&a.tasks).then_with(|| a.key.cmp(&b.key)));
    groups
}
