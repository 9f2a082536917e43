//! The admin API's endpoints: thin layers over the store's operations.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use crate::config::{KafkaSettings, RouteSettings, Targets};
use crate::replay::check_replay;
use crate::store::{
    Action, AuditEntry, AuditQuery, Budget, Budgets, CheckReport, Due, Member, NewReplay, Operator,
    ReplayJob, Selection, Stats, Store, TaskDetail, TaskFilter, TaskPage, MAX_PAGE,
};
use crate::task::{Status, TaskId};

/// Most ids one request may name.
pub const MAX_IDS: usize = 10_000;

/// What the endpoints share.
pub struct AppState {
    /// The store.
    pub store: Store,
    /// For replays: the cluster to check topics on.
    pub kafka: KafkaSettings,
    /// For replays: the member's routes, whose captured topics a replay may not target.
    pub routes: Vec<RouteSettings>,
    /// For a task's detail: where it is republished and parked.
    pub targets: Targets,
    /// For `check`.
    pub budgets: Budgets,
}

/// Shared state.
pub type Shared = State<Arc<AppState>>;

/// Query parameters of `GET /api/v1/tasks`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Statuses, comma-separated: failed, resolved, permanent_failure, discarded.
    pub status: Option<String>,
    /// Handler name.
    pub handler: Option<String>,
    /// Ingest route name.
    pub route: Option<String>,
    /// Topic the failure was consumed from.
    pub topic: Option<String>,
    /// Message key, exactly.
    pub key: Option<String>,
    /// Message key prefix.
    pub key_prefix: Option<String>,
    /// Text in the error, case-insensitive.
    pub error: Option<String>,
    /// Created at or after (RFC 3339).
    pub created_after: Option<DateTime<Utc>>,
    /// Created before (RFC 3339).
    pub created_before: Option<DateTime<Utc>>,
    /// Changed at or after (RFC 3339).
    pub updated_after: Option<DateTime<Utc>>,
    /// Changed before (RFC 3339).
    pub updated_before: Option<DateTime<Utc>>,
    /// Generation exactly: 1 for first failures, 2 and up for re-failures.
    pub generation: Option<i32>,
    /// Generation at least (2: every re-failure).
    pub min_generation: Option<i32>,
    /// The re-failures of this task (the tasks that came from it).
    pub previous_task: Option<i64>,
    /// Page size, 1 to 1000 (default 50).
    pub limit: Option<i64>,
    /// The previous page's `next_cursor`.
    pub after: Option<i64>,
}

impl ListQuery {
    fn filter(&self) -> Result<TaskFilter, ApiError> {
        let status = match &self.status {
            None => Vec::new(),
            Some(text) => text
                .split(',')
                .map(|s| {
                    s.trim().parse::<Status>().map_err(|_| {
                        ApiError::bad_request(format!(
                            "unknown status {s:?} (failed, resolved, permanent_failure, discarded)"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let filter = TaskFilter {
            status,
            handler: self.handler.clone(),
            route: self.route.clone(),
            topic: self.topic.clone(),
            key: self.key.clone(),
            key_prefix: self.key_prefix.clone(),
            error: self.error.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            updated_after: self.updated_after,
            updated_before: self.updated_before,
            generation: self.generation,
            min_generation: self.min_generation,
            previous_task: self.previous_task.map(TaskId),
        };
        filter.validate().map_err(ApiError::bad_request)?;
        Ok(filter)
    }
}

/// Body of `POST /api/v1/tasks/{retry,discard,resolve}`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ActionRequest {
    /// These tasks; or give `filter`.
    pub ids: Vec<TaskId>,
    /// The tasks this filter selects; or give `ids`.
    pub filter: Option<TaskFilter>,
    /// Required with an empty filter: act on every task.
    pub all: bool,
    /// Why: required to discard or resolve.
    pub reason: Option<String>,
    /// Count only; change nothing.
    pub dry_run: bool,
    /// Retry: when the next attempt is due, as on the command line: a duration from now
    /// ("1h": in an hour) or an RFC 3339 time, at most a year ahead (default now; never
    /// before the handler's breaker hold).
    #[schema(value_type = Option<String>)]
    pub at: Option<Due>,
    /// Retry: this many attempts more than the tasks have left (a task that used its
    /// budget up gets exactly this many calls) instead of a whole new budget.
    pub more_attempts: Option<i32>,
    /// Retry and resolve: also act on tasks whose compensation has started (running,
    /// waiting to retry, compensated or failed). A forced retry starts them over from no
    /// checkpoint; a compensation still pending is cancelled. Without it they are left
    /// alone and counted in `refused`.
    pub force: bool,
}

impl ActionRequest {
    fn selection(&self) -> Result<Selection, ApiError> {
        match (&self.ids[..], &self.filter) {
            ([], None) => Err(ApiError::bad_request(
                "give \"ids\" or \"filter\" (with \"all\": true to select every task)",
            )),
            ([_, ..], Some(_)) => Err(ApiError::bad_request(
                "give \"ids\" or \"filter\", not both",
            )),
            (ids, None) => {
                if ids.len() > MAX_IDS {
                    return Err(ApiError::bad_request(format!(
                        "at most {MAX_IDS} ids per request (use a filter for more)"
                    )));
                }
                Ok(Selection::Ids(ids.to_vec()))
            }
            ([], Some(filter)) => selection_of(filter, self.all),
        }
    }
}

fn selection_of(filter: &TaskFilter, all: bool) -> Result<Selection, ApiError> {
    filter.validate().map_err(ApiError::bad_request)?;
    if filter.is_everything() && !all {
        return Err(ApiError::bad_request(
            "the filter selects every task; add \"all\": true if that is what you mean",
        ));
    }
    Ok(Selection::Filter(filter.clone()))
}

/// What an action did (or, with `dry_run`, would do).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ActionResponse {
    /// `retry`, `discard` or `resolve`.
    pub action: &'static str,
    /// Tasks selected in a status the action applies to, less those it leaves alone.
    pub matched: i64,
    /// Tasks changed (0 on a dry run).
    pub changed: i64,
    /// Tasks left alone because their compensation has started (retry and resolve
    /// without `force`).
    pub refused: i64,
    /// Its audit log entry (absent on a dry run).
    pub audit_id: Option<i64>,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

/// Body of `POST /api/v1/tasks/replay`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayRequest {
    /// The tasks to replay.
    pub filter: TaskFilter,
    /// Required with an empty filter.
    pub all: bool,
    /// Target topic; absent: each task's original topic.
    pub to: Option<String>,
    /// Mark each replayed task resolved.
    pub mark_resolved: bool,
    /// Messages per second at most.
    pub rate: Option<f64>,
    /// Why.
    pub reason: Option<String>,
}

/// Query parameters of `GET /api/v1/replays`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReplaysQuery {
    /// Jobs to return, 1 to 1000 (default 50).
    pub limit: Option<i64>,
}

fn page_limit(limit: Option<i64>, default: i64) -> Result<i64, ApiError> {
    match limit {
        None => Ok(default),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_PAGE} (got {n})"
        ))),
    }
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("bad query: {}", e.body_text())))
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(b)| b)
        .map_err(|e| ApiError::bad_request(format!("bad body: {}", e.body_text())))
}

fn task_id(path: Result<Path<String>, PathRejection>) -> Result<TaskId, ApiError> {
    let Path(text) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .map(TaskId)
        .ok_or_else(|| {
            ApiError::bad_request(format!("{text:?} is not a task id (a positive integer)"))
        })
}

/// Lists tasks, newest first.
#[utoipa::path(get, path = "/api/v1/tasks", params(ListQuery), security(("bearer" = [])),
    responses((status = 200, body = TaskPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_tasks(
    State(state): Shared,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<TaskPage>, ApiError> {
    let q = query(q)?;
    let filter = q.filter()?;
    let limit = page_limit(q.limit, 50)?;
    if q.after.is_some_and(|a| a <= 0) {
        return Err(ApiError::bad_request(
            "after must be a task id (a positive integer)",
        ));
    }
    Ok(Json(
        state
            .store
            .list(&filter, q.after.map(TaskId), limit)
            .await?,
    ))
}

/// One task: why it waits or how it ended (`waiting`), every field, its payload
/// readable, its attempt history.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", params(("id" = i64, Path, description = "Task id")),
    security(("bearer" = [])),
    responses((status = 200, body = TaskDetail), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_task(
    State(state): Shared,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TaskDetail>, ApiError> {
    let id = task_id(path)?;
    match state.store.detail(id).await? {
        Some(detail) => Ok(Json(
            detail
                .with_targets(&state.targets)
                .with_budgets(&state.budgets),
        )),
        None => Err(ApiError::not_found(format!("no such task: {id}"))),
    }
}

async fn act(
    state: &AppState,
    caller: &Caller,
    action: Action,
    request: ActionRequest,
) -> Result<Json<ActionResponse>, ApiError> {
    caller.must_operate()?;
    let selection = request.selection()?;
    if let Selection::Ids(ids) = &selection {
        state.store.ensure_exist(ids).await?;
    }
    let applicable = state.store.count_applicable(&action, &selection).await?;
    if request.dry_run || applicable.changes == 0 {
        return Ok(Json(ActionResponse {
            action: action.name(),
            matched: applicable.changes,
            changed: 0,
            refused: applicable.refused,
            audit_id: None,
            dry_run: request.dry_run,
        }));
    }
    let operator = Operator {
        actor: caller.name.clone(),
        reason: request.reason,
    };
    let report = state.store.act(&operator, &action, &selection).await?;
    Ok(Json(ActionResponse {
        action: action.name(),
        matched: applicable.changes,
        changed: report.changed,
        refused: report.refused,
        audit_id: Some(report.audit_id),
        dry_run: false,
    }))
}

/// Makes tasks due again with a new attempt budget (failed, permanent_failure and
/// discarded ones); a task whose compensation has started only with `force` (then from
/// no checkpoint).
#[utoipa::path(post, path = "/api/v1/tasks/retry", request_body = ActionRequest, security(("bearer" = [])),
    responses((status = 200, body = ActionResponse), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn retry(
    State(state): Shared,
    Extension(caller): Extension<Caller>,
    request: Result<Json<ActionRequest>, JsonRejection>,
) -> Result<Json<ActionResponse>, ApiError> {
    let request = body(request)?;
    let budget = match request.more_attempts {
        None => Budget::Fresh,
        Some(attempts) if (1..=1_000_000).contains(&attempts) => Budget::More {
            attempts,
            budgets: state.budgets.clone(),
        },
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "more_attempts must be between 1 and 1000000 (got {n})"
            )))
        }
    };
    let action = Action::Retry {
        at: request.at,
        budget,
        force: request.force,
    };
    act(&state, &caller, action, request).await
}

fn with_reason(request: ActionRequest) -> Result<ActionRequest, ApiError> {
    if request.at.is_some() || request.more_attempts.is_some() {
        return Err(ApiError::bad_request(
            "\"at\" and \"more_attempts\" belong to retry",
        ));
    }
    match request.reason.as_deref().map(str::trim) {
        Some(reason) if !reason.is_empty() => Ok(request),
        _ => Err(ApiError::bad_request("\"reason\" is required")),
    }
}

/// Gives up on tasks (failed and permanent_failure ones): they become discarded.
#[utoipa::path(post, path = "/api/v1/tasks/discard", request_body = ActionRequest, security(("bearer" = [])),
    responses((status = 200, body = ActionResponse), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn discard(
    State(state): Shared,
    Extension(caller): Extension<Caller>,
    request: Result<Json<ActionRequest>, JsonRejection>,
) -> Result<Json<ActionResponse>, ApiError> {
    let request = with_reason(body(request)?)?;
    if request.force {
        return Err(ApiError::bad_request(
            "\"force\" belongs to retry and resolve (a discard leaves the compensation owed)",
        ));
    }
    act(&state, &caller, Action::Discard, request).await
}

/// Declares tasks handled (failed and permanent_failure ones): they become resolved; a
/// task whose compensation has started only with `force`.
#[utoipa::path(post, path = "/api/v1/tasks/resolve", request_body = ActionRequest, security(("bearer" = [])),
    responses((status = 200, body = ActionResponse), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn resolve(
    State(state): Shared,
    Extension(caller): Extension<Caller>,
    request: Result<Json<ActionRequest>, JsonRejection>,
) -> Result<Json<ActionResponse>, ApiError> {
    let request = with_reason(body(request)?)?;
    let action = Action::Resolve {
        force: request.force,
    };
    act(&state, &caller, action, request).await
}

/// Starts a replay job, run by a fleet member: the stored messages of the tasks a
/// filter selects, produced to a topic. The topics are checked first.
#[utoipa::path(post, path = "/api/v1/tasks/replay", request_body = ReplayRequest, security(("bearer" = [])),
    responses((status = 202, body = ReplayJob), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn replay(
    State(state): Shared,
    Extension(caller): Extension<Caller>,
    request: Result<Json<ReplayRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<ReplayJob>), ApiError> {
    caller.must_operate()?;
    let request = body(request)?;
    let Selection::Filter(filter) = selection_of(&request.filter, request.all)? else {
        unreachable!("a filter selects by filter");
    };
    let replay = NewReplay {
        filter,
        target_topic: request.to,
        mark_resolved: request.mark_resolved,
        rate: request.rate,
        detached: true,
    };
    check_replay(&state.store, &state.kafka, &state.routes, &replay).await?;
    let operator = Operator {
        actor: caller.name.clone(),
        reason: request.reason,
    };
    let job = state.store.create_replay(&operator, &replay, "").await?;
    Ok((StatusCode::ACCEPTED, Json(job)))
}

/// Replay jobs with their progress, newest first.
#[utoipa::path(get, path = "/api/v1/replays", params(ReplaysQuery), security(("bearer" = [])),
    responses((status = 200, body = Vec<ReplayJob>), (status = 400, body = ErrorBody)))]
pub async fn list_replays(
    State(state): Shared,
    q: Result<Query<ReplaysQuery>, QueryRejection>,
) -> Result<Json<Vec<ReplayJob>>, ApiError> {
    let q = query(q)?;
    let limit = page_limit(q.limit, 50)?;
    Ok(Json(state.store.replays(limit).await?))
}

/// Cancels a replay job; its runner stops after its current batch.
#[utoipa::path(post, path = "/api/v1/replays/{id}/cancel", params(("id" = i64, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = ReplayJob), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn cancel_replay(
    State(state): Shared,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ReplayJob>, ApiError> {
    caller.must_operate()?;
    let id = task_id(path)?.0;
    let operator = Operator {
        actor: caller.name.clone(),
        reason: None,
    };
    Ok(Json(state.store.cancel_replay(&operator, id).await?))
}

/// Counts by status and handler, due work per handler, the last hour's outcomes, live
/// members.
#[utoipa::path(get, path = "/api/v1/stats", security(("bearer" = [])),
    responses((status = 200, body = Stats), (status = 429, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn stats(State(state): Shared) -> Result<Json<Stats>, ApiError> {
    Ok(Json(state.store.stats().await?))
}

/// Query parameters of `GET /api/v1/audit`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// Only entries at or after (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Entries older than this entry id.
    pub before: Option<i64>,
    /// Entries to return, 1 to 1000 (default 50).
    pub limit: Option<i64>,
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/api/v1/audit", params(AuditParams), security(("bearer" = [])),
    responses((status = 200, body = Vec<AuditEntry>), (status = 400, body = ErrorBody)))]
pub async fn audit(
    State(state): Shared,
    q: Result<Query<AuditParams>, QueryRejection>,
) -> Result<Json<Vec<AuditEntry>>, ApiError> {
    let q = query(q)?;
    let limit = page_limit(q.limit, 50)?;
    let entries = state
        .store
        .audit(&AuditQuery {
            actor: q.actor,
            action: q.action,
            since: q.since,
            before: q.before,
            limit: Some(limit),
        })
        .await?;
    Ok(Json(entries))
}

/// Fleet members seen recently.
#[utoipa::path(get, path = "/api/v1/members", security(("bearer" = [])), responses((status = 200, body = Vec<Member>)))]
pub async fn members(State(state): Shared) -> Result<Json<Vec<Member>>, ApiError> {
    Ok(Json(state.store.live_members().await?))
}

/// Checks the store's invariants (reads every task: use sparingly).
#[utoipa::path(get, path = "/api/v1/check", security(("bearer" = [])),
    responses((status = 200, body = CheckReport), (status = 429, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn check(State(state): Shared) -> Result<Json<CheckReport>, ApiError> {
    Ok(Json(state.store.check(&state.budgets).await?))
}
