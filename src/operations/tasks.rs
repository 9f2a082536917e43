//! The read-only verbs on tasks and the fleet: list, show, stats, check, members.

use super::error::{OperationError, Result};
use super::page::{Page, PageRequest};
use super::selection::{select, FilterParams};
use super::Operations;
use crate::store::{CheckReport, Member, OutcomeMinute, Sampled, Stats, TaskDetail, TaskSummary};
use crate::task::TaskId;

impl Operations {
    /// A page of the tasks `filter` selects, newest first.
    pub async fn list(
        &self,
        filter: &FilterParams,
        page: &PageRequest,
    ) -> Result<Page<TaskSummary>> {
        let filter = filter.filter()?;
        let limit = page.limit()?;
        let after = page.after()?.map(TaskId);
        if filter.search.is_some() {
            let found = (self.store)
                .search(&filter, after, limit, crate::store::SEARCH_SCAN)
                .await?;
            let full = found.tasks.len() as i64 >= limit;
            // A full page continues after its last task; one the bound cut short, below
            // the oldest task read.
            let next_cursor = match (found.tasks.last(), found.searched.down_to) {
                (Some(last), _) if full => Some(last.id.0),
                (_, Some(oldest)) if found.searched.bounded => Some(oldest.0),
                _ => None,
            };
            return Ok(Page {
                items: found.tasks,
                next_cursor,
                searched: Some(found.searched),
            });
        }
        let tasks = self.store.list(&filter, after, limit).await?;
        Ok(Page::after(tasks, limit, |task| task.id.0))
    }

    /// Every field of task `id`, its payload readable, its attempt history, where this
    /// configuration republishes and parks it, and the attempts the fleet allows it.
    pub async fn show(&self, id: i64) -> Result<TaskDetail> {
        match self.store.detail(TaskId(id)).await? {
            Some(detail) => Ok(detail
                .with_targets(&self.targets)
                .with_budgets(&self.budgets().await?)),
            None => Err(OperationError::NotFound(format!("no such task: {id}"))),
        }
    }

    /// How many tasks `ids`, or `filter` (every task only with `all`), select, in any
    /// status: what a bulk verb's dry run compares its `matched` with (reads every one).
    pub async fn count(
        &self,
        ids: &[i64],
        filter: Option<&FilterParams>,
        all: bool,
    ) -> Result<i64> {
        let selection = select(ids, filter, all)?;
        Ok(self.store.count_selected(&selection).await?)
    }

    /// [`Operations::count`] when at most `most` and counted within `within`; `None`
    /// otherwise (a list page says "all that match" rather than read a million tasks
    /// on every load; a bulk verb's dry run counts exactly).
    pub async fn count_up_to(
        &self,
        ids: &[i64],
        filter: Option<&FilterParams>,
        all: bool,
        most: i64,
        within: std::time::Duration,
    ) -> Result<Option<i64>> {
        let selection = select(ids, filter, all)?;
        Ok(self
            .store
            .count_selected_up_to(&selection, most, within)
            .await?)
    }

    /// Counts by status and handler, due work, the last hour's outcomes, live members.
    pub async fn stats(&self) -> Result<Stats> {
        Ok(self.store.stats().await?)
    }

    /// The figures of [`Operations::stats`] as the fleet last sampled them, when the
    /// tasks were counted, and What broke as sampled: for views refreshed every few
    /// seconds (see [`crate::store::Store::sampled_stats`], and
    /// [`Operations::sampled_groups`] for What broke).
    pub async fn sampled_stats(&self) -> Result<Sampled> {
        Ok(self.store.sampled_stats().await?)
    }

    /// The last hour's attempt outcomes counted per minute, newest minute first.
    pub async fn outcome_minutes(&self) -> Result<Vec<OutcomeMinute>> {
        Ok(self.store.outcome_minutes().await?)
    }

    /// The store's invariants, checked against the fleet's budgets (reads every task).
    pub async fn check(&self) -> Result<CheckReport> {
        Ok(self.store.check(&self.budgets().await?).await?)
    }

    /// The fleet's members seen recently, by id.
    pub async fn members(&self) -> Result<Page<Member>> {
        Ok(Page::whole(self.store.live_members().await?))
    }
}
