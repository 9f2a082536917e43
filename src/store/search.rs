//! Search: tasks whose key, value or headers hold a text, looked for among the newest
//! [`super::SEARCH_SCAN`] tasks a filter selects, under a statement timeout. The cost is
//! bounded by both, whatever the store holds, and the answer says what was searched.
//!
//! No index serves it: payloads are bytes (not always text), and a trigram index over
//! them would cost every ingest for a search operators run during incidents only.

use serde::Serialize;
use sqlx::Row;

use super::filter::{bind_selection, Selection, TaskFilter};
use super::inspect::{summary_from_row, summary_statement, TaskSummary, MAX_PAGE};
use super::{Result, Store};
use crate::task::TaskId;

/// PostgreSQL's SQLSTATE for a statement cancelled by `statement_timeout`.
const QUERY_CANCELED: &str = "57014";

/// How long one page of a search may take before the database stops it.
pub const SEARCH_TIMEOUT_MS: u64 = 5_000;

/// What a page of a search looked at.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Searched {
    /// The text looked for.
    pub text: String,
    /// Tasks read (newest first, those the rest of the filter selects).
    pub scanned: i64,
    /// Most tasks a page reads.
    pub bound: i64,
    /// Whether the bound stopped the scan before the oldest task the filter selects:
    /// older tasks were not searched (the next page continues below them).
    pub bounded: bool,
    /// The oldest task read.
    #[schema(value_type = Option<i64>)]
    pub down_to: Option<TaskId>,
}

/// A page of a search: what it found, and what it read.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchPage {
    /// Tasks found, newest first.
    pub tasks: Vec<TaskSummary>,
    /// What was read.
    pub searched: Searched,
}

/// `$20`: below this id; `$21`: page size; `$22`: most tasks read; `$23`: the text.
/// Each task read is matched as it is read, and only its id and whether it matched are
/// kept: keeping the payloads of the tasks read (tens of megabytes for the bound) spilled
/// to a temporary file on every search.
///
/// One task more than the bound is read (and not searched), so that `bounded` says
/// whether older tasks were left, not only whether the bound was reached.
const SEARCH: &str = "\
    WITH scanned AS MATERIALIZED ( \
        SELECT id, \
               position($23::bytea IN coalesce(msg_key, '')) > 0 \
               OR position($23::bytea IN coalesce(msg_value, '')) > 0 \
               OR (position($23::bytea IN msg_headers) > 0 \
                   AND recovery_headers_hold(msg_headers, $23)) AS hit \
        FROM recovery_task \
        WHERE {CONDITION} AND ($20::bigint IS NULL OR id < $20) \
        ORDER BY id DESC LIMIT $22 + 1), \
    counted AS MATERIALIZED (SELECT count(*) AS n, min(id) AS oldest FROM scanned), \
    searched AS MATERIALIZED ( \
        SELECT least(n, $22) AS scanned, n > $22 AS more, \
               CASE WHEN n > $22 THEN (SELECT min(id) FROM scanned WHERE id > oldest) \
                    ELSE oldest END AS down_to \
        FROM counted), \
    found AS MATERIALIZED ( \
        SELECT id FROM scanned, counted WHERE hit AND (n <= $22 OR id > oldest) \
        ORDER BY id DESC LIMIT $21), \
    page AS (SELECT {SUMMARY} FROM recovery_task WHERE id IN (SELECT id FROM found)) \
    SELECT page.*, s.scanned, s.down_to, s.more \
    FROM searched s LEFT JOIN page ON true \
    ORDER BY page.id DESC NULLS LAST";

impl Store {
    /// Up to `limit` tasks `filter` selects whose key, value or headers hold
    /// `filter.search`, among the newest `scan` of them (operators get [`super::SEARCH_SCAN`])
    /// older than `after`.
    pub async fn search(
        &self,
        filter: &TaskFilter,
        after: Option<TaskId>,
        limit: i64,
        scan: i64,
    ) -> Result<SearchPage> {
        let text = filter.search.clone().unwrap_or_default();
        // One more is read than the bound: keep it a number.
        let scan = scan.clamp(1, i64::MAX - 1);
        let mut tx = self
            .pool
            .begin_with(
                "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_sort = off",
            )
            .await?;
        sqlx::query(&format!(
            "SET LOCAL statement_timeout = {SEARCH_TIMEOUT_MS}"
        ))
        .execute(&mut *tx)
        .await?;
        sqlx::query(super::ONE_BACKEND).execute(&mut *tx).await?;
        let selection = Selection::Filter(filter.clone());
        let rows = bind_selection(sqlx::query(&summary_statement(SEARCH)), &selection)
            .bind(after.map(|id| id.0))
            .bind(limit.clamp(1, MAX_PAGE))
            .bind(scan)
            .bind(text.as_bytes())
            .fetch_all(&mut *tx)
            .await
            .map_err(
                |error| match error.as_database_error().and_then(|e| e.code()) {
                    Some(code) if code == QUERY_CANCELED => super::StoreError::SearchTimedOut {
                        scan,
                        seconds: SEARCH_TIMEOUT_MS / 1000,
                    },
                    _ => error.into(),
                },
            )?;
        tx.commit().await?;
        let mut tasks = Vec::new();
        let (mut scanned, mut down_to, mut more) = (0, None, false);
        for row in &rows {
            scanned = row.try_get("scanned")?;
            down_to = row.try_get::<Option<i64>, _>("down_to")?.map(TaskId);
            more = row.try_get("more")?;
            if row.try_get::<Option<i64>, _>("id")?.is_some() {
                tasks.push(summary_from_row(row)?);
            }
        }
        Ok(SearchPage {
            tasks,
            searched: Searched {
                text,
                scanned,
                bound: scan,
                bounded: more,
                down_to,
            },
        })
    }
}
