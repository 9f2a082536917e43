//! Four eyes for large actions: above `operations.approval_over` an action waits for a
//! second operator; its requester cannot approve it; the first decision wins (approvals
//! racing rejections); the approved action runs as the requester's, the approver named in
//! its audit row; below the threshold nothing waits.

use redrive::config::{AdminToken, Role};
use redrive::operations::{
    ActRequest, Actor, FilterParams, OperationError, TransformRequest, Verb,
};
use redrive::{Failure, Fleet, NewTask, Settings, Status, Store};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::api::{with_tokens, Api, OPERATE};
use crate::support::{fresh_store, raw, scalar};

const SECOND: &str = "second-operator-token-0123";

fn actor(name: &str) -> Actor {
    Actor {
        name: name.into(),
        role: Role::Operate,
    }
}

async fn given_up(store: &Store, n: usize) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask {
            handler: "h".into(),
            status: Status::PermanentFailure,
            failure: Failure {
                key: Some(format!("k{i}").into_bytes()),
                value: Some(br#"{"a":1}"#.to_vec()),
                ..Failure::default()
            },
            ..NewTask::default()
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
}

fn over(settings: &Settings, n: u64) -> Settings {
    let mut settings = settings.clone();
    settings.operations.approval_over = Some(n);
    settings
}

/// The approval alice's `verb` of `request` waits for (it must be held).
async fn held_act(
    operations: &redrive::operations::Operations,
    verb: Verb,
    request: &ActRequest,
) -> Box<redrive::store::Approval> {
    match operations.act(&actor("alice"), verb, request, |_| {}).await {
        Err(OperationError::NeedsApproval { approval, .. }) => approval,
        other => panic!("held: {other:?}"),
    }
}

fn retry_all() -> ActRequest {
    ActRequest {
        filter: Some(FilterParams {
            handler: Some("h".into()),
            ..FilterParams::default()
        }),
        reason: Some("billing is back".into()),
        ..ActRequest::default()
    }
}

async fn failed(store: &Store) -> i64 {
    scalar(
        store,
        "SELECT count(*) FROM recovery_task WHERE status = 'failed'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_action_waits_for_a_second_operator_and_runs_as_the_requesters() {
    let (store, settings) = fresh_store().await;
    given_up(&store, 3).await;
    let fleet = Fleet::builder(over(&settings, 2)).build().unwrap();
    let operations = fleet.operations(store.clone());
    let (alice, bob) = (actor("alice"), actor("bob"));

    let held = operations
        .act(&alice, Verb::Retry, &retry_all(), |_| {})
        .await;
    let approval = match held {
        Err(OperationError::NeedsApproval { over, approval }) => {
            assert_eq!(
                (over, approval.selected, approval.status.as_str()),
                (2, 3, "pending")
            );
            assert_eq!(approval.requested_by, "alice");
            approval
        }
        other => panic!("a retry of 3 tasks over 2 waits: {other:?}"),
    };
    assert_eq!(failed(&store).await, 0, "nothing ran yet");
    // A dry run is never held.
    let dry = ActRequest {
        dry_run: true,
        ..retry_all()
    };
    assert_eq!(
        operations
            .act(&alice, Verb::Retry, &dry, |_| {})
            .await
            .unwrap()
            .matched,
        3
    );

    match operations.approve(&alice, approval.id, None).await {
        Err(OperationError::Forbidden(why)) => assert!(why.contains("second operator"), "{why}"),
        other => panic!("the requester cannot approve: {other:?}"),
    }
    let approved = operations
        .approve(&bob, approval.id, Some("checked the dashboard"))
        .await
        .unwrap();
    assert_eq!(approved.status, "approved");
    assert_eq!(approved.decided_by.as_deref(), Some("bob"));
    assert_eq!(approved.outcome.as_ref().unwrap()["changed"], 3);
    assert_eq!(failed(&store).await, 3, "the approved retry ran");
    let row = sqlx::query_as::<_, (String, String)>(
        "SELECT actor, reason FROM recovery_audit WHERE action = 'retry'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.0, "alice", "the action is the requester's");
    assert!(
        row.1.contains("billing is back")
            && row
                .1
                .contains(&format!("approved by bob (approval {})", approval.id)),
        "{row:?}"
    );
    match operations.approve(&actor("carol"), approval.id, None).await {
        Err(OperationError::Conflict(why)) => assert!(why.contains("already"), "{why}"),
        other => panic!("decided once: {other:?}"),
    }

    // Under the threshold nothing waits.
    let small = Fleet::builder(over(&settings, 10)).build().unwrap();
    let answer = small
        .operations(store.clone())
        .act(&alice, Verb::Discard, &retry_all(), |_| {})
        .await
        .unwrap();
    assert_eq!(answer.changed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_racing_rejections_decide_once_and_a_rejected_action_never_runs() {
    let (store, settings) = fresh_store().await;
    given_up(&store, 2).await;
    let fleet = Fleet::builder(over(&settings, 1)).build().unwrap();
    let operations = std::sync::Arc::new(fleet.operations(store.clone()));
    let transform = TransformRequest {
        filter: retry_all().filter,
        transform: raw(json!([{"op": "set", "path": "/a", "value": 2}])),
        reason: Some("fix".into()),
        ..TransformRequest::default()
    };
    let mut approved_runs = 0;
    for _ in 0..10 {
        let approval = match operations.transform(&actor("alice"), &transform).await {
            Err(OperationError::NeedsApproval { approval, .. }) => approval,
            other => panic!("held: {other:?}"),
        };
        let (a, b) = (operations.clone(), operations.clone());
        let id = approval.id;
        let approve = tokio::spawn(async move { a.approve(&actor("bob"), id, None).await });
        let reject =
            tokio::spawn(async move { b.reject(&actor("alice"), id, Some("withdrawn")).await });
        let (approve, reject) = (approve.await.unwrap(), reject.await.unwrap());
        assert!(
            approve.is_ok() != reject.is_ok(),
            "exactly one decision wins: {approve:?} / {reject:?}"
        );
        if approve.is_ok() {
            approved_runs += 1;
        }
    }
    let transforms = scalar(
        &store,
        "SELECT count(*) FROM recovery_audit WHERE action = 'transform'",
    )
    .await;
    assert_eq!(transforms, approved_runs, "only approved transforms ran");
    let decided = scalar(
        &store,
        "SELECT count(*) FROM recovery_audit WHERE action IN ('approval_approve', 'approval_reject')",
    )
    .await;
    assert_eq!(decided, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_held_action_answers_202_and_another_token_approves_it() {
    let (store, settings) = fresh_store().await;
    given_up(&store, 3).await;
    let mut settings = with_tokens(over(&settings, 2));
    settings.admin.tokens.insert(
        "second".into(),
        AdminToken {
            role: Role::Operate,
            token: SECOND.to_owned().into(),
        },
    );
    let api = Api::start(&store, &settings).await;
    let body = json!({"filter": {"handler": "h"}, "reason": "billing is back"});
    let (status, answer) = api.post("/api/v1/tasks/retry", Some(OPERATE), body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let id = answer["approval"].as_i64().unwrap();
    assert!(
        answer["error"].as_str().unwrap().contains("approval_over"),
        "{answer}"
    );
    let (status, page) = api
        .get("/api/v1/approvals?pending=true", Some(OPERATE))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"][0]["id"], id);

    let path = format!("/api/v1/approvals/{id}/approve");
    let (status, refused) = api.post(&path, Some(OPERATE), json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (status, approved) = api
        .post(&path, Some(SECOND), json!({"reason": "looked"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["outcome"]["changed"], 3);
    assert_eq!(failed(&store).await, 3);
    let (status, _) = api
        .post(
            &format!("/api/v1/approvals/{id}/reject"),
            Some(OPERATE),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

/// Found by the second attack: an approval of 150 tasks discarded 650, the selection
/// having grown before it was approved. An approved action never acts on more tasks than
/// were approved: a selection that grew is asked for again, and nothing is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_never_runs_on_more_tasks_than_were_approved() {
    let (store, settings) = fresh_store().await;
    given_up(&store, 3).await;
    let fleet = Fleet::builder(over(&settings, 2)).build().unwrap();
    let operations = fleet.operations(store.clone());
    let discard = ActRequest {
        reason: Some("noise".into()),
        ..retry_all()
    };
    let approval = held_act(&operations, Verb::Discard, &discard).await;
    given_up(&store, 2).await;
    match operations.approve(&actor("bob"), approval.id, None).await {
        Err(OperationError::Conflict(why)) => {
            assert!(
                why.contains("now holds 5 tasks, more than the 3 approved"),
                "{why}"
            )
        }
        other => panic!("refused: {other:?}"),
    }
    let discarded = scalar(
        &store,
        "SELECT count(*) FROM recovery_task WHERE status = 'discarded'",
    )
    .await;
    assert_eq!(discarded, 0, "nothing was done");
}

/// Found on re-reading: the requester of an approved paced retry could pause it and
/// resume it at any rate, past the pace the second operator approved. An approved job
/// resumes at its approved rate or slower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_job_never_resumes_faster_than_it_was_approved() {
    use redrive::operations::Runner;
    use redrive::pace::PaceRequest;
    let (store, settings) = fresh_store().await;
    given_up(&store, 3).await;
    let fleet = Fleet::builder(over(&settings, 2)).build().unwrap();
    let operations = fleet.operations(store.clone());
    let paced = ActRequest {
        pace: Some(PaceRequest {
            rate: Some(10.0),
            ..PaceRequest::default()
        }),
        ..retry_all()
    };
    let approval = held_act(&operations, Verb::Retry, &paced).await;
    let approved = operations
        .approve(&actor("bob"), approval.id, None)
        .await
        .unwrap();
    let job: i64 = approved.outcome.as_ref().unwrap()["job"]["id"]
        .as_i64()
        .unwrap_or_else(|| panic!("a job: {:?}", approved.outcome));
    operations.pause_replay(&actor("alice"), job).await.unwrap();
    for who in ["alice", "carol"] {
        match operations
            .resume_replay(&actor(who), job, Runner::Fleet, None, Some(1000.0))
            .await
        {
            Err(OperationError::Forbidden(why)) => assert!(
                why.contains(&format!("approval {}", approval.id)) && why.contains("10/s"),
                "{why}"
            ),
            other => panic!("{who} resumed it faster: {other:?}"),
        }
    }
    let status = scalar(
        &store,
        &format!("SELECT count(*) FROM recovery_replay WHERE id = {job} AND status = 'paused'"),
    )
    .await;
    assert_eq!(status, 1, "a refused resume leaves it paused");
    let slower = operations
        .resume_replay(&actor("alice"), job, Runner::Fleet, None, Some(5.0))
        .await
        .unwrap();
    assert_eq!(slower.pace.map(|p| p.rate), Some(5.0));
    operations.pause_replay(&actor("alice"), job).await.unwrap();
    let back = operations
        .resume_replay(&actor("alice"), job, Runner::Fleet, None, Some(10.0))
        .await
        .unwrap();
    assert_eq!(
        back.pace.map(|p| p.rate),
        Some(10.0),
        "back to what was approved"
    );
}

/// Found by the third attack: an approved discard of 10 tasks discarded 20, tasks coming
/// to match between the approval's count and the action. An approved action changes no
/// more tasks than were approved, however its selection moves while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_action_changes_no_more_than_approved_while_its_selection_moves() {
    let (store, settings) = fresh_store().await;
    let fleet = Fleet::builder(over(&settings, 5)).build().unwrap();
    let operations = fleet.operations(store.clone());
    for round in 0..8 {
        let handler = format!("grow{round}");
        let tasks: Vec<NewTask> = (0..30)
            .map(|i| NewTask {
                handler: handler.clone(),
                status: if i < 10 {
                    Status::PermanentFailure
                } else {
                    Status::Resolved
                },
                failure: Failure {
                    key: Some(format!("{}{i}", if i < 10 { "k" } else { "flip" }).into_bytes()),
                    ..Failure::default()
                },
                ..NewTask::default()
            })
            .collect();
        store.enqueue_many(&tasks).await.unwrap();
        let discard = ActRequest {
            filter: Some(FilterParams {
                handler: Some(handler.clone()),
                status: Some(redrive::operations::StatusNames(vec![
                    "permanent_failure".into()
                ])),
                ..FilterParams::default()
            }),
            reason: Some("noise".into()),
            ..ActRequest::default()
        };
        let approval = held_act(&operations, Verb::Discard, &discard).await;
        // The other tasks of the handler come to match and stop matching, again and again.
        let stop = tokio_util::sync::CancellationToken::new();
        let flipper = tokio::spawn({
            let (store, stop, handler) = (store.clone(), stop.clone(), handler.clone());
            async move {
                while !stop.is_cancelled() {
                    sqlx::query(
                        "UPDATE recovery_task SET status = CASE status \
                             WHEN 'resolved' THEN 'permanent_failure' ELSE 'resolved' END \
                         WHERE handler = $1 AND msg_key LIKE 'flip%' \
                           AND status IN ('resolved', 'permanent_failure')",
                    )
                    .bind(&handler)
                    .execute(store.pool())
                    .await
                    .unwrap();
                }
            }
        });
        let approved = operations.approve(&actor("bob"), approval.id, None).await;
        stop.cancel();
        flipper.await.unwrap();
        let discarded = scalar(
            &store,
            &format!(
                "SELECT count(*) FROM recovery_task WHERE handler = '{handler}' \
                 AND status = 'discarded'"
            ),
        )
        .await;
        assert!(
            discarded <= approval.selected,
            "round {round}: {discarded} discarded, {} approved: {approved:?}",
            approval.selected
        );
    }
}

/// Found by the third attack: a paced retry with `at` (which a paced retry refuses) was
/// held for approval, and failed only when approved. It is refused before anything is
/// recorded, as without approvals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_paced_retry_is_refused_before_it_is_held() {
    use redrive::pace::PaceRequest;
    let (store, settings) = fresh_store().await;
    given_up(&store, 3).await;
    let fleet = Fleet::builder(over(&settings, 2)).build().unwrap();
    let operations = fleet.operations(store.clone());
    let request = ActRequest {
        at: Some("1h".into()),
        pace: Some(PaceRequest {
            rate: Some(10.0),
            ..PaceRequest::default()
        }),
        ..retry_all()
    };
    match operations
        .act(&actor("alice"), Verb::Retry, &request, |_| {})
        .await
    {
        Err(OperationError::BadRequest(why)) => assert!(why.starts_with("at:"), "{why}"),
        other => panic!("refused: {other:?}"),
    }
    let held = scalar(&store, "SELECT count(*) FROM recovery_approval").await;
    assert_eq!(held, 0, "nothing recorded");
}

/// Found by the fourth attack: an approved paced retry of 6 tasks (its filter naming no
/// status) counted every task of the filter, resolved ones too, and retried 26 when they
/// came to match. A job an approval starts handles no more tasks than were approved, and
/// a retry job walks only the statuses a retry changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_paced_retry_handles_no_more_tasks_than_approved() {
    use redrive::pace::PaceRequest;
    use redrive::replay::Replayer;
    let (store, settings) = fresh_store().await;
    given_up(&store, 6).await;
    let resolved: Vec<NewTask> = (0..20)
        .map(|i| NewTask {
            handler: "h".into(),
            status: Status::Resolved,
            failure: Failure {
                key: Some(format!("r{i}").into_bytes()),
                ..Failure::default()
            },
            ..NewTask::default()
        })
        .collect();
    store.enqueue_many(&resolved).await.unwrap();
    let fleet = Fleet::builder(over(&settings, 5)).build().unwrap();
    let operations = fleet.operations(store.clone());
    let paced = ActRequest {
        pace: Some(PaceRequest {
            rate: Some(1000.0),
            ..PaceRequest::default()
        }),
        ..retry_all()
    };
    let approval = held_act(&operations, Verb::Retry, &paced).await;
    assert_eq!(approval.selected, 6);
    operations
        .approve(&actor("bob"), approval.id, None)
        .await
        .unwrap();
    // The resolved tasks come to match before a member takes the job.
    sqlx::query("UPDATE recovery_task SET status = 'permanent_failure' WHERE status = 'resolved'")
        .execute(store.pool())
        .await
        .unwrap();
    let job = store
        .claim_detached_replay("member-a")
        .await
        .unwrap()
        .expect("the approved job waits for a member");
    assert_eq!(job.total, Some(6), "{job:?}");
    let replayer = Replayer::new(
        store.clone(),
        settings.kafka.clone(),
        settings.ingest.max_message_bytes,
        "member-a".into(),
        Vec::new(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let job = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        replayer.run(job, &|_, _| {}, &stop),
    )
    .await
    .expect("the job ends within a minute")
    .unwrap();
    assert_eq!((job.status.as_str(), job.produced), ("done", 6), "{job:?}");
    let redriven = scalar(
        &store,
        "SELECT count(*) FROM recovery_task WHERE redriven_by IS NOT NULL",
    )
    .await;
    assert_eq!(redriven, 6);
}
