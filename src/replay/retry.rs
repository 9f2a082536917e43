//! A paced retry's batches: each batch of the selection (in task id order) is made due
//! again, marked with the job, and the cursor moved past it, in one transaction. The
//! fleet's workers then run them as any due task: the pace admits them, the handlers'
//! breakers and concurrency still apply.

use tokio_util::sync::CancellationToken;

use super::pacer::{BatchDone, Next, Pacer};
use super::{Progress, ReplayError, Replayer};
use crate::store::{apply_batch, Action, Operator, ReplayJob, Selection, Store, StoreError, Walk};
use crate::task::TaskId;

impl Replayer {
    /// Makes retry `job`'s tasks due again from where it stands to its end, at its pace.
    pub(super) async fn retry_all(
        &self,
        job: ReplayJob,
        progress: Progress<'_>,
        lost: &CancellationToken,
    ) -> Result<(), ReplayError> {
        let Some(action) = job.retry.clone() else {
            return Err(ReplayError::Invalid(format!(
                "retry job {} records no retry to make",
                job.id
            )));
        };
        let mut pacer = Pacer::new(&job);
        let total = job.total.unwrap_or(0).max(0) as u64;
        let mut done = (job.produced + job.skipped).max(0) as u64;
        progress(done, total);
        let operator = Operator {
            actor: job.actor.clone(),
            reason: Some(format!("retried by job {}", job.id)),
        };
        let mut cursor = job.cursor;
        let first = pacer.before_first_batch(&self.store, &self.runner, cursor, lost);
        if first.await? == Next::Stop {
            return Ok(());
        }
        loop {
            if lost.is_cancelled() {
                return Ok(());
            }
            // Never more than it counted when it was recorded (and confirmed, or
            // approved): tasks that start to match meanwhile may take the place of those
            // that stopped, never add to them.
            let left = match (job.upto_id, job.total) {
                (Some(_), Some(total)) => total - done as i64,
                _ => i64::MAX,
            };
            let limit = pacer.batch_limit(done as i64).min(left);
            let page = match limit > 0 {
                true => {
                    (self.store)
                        .replay_batch(&job.filter, cursor, job.upto_id, limit, i64::MAX)
                        .await?
                }
                false => Default::default(),
            };
            let Some(last) = page.last else {
                self.store.finish_replay(job.id, &self.runner, None).await?;
                progress(done.max(total), done.max(total));
                return Ok(());
            };
            let mut admitted = Vec::new();
            let limiter = pacer.limiter(None);
            for task in &page.tasks {
                if let Some(limiter) = limiter {
                    tokio::select! {
                        _ = lost.cancelled() => break,
                        _ = limiter.until_ready() => {}
                    }
                }
                admitted.push(task.id);
            }
            // Stopped part-way: the admitted tasks are retried and the rest wait.
            let whole = admitted.len() == page.tasks.len();
            let upto = match (whole, admitted.last()) {
                (true, _) => last,
                (false, Some(task)) => task.0,
                (false, None) => return Ok(()),
            };
            let unreadable = if whole { page.unreadable } else { 0 };
            let Some(changed) = self
                .commit_retry(&job, &operator, &action, upto, &admitted, unreadable)
                .await?
            else {
                return Ok(());
            };
            let handled = admitted.len() as u64 + unreadable as u64;
            done += handled;
            progress(done, total);
            let before = cursor;
            cursor = upto;
            if !whole {
                return Ok(());
            }
            let batch = BatchDone {
                before,
                cursor,
                sent: changed,
                done: done as i64,
            };
            let next = pacer.after_batch(&self.store, &self.runner, batch, lost);
            if next.await? == Next::Stop {
                return Ok(());
            }
        }
    }

    /// Retries `tasks` (those the action applies to), marks them with the job and moves
    /// its cursor to `upto`, in one transaction: how many it made due again, or none
    /// when the job is no longer ours.
    async fn commit_retry(
        &self,
        job: &ReplayJob,
        operator: &Operator,
        action: &Action,
        upto: i64,
        tasks: &[TaskId],
        unreadable: i64,
    ) -> Result<Option<i64>, ReplayError> {
        let mut tx = (self.store.pool())
            .begin_with(crate::store::ORDERED_WALK)
            .await
            .map_err(StoreError::from)?;
        let changed = match tasks.is_empty() {
            true => 0,
            false => {
                // Another job's tasks are not this one's to redrive (unless forced).
                let tasks = &Store::redrivable(&mut tx, job.id, tasks, job.force).await?;
                if tasks.is_empty() {
                    0
                } else {
                    let selection = Selection::Ids(tasks.to_vec());
                    let batch =
                        apply_batch(&mut tx, operator, action, &selection, Walk::WHOLE, None)
                            .await?;
                    Store::mark_redriven(&mut tx, job.id, tasks, true).await?;
                    // Idle workers take them at once, not at their next poll.
                    Store::notify_due(&mut tx).await?;
                    batch.changed
                }
            }
        };
        let left_alone = tasks.len() as i64 - changed + unreadable;
        let ours = Store::end_replay_batch(
            &mut tx,
            job.id,
            &self.runner,
            upto,
            changed,
            left_alone,
            false,
        )
        .await?;
        if !ours {
            return Ok(None);
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Some(changed))
    }
}
