//! The republish handler and parking against the mock cluster, including a broker outage.

use rdkafka::message::Message;
use redrive::config::RouteMode;
use redrive::{Header, Status};
use std::time::Duration;

use crate::support::broker::{
    bytes, consume, headers_of, produce, producer, route, KafkaCase, Sample,
};
use crate::support::{eventually, scalar, Member};
use crate::support::{fleet, task_at};

fn spring_context(topic: &str) -> Vec<Header> {
    vec![
        Header::new("kafka_dlt-original-topic", topic.as_bytes().to_vec()),
        Header::new("kafka_dlt-original-partition", 0i32.to_be_bytes().to_vec()),
        Header::new("kafka_dlt-original-offset", 12i64.to_be_bytes().to_vec()),
        Header::new("kafka_dlt-exception-message", b"downstream 503".to_vec()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn republish_writes_the_same_bytes_and_replaces_context_headers() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        settings,
    } = KafkaCase::new(
        &[("orders.dlt", 1), ("orders", 1)],
        vec![route(&["orders.dlt"], RouteMode::Capture, "republish")],
    )
    .await;
    let app_headers = vec![
        Header::new("traceparent", b"00-4bf92f-00f067-01".to_vec()),
        Header::new("bin", vec![0xff, 0x00]),
        Header {
            name: "none".into(),
            value: None,
        },
        Header::new("bin", vec![0x01]),
    ];
    let mut headers = app_headers.clone();
    headers.push(Header::new("redrive-task-id", b"999".to_vec()));
    headers.extend(spring_context("orders"));
    let sample = Sample {
        key: Some(vec![0x00, b'k']),
        value: Some(vec![0xc3, 0x28, b'{', 0x00]),
        headers,
        partition: None,
    };
    produce(&producer(&bootstrap), "orders.dlt", &sample).await;
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "the task resolved", || async {
        store.status_counts().await.unwrap().resolved == 1
    })
    .await;
    running.stop().await;
    let task = task_at(&store, "orders.dlt", 0, 0).await;

    let bootstrap2 = bootstrap.clone();
    let out = tokio::task::spawn_blocking(move || {
        consume(&bootstrap2, "orders", 1, 1, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(bytes(&out[0]), (sample.key.clone(), sample.value.clone()));
    let mut expected = app_headers;
    expected.push(Header::new(
        "redrive-task-id",
        task.id.to_string().into_bytes(),
    ));
    expected.push(Header::new("redrive-attempt", b"1".to_vec()));
    expected.push(Header::new("redrive-generation", b"1".to_vec()));
    assert_eq!(headers_of(&out[0]), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_parked_with_its_context() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("anon.dlt", 1), ("parking", 1)],
        vec![route(&["anon.dlt"], RouteMode::Capture, "republish")],
    )
    .await;
    settings.parking.topic = Some("parking".into());
    let sample = Sample {
        key: Some(b"k".to_vec()),
        value: Some(vec![0xfe, 0xff]),
        ..Sample::default()
    };
    produce(&producer(&bootstrap), "anon.dlt", &sample).await;
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "a permanent failure", || async {
        store.status_counts().await.unwrap().permanent_failure == 1
    })
    .await;
    let bootstrap2 = bootstrap.clone();
    let parked = tokio::task::spawn_blocking(move || {
        consume(&bootstrap2, "parking", 1, 1, Duration::from_secs(20))
    })
    .await
    .unwrap();
    running.stop().await;
    let task = task_at(&store, "anon.dlt", 0, 0).await;
    assert_eq!(task.status, Status::PermanentFailure);
    assert!(task
        .last_error
        .unwrap()
        .contains("no topic to republish to"));
    assert_eq!(parked.len(), 1, "parked once");
    assert_eq!(bytes(&parked[0]), (sample.key, sample.value));
    let headers = headers_of(&parked[0]);
    let get = |name: &str| {
        let h = headers
            .iter()
            .find(|h| h.name_is(name))
            .unwrap_or_else(|| panic!("{name} in {headers:?}"));
        String::from_utf8(h.value.clone().unwrap()).unwrap()
    };
    assert_eq!(get("redrive-original-topic"), "anon.dlt");
    assert_eq!(get("redrive-original-offset"), "0");
    assert_eq!(get("redrive-attempts"), "1");
    assert_eq!(get("redrive-task-id"), task.id.to_string());
    assert!(get("redrive-error-message").contains("no topic to republish to"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_broker_outage_pauses_ingest_and_republish_and_loses_nothing() {
    let KafkaCase {
        broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("flaky.dlt", 2), ("flaky", 2)],
        vec![route(&["flaky.dlt"], RouteMode::Capture, "republish")],
    )
    .await;
    settings.retry.backoff_base = Duration::from_millis(100);
    settings.retry.backoff_cap = Duration::from_secs(1);
    let producer = producer(&bootstrap);
    for i in 0..100 {
        let sample = Sample {
            value: Some(format!("event {i}").into()),
            headers: spring_context("flaky"),
            ..Sample::default()
        };
        produce(&producer, "flaky.dlt", &sample).await;
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "some tasks stored", || async {
        scalar(&store, "SELECT count(*) FROM recovery_task").await > 0
    })
    .await;
    broker.broker_down(1).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    broker.broker_up(1).unwrap();
    for i in 100..150 {
        let sample = Sample {
            value: Some(format!("event {i}").into()),
            headers: spring_context("flaky"),
            ..Sample::default()
        };
        produce(&producer, "flaky.dlt", &sample).await;
    }
    eventually(Duration::from_secs(90), "150 tasks resolved", || async {
        store.status_counts().await.unwrap().resolved == 150
    })
    .await;
    running.stop().await;
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        150,
        "one task per message"
    );
    let out = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "flaky", 2, 151, Duration::from_secs(10))
    })
    .await
    .unwrap();
    let mut values: Vec<Vec<u8>> = out.iter().map(|m| m.payload().unwrap().to_vec()).collect();
    values.sort();
    values.dedup();
    assert_eq!(
        (out.len(), values.len()),
        (150, 150),
        "each message republished exactly once"
    );
}
