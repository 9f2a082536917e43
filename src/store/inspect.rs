//! What operators look at: pages of tasks and the store's figures.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

use super::filter::{bind_selection, Selection, TaskFilter, CONDITION, KEY_HEADS};
use super::{Result, Store};
use crate::readable::Readable;
use crate::task::{Status, TaskId};

/// Largest page [`Store::list`] returns.
pub const MAX_PAGE: i64 = 1000;

/// Bytes of key and error a list row carries (`show` gives them whole).
const PREVIEW_BYTES: i32 = 120;

/// A task as one line of a list: no payload, key and error cut short.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TaskSummary {
    /// Task id.
    pub id: TaskId,
    /// Status.
    pub status: Status,
    /// Handler.
    pub handler: String,
    /// Ingest route, if ingested.
    pub route: Option<String>,
    /// Topic consumed from.
    pub topic: Option<String>,
    /// Partition consumed from.
    pub partition: Option<i32>,
    /// Offset consumed from.
    pub offset: Option<i64>,
    /// The key's first bytes (as `show` renders them: UTF-8, or hex).
    pub key: Option<String>,
    /// Attempts started.
    pub attempts: i32,
    /// When the next attempt is due (the lease deadline while leased); absent while held
    /// behind its key (the store's far-future mark) and once final (a stale deadline).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Waiting behind an open task of its ordering key.
    pub held: bool,
    /// The first bytes of the error it shows: its last attempt's, or before any attempt
    /// failed, the one it was reported with (its dead letter's).
    pub last_error: Option<String>,
    /// Worker holding its lease.
    pub lease_owner: Option<String>,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// Counts of one status and handler.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StatusCount {
    /// Status.
    pub status: Status,
    /// Handler.
    pub handler: String,
    /// Tasks.
    pub count: i64,
}

/// The oldest due task of a handler.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OldestDue {
    /// Handler.
    pub handler: String,
    /// Tasks due now.
    pub due: i64,
    /// How long the oldest has been due, in seconds.
    pub oldest_due_seconds: f64,
}

/// Attempts of the last hour with one outcome.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OutcomeCount {
    /// `resolved`, `retry`, `permanent_failure`, `fenced`, `operator_retry`, ...
    pub outcome: String,
    /// How many.
    pub count: i64,
}

/// The store's figures, for `redrive tasks stats` and `GET /api/v1/stats`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Stats {
    /// Tasks by status and handler.
    pub tasks: Vec<StatusCount>,
    /// Per handler with due tasks: how many and the oldest's age.
    pub due: Vec<OldestDue>,
    /// Attempts of the last hour by outcome (by the minute they started: up to 61 minutes).
    pub last_hour: Vec<OutcomeCount>,
    /// Members seen recently.
    pub members: Vec<super::members::Member>,
}

/// The columns of a [`TaskSummary`], key and error cut to `{PREVIEW}` bytes.
pub(super) const SUMMARY_COLUMNS: &str = "\
    id, status, handler, route, source_topic, source_partition, source_offset, \
    substring(msg_key FROM 1 FOR {PREVIEW}) AS key, attempts, \
    CASE WHEN status = 'failed' AND NOT held THEN next_attempt_at END AS next_attempt_at, held, \
    left(coalesce(last_error, error_message), {PREVIEW}) AS last_error, lease_owner, created_at, updated_at";

const LIST: &str = "\
    SELECT {SUMMARY} FROM recovery_task WHERE {CONDITION} AND ($20::bigint IS NULL OR id < $20) \
    ORDER BY id DESC LIMIT $21";

/// [`LIST`] by a narrow key filter: its tasks (at most [`KEYED_SORT_MAX`]) are found by id
/// from their key heads, then sorted.
const LIST_BY_KEY_HEADS: &str = "\
    SELECT {SUMMARY} FROM recovery_task WHERE {CONDITION} AND ($20::bigint IS NULL OR id < $20) \
        AND id = ANY(ARRAY(SELECT task_id FROM {KEY_HEADS})) \
    ORDER BY id DESC LIMIT $21";

/// How every list runs: planned for its own filter each time (a prepared statement's
/// generic plan would serve every filter with one plan).
/// Lists then walk newest first along the primary key, never sorting (a sort of every
/// match would follow a stale estimate), except by a narrow key filter.
const CUSTOM_PLANS: &str = "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan";

/// Most tasks a key filter's range of key heads may hold for a list to find them through
/// the key heads and sort them; a wider one (a short prefix most keys share) is walked
/// newest first like any other filter. Counted, not estimated: the choice must not
/// depend on the planner's statistics.
const KEYED_SORT_MAX: i64 = 5_000;

/// The key heads a selection's key filter selects (`$1`..`$19`), counted up to `$20`.
const KEY_RANGE: &str = "SELECT count(*) FROM (SELECT 1 FROM {KEY_HEADS} LIMIT $20) s";

/// Most tasks of unresolved statuses a list finds through their indexes and sorts (a
/// sort of 20,000 short rows takes milliseconds); with more it walks newest first.
const STATUS_SORT_MAX: i64 = 20_000;

/// PostgreSQL's SQLSTATE for a statement cancelled by `statement_timeout`.
const QUERY_CANCELED: &str = "57014";

/// The tasks a selection (`$1`..`$19`) holds, counted up to `$20`.
const COUNT_UP_TO: &str =
    "SELECT count(*) FROM (SELECT 1 FROM recovery_task WHERE {CONDITION} LIMIT $20) s";

/// The tasks `selection` holds, counted in `tx` up to `most + 1`.
async fn count_up_to_in(
    tx: &mut sqlx::PgConnection,
    selection: &Selection,
    most: i64,
) -> Result<i64> {
    let counted = bind_selection(sqlx::query(&summary_statement(COUNT_UP_TO)), selection)
        .bind(most.saturating_add(1))
        .fetch_one(tx)
        .await?;
    Ok(counted.try_get(0)?)
}

/// `statement` with its summary columns and selection condition filled in.
pub(super) fn summary_statement(statement: &str) -> String {
    statement
        .replace("{SUMMARY}", SUMMARY_COLUMNS)
        .replace("{PREVIEW}", &PREVIEW_BYTES.to_string())
        .replace("{CONDITION}", CONDITION)
        .replace("{KEY_HEADS}", KEY_HEADS)
}

/// A row of [`SUMMARY_COLUMNS`] as a [`TaskSummary`].
pub(super) fn summary_from_row(r: &sqlx::postgres::PgRow) -> Result<TaskSummary> {
    let status: String = r.try_get("status")?;
    let key: Option<Vec<u8>> = r.try_get("key")?;
    let id = TaskId(r.try_get("id")?);
    Ok(TaskSummary {
        id,
        status: status
            .parse()
            .map_err(|e| super::StoreError::MalformedRow(format!("task {id}: status: {e}")))?,
        handler: r.try_get("handler")?,
        route: r.try_get("route")?,
        topic: r.try_get("source_topic")?,
        partition: r.try_get("source_partition")?,
        offset: r.try_get("source_offset")?,
        key: key.map(|k| Readable::new(&k).line()),
        attempts: r.try_get("attempts")?,
        next_attempt_at: super::row::timestamp(r, id, "next_attempt_at")?,
        held: r.try_get("held")?,
        last_error: r.try_get("last_error")?,
        lease_owner: r.try_get("lease_owner")?,
        created_at: super::row::required_timestamp(r, id, "created_at")?,
        updated_at: super::row::required_timestamp(r, id, "updated_at")?,
    })
}

impl Store {
    /// Up to `limit` (at most [`MAX_PAGE`]) of the tasks `filter` selects, newest
    /// first, older than the `after` cursor.
    pub async fn list(
        &self,
        filter: &TaskFilter,
        after: Option<TaskId>,
        limit: i64,
    ) -> Result<Vec<TaskSummary>> {
        let selection = Selection::Filter(filter.clone());
        let mut tx = self.pool.begin_with(CUSTOM_PLANS).await?;
        let keyed = filter.key.is_some() || filter.key_prefix.is_some();
        let narrow_key = keyed && {
            let range = summary_statement(KEY_RANGE);
            let in_range: i64 = bind_selection(sqlx::query(&range), &selection)
                .bind(KEYED_SORT_MAX + 1)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
            in_range <= KEYED_SORT_MAX
        };
        let statement = summary_statement(match narrow_key {
            true => LIST_BY_KEY_HEADS,
            false => LIST,
        });
        // Statuses other than resolved are read through indexes of their own: a few
        // thousand of them are found there and sorted, rather than looked for among
        // every task newest first. One status whose index gives id order (a permanent
        // failure, a discard) needs no count: the walk along that index stops at the page.
        let ordered_by_index = matches!(
            filter.status.as_slice(),
            [Status::PermanentFailure] | [Status::Discarded]
        );
        let unresolved = !filter.status.is_empty()
            && !filter.status.contains(&Status::Resolved)
            && !ordered_by_index;
        let narrow_status = !narrow_key && unresolved && {
            // Counted through the statuses' own indexes, never by reading every task.
            sqlx::query("SET LOCAL enable_seqscan = off")
                .execute(&mut *tx)
                .await?;
            let in_range = count_up_to_in(&mut tx, &selection, STATUS_SORT_MAX).await?;
            sqlx::query("SET LOCAL enable_seqscan = on")
                .execute(&mut *tx)
                .await?;
            in_range <= STATUS_SORT_MAX
        };
        let plan = match (narrow_key, narrow_status) {
            (true, _) => None,
            (_, true) => Some("SET LOCAL enable_indexscan = off"),
            _ => Some("SET LOCAL enable_sort = off"),
        };
        if let Some(plan) = plan {
            sqlx::query(plan).execute(&mut *tx).await?;
        }
        let rows = bind_selection(sqlx::query(&statement), &selection)
            .bind(after.map(|id| id.0))
            .bind(limit.clamp(1, MAX_PAGE))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(summary_from_row).collect()
    }

    /// How many tasks `selection` holds, when at most `most` and counted `within` that
    /// time; `None` otherwise. Reads at most `most + 1` of them, planned for the
    /// selection's own values; a filter no index serves (error text, creation time) gives
    /// up after `within` instead of reading every task.
    pub async fn count_selected_up_to(
        &self,
        selection: &Selection,
        most: i64,
        within: std::time::Duration,
    ) -> Result<Option<i64>> {
        let mut tx = self.pool.begin_with(CUSTOM_PLANS).await?;
        let budget = format!(
            "SET LOCAL statement_timeout = {}",
            within.as_millis().clamp(1, 60_000)
        );
        sqlx::query(&budget).execute(&mut *tx).await?;
        let found = match count_up_to_in(&mut tx, selection, most).await {
            Err(super::StoreError::Database(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some(QUERY_CANCELED) =>
            {
                return Ok(None)
            }
            found => found?,
        };
        tx.commit().await?;
        Ok((found <= most).then_some(found))
    }

    /// Counts by status and handler, due work per handler, the last hour's outcomes and
    /// the live members. The counts read every task: for operators, not for scrapes.
    pub async fn stats(&self) -> Result<Stats> {
        let tasks = sqlx::query(
            "SELECT status, handler, count(*) AS n FROM recovery_task \
             GROUP BY status, handler ORDER BY status, handler",
        )
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            let status: String = r.try_get("status")?;
            Ok(StatusCount {
                status: status.parse().map_err(|e| {
                    super::StoreError::MalformedRow(format!("a task's status: {e}"))
                })?,
                handler: r.try_get("handler")?,
                count: r.try_get("n")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
        let due = sqlx::query(
            "SELECT handler, count(*) AS due, \
                    extract(epoch FROM now() - recovery_clamp_time(min(next_attempt_at)))::float8 AS age \
             FROM recovery_task WHERE status = 'failed' AND next_attempt_at <= now() \
             GROUP BY handler ORDER BY handler",
        )
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            Ok(OldestDue {
                handler: r.try_get("handler")?,
                due: r.try_get("due")?,
                oldest_due_seconds: r.try_get("age")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
        let last_hour = self.last_hour().await?;
        Ok(Stats {
            tasks,
            due,
            last_hour,
            members: self.live_members().await?,
        })
    }
}
