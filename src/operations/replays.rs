//! Replay jobs: start (or a dry run that counts what would be produced and skipped, and
//! why), list, cancel, resume. Running a job is the runner's business
//! ([`crate::replay::Replayer`]): a fleet member, or the CLI in the foreground.

use serde::{Deserialize, Serialize};

use super::act::{filter_of, pace_of, SAMPLE};
use super::actor::{optional_reason, Actor};
use super::approved::{audited_reason, Approved};
use super::error::{OperationError, Result};
use super::page::{Page, PageRequest};
use super::selection::{select, FilterParams};
use super::Operations;
use crate::pace::{Pace, PaceRequest};
use crate::replay::{check_replay, replay_topics};
use crate::store::{
    NewReplay, Redriven, ReplayJob, ReplayRowError, Resumed, StoreError, TaskFilter, TaskSummary,
    REPLAY_STALE_AFTER,
};
use std::time::Duration;

/// How long a resume waits for the runner of a job paused mid-batch to let go of it.
const LET_GO_WITHIN: Duration = Duration::from_secs(5);

/// What to replay: the body of `POST /api/v1/tasks/replay`, and what `redrive tasks
/// replay` reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayRequest {
    /// These tasks (at most 10,000, ticked on a list); or give `filter`.
    pub ids: Vec<i64>,
    /// The tasks to replay; or give `ids`.
    pub filter: Option<FilterParams>,
    /// Required with an empty filter: replay every task.
    pub all: bool,
    /// Target topic; absent: each task's original topic.
    pub to: Option<String>,
    /// Mark each replayed task resolved.
    pub mark_resolved: bool,
    /// Messages per second at most, unpaced (or give `pace`).
    pub rate: Option<f64>,
    /// Ramp up through checkpoints and pause when the replayed messages fail again.
    pub pace: Option<PaceRequest>,
    /// Also replay tasks an earlier job already redrove (without it, refused; the dry
    /// run names those jobs).
    pub force: bool,
    /// Why (written to the audit log).
    pub reason: Option<String>,
    /// Count what it would produce and skip, with a sample; record and produce nothing
    /// (and ask Kafka nothing).
    pub dry_run: bool,
}

/// Who runs a replay job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner<'a> {
    /// The fleet's members: the job waits for one (detached).
    Fleet,
    /// This process, by this name (the CLI in the foreground).
    Here(&'a str),
}

/// Tasks a replay would skip for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Skipped {
    /// `payload_not_stored` or `no_original_topic`.
    pub reason: &'static str,
    /// How many.
    pub count: i64,
    /// The reason in words.
    pub why: &'static str,
}

/// What a replay would do now (a dry run).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReplayPreview {
    /// Always true: nothing was recorded or produced.
    pub dry_run: bool,
    /// Tasks the filter selects.
    pub matched: i64,
    /// Messages it would produce.
    pub produced: i64,
    /// Tasks it would skip, by reason (every reason, with its count).
    pub skipped: Vec<Skipped>,
    /// The topics it would produce to (not checked with Kafka on a dry run).
    pub topics: Vec<String>,
    /// The first tasks (up to 5, in the order it would produce them) it would produce.
    pub sample: Vec<TaskSummary>,
    /// Selected tasks an earlier job already redrove (a replay of them needs `force`).
    pub redriven: Redriven,
    /// The pace it would run at, if paced.
    pub pace: Option<Pace>,
}

impl Operations {
    /// What replaying `request` would do now, checked as far as it can be without
    /// Kafka (filter, rate, target name, no capture loop). For an actor allowed to
    /// operate, as the replay itself.
    pub async fn preview_replay(
        &self,
        actor: &Actor,
        request: &ReplayRequest,
    ) -> Result<ReplayPreview> {
        actor.must_operate()?;
        let replay = new_replay(request, Runner::Fleet)?;
        self.store.ensure_exist(&replay.filter.ids).await?;
        let topics = replay_topics(&self.store, &self.routes, &replay).await?;
        let target = replay.target_topic.as_deref();
        let counts = self.store.replay_counts(&replay.filter, target).await?;
        let sample = (self.store)
            .replay_sample(&replay.filter, target, SAMPLE)
            .await?;
        Ok(ReplayPreview {
            dry_run: true,
            matched: counts.selected,
            produced: counts.produced,
            skipped: vec![
                Skipped {
                    reason: "payload_not_stored",
                    count: counts.payload_not_stored,
                    why: "its payload was not stored (too large at ingest): producing it \
                          would write an empty record",
                },
                Skipped {
                    reason: "no_original_topic",
                    count: counts.no_original_topic,
                    why: "no target topic was given and it has no original topic",
                },
            ],
            topics,
            sample,
            redriven: self.store.redriven_before(&replay.filter).await?,
            pace: replay.pace,
        })
    }

    /// Records a replay job of `request` for `actor`, audited, after checking every
    /// topic it would produce to (a Kafka client): run by `runner`.
    pub async fn start_replay(
        &self,
        actor: &Actor,
        request: &ReplayRequest,
        runner: Runner<'_>,
    ) -> Result<ReplayJob> {
        self.start_replay_as(actor, request, runner, None).await
    }

    /// [`Operations::start_replay`]; `approved`: run as approved (not held for
    /// approval), the approver named in the audit reason.
    pub(super) async fn start_replay_as(
        &self,
        actor: &Actor,
        request: &ReplayRequest,
        runner: Runner<'_>,
        approved: Option<&Approved>,
    ) -> Result<ReplayJob> {
        actor.must_operate()?;
        let mut replay = new_replay(request, runner)?;
        replay.approval = approved.map(|a| a.id);
        replay.most = approved.map(|a| a.selected);
        // Where large actions need approval, what was counted (and approved) is all it
        // does.
        replay.bounded |= self.approval_over.is_some();
        self.store.ensure_exist(&replay.filter.ids).await?;
        self.refuse_redriven(&replay.filter, request.force).await?;
        check_replay(&self.store, &self.kafka, &self.routes, &replay).await?;
        let reason = optional_reason(request.reason.as_deref())?;
        if self.approval_over.is_some() && approved.is_none() {
            let selection = crate::store::Selection::Filter(replay.filter.clone());
            let selected = self.store.count_selected(&selection).await?;
            (self.hold_for_approval(actor, "replay", request, selected, reason.clone(), None))
                .await?;
        }
        let operator = actor.operator(audited_reason(reason, approved));
        let name = match runner {
            Runner::Fleet => "",
            Runner::Here(name) => name,
        };
        Ok(self.store.create_replay(&operator, &replay, name).await?)
    }

    /// A page of replay jobs with their progress, newest first.
    pub async fn replays(&self, page: &PageRequest) -> Result<Page<ReplayJob>> {
        let limit = page.limit()?;
        let jobs = self.store.replays(limit, page.after()?).await?;
        Ok(Page::after(jobs, limit, |job| job.id))
    }

    /// Cancels replay job `id` for `actor`, audited; its runner stops after its current
    /// batch.
    pub async fn cancel_replay(&self, actor: &Actor, id: i64) -> Result<ReplayJob> {
        actor.must_operate()?;
        Ok(self.store.cancel_replay(&actor.operator(None), id).await?)
    }

    /// Refuses to redrive tasks of `filter` that an earlier job already redrove, unless
    /// `force`.
    async fn refuse_redriven(&self, filter: &TaskFilter, force: bool) -> Result<()> {
        if force {
            return Ok(());
        }
        match self.store.redriven_before(filter).await?.refusal() {
            Some(refusal) => Err(OperationError::Conflict(refusal)),
            None => Ok(()),
        }
    }

    /// Pauses job `id` for `actor`, audited: its runner stops after its current batch,
    /// and no member takes it until it is resumed.
    pub async fn pause_replay(&self, actor: &Actor, id: i64) -> Result<ReplayJob> {
        actor.must_operate()?;
        Ok(self
            .store
            .pause_by_operator(&actor.operator(None), id)
            .await?)
    }

    /// Resumes job `id` (paused, or not ended with its runner stopped, or is
    /// `dead_runner`, known dead) for `actor`, audited: `runner` takes it, at `rate` if
    /// given (slowing it down: a paced job's full pace, an unpaced replay's rate).
    pub async fn resume_replay(
        &self,
        actor: &Actor,
        id: i64,
        runner: Runner<'_>,
        dead_runner: Option<&str>,
        rate: Option<f64>,
    ) -> Result<ReplayJob> {
        actor.must_operate()?;
        let operator = actor.operator(None);
        let slower = match rate {
            None => None,
            Some(rate) => {
                let job = (self.store.replay(id).await?).ok_or_else(|| {
                    OperationError::NotFound(format!("no job {id} (replays and paced retries)"))
                })?;
                refuse_faster_than_approved(&job, rate)?;
                Some(match &job.pace {
                    Some(pace) => Resumed {
                        pace: Some(pace.at_rate(rate).map_err(OperationError::BadRequest)?),
                        rate: None,
                    },
                    None => {
                        if let Some(refusal) = crate::rate::refusal(rate) {
                            return Err(OperationError::BadRequest(format!("rate {refusal}")));
                        }
                        Resumed {
                            pace: None,
                            rate: Some(rate),
                        }
                    }
                })
            }
        };
        let (name, detach) = match runner {
            Runner::Fleet => ("", true),
            Runner::Here(name) => (name, false),
        };
        // A job paused while it ran is let go by its runner once what it had in flight
        // is delivered (about a second): until then it is not resumed, so that two
        // runners never produce one batch.
        let deadline = tokio::time::Instant::now() + LET_GO_WITHIN;
        loop {
            let resumed = (self.store)
                .resume_replay(&operator, id, name, detach, dead_runner, slower.as_ref())
                .await;
            match resumed {
                Err(StoreError::Replay(ReplayRowError::NotYours { status, runner, .. }))
                    if status == "paused" =>
                {
                    // No runner: it let go between the resume and the read that explains
                    // why the resume took nothing; the next resume takes the job.
                    let Some(runner) = runner else {
                        if tokio::time::Instant::now() < deadline {
                            continue;
                        }
                        return Err(OperationError::Conflict(format!(
                            "job {id} is paused and could not be resumed within {}s",
                            LET_GO_WITHIN.as_secs()
                        )));
                    };
                    if tokio::time::Instant::now() >= deadline {
                        return Err(OperationError::Conflict(format!(
                            "job {id} was paused while {runner} ran it, and {runner} has not \
                             let go of it within {}s (it delivers what it had in flight \
                             first); resume it again in a moment. A runner that died lets \
                             go by itself {}s after its last beat",
                            LET_GO_WITHIN.as_secs(),
                            REPLAY_STALE_AFTER.as_secs()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return Ok(other?),
            }
        }
    }
}

/// Refuses to resume `job` at `rate` when an approval started it at a lower rate: an
/// approved job may be slowed down, never sped past what was approved (a faster pace is
/// a new action, approved again).
fn refuse_faster_than_approved(job: &ReplayJob, rate: f64) -> Result<()> {
    match (job.approval_id, job.approved_rate) {
        (Some(approval), Some(approved)) if rate > approved => {
            Err(OperationError::Forbidden(format!(
                "job {} runs approval {approval}, approved at up to {approved}/s; it may resume \
                 at that rate or slower, not at {rate}/s (a faster pace needs a new approval: \
                 cancel it and ask again)",
                job.id
            )))
        }
        _ => Ok(()),
    }
}

/// The job `request` describes, its selection checked.
fn new_replay(request: &ReplayRequest, runner: Runner<'_>) -> Result<NewReplay> {
    // A replay job is a filter (it walks its tasks in id order, batch by batch): ticked
    // ids become a filter of those ids.
    let filter = filter_of(&select(&request.ids, request.filter.as_ref(), request.all)?);
    let pace = pace_of(request.pace.as_ref())?;
    if pace.is_some() && request.rate.is_some() {
        return Err(OperationError::bad_request(
            "rate: a paced replay takes its rate in pace.rate (give one of them)",
        ));
    }
    Ok(NewReplay {
        filter,
        retry: None,
        bounded: pace.is_some(),
        pace,
        force: request.force,
        target_topic: request.to.clone(),
        mark_resolved: request.mark_resolved,
        rate: request.rate,
        detached: runner == Runner::Fleet,
        approval: None,
        most: None,
    })
}
