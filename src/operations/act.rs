//! Retry, discard and resolve: by ids or by filter, with a dry run that counts and
//! samples, in the store's fenced, audited batches.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::task::JoinHandle;

use super::actor::{optional_reason, required_reason, Actor};
use super::approved::{audited_reason, Approved};
use super::error::{OperationError, Result};
use super::selection::{select, FilterParams};
use super::{Operations, Runner};
use crate::pace::{Pace, PaceRequest};
use crate::resilience::breaker::Breaker;
use crate::store::{
    Action, ActionReport, Budget, Due, NewReplay, Redriven, ReplayJob, Selection, TaskFilter,
    TaskSummary,
};
use crate::task::Status;

/// Tasks a dry run shows at most.
pub const SAMPLE: i64 = 5;

/// Most attempts a retry may add with `more_attempts`.
pub const MAX_MORE_ATTEMPTS: i32 = 1_000_000;

/// The verbs that decide what becomes of tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Due again, with a new attempt budget (failed, permanent_failure and discarded
    /// tasks).
    Retry,
    /// Given up: discarded (failed and permanent_failure tasks).
    Discard,
    /// Declared handled: resolved (failed and permanent_failure tasks).
    Resolve,
}

impl Verb {
    /// The statuses it changes; tasks in other statuses are left alone.
    pub fn applies_to(self) -> &'static [Status] {
        match self {
            Verb::Retry => Action::Retry {
                at: None,
                budget: Budget::Fresh,
                force: false,
            }
            .applies_to(),
            Verb::Discard => Action::Discard.applies_to(),
            Verb::Resolve => Action::Resolve { force: false }.applies_to(),
        }
    }
}

/// Which tasks, why, and a retry's options: the body of `POST
/// /api/v1/tasks/{retry,discard,resolve}`, and what `redrive tasks VERB` reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ActRequest {
    /// These tasks (at most 10,000); or give `filter`.
    pub ids: Vec<i64>,
    /// The tasks this filter selects; or give `ids`.
    pub filter: Option<FilterParams>,
    /// Required with no ids and an empty filter: act on every task.
    pub all: bool,
    /// Why (written to the audit log): required to discard or resolve (but not to count
    /// and sample with `dry_run`, which writes nothing).
    pub reason: Option<String>,
    /// Count and sample only; change nothing.
    pub dry_run: bool,
    /// Retry: when the next attempt is due: a duration from now ("1h": in an hour) or
    /// an RFC 3339 time, at most a year ahead (default now; never before the handler's
    /// breaker hold).
    pub at: Option<String>,
    /// Retry: this many attempts more than the tasks have left (a task that used its
    /// budget up gets exactly this many calls) instead of a whole new budget; 1 to
    /// 1,000,000.
    pub more_attempts: Option<i32>,
    /// Retry and resolve: also act on tasks whose compensation has started (running,
    /// waiting to retry, compensated or failed). A forced retry starts them over from no
    /// checkpoint; a compensation still pending is cancelled. Without it they are left
    /// alone and counted in `refused`. A retry: also retry tasks an earlier redrive job
    /// already redrove (without it, refused; the dry run names those jobs).
    pub force: bool,
    /// Retry: a pace (a rate, a ramp through checkpoints, a pause when the retried tasks
    /// fail again) instead of every task due at once: the retry becomes a job the
    /// fleet's members run (`job` in the answer; follow it in `/api/v1/replays`).
    pub pace: Option<PaceRequest>,
}

/// What an action did, or with `dry_run` would do.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ActAnswer {
    /// `retry`, `discard` or `resolve`.
    pub action: &'static str,
    /// Tasks selected in a status the action applies to, less those it leaves alone.
    pub matched: i64,
    /// Tasks changed (0 on a dry run).
    pub changed: i64,
    /// Tasks left alone because their compensation has started (retry and resolve
    /// without `force`).
    pub refused: i64,
    /// Its audit log entry (absent on a dry run; a confirmed action that changed nothing
    /// has one too, with count 0).
    pub audit_id: Option<i64>,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// On a dry run: the first tasks (up to 5, in the order it would change them) it
    /// would change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<Vec<TaskSummary>>,
    /// On a dry run: why rows of the sample could not be read (written by hand), each
    /// naming its task. Such tasks are counted in `matched` and the action changes them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    /// Retry: the handlers of the selected tasks whose breaker an operator forced open:
    /// none of their retried tasks runs until the breaker is released.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by_breakers: Vec<HeldByBreaker>,
    /// Retry: selected tasks an earlier redrive job already redrove (a retry of them
    /// needs `force`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redriven: Option<Redriven>,
    /// A paced retry: the job that runs it (`changed` stays 0; the job counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<ReplayJob>,
}

/// A breaker forced open over tasks a retry selects.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HeldByBreaker {
    /// The handler.
    pub handler: String,
    /// Who forced it open and why ("forced open by ACTOR: REASON").
    pub reason: Option<String>,
    /// The warning in words.
    pub warning: String,
}

impl HeldByBreaker {
    fn of(breaker: Breaker) -> HeldByBreaker {
        let handler = breaker.handler;
        let why = breaker.reason.as_deref().unwrap_or("forced open");
        HeldByBreaker {
            warning: format!(
                "the breaker of `{handler}` is {why}: none of the retried tasks of `{handler}` \
                 will run until it is released (`redrive breakers release {handler}`)"
            ),
            handler,
            reason: breaker.reason,
        }
    }
}

impl Operations {
    /// [`Operations::act`] as a task of its own, run to its end whatever becomes of who
    /// asked (a client that hangs up, a page left). A member that stops meanwhile ends
    /// it after the batch in progress and says so in a warning: the tasks changed so far
    /// stay changed, its audit entry counts them, and the same selection run again
    /// finishes the work.
    pub fn act_to_end(
        self: &Arc<Self>,
        actor: Actor,
        verb: Verb,
        request: ActRequest,
        mut progress: impl FnMut(ActionReport) + Send + 'static,
    ) -> JoinHandle<Result<ActAnswer>> {
        let operations = self.clone();
        tokio::spawn(async move {
            let mut unfinished = Unfinished {
                verb,
                changed: 0,
                ended: false,
            };
            let answer = (operations.act(&actor, verb, &request, |report| {
                unfinished.changed = report.changed;
                progress(report);
            }))
            .await;
            unfinished.ended = true;
            answer
        })
    }

    /// Applies `verb` to the tasks `request` selects, for `actor` (who must be allowed to
    /// operate), telling `progress` after every committed batch; with `dry_run`, counts
    /// and samples what it would change instead. Listed ids that do not exist are an
    /// error before anything changes.
    pub async fn act(
        &self,
        actor: &Actor,
        verb: Verb,
        request: &ActRequest,
        progress: impl FnMut(ActionReport) + Send,
    ) -> Result<ActAnswer> {
        self.act_by(actor, verb, request, Runner::Fleet, progress)
            .await
    }

    /// [`Operations::act`], with a paced retry's job run by `runner` (the CLI in the
    /// foreground) instead of the fleet's members.
    pub async fn act_by(
        &self,
        actor: &Actor,
        verb: Verb,
        request: &ActRequest,
        runner: Runner<'_>,
        progress: impl FnMut(ActionReport) + Send,
    ) -> Result<ActAnswer> {
        self.act_as(actor, verb, request, runner, None, progress)
            .await
    }

    /// [`Operations::act_by`]; `approved`: run as approved (not held for approval), the
    /// approver named in the audit reason.
    pub(super) async fn act_as(
        &self,
        actor: &Actor,
        verb: Verb,
        request: &ActRequest,
        runner: Runner<'_>,
        approved: Option<&Approved>,
        progress: impl FnMut(ActionReport) + Send,
    ) -> Result<ActAnswer> {
        actor.must_operate()?;
        let action = self.action(verb, request).await?;
        let reason = match verb {
            Verb::Discard | Verb::Resolve if !request.dry_run => {
                Some(required_reason(request.reason.as_deref())?)
            }
            _ => optional_reason(request.reason.as_deref())?,
        };
        let selection = select(&request.ids, request.filter.as_ref(), request.all)?;
        if let Selection::Ids(ids) = &selection {
            self.store.ensure_exist(ids).await?;
        }
        let applicable = self.store.count_applicable(&action, &selection).await?;
        let mut answer = ActAnswer {
            action: action.name(),
            matched: applicable.changes,
            changed: 0,
            refused: applicable.refused,
            audit_id: None,
            dry_run: request.dry_run,
            sample: None,
            unreadable: Vec::new(),
            held_by_breakers: Vec::new(),
            redriven: None,
            job: None,
        };
        let pace = pace_of(request.pace.as_ref())?;
        if pace.is_some() && action_has_time(&action) {
            return Err(OperationError::bad_request(
                "at: a paced retry makes its tasks due as its pace admits them",
            ));
        }
        if verb == Verb::Retry {
            let forced = (self.store)
                .forced_open_over(&selection, action.applies_to())
                .await?;
            answer.held_by_breakers = forced.into_iter().map(HeldByBreaker::of).collect();
            let redriven = self.store.redriven_before(&filter_of(&selection)).await?;
            if !request.dry_run && !request.force {
                if let Some(refusal) = redriven.refusal() {
                    return Err(OperationError::Conflict(refusal));
                }
            }
            answer.redriven = Some(redriven);
        } else if pace.is_some() {
            return Err(OperationError::bad_request("pace belongs to retry"));
        }
        if request.dry_run {
            let sample = self
                .store
                .action_sample(&action, &selection, SAMPLE)
                .await?;
            answer.sample = Some(sample.tasks);
            answer.unreadable = sample.unreadable;
            return Ok(answer);
        }
        let name = action.name();
        (self.hold_for_approval(
            actor,
            name,
            request,
            answer.matched,
            reason.clone(),
            approved,
        ))
        .await?;
        let reason = audited_reason(reason, approved);
        if let Some(pace) = pace {
            let replay = NewReplay {
                filter: applicable_only(filter_of(&selection), &action),
                retry: Some(action),
                pace: Some(pace),
                force: request.force,
                bounded: true,
                target_topic: None,
                mark_resolved: false,
                rate: None,
                detached: runner == Runner::Fleet,
                approval: approved.map(|a| a.id),
                most: approved.map(|a| a.selected),
            };
            let name = match runner {
                Runner::Fleet => "",
                Runner::Here(name) => name,
            };
            let operator = actor.operator(reason);
            answer.job = Some(self.store.create_replay(&operator, &replay, name).await?);
            return Ok(answer);
        }
        // Confirmed: audited even when nothing is left to change (the fleet may have
        // finished the tasks since the preview), with count 0. An approved action
        // changes no more tasks than were approved, however its selection moves.
        let operator = actor.operator(reason);
        let most = approved.map(|approved| approved.selected);
        let report = (self.store)
            .act_reporting(&operator, &action, &selection, most, progress)
            .await;
        // Whoever acted sees the effect in the groups at once, even of an action that
        // stopped part way.
        self.shared_groups.drop_all();
        let report = report?;
        answer.changed = report.changed;
        answer.refused = report.refused;
        answer.audit_id = Some(report.audit_id);
        Ok(answer)
    }

    /// The store's action for `verb`, its options checked.
    async fn action(&self, verb: Verb, request: &ActRequest) -> Result<Action> {
        if verb != Verb::Retry && (request.at.is_some() || request.more_attempts.is_some()) {
            return Err(OperationError::bad_request(
                "at and more_attempts belong to retry",
            ));
        }
        Ok(match verb {
            Verb::Retry => Action::Retry {
                at: request
                    .at
                    .as_deref()
                    .map(|at| at.parse::<Due>().map_err(|e| format!("at: {e}")))
                    .transpose()
                    .map_err(OperationError::BadRequest)?,
                budget: match request.more_attempts {
                    None => Budget::Fresh,
                    Some(attempts) if (1..=MAX_MORE_ATTEMPTS).contains(&attempts) => Budget::More {
                        attempts,
                        budgets: self.budgets().await?,
                    },
                    Some(n) => {
                        return Err(OperationError::bad_request(format!(
                            "more_attempts must be between 1 and {MAX_MORE_ATTEMPTS} (got {n})"
                        )))
                    }
                },
                force: request.force,
            },
            Verb::Discard if request.force => {
                return Err(OperationError::bad_request(
                    "force belongs to retry and resolve (a discard leaves the compensation \
                     owed)",
                ))
            }
            Verb::Discard => Action::Discard,
            Verb::Resolve => Action::Resolve {
                force: request.force,
            },
        })
    }
}
/// The pace `request` asks for, checked; none when none was given.
pub(super) fn pace_of(request: Option<&PaceRequest>) -> Result<Option<Pace>> {
    match request {
        Some(pace) => Pace::from_request(pace)
            .map(Some)
            .map_err(|why| OperationError::BadRequest(format!("pace: {why}"))),
        _ => Ok(None),
    }
}

/// The filter a job walks for `selection` (ticked ids become a filter of those ids).
pub(super) fn filter_of(selection: &Selection) -> TaskFilter {
    match selection {
        Selection::Ids(ids) => {
            let mut ids = ids.clone();
            ids.sort();
            ids.dedup();
            TaskFilter {
                ids,
                ..TaskFilter::default()
            }
        }
        Selection::Filter(filter) => filter.clone(),
    }
}

/// `filter` narrowed to the statuses `action` applies to, so that a job walking it
/// counts (and an approval bounds) only the tasks it may change: every such status when
/// the filter names none, those it names among them otherwise (a filter naming none of
/// them is left as it is: the action changes nothing it selects).
fn applicable_only(mut filter: TaskFilter, action: &Action) -> TaskFilter {
    let applies = action.applies_to();
    if filter.status.is_empty() {
        filter.status = applies.to_vec();
    } else if filter.status.iter().any(|s| applies.contains(s)) {
        filter.status.retain(|s| applies.contains(s));
    }
    filter
}

/// Whether a retry sets its own due time.
fn action_has_time(action: &Action) -> bool {
    matches!(action, Action::Retry { at: Some(_), .. })
}

/// A bulk action under way; dropped before its end (its member stopping), it says so.
/// `changed` is as of the last batch it heard of: a batch committing as the member
/// stops is counted by the audit entry, not here.
struct Unfinished {
    verb: Verb,
    changed: i64,
    ended: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.ended {
            tracing::warn!(
                verb = ?self.verb,
                changed_at_least = self.changed,
                "a bulk action was stopped before its end (this member is stopping): the \
                 tasks changed so far stay changed and its audit entry counts them; run \
                 the same selection again to finish"
            );
            // Dropped as the process ends: the line must reach stderr before it does.
            crate::telemetry::flush_logs();
        }
    }
}
