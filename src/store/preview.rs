//! What a bulk verb would do, read without changing anything: the first tasks an action
//! would change, and what a replay would produce and skip.

use serde::Serialize;
use sqlx::Row;

use super::filter::{bind_selection, Selection, TaskFilter};
use super::inspect::{summary_from_row, summary_statement};
use super::operate::{Action, STARTED};
use super::{Result, Store, StoreError, TaskSummary, ORDERED_WALK};

/// The first tasks (by id, as the action walks them) in a status the action applies to,
/// less those it would leave alone over a started compensation (`$21`).
const ACTION_SAMPLE: &str = "\
    SELECT {SUMMARY} FROM recovery_task t WHERE {CONDITION} AND status = ANY($20) \
      AND NOT ($21 AND EXISTS (SELECT 1 FROM recovery_compensation c \
                               WHERE c.task_id = t.id AND {STARTED})) \
    ORDER BY id LIMIT $22";

/// Whether a replay produces a task (`$20`: its target topic, if one was given): the
/// replay runner's own rule (`replay::target_of`).
const PRODUCED: &str = "payload_stored AND ($20::text IS NOT NULL OR original_topic IS NOT NULL)";

const REPLAY_COUNTS: &str = "\
    SELECT count(*) AS selected, count(*) FILTER (WHERE {PRODUCED}) AS produced, \
           count(*) FILTER (WHERE NOT payload_stored) AS payload_not_stored, \
           count(*) FILTER (WHERE payload_stored AND $20::text IS NULL \
                            AND original_topic IS NULL) AS no_original_topic \
    FROM recovery_task WHERE {CONDITION}";

const REPLAY_SAMPLE: &str = "\
    SELECT {SUMMARY} FROM recovery_task WHERE {CONDITION} AND {PRODUCED} ORDER BY id LIMIT $21";

/// The first tasks an action would change, in its order.
#[derive(Debug, Default)]
pub struct ActionSample {
    /// Those whose rows could be read.
    pub tasks: Vec<TaskSummary>,
    /// Why each of the others could not be (rows written by hand), naming its task.
    pub unreadable: Vec<String>,
}

/// What a replay of a filter would do now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ReplayCounts {
    /// Tasks the filter selects.
    pub selected: i64,
    /// Tasks it would produce.
    pub produced: i64,
    /// Tasks it would skip because their payload was not stored (too large at ingest):
    /// producing them would write an empty record.
    pub payload_not_stored: i64,
    /// Tasks it would skip because no target topic was given and they have no original
    /// topic to go back to.
    pub no_original_topic: i64,
}

impl Store {
    /// Up to `limit` of the tasks `action` would change in `selection`, in the order it
    /// changes them.
    pub async fn action_sample(
        &self,
        action: &Action,
        selection: &Selection,
        limit: i64,
    ) -> Result<ActionSample> {
        let applies: Vec<&str> = action.applies_to().iter().map(|s| s.as_str()).collect();
        let statement = summary_statement(ACTION_SAMPLE).replace("{STARTED}", STARTED);
        let mut tx = self.pool.begin_with(ORDERED_WALK).await?;
        let rows = bind_selection(sqlx::query(&statement), selection)
            .bind(applies)
            .bind(action.spares_compensations())
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut sample = ActionSample::default();
        for row in &rows {
            match summary_from_row(row) {
                Ok(task) => sample.tasks.push(task),
                // The action itself writes such a row like any other (a retry or a
                // discard is how an operator repairs it): its preview must not stop it.
                Err(error @ StoreError::MalformedRow(_)) => {
                    sample.unreadable.push(error.to_string())
                }
                Err(error) => return Err(error),
            }
        }
        Ok(sample)
    }

    /// What a replay of `filter` to `target` (none: each task's original topic) would
    /// produce and skip now.
    pub async fn replay_counts(
        &self,
        filter: &TaskFilter,
        target: Option<&str>,
    ) -> Result<ReplayCounts> {
        let selection = Selection::Filter(filter.clone());
        let statement = summary_statement(REPLAY_COUNTS).replace("{PRODUCED}", PRODUCED);
        let row = bind_selection(sqlx::query(&statement), &selection)
            .bind(target)
            .fetch_one(&self.pool)
            .await?;
        Ok(ReplayCounts {
            selected: row.try_get("selected")?,
            produced: row.try_get("produced")?,
            payload_not_stored: row.try_get("payload_not_stored")?,
            no_original_topic: row.try_get("no_original_topic")?,
        })
    }

    /// The first `limit` tasks a replay of `filter` to `target` would produce, in the
    /// order it produces them.
    pub async fn replay_sample(
        &self,
        filter: &TaskFilter,
        target: Option<&str>,
        limit: i64,
    ) -> Result<Vec<TaskSummary>> {
        let selection = Selection::Filter(filter.clone());
        let statement = summary_statement(REPLAY_SAMPLE).replace("{PRODUCED}", PRODUCED);
        let mut tx = self.pool.begin_with(ORDERED_WALK).await?;
        let rows = bind_selection(sqlx::query(&statement), &selection)
            .bind(target)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(summary_from_row).collect()
    }
}
