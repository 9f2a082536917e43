//! The admin HTTP API over real HTTP: auth, every endpoint, and bad input as 400s.

use redrive::admin;
use redrive::{Failure, Fleet, NewTask, Settings, Store, TaskId};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::support::api::{answer, with_tokens, Api, OPERATE, READ};
use crate::support::{eventually, fresh_store, scalar, Member};

async fn keyed_tasks(store: &Store, handler: &str, keys: &[&[u8]]) -> Vec<TaskId> {
    let tasks: Vec<NewTask> = keys
        .iter()
        .map(|key| NewTask {
            handler: handler.into(),
            failure: Failure {
                key: Some(key.to_vec()),
                value: Some(vec![0xff, 0x00, b'v']),
                ..Failure::default()
            },
            ..NewTask::default()
        })
        .collect();
    store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_who_may_read_and_who_may_act() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let ids = keyed_tasks(&store, "log", &[b"k1"]).await;

    let (status, body) = api.get("/api/v1/tasks", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body["error"].as_str().unwrap().contains("bearer"));
    let (status, _) = api
        .get("/api/v1/tasks", Some("operate-token-012345678"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = api.get("/api/v1/tasks", Some(READ)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["items"][0]["id"], ids[0].0);

    let discard = json!({"ids": [ids[0].0], "reason": "bad data"});
    let (status, body) = api
        .post("/api/v1/tasks/discard", Some(READ), discard.clone())
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = api
        .post("/api/v1/tasks/discard", Some(OPERATE), discard)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["changed"].as_i64(), body["matched"].as_i64()),
        (Some(1), Some(1))
    );

    let (status, audit) = api.get("/api/v1/audit", Some(READ)).await;
    assert_eq!(status, StatusCode::OK);
    let audit = &audit["items"];
    assert_eq!(audit[0]["actor"], "ops", "the token's name is the actor");
    assert_eq!(audit[0]["action"], "discard");
    assert_eq!(audit[0]["reason"], "bad data");
    assert_eq!(audit[0]["ids"], json!([ids[0].0]));
}

/// Found by the issue 16 attack: a bulk retry whose client hung up (a proxy's or a
/// script's timeout) stopped after its first batches, and nobody learnt that some tasks
/// changed. Once started, it runs to its end and its audit entry counts every task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_bulk_action_whose_client_hangs_up_still_runs_to_its_end() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    const TASKS: i64 = 30_000;
    let tasks: Vec<NewTask> = (0..TASKS)
        .map(|i| NewTask::new("log", format!("v{i}").into_bytes()))
        .collect();
    for chunk in tasks.chunks(5_000) {
        store.enqueue_many(chunk).await.unwrap();
    }
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(50))
        .build()
        .unwrap();
    let sent = impatient
        .post(format!("{}/api/v1/tasks/discard", api.base))
        .bearer_auth(OPERATE)
        .json(&json!({"filter": {"handler": "log"}, "reason": "hang up"}))
        .send()
        .await;
    assert!(
        sent.is_err_and(|e| e.is_timeout()),
        "the client gave up first"
    );
    eventually(
        std::time::Duration::from_secs(120),
        "every task discarded",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'discarded'",
            )
            .await
                == TASKS
        },
    )
    .await;
    eventually(
        std::time::Duration::from_secs(10),
        "the audit entry counts them all",
        || async {
            scalar(
                &store,
                "SELECT max(count) FROM recovery_audit WHERE action = 'discard'",
            )
            .await
                == TASKS
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_that_says_what_is_wrong() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    keyed_tasks(&store, "log", &[b"k"]).await;
    for (path, says) in [
        ("/api/v1/tasks?status=done", "unknown status"),
        ("/api/v1/tasks?limit=5000", "limit"),
        ("/api/v1/tasks?limit=0", "limit"),
        ("/api/v1/tasks?colour=red", "colour"),
        ("/api/v1/tasks?created_after=yesterday", "created_after"),
        ("/api/v1/tasks?after=-3", "after"),
        ("/api/v1/tasks?key=a&key_prefix=b", "not both"),
        ("/api/v1/tasks/abc", "not a task id"),
        ("/api/v1/tasks/0", "not a task id"),
        ("/api/v1/tasks/99999999999999999999", "not a task id"),
        ("/api/v1/audit?limit=-1", "limit"),
        // Found by the issue 16 attack: these were 500s with PostgreSQL's words.
        ("/api/v1/tasks?created_after=10000years", "too long ago"),
        ("/api/v1/audit?since=10000years", "too long ago"),
        ("/api/v1/audit?actor=%00", "NUL"),
        ("/api/v1/audit?action=%00", "NUL"),
        ("/api/v1/tasks?key_prefix=", "key_prefix is empty"),
        ("/api/v1/tasks?limit=1e3", "limit=\"1e3\""),
        ("/api/v1/tasks?after=abc", "after=\"abc\""),
        ("/api/v1/tasks?generation=two", "generation=\"two\""),
    ] {
        let (status, body) = api.get(path, Some(READ)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{path}: {error}");
    }
    let (status, body) = api.get("/api/v1/tasks/retry", Some(READ)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("GET is not a method"));
    for (path, request, says) in [
        (
            "/api/v1/tasks/retry",
            json!({}),
            "no task ids and no filter",
        ),
        (
            "/api/v1/tasks/retry",
            json!({"ids": [1], "filter": {}}),
            "not both",
        ),
        ("/api/v1/tasks/retry", json!({"filter": {}}), "every task"),
        (
            "/api/v1/tasks/retry",
            json!({"filter": {"status": ["nope"]}}),
            "unknown status \"nope\"",
        ),
        (
            "/api/v1/tasks/retry",
            json!({"filter": {"colour": "red"}}),
            "colour",
        ),
        ("/api/v1/tasks/retry", json!({"ids": ["x"]}), "bad body"),
        (
            "/api/v1/tasks/retry",
            json!({"ids": [1], "more_attempts": 0}),
            "more_attempts",
        ),
        ("/api/v1/tasks/discard", json!({"ids": [1]}), "reason"),
        (
            "/api/v1/tasks/discard",
            json!({"ids": [1], "reason": "a\u{0}b"}),
            "NUL",
        ),
        (
            "/api/v1/tasks/discard",
            json!({"ids": [1], "reason": "x".repeat(2001)}),
            "at most 2000",
        ),
        (
            "/api/v1/tasks/discard",
            json!({"filter": {"key_prefix": ""}, "reason": "r"}),
            "key_prefix is empty",
        ),
        (
            "/api/v1/tasks/replay",
            json!({"all": true, "reason": "a\u{0}b"}),
            "NUL",
        ),
        (
            "/api/v1/tasks/resolve",
            json!({"ids": [1], "reason": "  "}),
            "reason",
        ),
        (
            "/api/v1/tasks/discard",
            json!({"ids": [1], "reason": "r", "at": "1h"}),
            "belong to retry",
        ),
        ("/api/v1/tasks/replay", json!({"filter": {}}), "every task"),
        (
            "/api/v1/tasks/replay",
            json!({"all": true, "rate": 0}),
            "rate",
        ),
    ] {
        let (status, body) = api.post(path, Some(OPERATE), request.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {request}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{path} {request}: {error}");
    }
    // Malformed JSON.
    let response = api
        .client
        .post(format!("{}/api/v1/tasks/retry", api.base))
        .bearer_auth(OPERATE)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (status, body) = answer(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Unknown ids say so, and change nothing.
    let (status, body) = api.get("/api/v1/tasks/424242", Some(READ)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("no such task: 424242"))
    );
    let (status, body) = api
        .post(
            "/api/v1/tasks/discard",
            Some(OPERATE),
            json!({"ids": [1, 424242], "reason": "r"}),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("no such task: 424242"))
    );
    assert_eq!(
        store.get(TaskId(1)).await.unwrap().unwrap().status,
        redrive::Status::Failed
    );
    // A filter that matches nothing says so in its counts.
    let (status, body) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            json!({"filter": {"handler": "nobody"}}),
        )
        .await;
    assert_eq!(
        (status, body["matched"].as_i64()),
        (StatusCode::OK, Some(0))
    );
}

/// A retry's `at` and `more_attempts` mean what they mean on the command line: a
/// duration is that long from now, a time far off is refused; both are audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrys_at_and_more_attempts_match_the_command_line() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let ids = keyed_tasks(&store, "log", &[b"k"]).await;
    let (status, body) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            json!({"ids": ids, "at": "1h", "more_attempts": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE next_attempt_at \
             BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes'"
        )
        .await,
        1,
        "due in an hour"
    );
    let (_, audit) = api.get("/api/v1/audit", Some(READ)).await;
    assert_eq!(
        audit["items"][0]["details"],
        json!({"at": "1h", "more_attempts": 2})
    );
    for (far, says) in [
        ("2999-01-01T00:00:00Z", "more than a year from now"),
        ("-1h", "negative"),
        ("soon", "neither an RFC 3339 time nor a duration"),
    ] {
        let (status, body) = api
            .post(
                "/api/v1/tasks/retry",
                Some(OPERATE),
                json!({"ids": ids, "at": far}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{far}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("at: ") && error.contains(says),
            "{far}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_and_pages_through_every_task_once() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let orders = keyed_tasks(
        &store,
        "log",
        &[b"order-1", b"order-2", b"order-3", b"user-1", b"order-4"],
    )
    .await;
    keyed_tasks(&store, "republish", &[b"order-9"]).await;

    let (_, page) = api
        .get(
            "/api/v1/tasks?handler=log&key_prefix=order-&limit=2",
            Some(READ),
        )
        .await;
    let mut seen: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    let mut cursor = page["next_cursor"].as_i64();
    while let Some(after) = cursor {
        let (status, page) = api
            .get(
                &format!("/api/v1/tasks?handler=log&key_prefix=order-&limit=2&after={after}"),
                Some(READ),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_i64().unwrap()),
        );
        cursor = page["next_cursor"].as_i64();
    }
    let expected: Vec<i64> = [orders[4], orders[2], orders[1], orders[0]]
        .iter()
        .map(|i| i.0)
        .collect();
    assert_eq!(seen, expected, "newest first, each once");

    let (_, page) = api.get("/api/v1/tasks?key=user-1", Some(READ)).await;
    assert_eq!(page["items"][0]["id"], orders[3].0);
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let (_, page) = api
        .get("/api/v1/tasks?status=resolved,discarded", Some(READ))
        .await;
    assert_eq!(page["items"], json!([]));

    // Show: a binary value is hex, a text key is text, with the history.
    let (status, detail) = api
        .get(&format!("/api/v1/tasks/{}", orders[0].0), Some(READ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        detail["key"],
        json!({"encoding": "utf8", "data": "order-1", "size": 7})
    );
    assert_eq!(
        detail["value"],
        json!({"encoding": "hex", "data": "ff0076", "size": 3})
    );
    assert_eq!(detail["task"]["status"], "failed");
    assert_eq!(detail["history"], json!([]));

    // Retry by filter, then its figures.
    let (status, body) = api
        .post(
            "/api/v1/tasks/resolve",
            Some(OPERATE),
            json!({"filter": {"key_prefix": "order-"}, "reason": "fixed by hand"}),
        )
        .await;
    assert_eq!(
        (status, body["changed"].as_i64()),
        (StatusCode::OK, Some(5)),
        "{body}"
    );
    let (_, stats) = api.get("/api/v1/stats", Some(READ)).await;
    let resolved: i64 = stats["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "resolved")
        .map(|c| c["count"].as_i64().unwrap())
        .sum();
    assert_eq!(resolved, 5);
    let (_, check) = api.get("/api/v1/check", Some(READ)).await;
    assert_eq!(check["violations"], json!([]), "{check}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_every_endpoint() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let (status, doc) = api.get("/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    for path in [
        "/api/v1/tasks",
        "/api/v1/tasks/{id}",
        "/api/v1/tasks/retry",
        "/api/v1/tasks/discard",
        "/api/v1/tasks/resolve",
        "/api/v1/tasks/replay",
        "/api/v1/replays",
        "/api/v1/replays/{id}/cancel",
        "/api/v1/replays/{id}/resume",
        "/api/v1/stats",
        "/api/v1/audit",
        "/api/v1/members",
        "/api/v1/check",
        "/api/v1/breakers",
        "/api/v1/breakers/{handler}/open",
        "/api/v1/breakers/{handler}/close",
        "/api/v1/breakers/{handler}/release",
        "/api/v1/brakes",
        "/api/v1/brakes/{route}/engage",
        "/api/v1/brakes/{route}/release",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    for schema in [
        "FilterParams",
        "ActRequest",
        "ActAnswer",
        "ReplayPreview",
        "EngageRequest",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// `redrive run` serves the API when `admin.listen` is set, and records itself as a
/// live member; a taken address stops start-up naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_member_serves_the_api_and_is_listed_live() {
    let (store, settings) = fresh_store().await;
    let mut settings = with_tokens(settings);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    settings.admin.listen = Some(taken.local_addr().unwrap());
    let fleet = Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap();
    let error = fleet
        .run_with_store(store.clone(), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("admin.listen"), "{error}");
    drop(taken);

    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    settings.admin.listen = Some(free);
    let fleet = Fleet::builder(settings)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    let client = reqwest::Client::new();
    let mut members = Value::Null;
    for _ in 0..100 {
        if let Ok(response) = client
            .get(format!("http://{free}/api/v1/members"))
            .bearer_auth(READ)
            .send()
            .await
        {
            members = answer(response).await.1["items"].take();
            if members.as_array().is_some_and(|m| !m.is_empty()) {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(members.as_array().map(Vec::len), Some(1), "{members}");
    let roles = &members[0]["roles"];
    assert!(
        roles.as_array().unwrap().contains(&json!("admin")),
        "{roles}"
    );
    member.stop().await;
    assert_eq!(
        store.live_members().await.unwrap(),
        [],
        "a clean stop removes the member"
    );
}

/// A replay to a topic one of the member's capture routes consumes is a 400 naming the
/// route, before any Kafka client is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_into_a_captured_topic_is_refused() {
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = "127.0.0.1:1".into();
    let mut route = redrive::config::RouteSettings::new(
        &["orders.dlt"],
        redrive::config::RouteMode::Capture,
        "log",
    );
    route.name = "dlt".into();
    settings.routes.push(route);
    let api = Api::start(&store, &with_tokens(settings)).await;
    keyed_tasks(&store, "log", &[b"k1"]).await;
    let (status, body) = api
        .post(
            "/api/v1/tasks/replay",
            Some(OPERATE),
            json!({"all": true, "to": "orders.dlt"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("capture route routes[0].topics") && error.contains("endless loop"),
        "{error}"
    );
}

/// A GET of `path` with extra request headers (`Host` among them).
async fn get_with(
    api: &Api,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut request = api.client.get(format!("{}{path}", api.base));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    answer(request.send().await.unwrap()).await
}

/// Regression: the token-less API answered any `Host`, so a web page on a rebinding
/// domain (or any site, through the operator's browser) could read payloads and act.
/// An open API answers loopback names only, and no API answers a cross-site request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_api_answers_only_its_loopback_names_and_no_cross_site_request() {
    let (store, settings) = fresh_store().await;
    let open = Api::start(&store, &settings).await;
    let ids = keyed_tasks(&store, "log", &[b"k1"]).await;
    let port = open.base.rsplit(':').next().unwrap().to_owned();
    let own = format!("127.0.0.1:{port}");
    for host in [
        own.clone(),
        format!("localhost:{port}"),
        "LOCALHOST".to_owned(),
        "127.8.9.10".to_owned(),
        format!("[::1]:{port}"),
    ] {
        let (status, body) = get_with(&open, "/api/v1/tasks", None, &[("host", &host)]).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
    }
    let same_origin = format!("http://{own}");
    let (status, body) = get_with(
        &open,
        "/api/v1/tasks",
        None,
        &[("origin", &same_origin), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (headers, says) in [
        (vec![("host", format!("evil.example:{port}"))], "Host"),
        (vec![("host", "127.0.0.1.evil.example".to_owned())], "Host"),
        (vec![("host", "localhost.evil.example".to_owned())], "Host"),
        (
            vec![("origin", "http://evil.example".to_owned())],
            "cross-site",
        ),
        (vec![("origin", "null".to_owned())], "cross-site"),
        (
            vec![("sec-fetch-site", "cross-site".to_owned())],
            "cross-site",
        ),
        (
            vec![("sec-fetch-site", "same-site".to_owned())],
            "cross-site",
        ),
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        for path in ["/api/v1/tasks", "/api/v1/openapi.json"] {
            let (status, body) = get_with(&open, path, None, &headers).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?} {path}: {body}");
            let error = body["error"].as_str().unwrap();
            assert!(error.contains(says), "{headers:?}: {error}");
        }
        let mut request = open
            .client
            .post(format!("{}/api/v1/tasks/discard", open.base))
            .json(&json!({"ids": [ids[0].0], "reason": "from a web page"}));
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        let (status, body) = answer(request.send().await.unwrap()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}: {body}");
    }
    assert_eq!(
        store.get(ids[0]).await.unwrap().unwrap().status,
        redrive::Status::Failed,
        "no refused request changed anything"
    );

    // With tokens the API may be reached under any name, but not cross-site.
    let (store, settings) = fresh_store().await;
    let guarded = Api::start(&store, &with_tokens(settings)).await;
    let (status, body) = get_with(
        &guarded,
        "/api/v1/tasks",
        Some(READ),
        &[("host", "redrive.internal:9465")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = get_with(
        &guarded,
        "/api/v1/tasks",
        Some(READ),
        &[
            ("origin", "https://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

/// Heavy reads (`/stats`, `/check`, a grouping's count) run a few at a time; one more is
/// answered 429 with `Retry-After` at once instead of queueing on the database, while
/// light reads, and groupings answered from a shared count, go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_reads_beyond_the_limit_are_answered_429_at_once() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let (status, shared) = api.get("/api/v1/groups", Some(READ)).await;
    assert_eq!(status, StatusCode::OK, "{shared}");
    let mut lock = store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE recovery_task IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut waiting = Vec::new();
    for path in ["/api/v1/stats", "/api/v1/check"] {
        let request = api
            .client
            .get(format!("{}{path}", api.base))
            .bearer_auth(READ)
            .send();
        waiting.push(tokio::spawn(request));
    }
    crate::support::eventually(
        std::time::Duration::from_secs(30),
        "both heavy reads waiting on the lock",
        || async {
            crate::support::scalar(
                &store,
                "SELECT count(*) FROM pg_locks WHERE relation = 'recovery_task'::regclass AND NOT granted",
            )
            .await
                == admin::HEAVY_READS as i64
        },
    )
    .await;
    for path in ["/api/v1/stats", "/api/v1/check"] {
        let response = api
            .client
            .get(format!("{}{path}", api.base))
            .bearer_auth(READ)
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await
            .expect("an answer at once, not a place in the queue");
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        assert!(response.headers().get("retry-after").is_some(), "{path}");
        let (_, body) = answer(response).await;
        assert!(
            body["error"].as_str().unwrap().contains("try again"),
            "{body}"
        );
    }
    let (status, _) = api.get("/api/v1/members", Some(READ)).await;
    assert_eq!(status, StatusCode::OK, "light reads are not limited");
    let (status, again) = api.get("/api/v1/groups", Some(READ)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a shared grouping needs no slot: {again}"
    );
    assert_eq!(again["counted_at"], shared["counted_at"]);
    let response = (api
        .client
        .get(format!("{}/api/v1/groups?by=class", api.base)))
    .bearer_auth(READ)
    .timeout(std::time::Duration::from_secs(10))
    .send()
    .await
    .expect("an answer at once, not a place in the queue");
    assert_eq!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a grouping to count"
    );
    assert_eq!(response.headers()["retry-after"], "5");
    lock.commit().await.unwrap();
    for request in waiting {
        assert_eq!(request.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

/// Found by an attack: a client hanging up freed its heavy-read slot while PostgreSQL ran
/// its statement on, so that clients asking and hanging up ran more counts at once than
/// allowed and took every connection of the API's pool (a light read then waited 5 s for
/// one and got 503). A heavy read keeps its slot until its statement ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_reads_abandoned_by_their_clients_keep_their_slots_until_their_statements_end() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let mut lock = store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE recovery_task IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let paths = [
        "/api/v1/groups?by=class",
        "/api/v1/groups?by=handler",
        "/api/v1/stats",
        "/api/v1/groups?since=2h",
        "/api/v1/check",
        "/api/v1/groups?by=topic",
    ];
    for path in paths {
        let asked = (api.client.get(format!("{}{path}", api.base)))
            .bearer_auth(READ)
            .header("cache-control", "no-cache")
            .timeout(std::time::Duration::from_millis(300))
            .send()
            .await;
        // The client hangs up, or is refused at once once the slots are taken.
        if let Ok(response) = asked {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        }
    }
    let waiting =
        "SELECT count(*) FROM pg_locks WHERE relation = 'recovery_task'::regclass AND NOT granted";
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        crate::support::scalar(&store, waiting).await,
        admin::HEAVY_READS as i64,
        "statements of abandoned heavy reads running at once"
    );
    let (status, body) = api.get("/api/v1/members", Some(READ)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a light read finds a connection: {body}"
    );
    lock.commit().await.unwrap();
    crate::support::eventually(
        std::time::Duration::from_secs(30),
        "heavy reads answered again",
        || async { api.get("/api/v1/stats", Some(READ)).await.0 == StatusCode::OK },
    )
    .await;
}

/// Regression: API work had no bound, and every database error was answered 503 "cannot
/// be reached". A statement of an API request is cancelled after
/// `admin.statement_timeout` (504), an error of the data is a 500 that says what the
/// database said, and only a database that cannot be reached is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_statements_are_bounded_and_database_errors_are_told_apart() {
    let (store, base) = fresh_store().await;
    let proxy = crate::support::PgProxy::start().await;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let env = std::collections::HashMap::from(
        [
            ("REDRIVE__DATABASE__URL", crate::support::database_url()),
            ("REDRIVE__DATABASE__SCHEMA", base.database.schema.clone()),
            ("REDRIVE__WORKER__ENABLED", "false".to_owned()),
            ("REDRIVE__ADMIN__LISTEN", listen.to_string()),
            ("REDRIVE__ADMIN__STATEMENT_TIMEOUT", "300ms".to_owned()),
            ("REDRIVE__ADMIN__TOKENS__VIEWER__ROLE", "read".to_owned()),
            ("REDRIVE__ADMIN__TOKENS__VIEWER__TOKEN", READ.to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let settings = proxy.route(&Settings::load(None, Some(env)).expect("valid settings"));
    let fleet = Fleet::builder(settings)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    let api = Api {
        base: format!("http://{listen}"),
        client: reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(20))
            .build()
            .unwrap(),
        stop: CancellationToken::new(),
    };
    crate::support::eventually(std::time::Duration::from_secs(30), "the API", || async {
        api.client
            .get(format!("{}/api/v1/stats", api.base))
            .bearer_auth(READ)
            .send()
            .await
            .is_ok_and(|r| r.status() == StatusCode::OK)
    })
    .await;

    let mut lock = store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE recovery_task IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (status, body) = api.get("/api/v1/stats", Some(READ)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("admin.statement_timeout"),
        "{body}"
    );
    lock.rollback().await.unwrap();
    let (status, _) = api.get("/api/v1/stats", Some(READ)).await;
    assert_eq!(status, StatusCode::OK);

    sqlx::query("ALTER TABLE recovery_audit RENAME TO recovery_audit_gone")
        .execute(store.pool())
        .await
        .unwrap();
    let (status, body) = api.get("/api/v1/audit", Some(READ)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("recovery_audit") && !error.contains("cannot be reached"),
        "{error}"
    );

    proxy.cut();
    let response = api
        .client
        .get(format!("{}/api/v1/stats", api.base))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().get("retry-after").is_some());
    let (_, body) = answer(response).await;
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("cannot be reached"),
        "{body}"
    );
    proxy.restore();
    member.stop().await;
}

/// Retry and resolve leave a task whose compensation has started alone, counted in
/// `refused`, unless `"force": true`; a discard takes no `force`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_and_resolve_over_a_started_compensation_need_force() {
    let (store, settings) = fresh_store().await;
    let api = Api::start(&store, &with_tokens(settings)).await;
    let id = keyed_tasks(&store, "log", &[b"k1"]).await[0];
    let lease = std::time::Duration::from_secs(30);
    let claimed = store.claim(&["log".into()], 1, "w", lease).await.unwrap();
    let failed = redrive::store::Finish {
        cause: None,
        lease: claimed[0].lease(),
        outcome: redrive::task::FinishOutcome::PermanentFailure,
        started_at: chrono::Utc::now(),
        duration: std::time::Duration::ZERO,
        error: Some("refused".into()),
        compensate: true,
    };
    store.finish("w", &[failed]).await.unwrap();
    let running = store
        .claim_compensations(&["log".into()], 1, "w", lease)
        .await
        .unwrap();
    assert_eq!(running.len(), 1);

    let ids = json!([id.0]);
    for (path, body) in [
        ("/api/v1/tasks/retry", json!({"ids": ids, "dry_run": true})),
        ("/api/v1/tasks/retry", json!({"ids": ids})),
        (
            "/api/v1/tasks/resolve",
            json!({"ids": ids, "reason": "by hand"}),
        ),
    ] {
        let (status, body) = api.post(path, Some(OPERATE), body).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (&body["matched"], &body["changed"], &body["refused"]),
            (&json!(0), &json!(0), &json!(1)),
            "{path}: {body}"
        );
    }
    let (status, body) = api
        .post(
            "/api/v1/tasks/discard",
            Some(OPERATE),
            json!({"ids": ids, "reason": "x", "force": true}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            json!({"ids": ids, "force": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((&body["changed"], &body["refused"]), (&json!(1), &json!(0)));
    let task = store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.checkpoint),
        (redrive::Status::Failed, None)
    );
    assert_eq!(
        store.compensation(id).await.unwrap().unwrap().state,
        "cancelled"
    );
}

/// Found by the second issue 16 attack: a bulk action whose client had hung up was cut
/// short by the member's SIGTERM with nothing said anywhere. The member still stops
/// promptly, and now warns what it left: the tasks changed so far (counted by the audit
/// entry) and that the same selection finishes the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_stopped_mid_bulk_action_says_what_it_left() {
    let (store, settings) = fresh_store().await;
    const TASKS: i64 = 200_000;
    let tasks: Vec<NewTask> = (0..TASKS)
        .map(|i| NewTask::new("log", format!("v{i}").into_bytes()))
        .collect();
    for chunk in tasks.chunks(10_000) {
        store.enqueue_many(chunk).await.unwrap();
    }
    let mut console = crate::support::console::Console::start(&settings, false).await;
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(100))
        .build()
        .unwrap();
    let sent = impatient
        .post(format!("{}/api/v1/tasks/discard", console.base))
        .bearer_auth(OPERATE)
        .json(&json!({"filter": {"handler": "log"}, "reason": "hang up"}))
        .send()
        .await;
    assert!(
        sent.is_err_and(|e| e.is_timeout()),
        "the client gave up first"
    );
    let discarded = "SELECT count(*) FROM recovery_task WHERE status = 'discarded'";
    eventually(
        std::time::Duration::from_secs(30),
        "a first batch discarded",
        || async { scalar(&store, discarded).await > 0 },
    )
    .await;
    console.member.signal(libc::SIGTERM);
    console
        .member
        .stopped(std::time::Duration::from_secs(30))
        .await;
    let changed = scalar(&store, discarded).await;
    assert!(changed < TASKS, "stopped before its end: {changed}");
    assert_eq!(
        scalar(
            &store,
            "SELECT max(count) FROM recovery_audit WHERE action = 'discard'"
        )
        .await,
        changed,
        "the audit entry counts what changed"
    );
    let warned = console
        .member
        .log_lines("a bulk action was stopped before its end");
    assert_eq!(warned.len(), 1, "{}", console.member.log_tail());
    let told: i64 = (warned[0].split("changed_at_least=").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("the warning says how many changed");
    assert!(0 < told && told <= changed, "{}", warned[0]);
}
