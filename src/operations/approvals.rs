//! Four eyes for large actions: with `operations.approval_over` set, a retry, discard,
//! resolve, replay or transform that selects more tasks is recorded as waiting for a
//! second operator ([`OperationError::NeedsApproval`]). Another operator (another token,
//! console user or shell user; never the requester) approves it, and the approver's face
//! runs it as the requester's action, its audit reason naming the approver; anyone may
//! reject it, the requester withdrawing it too. The first decision wins.

use serde::Serialize;

use super::act::{ActRequest, Verb};
use super::actor::{optional_reason, Actor};
use super::approved::Approved;
use super::error::{OperationError, Result};
use super::page::{Page, PageRequest};
use super::replays::{ReplayRequest, Runner};
use super::transform::TransformRequest;
use super::Operations;
use crate::config::Role;
use crate::store::Approval;

impl Operations {
    /// Holds an action of `verb` selecting `selected` tasks for approval when the
    /// deployment asks for it (and it is not being run approved): records `request` as
    /// waiting and answers [`OperationError::NeedsApproval`].
    pub(super) async fn hold_for_approval(
        &self,
        actor: &Actor,
        verb: &str,
        request: &impl Serialize,
        selected: i64,
        reason: Option<String>,
        approved: Option<&Approved>,
    ) -> Result<()> {
        let over = match (self.approval_over, approved) {
            (Some(over), None) if self.needs_approval(selected) => over,
            _ => return Ok(()),
        };
        let request = serde_json::to_string(request).expect("a request serializes");
        let operator = actor.operator(reason);
        let approval = (self.store)
            .request_approval(&operator, verb, request, selected)
            .await?;
        Err(OperationError::NeedsApproval {
            over,
            approval: Box::new(approval),
        })
    }

    /// Whether an action selecting `selected` tasks waits for a second operator here.
    pub fn needs_approval(&self, selected: i64) -> bool {
        self.approval_over
            .is_some_and(|over| u64::try_from(selected).is_ok_and(|n| n > over))
    }

    /// A page of approvals, newest first; with `pending`, those waiting.
    pub async fn approvals(&self, pending: bool, page: &PageRequest) -> Result<Page<Approval>> {
        let limit = page.limit()?;
        let items = self.store.approvals(pending, limit, page.after()?).await?;
        Ok(Page::after(items, limit, |a| a.id))
    }

    /// Approves approval `id` for `actor` (who must be allowed to operate, and not be its
    /// requester), then runs its action as the requester's (a paced retry or a replay:
    /// recorded for the fleet's members). Answers the approval with what the action
    /// answered (or why it failed) in `outcome`.
    pub async fn approve(&self, actor: &Actor, id: i64, reason: Option<&str>) -> Result<Approval> {
        actor.must_operate()?;
        let operator = actor.operator(optional_reason(reason)?);
        let mut approval = self.store.decide_approval(&operator, id, true).await?;
        // Until it answers, the approval says it runs: an approver stopped part-way (a
        // killed CLI) leaves that, not an approval that looks complete.
        let running = serde_json::json!({ "running": true });
        self.store.record_approval_outcome(id, running).await?;
        let approved = Approved {
            id,
            by: actor.name.clone(),
            selected: approval.selected,
        };
        let requester = Actor {
            name: approval.requested_by.clone(),
            role: Role::Operate,
        };
        let outcome = self.run_approved(&requester, &approval, &approved).await;
        let recorded = match &outcome {
            Ok(answer) => answer.clone(),
            Err(error) => serde_json::json!({ "error": error.to_string() }),
        };
        self.store
            .record_approval_outcome(id, recorded.clone())
            .await?;
        approval.outcome = Some(recorded);
        outcome?;
        Ok(approval)
    }

    /// Rejects approval `id` for `actor` (who must be allowed to operate; the requester
    /// withdraws it so), `reason` recorded.
    pub async fn reject(&self, actor: &Actor, id: i64, reason: Option<&str>) -> Result<Approval> {
        actor.must_operate()?;
        let operator = actor.operator(optional_reason(reason)?);
        Ok(self.store.decide_approval(&operator, id, false).await?)
    }

    /// How many tasks the approved action's selection holds now, counted as when it was
    /// held.
    async fn selected_now(
        &self,
        requester: &Actor,
        held: &Held,
        approved: &Approved,
    ) -> Result<i64> {
        Ok(match held {
            Held::Act(verb, request) => {
                let request = ActRequest {
                    dry_run: true,
                    ..request.clone()
                };
                let run = Runner::Fleet;
                let preview = self.act_as(requester, *verb, &request, run, Some(approved), |_| {});
                preview.await?.matched
            }
            Held::Replay(request) => self.preview_replay(requester, request).await?.matched,
            Held::Transform(request) => self.transformable(request).await?,
        })
    }

    /// Runs the approved action; what it answered, as JSON.
    async fn run_approved(
        &self,
        requester: &Actor,
        approval: &Approval,
        approved: &Approved,
    ) -> Result<serde_json::Value> {
        let held = Held::read(approval)?;
        // Never more than was approved: a selection that has grown since is asked for
        // again.
        let now = self.selected_now(requester, &held, approved).await?;
        if now > approval.selected {
            return Err(OperationError::Conflict(format!(
                "approval {}: its selection now holds {now} tasks, more than the {} approved; \
                 nothing was done (ask for it again)",
                approval.id, approval.selected
            )));
        }
        let answer = match &held {
            Held::Act(verb, request) => {
                let run = Runner::Fleet;
                let answer = self.act_as(requester, *verb, request, run, Some(approved), |_| {});
                serde_json::to_value(answer.await?)
            }
            Held::Replay(request) => {
                let job = self.start_replay_as(requester, request, Runner::Fleet, Some(approved));
                serde_json::to_value(job.await?)
            }
            Held::Transform(request) => {
                let answer = self.transform_as(requester, request, Some(approved));
                serde_json::to_value(answer.await?)
            }
        };
        Ok(answer.expect("an answer serializes"))
    }
}

/// The action an approval holds, read from the request as it was sent.
enum Held {
    /// A retry, discard or resolve.
    Act(Verb, ActRequest),
    /// A replay.
    Replay(ReplayRequest),
    /// A transform.
    Transform(TransformRequest),
}

impl Held {
    /// The action `approval` holds, or why it cannot be read.
    fn read(approval: &Approval) -> Result<Held> {
        let text = approval.request_text.as_str();
        let malformed = |e: serde_json::Error| {
            OperationError::BadRequest(format!("approval {}: its request: {e}", approval.id))
        };
        Ok(match approval.verb.as_str() {
            "retry" => Held::Act(Verb::Retry, serde_json::from_str(text).map_err(malformed)?),
            "discard" => Held::Act(
                Verb::Discard,
                serde_json::from_str(text).map_err(malformed)?,
            ),
            "resolve" => Held::Act(
                Verb::Resolve,
                serde_json::from_str(text).map_err(malformed)?,
            ),
            "replay" => Held::Replay(serde_json::from_str(text).map_err(malformed)?),
            "transform" => Held::Transform(serde_json::from_str(text).map_err(malformed)?),
            other => {
                return Err(OperationError::BadRequest(format!(
                    "approval {}: no action {other:?}",
                    approval.id
                )))
            }
        })
    }
}
