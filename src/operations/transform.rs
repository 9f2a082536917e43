//! Fixing stored payloads before redriving them: a declarative transform
//! ([`crate::task::transform`]) over the tasks of a selection, with a dry run that counts
//! what it would change, fail on and leave alone and shows a before/after diff of a few;
//! applied as a new version of each changed payload (the value as it came is kept, and
//! shown by `tasks show`), audited. A retry or a replay afterwards sends the new version.

use serde::{Deserialize, Serialize};

use super::act::filter_of;
use super::actor::{required_reason, Actor};
use super::approved::{audited_reason, Approved};
use super::error::{OperationError, Result};
use super::selection::{select, FilterParams};
use super::Operations;
use crate::store::{NewPayload, Selection};
use crate::task::transform::{Applied, Change, Transform};

/// Tasks read per batch.
const BATCH: i64 = 200;
/// Tasks a dry run shows a diff of, and failures it names, at most.
const SHOWN: usize = 5;

/// Which tasks, the transform and why: the body of `POST /api/v1/tasks/transform`, and
/// what `redrive tasks transform` reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TransformRequest {
    /// These tasks (at most 10,000); or give `filter`.
    pub ids: Vec<i64>,
    /// The tasks this filter selects; or give `ids`.
    pub filter: Option<FilterParams>,
    /// Required with no ids and an empty filter: every task.
    pub all: bool,
    /// The operations, in order: `[{"op": "set", "path": "/a", "value": 1}, {"op":
    /// "remove", "path": "/b"}, {"op": "rename", "from": "/c", "path": "/d"}, {"op":
    /// "map", "path": "/e", "from_value": "EUR", "to": "eur"}]` (JSON Pointers).
    #[schema(value_type = Object)]
    pub transform: Option<Box<serde_json::value::RawValue>>,
    /// Why (written to the audit log); required unless `dry_run`.
    pub reason: Option<String>,
    /// Count and show what it would do; change nothing.
    pub dry_run: bool,
}

/// One task a dry run shows: what the transform would change in it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TransformSample {
    /// The task.
    pub task: i64,
    /// Each change: the pointer, the value before and after (JSON, cut).
    #[schema(value_type = Vec<Object>)]
    pub changes: Vec<Change>,
}

/// A task the transform fails on, and why.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TransformFailure {
    /// The task.
    pub task: i64,
    /// Why (its payload is not JSON, a path is missing, ...).
    pub reason: String,
}

/// What a transform did, or with `dry_run` would do.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TransformAnswer {
    /// Tasks selected in a status a transform applies to (failed, permanent_failure,
    /// discarded).
    pub matched: i64,
    /// Tasks whose payload it changed (a dry run: would change).
    pub changed: i64,
    /// Tasks it leaves alone: the transform changes nothing in them.
    pub unchanged: i64,
    /// Tasks it fails on (each left untouched).
    pub failed: i64,
    /// Tasks whose payload changed between the read and the write (by another
    /// transform, say): left untouched; run it again to include them.
    pub raced: i64,
    /// The first tasks it changes, with their diff.
    pub sample: Vec<TransformSample>,
    /// The first tasks it fails on, with why.
    pub failures: Vec<TransformFailure>,
    /// The transform, one operation per line.
    pub transform: String,
    /// Its audit log entry (absent on a dry run).
    pub audit_id: Option<i64>,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

impl Operations {
    /// Applies the transform of `request` to the payloads it selects, for `actor` (who
    /// must be allowed to operate), batch by batch; with `dry_run`, counts and shows what
    /// it would do instead.
    pub async fn transform(
        &self,
        actor: &Actor,
        request: &TransformRequest,
    ) -> Result<TransformAnswer> {
        self.transform_as(actor, request, None).await
    }

    /// How many tasks `request` would transform (the tasks it selects whose payload a
    /// transform may change): what an approval of it counts.
    pub(super) async fn transformable(&self, request: &TransformRequest) -> Result<i64> {
        let selection = select(&request.ids, request.filter.as_ref(), request.all)?;
        let selection = Selection::Filter(filter_of(&selection));
        Ok(self.store.count_transformable(&selection).await?)
    }

    /// [`Operations::transform`]; `approved`: run as approved (not held for approval),
    /// the approver named in the audit reason.
    pub(super) async fn transform_as(
        &self,
        actor: &Actor,
        request: &TransformRequest,
        approved: Option<&Approved>,
    ) -> Result<TransformAnswer> {
        actor.must_operate()?;
        // Read from the text as sent: a value parsed on the way would have lost a
        // duplicate key or a number a double cannot hold, which the parser refuses.
        let text = (request.transform.as_ref()).ok_or_else(|| {
            OperationError::bad_request("transform: required (a list of operations)")
        })?;
        let transform = Transform::parse(text.get())
            .map_err(|e| OperationError::BadRequest(format!("transform: {e}")))?;
        let reason = match request.dry_run {
            true => None,
            false => Some(required_reason(request.reason.as_deref())?),
        };
        let selection = select(&request.ids, request.filter.as_ref(), request.all)?;
        if let Selection::Ids(ids) = &selection {
            self.store.ensure_exist(ids).await?;
        }
        // A walk in id order, batch by batch, as a job's.
        let selection = Selection::Filter(filter_of(&selection));
        if reason.is_some() && self.approval_over.is_some() && approved.is_none() {
            let selected = self.store.count_transformable(&selection).await?;
            (self.hold_for_approval(actor, "transform", request, selected, reason.clone(), None))
                .await?;
        }
        let audit = match &reason {
            Some(reason) => {
                let details = serde_json::json!({ "transform": transform });
                let reason = audited_reason(Some(reason.clone()), approved);
                let operator = actor.operator(reason);
                Some(
                    (self.store)
                        .begin_transform(&operator, &selection, details)
                        .await?,
                )
            }
            None => None,
        };
        let mut answer = TransformAnswer {
            matched: 0,
            changed: 0,
            unchanged: 0,
            failed: 0,
            raced: 0,
            sample: Vec::new(),
            failures: Vec::new(),
            transform: transform.to_string(),
            audit_id: audit,
            dry_run: request.dry_run,
        };
        // An approved transform changes no more tasks than were approved, however its
        // selection moves.
        let most = approved.map(|approved| approved.selected);
        let mut after = 0;
        loop {
            let limit = most.map_or(BATCH, |most| (most - answer.matched).min(BATCH));
            if limit <= 0 {
                break;
            }
            let payloads = self.store.payloads(&selection, after, limit).await?;
            let Some(last) = payloads.last() else {
                break;
            };
            after = last.id.0;
            let mut writes = Vec::new();
            for payload in payloads {
                answer.matched += 1;
                let applied = match (&payload.value, payload.payload_stored) {
                    (_, false) => {
                        Applied::Failed("its payload was not stored (too large at ingest)".into())
                    }
                    (None, true) => Applied::Failed("the message has no value".into()),
                    (Some(value), true) => transform.apply(value),
                };
                match applied {
                    Applied::Unchanged => answer.unchanged += 1,
                    Applied::Failed(reason) => {
                        answer.failed += 1;
                        if answer.failures.len() < SHOWN {
                            let task = payload.id.0;
                            answer.failures.push(TransformFailure { task, reason });
                        }
                    }
                    Applied::Changed { bytes, changes } => {
                        answer.changed += 1;
                        if answer.sample.len() < SHOWN {
                            let task = payload.id.0;
                            answer.sample.push(TransformSample { task, changes });
                        }
                        writes.push(NewPayload {
                            id: payload.id,
                            old: payload.value.unwrap_or_default(),
                            new: bytes,
                        });
                    }
                }
            }
            if let Some(audit) = audit {
                let written = self.store.write_payloads(audit, &writes).await?;
                let raced = (writes.len() - written.len()) as i64;
                answer.raced += raced;
                answer.changed -= raced;
            }
        }
        Ok(answer)
    }
}
