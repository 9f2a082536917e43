//! Per-route targets: each route's failures are republished and parked to its own
//! topics (mock cluster), and `tasks show` (binary) and the API's detail say which
//! topics apply, falling back to the global keys for a route no longer configured.

use redrive::config::RouteMode;
use redrive::{Header, Status, Task};
use reqwest::StatusCode;
use std::io::Write;
use std::time::Duration;

use crate::support::api::{with_tokens, Api, READ};
use crate::support::broker::Sample;
use crate::support::broker::{bytes, consume, headers_of, produce, producer, route, KafkaCase};
use crate::support::cli::run;
use crate::support::{eventually, fresh_store, Member};
use crate::support::{fleet, task_at};

/// Spring dead-letter headers of a message from `topic`.
fn spring(topic: &str) -> Vec<Header> {
    vec![
        Header::new("kafka_dlt-original-topic", topic.as_bytes().to_vec()),
        Header::new("kafka_dlt-original-partition", 0i32.to_be_bytes().to_vec()),
        Header::new("kafka_dlt-original-offset", 3i64.to_be_bytes().to_vec()),
    ]
}

/// The value of header `name` of a produced message, as text.
fn header(headers: &[Header], name: &str) -> String {
    let found = headers.iter().find(|h| h.name_is(name));
    let value = found.and_then(|h| h.value.clone());
    String::from_utf8(value.unwrap_or_else(|| panic!("{name} in {headers:?}"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn each_routes_failures_go_to_its_own_republish_and_parking_topics() {
    let topics = [
        "orders.dlt",
        "payments.dlt",
        "orders.retry",
        "payments.retry",
        "orders.parking",
        "payments.parking",
    ];
    let mut routes = Vec::new();
    for name in ["orders", "payments"] {
        let dlt = format!("{name}.dlt");
        let mut own = route(&[dlt.as_str()], RouteMode::Capture, "republish");
        own.name = name.into();
        own.republish_topic = Some(format!("{name}.retry"));
        own.parking_topic = Some(format!("{name}.parking"));
        routes.push(own);
    }
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(&topics.map(|t| (t, 1)), routes).await;
    // A message over this size is stored without its payload, which republish refuses
    // permanently: that failure is parked.
    settings.ingest.max_message_bytes = 1000;
    let producer = producer(&bootstrap);
    for name in ["orders", "payments"] {
        let small = Sample {
            value: Some(format!("{name} event").into()),
            headers: spring(name),
            ..Sample::default()
        };
        produce(&producer, &format!("{name}.dlt"), &small).await;
        let large = Sample {
            value: Some(vec![b'x'; 2000]),
            headers: spring(name),
            ..Sample::default()
        };
        produce(&producer, &format!("{name}.dlt"), &large).await;
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "every task final", || async {
        let counts = store.status_counts().await.unwrap();
        (counts.resolved, counts.permanent_failure) == (2, 2)
    })
    .await;
    for name in ["orders", "payments"] {
        let dlt = format!("{name}.dlt");
        let republished = task_at(&store, &dlt, 0, 0).await;
        let parked = task_at(&store, &dlt, 0, 1).await;
        assert_eq!(republished.status, Status::Resolved);
        assert_eq!(parked.status, Status::PermanentFailure);
        let (retry, parking) = (format!("{name}.retry"), format!("{name}.parking"));
        let read = tokio::task::spawn_blocking({
            let bootstrap = bootstrap.clone();
            move || {
                let retried = consume(&bootstrap, &retry, 1, 2, Duration::from_secs(5));
                let parked = consume(&bootstrap, &parking, 1, 2, Duration::from_secs(5));
                (retried, parked)
            }
        });
        let (retried, parked_out) = read.await.unwrap();
        assert_eq!(
            retried.len(),
            1,
            "{name}: one message republished to its own topic"
        );
        assert_eq!(
            bytes(&retried[0]).1,
            Some(format!("{name} event").into_bytes())
        );
        assert_eq!(
            parked_out.len(),
            1,
            "{name}: one failure parked on its own topic"
        );
        let parked_headers = headers_of(&parked_out[0]);
        assert_eq!(
            header(&parked_headers, "redrive-task-id"),
            parked.id.to_string()
        );
    }
    running.stop().await;
}

/// A config file of the `payments` route only (`orders` is no longer configured), with
/// global defaults.
fn payments_only_toml() -> &'static str {
    r#"
[republish]
target_topic = "all.retry"

[parking]
topic = "all.parking"

[[routes]]
name = "payments"
topics = ["payments.dlt"]
mode = "capture"
handler = "republish"
republish_topic = "payments.retry"
parking_topic = "payments.parking"
"#
}

async fn captured(store: &redrive::Store, route: &str, topic: &str) -> Task {
    let mut task = redrive::NewTask::new("republish", b"v".to_vec());
    task.failure.route = Some(route.into());
    task.failure.original = Some(
        redrive::SourceCoordinates {
            topic: topic.into(),
            partition: 0,
            offset: 1,
        }
        .into(),
    );
    let id = store.enqueue(&task).await.unwrap().id();
    store.get(id).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_show_and_the_api_name_the_targets_that_apply_and_where_they_come_from() {
    let (store, mut settings) = fresh_store().await;
    let payments = captured(&store, "payments", "payments").await;
    let orders = captured(&store, "orders", "orders").await;

    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(payments_only_toml().as_bytes()).unwrap();
    let config = file.path().to_str().unwrap().to_owned();
    let show = |id: &Task| {
        let out = run(
            &settings,
            &["--config", &config, "tasks", "show", &id.id.to_string()],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let shown = show(&payments);
    assert!(
        shown.contains("republish_to           payments.retry (routes.payments.republish_topic)"),
        "{shown}"
    );
    assert!(
        shown.contains("parks_to               payments.parking (routes.payments.parking_topic)"),
        "{shown}"
    );
    let shown = show(&orders);
    assert!(
        shown.contains(
            "republish_to           all.retry (republish.target_topic (route \"orders\" is no longer configured))"
        ),
        "{shown}"
    );
    assert!(
        shown.contains(
            "parks_to               all.parking (parking.topic (route \"orders\" is no longer configured))"
        ),
        "{shown}"
    );

    settings = redrive::Settings::load(
        Some(file.path()),
        Some(
            [
                (
                    "REDRIVE__DATABASE__URL".to_owned(),
                    crate::support::database_url(),
                ),
                (
                    "REDRIVE__DATABASE__SCHEMA".to_owned(),
                    settings.database.schema.clone(),
                ),
            ]
            .into(),
        ),
    )
    .unwrap();
    let api = Api::start(&store, &with_tokens(settings)).await;
    let (status, body) = api
        .get(&format!("/api/v1/tasks/{}", payments.id), Some(READ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["targets"]["republish"]["topic"], "payments.retry");
    assert_eq!(body["targets"]["parking"]["topic"], "payments.parking");
    let (_, body) = api
        .get(&format!("/api/v1/tasks/{}", orders.id), Some(READ))
        .await;
    assert_eq!(body["targets"]["parking"]["topic"], "all.parking");
    assert_eq!(
        body["targets"]["parking"]["from"],
        "parking.topic (route \"orders\" is no longer configured)"
    );
}

/// Regression: a dead letter whose original topic is one this fleet's capture routes
/// consume (its own dead-letter topic, or another route's) was republished there, came
/// back as a new dead letter, and looped. The republish handler refuses it: the task
/// ends PERMANENT_FAILURE, parked, with the topic and the route in its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_dead_letter_whose_original_topic_a_capture_route_consumes_is_parked_not_republished() {
    let mut orders = route(&["orders1.dlt"], RouteMode::Capture, "republish");
    orders.name = "orders1".into();
    let mut payments = route(&["payments.dlt"], RouteMode::Capture, "log");
    payments.name = "payments".into();
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders1.dlt", 1), ("payments.dlt", 1), ("parking", 1)],
        vec![orders, payments],
    )
    .await;
    settings.parking.topic = Some("parking".into());
    let producer = producer(&bootstrap);
    let itself = Sample {
        value: Some(b"order 1".to_vec()),
        headers: vec![Header::new(
            "kafka_dlt-original-topic",
            b"orders1.dlt".to_vec(),
        )],
        ..Sample::default()
    };
    let other_route = Sample {
        value: Some(b"order 2".to_vec()),
        headers: spring("payments.dlt"),
        ..Sample::default()
    };
    produce(&producer, "orders1.dlt", &itself).await;
    produce(&producer, "orders1.dlt", &other_route).await;

    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "both tasks final", || async {
        let counts = store.status_counts().await.unwrap();
        counts.permanent_failure + counts.resolved >= 2
    })
    .await;
    let parked = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || consume(&bootstrap, "parking", 1, 2, Duration::from_secs(20))
    })
    .await
    .unwrap();
    running.stop().await;

    let cases = [
        (
            "orders1.dlt",
            "capture route \"orders1\" (routes[0].topics)",
        ),
        (
            "payments.dlt",
            "capture route \"payments\" (routes[1].topics)",
        ),
    ];
    for (offset, (topic, route)) in cases.into_iter().enumerate() {
        let task = task_at(&store, "orders1.dlt", 0, offset as i64).await;
        assert_eq!(task.status, Status::PermanentFailure, "{topic}");
        let error = task.last_error.clone().unwrap_or_default();
        assert!(
            error.contains(&format!(
                "republish to {topic:?} refused: it is consumed by {route}"
            )),
            "{error}"
        );
        let attempts = store.attempts(task.id).await.unwrap();
        assert_eq!(attempts.len(), 1, "one attempt, refused: {topic}");
    }
    let count = crate::support::scalar(&store, "SELECT count(*) FROM recovery_task").await;
    assert_eq!(count, 2, "nothing came back: nothing was republished");
    let produced = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            let dlt = consume(&bootstrap, "orders1.dlt", 1, 3, Duration::from_secs(3));
            let payments = consume(&bootstrap, "payments.dlt", 1, 1, Duration::from_secs(3));
            (dlt.len(), payments.len())
        }
    })
    .await
    .unwrap();
    assert_eq!(produced, (2, 0), "no message republished");
    assert_eq!(parked.len(), 2, "each parked");
}
