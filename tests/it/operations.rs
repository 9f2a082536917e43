//! The operations layer through its faces: every verb over HTTP (the role it needs, bad
//! input named), one list envelope, durations in time filters, dry runs that sample, and
//! the CLI and the API giving the same answer to the same bad request.

use redrive::config::{BreakerSettings, HandlerSettings, RouteMode};
use redrive::store::{NewReplay, Operator, TaskFilter};
use redrive::{Failure, NewTask, OriginalCoordinates, Settings, Store, TaskId};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::api::{with_tokens, Api, OPERATE, READ};
use crate::support::broker::route;
use crate::support::{fresh_store, scalar};

/// A store with `n` tasks of handler `log` (keys `k0`...), and an API over it whose
/// configuration has a breaker on `log` and a capture route on `orders`.
async fn api_over(n: usize) -> (Store, Settings, Api, Vec<TaskId>) {
    let (store, mut settings) = fresh_store().await;
    settings.handlers.insert(
        "log".into(),
        HandlerSettings {
            breaker: Some(BreakerSettings::default()),
            ..HandlerSettings::default()
        },
    );
    settings.routes = vec![route(&["orders"], RouteMode::Capture, "log")];
    let settings = with_tokens(settings);
    let api = Api::start(&store, &settings).await;
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask {
            handler: "log".into(),
            failure: Failure {
                key: Some(format!("k{i}").into_bytes()),
                value: Some(format!("v{i}").into_bytes()),
                ..Failure::default()
            },
            ..NewTask::default()
        })
        .collect();
    let ids = (store.enqueue_many(&tasks).await.unwrap().iter())
        .map(|e| e.id())
        .collect();
    (store, settings, api, ids)
}

/// Asserts a 400 whose error names `field`.
fn bad_request(what: &str, (status, body): (StatusCode, Value), field: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains(field), "{what}: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakers_are_listed_forced_and_released_over_http_by_an_operate_token() {
    let (store, _, api, ids) = api_over(1).await;
    let (status, page) = api.get("/api/v1/breakers", Some(READ)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["items"][0]["handler"], "log");
    assert_eq!(page["items"][0]["state"], "closed");

    let why = json!({"reason": "billing maintenance"});
    let (status, body) = api
        .post("/api/v1/breakers/log/open", Some(READ), why.clone())
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    bad_request(
        "no reason",
        api.post("/api/v1/breakers/log/open", Some(OPERATE), json!({}))
            .await,
        "reason",
    );
    bad_request(
        "unknown field",
        api.post(
            "/api/v1/breakers/log/open",
            Some(OPERATE),
            json!({"reason": "x", "colour": "red"}),
        )
        .await,
        "colour",
    );
    let (status, body) = api
        .post(
            "/api/v1/breakers/republish/open",
            Some(OPERATE),
            why.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("[handlers.republish.breaker]"));

    let (status, body) = api
        .post("/api/v1/breakers/log/open", Some(OPERATE), why.clone())
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["state"], &body["forced"]),
        (&json!("open"), &json!("open"))
    );
    let held = store.get(ids[0]).await.unwrap().unwrap().next_attempt_at;
    assert!(
        held > chrono::Utc::now(),
        "the breaker holds the handler's tasks"
    );
    let (status, body) = api
        .post("/api/v1/breakers/log/close", Some(OPERATE), why.clone())
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["state"], &body["forced"]),
        (&json!("closed"), &json!("closed"))
    );
    let (status, body) = api
        .post("/api/v1/breakers/log/release", Some(OPERATE), why)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["forced"], Value::Null);
    let (_, audit) = api.get("/api/v1/audit?actor=ops", Some(READ)).await;
    let actions: Vec<&str> = (audit["items"].as_array().unwrap().iter())
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["breaker_release", "breaker_close", "breaker_open"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brakes_are_listed_engaged_and_released_over_http_by_an_operate_token() {
    let (store, _, api, _) = api_over(0).await;
    let (status, page) = api.get("/api/v1/brakes", Some(READ)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        page["items"][0]["route"], "orders",
        "every route has a brake"
    );
    assert_eq!(page["items"][0]["engaged_until"], Value::Null);

    let engage = "/api/v1/brakes/orders/engage";
    let (status, body) = api
        .post(engage, Some(READ), json!({"reason": "incident"}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    for (request, field) in [
        (json!({}), "reason"),
        (json!({"reason": "x", "for": "soon"}), "for: "),
        (json!({"reason": "x", "for": "8days"}), "for: "),
        (json!({"reason": "x", "for": "0s"}), "for: "),
    ] {
        let answer = api.post(engage, Some(OPERATE), request.clone()).await;
        bad_request(&request.to_string(), answer, field);
    }
    let (status, body) = api
        .post(
            "/api/v1/brakes/ordrs/engage",
            Some(OPERATE),
            json!({"reason": "typo"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"].as_str().unwrap().contains("orders"), "{body}");

    let (status, body) = api
        .post(
            engage,
            Some(OPERATE),
            json!({"reason": "incident", "for": "30m"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["trips"], 1);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_brake WHERE engaged_until \
             BETWEEN now() + interval '29 minutes' AND now() + interval '31 minutes'"
        )
        .await,
        1,
        "held for 30 minutes"
    );
    let release = "/api/v1/brakes/orders/release";
    bad_request(
        "no reason",
        api.post(release, Some(OPERATE), json!({})).await,
        "reason",
    );
    let (status, _) = api.post(release, Some(READ), json!({"reason": "x"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = api
        .post(release, Some(OPERATE), json!({"reason": "over"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["released_by"], "ops");
    let (status, body) = api
        .post(release, Some(OPERATE), json!({"reason": "twice"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"].as_str().unwrap().contains("not engaged"));
    let (_, audit) = api
        .get("/api/v1/audit?action=brake_engage", Some(READ))
        .await;
    assert_eq!(audit["items"][0]["reason"], "incident");
    assert_eq!(audit["items"][0]["details"]["route"], "orders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_replay_is_handed_to_the_fleet_over_http() {
    let (store, _, api, _) = api_over(3).await;
    let operator = Operator {
        actor: "cli:someone".into(),
        reason: None,
    };
    let replay = NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: TaskFilter::default(),
        target_topic: Some("replayed".into()),
        mark_resolved: false,
        rate: None,
        detached: false,
        approval: None,
        most: None,
    };
    let job = store
        .create_replay(&operator, &replay, "cli-gone")
        .await
        .unwrap();
    let path = format!("/api/v1/replays/{}/resume", job.id);
    let (status, body) = api.post(&path, Some(OPERATE), json!({})).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "its runner still holds it: {body}"
    );
    store
        .finish_replay(job.id, "cli-gone", Some("kafka: all brokers down"))
        .await
        .unwrap();

    let (status, _) = api.post(&path, Some(READ), json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    bad_request(
        "bad id",
        api.post("/api/v1/replays/x/resume", Some(OPERATE), json!({}))
            .await,
        "not a replay job id",
    );
    let (status, _) = api
        .post("/api/v1/replays/424242/resume", Some(OPERATE), json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = api.post(&path, Some(OPERATE), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["status"], &body["detached"], &body["runner"]),
        (&json!("pending"), &json!(true), &Value::Null),
        "waiting for a member"
    );
    let (_, audit) = api
        .get("/api/v1/audit?action=replay_resume", Some(READ))
        .await;
    assert_eq!(audit["items"][0]["actor"], "ops");
    assert_eq!(audit["items"][0]["details"]["job"], job.id);
}

/// Every list answers `items` and `next_cursor`, and a cursor walks each list once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_answers_one_envelope_and_pages_with_its_cursor() {
    let (store, _, api, ids) = api_over(3).await;
    for id in &ids {
        let (status, body) = api
            .post(
                "/api/v1/tasks/discard",
                Some(OPERATE),
                json!({"ids": [id.0], "reason": "one by one"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let operator = Operator {
        actor: "ops".into(),
        reason: None,
    };
    for _ in 0..3 {
        let replay = NewReplay {
            retry: None,
            pace: None,
            force: false,
            bounded: false,
            filter: TaskFilter::default(),
            target_topic: Some("replayed".into()),
            mark_resolved: false,
            rate: None,
            detached: true,
            approval: None,
            most: None,
        };
        store.create_replay(&operator, &replay, "").await.unwrap();
    }
    for path in [
        "/api/v1/tasks",
        "/api/v1/replays",
        "/api/v1/audit",
        "/api/v1/members",
        "/api/v1/breakers",
        "/api/v1/brakes",
    ] {
        let (status, page) = api.get(path, Some(READ)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
        let fields: Vec<&String> = page.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["items", "next_cursor"], "{path}: {page}");
        assert!(page["items"].is_array(), "{path}: {page}");
    }
    for (path, total) in [
        ("/api/v1/tasks", 3),
        ("/api/v1/replays", 3),
        ("/api/v1/audit", 6),
    ] {
        let mut seen = Vec::new();
        let mut next = format!("{path}?limit=2");
        loop {
            let (status, page) = api.get(&next, Some(READ)).await;
            assert_eq!(status, StatusCode::OK, "{next}: {page}");
            seen.extend(
                page["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i["id"].clone()),
            );
            match page["next_cursor"].as_i64() {
                Some(cursor) => next = format!("{path}?limit=2&after={cursor}"),
                None => break,
            }
        }
        let mut unique: Vec<i64> = seen.iter().map(|id| id.as_i64().unwrap()).collect();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            (seen.len(), unique.len()),
            (total, total),
            "{path}: {seen:?}"
        );
    }
    let (_, audit) = api.get("/api/v1/audit?before=2&limit=5", Some(READ)).await;
    assert_eq!(audit["items"][0]["id"], 1, "before is read as after");
}

/// Time filters take durations ("1h": an hour ago) as the CLI does, in a list's query,
/// in an action's filter and in the audit log's `since`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_filters_take_durations_over_http() {
    let (store, _, api, ids) = api_over(2).await;
    sqlx::query("UPDATE recovery_task SET created_at = now() - interval '3 hours' WHERE id = $1")
        .bind(ids[0].0)
        .execute(store.pool())
        .await
        .unwrap();
    let (status, page) = api.get("/api/v1/tasks?created_after=1h", Some(READ)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let listed: Vec<i64> = (page["items"].as_array().unwrap().iter())
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, [ids[1].0], "created within the hour");
    let (_, page) = api
        .get("/api/v1/tasks?created_before=2h&status=failed", Some(READ))
        .await;
    assert_eq!(page["items"][0]["id"], ids[0].0);
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    bad_request(
        "not a time",
        api.get("/api/v1/tasks?updated_before=soon", Some(READ))
            .await,
        "updated_before: ",
    );

    let (status, body) = api
        .post(
            "/api/v1/tasks/discard",
            Some(OPERATE),
            json!({"filter": {"created_before": "2h"}, "reason": "old"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["changed"], 1);
    let (_, audit) = api.get("/api/v1/audit?since=1h", Some(READ)).await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 1);
    let (_, audit) = api
        .get("/api/v1/audit?since=2026-01-01T00:00:00Z", Some(READ))
        .await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 1);
    let (_, audit) = api.get("/api/v1/audit?since=0s", Some(READ)).await;
    assert_eq!(audit["items"], json!([]), "nothing since now");
    bad_request(
        "not a time",
        api.get("/api/v1/audit?since=last%20week", Some(READ)).await,
        "since: ",
    );
}

/// A dry run answers the count and the first tasks it would change (id, key, error,
/// handler, status), by filter and by ids alike, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_samples_what_it_would_change_by_filter_and_by_ids() {
    let (store, _, api, ids) = api_over(8).await;
    sqlx::query("UPDATE recovery_task SET last_error = 'HTTP 503 from billing'")
        .execute(store.pool())
        .await
        .unwrap();
    let (status, body) = api
        .post(
            "/api/v1/tasks/discard",
            Some(OPERATE),
            json!({"filter": {"key_prefix": "k"}, "reason": "r", "dry_run": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["matched"], &body["dry_run"]),
        (&json!(8), &json!(true))
    );
    let sample = body["sample"].as_array().unwrap();
    assert_eq!(sample.len(), 5, "{body}");
    assert_eq!(
        sample[0]["id"], ids[0].0,
        "in the order it would change them"
    );
    assert_eq!(sample[0]["key"], "k0");
    assert_eq!(sample[0]["last_error"], "HTTP 503 from billing");
    assert_eq!(sample[0]["handler"], "log");
    assert_eq!(sample[0]["status"], "failed");

    let (status, body) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            json!({"ids": [ids[6].0, ids[7].0], "dry_run": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sampled: Vec<i64> = (body["sample"].as_array().unwrap().iter())
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(sampled, [ids[6].0, ids[7].0]);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status <> 'failed'"
        )
        .await,
        0,
        "a dry run changes nothing"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_audit").await,
        0
    );
    let (_, body) = api
        .post(
            "/api/v1/tasks/resolve",
            Some(OPERATE),
            json!({"ids": [ids[0].0], "reason": "r"}),
        )
        .await;
    assert_eq!(body.get("sample"), None, "only a dry run samples: {body}");
}

/// A replay's dry run counts what it would produce and what it would skip, by reason,
/// with a sample of what it would produce, and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_dry_run_counts_what_it_would_skip_and_why() {
    let (store, _, api, _) = api_over(0).await;
    let task = |key: &str, original: Option<&str>, stored: bool| NewTask {
        handler: "log".into(),
        failure: Failure {
            key: Some(key.as_bytes().to_vec()),
            value: stored.then(|| b"v".to_vec()),
            payload_stored: stored,
            original: original.map(|topic| OriginalCoordinates {
                topic: topic.into(),
                partition: None,
                offset: None,
            }),
            ..Failure::default()
        },
        ..NewTask::default()
    };
    let tasks = [
        task("a", Some("payments"), true),
        task("b", Some("payments"), true),
        task("c", Some("payments"), false),
        task("d", None, true),
    ];
    store.enqueue_many(&tasks).await.unwrap();
    let preview = |request: Value| {
        let api = &api;
        async move {
            let (status, body) = api
                .post("/api/v1/tasks/replay", Some(OPERATE), request)
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        }
    };
    let skipped = |body: &Value, reason: &str| {
        (body["skipped"].as_array().unwrap().iter())
            .find(|s| s["reason"] == reason)
            .unwrap_or_else(|| panic!("{reason} in {body}"))["count"]
            .as_i64()
            .unwrap()
    };
    let body = preview(json!({"all": true, "dry_run": true})).await;
    assert_eq!(
        (&body["matched"], &body["produced"]),
        (&json!(4), &json!(2)),
        "{body}"
    );
    assert_eq!(skipped(&body, "payload_not_stored"), 1);
    assert_eq!(skipped(&body, "no_original_topic"), 1);
    assert_eq!(body["topics"], json!(["payments"]));
    let keys: Vec<&str> = (body["sample"].as_array().unwrap().iter())
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "b"]);

    let body = preview(json!({"all": true, "to": "elsewhere", "dry_run": true})).await;
    assert_eq!(
        body["produced"], 3,
        "a target topic serves tasks without one: {body}"
    );
    assert_eq!(skipped(&body, "no_original_topic"), 0);
    assert_eq!(body["topics"], json!(["elsewhere"]));
    let body = preview(json!({"filter": {"key": "c"}, "dry_run": true})).await;
    assert_eq!(
        (&body["produced"], &body["sample"]),
        (&json!(0), &json!([]))
    );

    let (status, body) = api
        .post(
            "/api/v1/tasks/replay",
            Some(READ),
            json!({"all": true, "dry_run": true}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    bad_request(
        "into a captured topic",
        api.post(
            "/api/v1/tasks/replay",
            Some(OPERATE),
            json!({"all": true, "to": "orders", "dry_run": true}),
        )
        .await,
        "orders",
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_audit").await,
        0
    );
}

/// A request to the API.
enum Request {
    Get(&'static str),
    Post(&'static str, Value),
}

/// The CLI and the API are faces of one layer: the same bad request is refused with the
/// same words by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_api_refuse_the_same_request_with_the_same_words() {
    let (_, settings, api, _) = api_over(3).await;
    let cases: [(&[&str], Request); 5] = [
        (
            &["tasks", "retry", "--yes"],
            Request::Post("/api/v1/tasks/retry", json!({})),
        ),
        (
            &[
                "tasks",
                "discard",
                "1",
                "--handler",
                "log",
                "--reason",
                "r",
                "--yes",
            ],
            Request::Post(
                "/api/v1/tasks/discard",
                json!({"ids": [1], "filter": {"handler": "log"}, "reason": "r"}),
            ),
        ),
        (
            &["tasks", "retry", "--status", "done", "--dry-run"],
            Request::Post(
                "/api/v1/tasks/retry",
                json!({"filter": {"status": "done"}, "dry_run": true}),
            ),
        ),
        (
            &["tasks", "list", "--created-after", "last tuesday"],
            Request::Get("/api/v1/tasks?created_after=last%20tuesday"),
        ),
        (
            &["tasks", "list", "--limit", "5000"],
            Request::Get("/api/v1/tasks?limit=5000"),
        ),
    ];
    for (args, request) in cases {
        let (status, body) = match request {
            Request::Get(path) => api.get(path, Some(READ)).await,
            Request::Post(path, body) => api.post(path, Some(OPERATE), body).await,
        };
        assert_eq!(status, StatusCode::BAD_REQUEST, "{args:?}: {body}");
        let said = body["error"].as_str().unwrap();
        let out = crate::support::cli::run(&settings, args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim(), format!("Error: {said}"), "{args:?}");
    }
}

/// A bulk action tells its progress after every batch it commits (its audit row, tasks
/// changed and left alone so far): what a face shows while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_action_reports_its_progress_after_every_batch() {
    use redrive::operations::{ActRequest, Actor, FilterParams, Verb};
    let (store, settings) = fresh_store().await;
    sqlx::raw_sql(
        "INSERT INTO recovery_task (handler, msg_value) \
         SELECT 'log', 'v'::bytea FROM generate_series(1, 1200)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let fleet = redrive::Fleet::builder(settings)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let operations = fleet.operations(store.clone());
    let request = ActRequest {
        filter: Some(FilterParams {
            handler: Some("log".into()),
            ..FilterParams::default()
        }),
        reason: Some("bulk".into()),
        ..ActRequest::default()
    };
    let mut told = Vec::new();
    let answer = operations
        .act(&Actor::shell(), Verb::Discard, &request, |report| {
            told.push((report.audit_id, report.changed, report.refused))
        })
        .await
        .unwrap();
    let audit = answer.audit_id.unwrap();
    let changed: Vec<i64> = told.iter().map(|(_, changed, _)| *changed).collect();
    assert_eq!(
        changed,
        [500, 1000, 1200, 1200],
        "after each batch, and at the end"
    );
    assert!(told
        .iter()
        .all(|(id, _, refused)| *id == audit && *refused == 0));
    let reader = Actor {
        name: "viewer".into(),
        role: redrive::config::Role::Read,
    };
    let refused = operations
        .act(&reader, Verb::Retry, &request, |_| {})
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("may only read"), "{refused}");
}

/// Statuses are compared one by one (so each has its index): every combination selects
/// exactly its tasks, in lists and in counts; the console's count stops at its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn every_combination_of_statuses_selects_exactly_its_tasks_and_counts_stop_at_their_bound() {
    use redrive::store::{Action, Selection};
    use redrive::task::Status;
    use std::time::Duration;
    let (store, _settings) = fresh_store().await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(
            store
                .enqueue(&NewTask::new("h", format!("t{i}")))
                .await
                .unwrap()
                .id(),
        );
    }
    let operator = Operator {
        actor: "test".into(),
        reason: Some("statuses".into()),
    };
    for (action, chosen) in [
        (Action::Discard, &ids[0..2]),
        (Action::Resolve { force: false }, &ids[2..5]),
    ] {
        store
            .act(&operator, &action, &Selection::Ids(chosen.to_vec()))
            .await
            .unwrap();
    }
    sqlx::query(
        "UPDATE recovery_task SET status = 'permanent_failure', finished_at = now() WHERE id = $1",
    )
    .bind(ids[5].0)
    .execute(store.pool())
    .await
    .unwrap();
    let all = [
        Status::Failed,
        Status::PermanentFailure,
        Status::Resolved,
        Status::Discarded,
    ];
    let held = |s: Status| match s {
        Status::Discarded => 2,
        Status::Resolved => 3,
        Status::PermanentFailure => 1,
        Status::Failed => 2,
    };
    for mask in 1..16_u32 {
        let statuses: Vec<Status> = (0..4)
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| all[b])
            .collect();
        let expected: i64 = statuses.iter().map(|s| held(*s)).sum();
        let filter = TaskFilter {
            status: statuses.clone(),
            ..TaskFilter::default()
        };
        let listed = store.list(&filter, None, 100).await.unwrap();
        assert_eq!(listed.len() as i64, expected, "{statuses:?}");
        assert!(
            listed.iter().all(|t| statuses.contains(&t.status)),
            "{statuses:?}"
        );
        let selection = Selection::Filter(filter);
        assert_eq!(
            store.count_selected(&selection).await.unwrap(),
            expected,
            "{statuses:?}"
        );
        assert_eq!(
            store
                .count_selected_up_to(&selection, expected, Duration::from_secs(10))
                .await
                .unwrap(),
            Some(expected)
        );
        assert_eq!(
            store
                .count_selected_up_to(&selection, expected - 1, Duration::from_secs(10))
                .await
                .unwrap(),
            None
        );
    }
    // A count no index serves gives up after its time instead of reading every task.
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_value, next_attempt_at) \
         SELECT 'bulk', convert_to('x', 'UTF8'), now() FROM generate_series(1, 300000)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let nowhere = Selection::Filter(TaskFilter {
        error: Some("no such error".into()),
        ..TaskFilter::default()
    });
    assert_eq!(
        store
            .count_selected_up_to(&nowhere, 10_000, Duration::from_millis(1))
            .await
            .unwrap(),
        None,
        "300,000 tasks read in a millisecond"
    );
    assert_eq!(
        store
            .count_selected_up_to(&nowhere, 10_000, Duration::from_secs(30))
            .await
            .unwrap(),
        Some(0)
    );
}

/// A confirmed action that finds nothing left to change (the fleet finished the tasks
/// between the preview and the confirmation) still writes its audit row, with count 0,
/// and answers its id: an operator's "yes" is always on the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_action_that_changes_nothing_is_audited_with_count_zero() {
    let (store, _, api, ids) = api_over(2).await;
    let (status, preview) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            json!({"ids": [ids[0].0, ids[1].0], "dry_run": true}),
        )
        .await;
    assert_eq!((status, &preview["matched"]), (StatusCode::OK, &json!(2)));
    // The fleet resolves both between the preview and the confirmation.
    sqlx::query("UPDATE recovery_task SET status = 'resolved', finished_at = now()")
        .execute(store.pool())
        .await
        .unwrap();
    let (status, body) = api
        .post(
            "/api/v1/tasks/discard",
            Some(OPERATE),
            json!({"ids": [ids[0].0, ids[1].0], "reason": "billing is back"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["changed"], 0, "{body}");
    let audit = body["audit_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no audit id: {body}"));
    assert_eq!(
        scalar(
            &store,
            &format!(
                "SELECT count(*) FROM recovery_audit WHERE id = {audit} AND action = 'discard' \
                 AND count = 0 AND reason = 'billing is back'"
            )
        )
        .await,
        1
    );
}
