//! A job's pace while it runs: the rate of its step, how many tasks its next batch may
//! take, and after each batch the judgement of what it redrove (and, at the end of a
//! step, the checkpoint) that may pause it. See [`crate::pace`] for the rules.

use chrono::{DateTime, Utc};
use governor::DefaultDirectRateLimiter;
use std::collections::VecDeque;
use tokio_util::sync::CancellationToken;

use super::ReplayError;
use crate::pace::{Outcomes, Pace};
use crate::store::{ReplayJob, Store};

/// Tasks per batch at most.
pub(super) const MOST_PER_BATCH: i64 = 200;

/// What a job does after a batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Send the next batch.
    Go,
    /// Stop: it paused, or is no longer this runner's.
    Stop,
}

/// How long a retry waits for the workers to take the tasks it released before it
/// pauses, saying so.
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);
/// How often a retry looks again while its released tasks wait for the workers.
const WAIT_FOR_WORKERS: std::time::Duration = std::time::Duration::from_millis(100);

/// How late a replayed message's re-failure may come back and still weigh in the
/// judgement of the batches around it.
const REPLAY_LAG: std::time::Duration = std::time::Duration::from_secs(2);

/// A judgement of a step so far.
struct Judged {
    /// Why the job must pause, if it must.
    reason: Option<String>,
    /// Its tasks due now that no worker has taken yet.
    waiting: i64,
}

/// What a batch did, as the pacer judges it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchDone {
    /// The cursor before the batch.
    pub(super) before: i64,
    /// The cursor after it.
    pub(super) cursor: i64,
    /// Tasks it sent (produced, or made due again).
    pub(super) sent: i64,
    /// Tasks the job has handled in all (sent and skipped).
    pub(super) done: i64,
}

/// The pace of one running job.
pub(super) struct Pacer {
    id: i64,
    kind_retry: bool,
    pace: Option<Pace>,
    step: i32,
    step_cursor: i64,
    step_base: i64,
    step_started_at: DateTime<Utc>,
    /// The last batches of the step: (cursor before the batch, tasks it sent).
    window: VecDeque<(i64, i64)>,
    limiter: Option<DefaultDirectRateLimiter>,
}

impl Pacer {
    /// The pace of `job` where it stands.
    pub(super) fn new(job: &ReplayJob) -> Pacer {
        let mut pacer = Pacer {
            id: job.id,
            kind_retry: job.kind == "retry",
            pace: job.pace.clone(),
            step: job.step.max(0),
            step_cursor: job.step_cursor,
            step_base: job.step_base,
            step_started_at: job.step_started_at.unwrap_or(job.created_at),
            window: VecDeque::new(),
            limiter: None,
        };
        pacer.limiter = pacer.rate().map(|rate| crate::rate::limiter(rate, 1));
        pacer
    }

    /// The rate now, if any: the step's, or an unpaced replay's.
    fn rate(&self) -> Option<f64> {
        self.pace.as_ref().map(|pace| pace.rate_of(self.step))
    }

    /// The limiter of the step, if any; `unpaced` is an unpaced replay's own rate.
    pub(super) fn limiter(&mut self, unpaced: Option<f64>) -> Option<&DefaultDirectRateLimiter> {
        if self.limiter.is_none() {
            self.limiter = unpaced.map(|rate| crate::rate::limiter(rate, 1));
        }
        self.limiter.as_ref()
    }

    /// How many tasks the next batch may take, `done` handled so far: about a second's
    /// worth at the step's rate, and never past the step's checkpoint.
    pub(super) fn batch_limit(&self, done: i64) -> i64 {
        let Some(pace) = &self.pace else {
            return MOST_PER_BATCH;
        };
        let second = pace.rate_of(self.step).ceil();
        let mut limit = if second.is_finite() && second < MOST_PER_BATCH as f64 {
            (second as i64).max(1)
        } else {
            MOST_PER_BATCH
        };
        if !pace.is_last(self.step) {
            let left = self.step_base + pace.step_tasks - done;
            limit = limit.min(left.max(1));
        }
        limit
    }

    /// After `batch`: judges the step so far, and at the step's end waits for its
    /// outcomes and judges it whole before the next step begins. Pauses the job
    /// (recorded, audited) when what it redrove failed again.
    pub(super) async fn after_batch(
        &mut self,
        store: &Store,
        runner: &str,
        batch: BatchDone,
        lost: &CancellationToken,
    ) -> Result<Next, ReplayError> {
        let BatchDone {
            before,
            cursor,
            sent,
            done,
        } = batch;
        let Some(pace) = self.pace.clone() else {
            return Ok(Next::Go);
        };
        self.window.push_back((before, sent));
        // The latest outcomes weigh: a window of about twice what a judgement needs, so
        // that a downstream failing in the middle of a long step is met soon, widened by
        // what was sent too lately for its outcome to be in (see `in_flight`).
        let wanted = (pace.min_outcomes * 2).max(100) + self.in_flight(&pace, done);
        while self.window.len() > 1
            && self.window.iter().skip(1).map(|w| w.1).sum::<i64>() >= wanted
        {
            self.window.pop_front();
        }
        let window_start = self
            .window
            .front()
            .map_or(cursor, |w| w.0)
            .max(self.step_cursor);
        let window_sent = self.window.iter().map(|w| w.1).sum();
        if let Some(stop) = self
            .keep_up(
                store,
                runner,
                &pace,
                (window_start, window_sent),
                self.most_waiting(&pace, done),
                lost,
            )
            .await?
        {
            return Ok(stop);
        }
        let step_sent = done - self.step_base;
        if pace.is_last(self.step) || step_sent < pace.step_tasks {
            return Ok(Next::Go);
        }
        // The checkpoint: the step's outcomes come in for `settle`, then the whole step
        // is judged.
        tracing::info!(
            job = self.id,
            step = self.step + 1,
            settle_ms = pace.settle_ms,
            "a step of a paced job is done; waiting for its outcomes"
        );
        tokio::select! {
            _ = lost.cancelled() => return Ok(Next::Stop),
            _ = tokio::time::sleep(pace.settle()) => {}
        }
        let whole = done - self.step_base;
        let judged = self.judge(store, &pace, self.step_cursor, whole).await?;
        if let Some(reason) = judged.reason {
            return self
                .pause(store, runner, &format!("at the checkpoint: {reason}"))
                .await;
        }
        let step = self.step + 1;
        let Some(began) = store
            .begin_step(self.id, runner, step, cursor, done)
            .await?
        else {
            return Ok(Next::Stop);
        };
        tracing::info!(
            job = self.id,
            step = step + 1,
            rate = pace.rate_of(step),
            "next step"
        );
        self.step = step;
        self.step_cursor = cursor;
        self.step_base = done;
        self.step_started_at = began;
        self.window.clear();
        self.limiter = Some(crate::rate::limiter(pace.rate_of(step), 1));
        Ok(Next::Go)
    }

    /// How many released tasks of a retry may wait for a worker: a quarter of a
    /// second's worth at the step's rate, or one batch.
    fn most_waiting(&self, pace: &Pace, done: i64) -> i64 {
        let quarter = (pace.rate_of(self.step) / 4.0).ceil() as i64;
        quarter.max(self.batch_limit(done)).max(1)
    }

    /// How many of the latest tasks sent may have no outcome yet: a retry's tasks
    /// waiting for a worker and its latest batch; a replay's messages of the last
    /// [`REPLAY_LAG`] (a re-failure comes back through the consumer, its dead-letter
    /// topic and a member's ingest).
    fn in_flight(&self, pace: &Pace, done: i64) -> i64 {
        match self.kind_retry {
            true => self.most_waiting(pace, done) + self.batch_limit(done),
            false => (pace.rate_of(self.step) * REPLAY_LAG.as_secs_f64()).ceil() as i64,
        }
    }

    /// Before the first batch of a run (a resumed job): waits, as after a batch, until
    /// none of the tasks it released before wait for a worker, so that a resume (at any
    /// rate) never adds to a queue no worker takes.
    pub(super) async fn before_first_batch(
        &mut self,
        store: &Store,
        runner: &str,
        cursor: i64,
        lost: &CancellationToken,
    ) -> Result<Next, ReplayError> {
        let Some(pace) = self.pace.clone() else {
            return Ok(Next::Go);
        };
        let kept_up = self.keep_up(store, runner, &pace, (cursor, 0), 0, lost);
        Ok(kept_up.await?.unwrap_or(Next::Go))
    }

    /// Judges the step's latest outcomes (its tasks after `window_start`, `window_sent`
    /// of them, the window) and pauses the job when they failed. A retry admits no more
    /// than the workers take: while more than `most_waiting` of its released tasks wait
    /// for their call, it waits (judging as it waits), so that the pace is the pace of
    /// the calls and a pause leaves few released tasks still to be called. Answers
    /// [`Next::Stop`] when the job stopped.
    async fn keep_up(
        &self,
        store: &Store,
        runner: &str,
        pace: &Pace,
        (window_start, window_sent): (i64, i64),
        most_waiting: i64,
        lost: &CancellationToken,
    ) -> Result<Option<Next>, ReplayError> {
        let waiting_since = tokio::time::Instant::now();
        loop {
            let judged = self.judge(store, pace, window_start, window_sent).await?;
            if let Some(reason) = judged.reason {
                return self.pause(store, runner, &reason).await.map(Some);
            }
            if !self.kind_retry || judged.waiting <= most_waiting {
                return Ok(None);
            }
            if waiting_since.elapsed() >= STALLED_AFTER {
                let reason = format!(
                    "{} of the tasks it made due have waited {} s for a worker (does a live \
                     member serve their handler? `redrive members`)",
                    judged.waiting,
                    STALLED_AFTER.as_secs()
                );
                return self.pause(store, runner, &reason).await.map(Some);
            }
            tokio::select! {
                _ = lost.cancelled() => return Ok(Some(Next::Stop)),
                _ = tokio::time::sleep(WAIT_FOR_WORKERS) => {}
            }
        }
    }

    /// The judgement of its tasks after `after` (`sent` of them): why the job must
    /// pause, if it must, and how many of them wait for their call.
    async fn judge(
        &self,
        store: &Store,
        pace: &Pace,
        after: i64,
        sent: i64,
    ) -> Result<Judged, ReplayError> {
        let step = store
            .step_outcomes(self.id, after, self.step_started_at, self.kind_retry)
            .await?;
        let mut outcomes = step.outcomes;
        let waiting = step.waiting;
        if self.kind_retry {
            if let Some(breaker) = step.open_breakers.first() {
                let reason = Some(format!("the breaker of {breaker}"));
                return Ok(Judged { reason, waiting });
            }
        } else {
            // A replay hears only of failures: the messages it produced are its outcomes,
            // and those that came back failed.
            outcomes = Outcomes {
                total: sent.max(outcomes.failed),
                ..outcomes
            };
        }
        Ok(Judged {
            reason: pace.judge(self.step, &outcomes),
            waiting,
        })
    }

    async fn pause(&self, store: &Store, runner: &str, reason: &str) -> Result<Next, ReplayError> {
        tracing::warn!(job = self.id, %reason, "a paced job paused itself; resume, slow down or cancel it");
        store.pause_job(self.id, runner, reason).await?;
        Ok(Next::Stop)
    }
}
