//! Dead letters that carry less than a whole record: the original topic alone (the
//! compose quickstart's samples), and Kafka share groups' DLQ records, which carry only
//! headers by default and are stored with their original record fetched from its topic.

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::Message;
use redrive::{Header, Settings, Status, Store};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::support::broker::{
    cluster, consume, headers_of, produce, producer, route, use_cluster, KafkaCase, Sample,
};
use crate::support::{database_url, eventually, fresh_store, Member};
use crate::support::{fleet, task_at};
use redrive::config::RouteMode;

/// The messages of `deploy/sample-dead-letters.txt` as docker-compose.yml produces them
/// (`kafka-console-producer.sh --property parse.key=true --property parse.headers=true`):
/// `name:value,name:value`, a tab, the key, a tab, the value.
fn compose_samples() -> Vec<Sample> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/sample-dead-letters.txt");
    let text = std::fs::read_to_string(path).expect("the compose samples");
    text.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let mut fields = line.splitn(3, '\t');
            let (headers, key, value) = (
                fields.next().unwrap(),
                fields.next().expect("a key"),
                fields.next().expect("a value"),
            );
            let headers = headers
                .split(',')
                .map(|pair| {
                    let (name, value) = pair.split_once(':').expect("name:value");
                    Header::new(name, value.as_bytes().to_vec())
                })
                .collect();
            Sample {
                key: Some(key.as_bytes().to_vec()),
                value: Some(value.as_bytes().to_vec()),
                headers,
                partition: None,
            }
        })
        .collect()
}

/// The compose members' configuration (`deploy/redrive/redrive.toml`), pointed at
/// `bootstrap` and a fresh schema as the compose environment points it at its own.
fn compose_settings(bootstrap: &str, schema: &str) -> Settings {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/redrive/redrive.toml");
    let env = HashMap::from([
        ("REDRIVE__DATABASE__URL".to_owned(), database_url()),
        ("REDRIVE__DATABASE__SCHEMA".to_owned(), schema.to_owned()),
        (
            "REDRIVE__KAFKA__BOOTSTRAP_SERVERS".to_owned(),
            bootstrap.to_owned(),
        ),
    ]);
    let mut settings = Settings::load(Some(&path), Some(env)).expect("the compose config");
    // The mock cluster's group wants quick timings (see broker::use_cluster).
    let routes = settings.routes.clone();
    use_cluster(&mut settings, bootstrap, routes);
    settings.worker.poll_interval = Duration::from_millis(200);
    settings
}

/// Regression: the quickstart's samples carry the original topic alone, and every one
/// ended PERMANENT_FAILURE "no known dead-letter headers": the quickstart showed only
/// failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_quickstart_samples_end_resolved() {
    let broker = cluster(&[("orders", 3), ("orders.dlt", 3), ("orders.parking", 3)]);
    let bootstrap = broker.bootstrap_servers();
    let (store, fresh) = fresh_store().await;
    let settings = compose_settings(&bootstrap, &fresh.database.schema);
    let samples = compose_samples();
    assert_eq!(samples.len(), 3, "the file's samples");
    let producer = producer(&bootstrap);
    for sample in &samples {
        produce(&producer, "orders.dlt", sample).await;
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "every sample resolved", || async {
        let counts = store.status_counts().await.unwrap();
        counts.resolved == 3 || counts.permanent_failure > 0
    })
    .await;
    running.stop().await;
    let counts = store.status_counts().await.unwrap();
    assert_eq!(
        (counts.resolved, counts.permanent_failure),
        (3, 0),
        "{counts:?}"
    );
    let republished = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "orders", 3, 3, Duration::from_secs(20))
    })
    .await
    .unwrap();
    let mut values: Vec<Vec<u8>> = republished
        .iter()
        .map(|m| crate::support::broker::bytes(m).1.unwrap())
        .collect();
    values.sort();
    let mut sent: Vec<Vec<u8>> = samples.into_iter().map(|s| s.value.unwrap()).collect();
    sent.sort();
    assert_eq!(values, sent, "each sample back on its original topic");
}

/// The headers a Kafka share group's DLQ writes (KIP-1191), as the broker's
/// `ShareGroupDLQStateManager` encodes them: UTF-8 text.
fn share_group_headers(topic: &[u8], partition: &[u8], offset: &[u8]) -> Vec<Header> {
    vec![
        Header::new("__dlq.errors.topic", topic.to_vec()),
        Header::new("__dlq.errors.partition", partition.to_vec()),
        Header::new("__dlq.errors.offset", offset.to_vec()),
        Header::new("__dlq.errors.group", b"billing-workers".to_vec()),
        Header::new("__dlq.errors.delivery.count", b"5".to_vec()),
        Header::new(
            "__dlq.errors.message",
            b"Offset delivery count exceeded the threshold.".to_vec(),
        ),
    ]
}

/// A cluster of `topics`, and a store and settings whose one route captures the share
/// group's dead-letter topic `billing.dlq` and republishes its originals.
async fn billing_dlq(
    topics: &[(&str, i32)],
) -> (
    MockCluster<'static, DefaultProducerContext>,
    Store,
    Settings,
) {
    let capture = route(&["billing.dlq"], RouteMode::Capture, "republish");
    let KafkaCase {
        broker,
        store,
        settings,
        ..
    } = KafkaCase::new(topics, vec![capture]).await;
    (broker, store, settings)
}

/// Runs a member on `settings` until `count` tasks are stored, then stops it.
async fn run_until_stored(settings: &Settings, store: &Store, count: i64) {
    let running = Member::start(fleet(settings), store);
    eventually(
        Duration::from_secs(60),
        &format!("{count} dead letters stored"),
        || async {
            crate::support::scalar(store, "SELECT count(*) FROM recovery_task").await == count
        },
    )
    .await;
    running.stop().await;
}

/// A headers-only dead letter (no key, no value), as a share group's DLQ writes it.
fn headers_only(headers: Vec<Header>) -> Sample {
    Sample {
        headers,
        ..Sample::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_group_dead_letter_is_stored_with_its_original_and_recovers() {
    let (broker, store, settings) = billing_dlq(&[("billing", 2), ("billing.dlq", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    let producer = producer(&bootstrap);
    let filler = Sample {
        value: Some(b"other".to_vec()),
        partition: Some(1),
        ..Sample::default()
    };
    produce(&producer, "billing", &filler).await;
    let app_headers = vec![
        Header::new("traceparent", b"00-4bf92f-00f067-01".to_vec()),
        Header::new("bin", vec![0xff, 0x00]),
    ];
    let original = Sample {
        key: Some(vec![0x00, b'k']),
        value: Some(vec![0xc3, 0x28, b'{', 0x00]),
        headers: app_headers.clone(),
        partition: Some(1),
    };
    let (partition, offset) = produce(&producer, "billing", &original).await;
    assert_eq!((partition, offset), (1, 1));
    let dead_letter = share_group_headers(b"billing", b"1", b"1");
    // A header on the dead letter that is no failure context is not the original's:
    // neither stored nor republished (it was both).
    let mut sent = dead_letter.clone();
    sent.push(Header::new("x-case", b"s01".to_vec()));
    produce(&producer, "billing.dlq", &headers_only(sent)).await;

    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "the task resolved", || async {
        store.status_counts().await.unwrap().resolved == 1
    })
    .await;
    running.stop().await;

    let task = task_at(&store, "billing.dlq", 0, 0).await;
    assert_eq!(task.status, Status::Resolved);
    assert_eq!(task.failure.key, original.key);
    assert_eq!(task.failure.value, original.value);
    assert_eq!(task.failure.value_size, Some(4));
    let mut stored_headers = app_headers.clone();
    stored_headers.extend(dead_letter);
    assert_eq!(
        task.failure.headers, stored_headers,
        "the original's headers, then the dead letter's as context"
    );
    let at = task.failure.original.clone().unwrap();
    assert_eq!(
        (at.topic.as_str(), at.partition, at.offset),
        ("billing", Some(1), Some(1))
    );
    assert_eq!(
        task.failure.error_message.as_deref(),
        Some(
            "Offset delivery count exceeded the threshold. \
             (share group billing-workers, delivered 5 times)"
        )
    );
    assert!(
        task.failure
            .ingest_note
            .as_deref()
            .unwrap()
            .contains("fetched from the original record at billing[1]@1"),
        "{:?}",
        task.failure.ingest_note
    );
    assert!(
        (task.failure.ingest_note.as_deref().unwrap())
            .contains("the dead letter's other headers are not kept (x-case)"),
        "{:?}",
        task.failure.ingest_note
    );

    // Republished as the original was, without the DLQ's headers.
    let out = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "billing", 2, 3, Duration::from_secs(20))
    })
    .await
    .unwrap();
    let again: Vec<_> = out
        .iter()
        .filter(|m| headers_of(m).iter().any(|h| h.name_is("redrive-task-id")))
        .collect();
    assert_eq!(again.len(), 1, "republished once");
    assert_eq!(
        crate::support::broker::bytes(again[0]),
        (original.key.clone(), original.value.clone())
    );
    let mut expected = app_headers;
    expected.push(Header::new(
        "redrive-task-id",
        task.id.to_string().into_bytes(),
    ));
    expected.push(Header::new("redrive-attempt", b"1".to_vec()));
    expected.push(Header::new("redrive-generation", b"1".to_vec()));
    assert_eq!(headers_of(again[0]), expected);
}

/// A dead letter's topic, partition and offset headers, and why its original is gone.
type GoneCase = (&'static [u8], &'static [u8], &'static [u8], &'static str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_group_dead_letter_whose_original_is_gone_is_a_parked_permanent_failure() {
    let (broker, store, mut settings) =
        billing_dlq(&[("billing", 1), ("billing.dlq", 1), ("parking", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    settings.parking.topic = Some("parking".into());
    let producer = producer(&bootstrap);
    let only = Sample {
        value: Some(b"v".to_vec()),
        ..Sample::default()
    };
    produce(&producer, "billing", &only).await;
    let cases: [GoneCase; 3] = [
        (
            b"deleted-topic",
            b"0",
            b"3",
            "topic \"deleted-topic\" does not exist",
        ),
        (b"billing", b"4", b"0", "the topic has no partition 4"),
        (
            b"billing",
            b"0",
            b"1000",
            "offset 1000 is past the partition's end (1)",
        ),
    ];
    for (topic, partition, offset, _) in &cases {
        let sample = headers_only(share_group_headers(topic, partition, offset));
        produce(&producer, "billing.dlq", &sample).await;
    }

    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "3 permanent failures", || async {
        store.status_counts().await.unwrap().permanent_failure == 3
    })
    .await;
    let parked = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "parking", 1, 3, Duration::from_secs(20))
    })
    .await
    .unwrap();
    running.stop().await;

    for (offset, (_, _, _, why)) in cases.iter().enumerate() {
        let task = task_at(&store, "billing.dlq", 0, offset as i64).await;
        assert_eq!(task.status, Status::PermanentFailure, "{why}");
        assert_eq!(task.attempts, 0, "never republished: {why}");
        assert_eq!(
            task.failure.error_class.as_deref(),
            Some("redrive.OriginalUnavailable")
        );
        let error = task.failure.error_message.clone().unwrap();
        assert!(
            error.contains("could not be fetched") && error.contains(why),
            "{why}: {error}"
        );
        assert!(
            error.contains("(dead-lettered: Offset delivery count exceeded"),
            "{error}"
        );
        assert_eq!(
            task.failure.ingest_note.as_deref().map(|n| n.contains(why)),
            Some(true)
        );
        assert!(!task.failure.payload_stored, "nothing to republish");
        assert!(
            task.failure
                .headers
                .iter()
                .any(|h| h.name_is("__dlq.errors.group")),
            "the dead letter's context is kept"
        );
    }
    assert_eq!(parked.len(), 3, "each parked");
}

/// Hostile `__dlq.errors.*` values: neither a panic nor a fetch of a made-up record;
/// each dead letter is stored, with what could not be read in its note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_share_group_headers_are_stored_as_unfetchable() {
    let (broker, store, mut settings) = billing_dlq(&[("billing", 1), ("billing.dlq", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    settings.worker.enabled = false;
    let producer = producer(&bootstrap);
    let hostile: [(&[u8], &[u8], &[u8]); 5] = [
        (b"billing", b"one", b"0"),
        (b"billing", b"0", b"-1"),
        (b"billing", b"99999999999", b"0"),
        (b"billing", b"0", b"123456789012345678901234567890"),
        (b"bill\xffing\x00", b"\xc3\x28", b"\xff\xfe\xfd\xfc"),
    ];
    for (topic, partition, offset) in hostile {
        let sample = headers_only(share_group_headers(topic, partition, offset));
        produce(&producer, "billing.dlq", &sample).await;
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "5 tasks", || async {
        store.status_counts().await.unwrap().permanent_failure == 5
    })
    .await;
    running.stop().await;
    for offset in 0..5 {
        let task = task_at(&store, "billing.dlq", 0, offset).await;
        let note = task.failure.ingest_note.clone().unwrap();
        // The last one's topic is no topic name either.
        let why = match offset {
            4 => "no readable original topic",
            _ => "its partition or offset is not readable",
        };
        assert!(
            note.contains("kafka-share-group headers incomplete")
                && note.contains("unreadable")
                && note.contains(why),
            "{offset}: {note}"
        );
        assert_eq!(
            task.failure.error_class.as_deref(),
            Some("redrive.OriginalUnavailable")
        );
    }
}

/// A redelivered share-group dead letter (here: read again by another group) is the
/// task recorded the first time, even when its original cannot be fetched any more:
/// not a second task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_redelivered_share_group_dead_letter_is_not_recorded_twice() {
    let (broker, store, mut settings) = billing_dlq(&[("billing", 1), ("billing.dlq", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    settings.worker.enabled = false;
    let producer = producer(&bootstrap);
    let original = Sample {
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        ..Sample::default()
    };
    produce(&producer, "billing", &original).await;
    let dead_letter = headers_only(share_group_headers(b"billing", b"0", b"0"));
    produce(&producer, "billing.dlq", &dead_letter).await;
    let count =
        || async { crate::support::scalar(&store, "SELECT count(*) FROM recovery_task").await };
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "the task", || async {
        count().await == 1
    })
    .await;
    running.stop().await;
    let first = task_at(&store, "billing.dlq", 0, 0).await;
    assert_eq!(first.failure.value.as_deref(), Some(&b"v"[..]));

    // Another group reads the dead letter again; its original is out of reach now.
    let mut again = settings.clone();
    again.kafka.group_id = format!("{}-again", settings.kafka.group_id);
    again.ingest.original_fetch_timeout = Duration::from_millis(1);
    let running = Member::start(fleet(&again), &store);
    eventually(
        Duration::from_secs(60),
        "the dead letter read again",
        || async {
            let (bootstrap, group) = (bootstrap.clone(), again.kafka.group_id.clone());
            let committed = tokio::task::spawn_blocking(move || {
                crate::support::broker::committed(&bootstrap, &group, "billing.dlq", 1)
            });
            committed.await.unwrap() == [1]
        },
    )
    .await;
    running.stop().await;
    assert_eq!(count().await, 1, "one task for one dead letter");
    let task = task_at(&store, "billing.dlq", 0, 0).await;
    assert_eq!(task.status, Status::Failed);
    assert_eq!(task.failure, first.failure);
}

/// The broker may write one share-group dead letter twice (a produce it retried after
/// a timeout): two records at two offsets of the dead-letter topic. They are one
/// failure, identified by the group and the original coordinates (each was a task of
/// its own, keyed by the dead letter's own offset); the disposition is stored and
/// filters, and a Karafka 2.5 dead letter (`source_*`) is recognised, its group said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_share_group_dead_letter_written_twice_is_one_task_with_its_disposition() {
    let (broker, store, mut settings) =
        billing_dlq(&[("billing", 1), ("billing.dlq", 1), ("events", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    settings.worker.enabled = false;
    settings.routes[0].topics.push("events.dlq".into());
    broker.create_topic("events.dlq", 1, 1).unwrap();
    let producer = producer(&bootstrap);
    let original = Sample {
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        ..Sample::default()
    };
    produce(&producer, "billing", &original).await;
    let dead_letter = headers_only(share_group_headers(b"billing", b"0", b"0"));
    produce(&producer, "billing.dlq", &dead_letter).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    produce(&producer, "billing.dlq", &dead_letter).await;
    let mut rejected = share_group_headers(b"billing", b"0", b"1");
    rejected.retain(|h| h.name != b"__dlq.errors.message");
    rejected.push(Header::new(
        "__dlq.errors.message",
        b"Offset rejected by client.".to_vec(),
    ));
    rejected.push(Header::new(
        "__dlq.errors.message",
        b"Offset rejected by client.".to_vec(),
    ));
    let copied = Sample {
        key: Some(b"k1".to_vec()),
        value: Some(b"v1".to_vec()),
        headers: rejected,
        ..Sample::default()
    };
    produce(&producer, "billing.dlq", &copied).await;
    // Found by an attack: a group of 2,700 bytes made a dedup key PostgreSQL cannot
    // index, and ingest stopped at it (this partition and every later commit).
    let mut long_group = share_group_headers(b"billing", b"0", b"2");
    long_group.retain(|h| h.name != b"__dlq.errors.group");
    long_group.push(Header::new("__dlq.errors.group", vec![b'g'; 2700]));
    let long_group = Sample {
        key: Some(b"k2".to_vec()),
        value: Some(b"v2".to_vec()),
        headers: long_group,
        ..Sample::default()
    };
    produce(&producer, "billing.dlq", &long_group).await;
    let karafka = Sample {
        key: Some(b"customer-7".to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![
            Header::new("source_topic", b"events".to_vec()),
            Header::new("source_partition", b"0".to_vec()),
            Header::new("source_offset", b"12".to_vec()),
            Header::new("source_consumer_group", b"karafka_app".to_vec()),
            Header::new("source_attempts", b"3".to_vec()),
        ],
        ..Sample::default()
    };
    produce(&producer, "events.dlq", &karafka).await;
    let running = Member::start(fleet(&settings), &store);
    eventually(
        Duration::from_secs(60),
        "every dead letter read",
        || async {
            let (bootstrap, group) = (bootstrap.clone(), settings.kafka.group_id.clone());
            let committed = tokio::task::spawn_blocking(move || {
                (
                    crate::support::broker::committed(&bootstrap, &group, "billing.dlq", 1),
                    crate::support::broker::committed(&bootstrap, &group, "events.dlq", 1),
                )
            });
            committed.await.unwrap() == (vec![4], vec![1])
        },
    )
    .await;
    running.stop().await;
    let mut rows: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT dedup_key, disposition, error_message FROM recovery_task \
         ORDER BY source_topic, source_offset",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 4, "{rows:#?}");
    let long = rows.remove(2);
    assert!(long.0.starts_with("kafka-share-dlq:sha256-"), "{}", long.0);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_deref()),
        (
            "kafka-share-dlq:billing-workers:billing:0:0",
            Some("delivery_count_exceeded")
        )
    );
    assert_eq!(rows[1].1.as_deref(), Some("rejected"));
    assert_eq!(rows[2].1, None);
    assert_eq!(
        rows[2].2.as_deref(),
        Some("consumer group karafka_app, 3 attempts")
    );
    let karafka_task = task_at(&store, "events.dlq", 0, 0).await;
    assert_eq!(
        karafka_task.failure.original.map(|o| o.to_string()),
        Some("events[0]@12".to_owned())
    );
    let filter = redrive::store::TaskFilter {
        disposition: Some("rejected".into()),
        ..Default::default()
    };
    let page = store.list(&filter, None, 10).await.unwrap();
    assert_eq!(page.len(), 1, "the disposition filters");
}

/// A record redrive republished that fails again in a share group comes back as a
/// headers-only dead letter: the `redrive-task-id` that links it is in the original
/// record fetched, not in the dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_republished_record_failing_again_in_its_share_group_links_to_its_task() {
    let (broker, store, settings) = billing_dlq(&[("billing", 1), ("billing.dlq", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    let producer = producer(&bootstrap);
    let original = Sample {
        value: Some(b"{\"invoice\":7}".to_vec()),
        ..Sample::default()
    };
    let (partition, offset) = produce(&producer, "billing", &original).await;
    let first_letter = share_group_headers(b"billing", b"0", offset.to_string().as_bytes());
    produce(&producer, "billing.dlq", &headers_only(first_letter)).await;

    let running = Member::start(fleet(&settings), &store);
    eventually(
        Duration::from_secs(60),
        "the first task resolved",
        || async { store.status_counts().await.unwrap().resolved == 1 },
    )
    .await;
    let first = task_at(&store, "billing.dlq", 0, 0).await;
    let bootstrap_for_read = bootstrap.clone();
    let out = tokio::task::spawn_blocking(move || {
        consume(
            &bootstrap_for_read,
            "billing",
            1,
            2,
            Duration::from_secs(20),
        )
    })
    .await
    .unwrap();
    let republished = (out.iter())
        .find(|m| headers_of(m).iter().any(|h| h.name_is("redrive-task-id")))
        .expect("the first task republished");
    assert_eq!(partition, republished.partition());

    // Its consumer's share group gives up on the republished record too.
    let again = republished.offset().to_string();
    let second_letter = share_group_headers(b"billing", b"0", again.as_bytes());
    produce(&producer, "billing.dlq", &headers_only(second_letter)).await;
    eventually(
        Duration::from_secs(60),
        "the second task stored",
        || async {
            let counts = store.status_counts().await.unwrap();
            counts.resolved + counts.failed + counts.permanent_failure == 2
        },
    )
    .await;
    running.stop().await;

    let second = task_at(&store, "billing.dlq", 0, 1).await;
    assert_eq!(second.failure.value, original.value);
    assert_eq!(
        (second.failure.generation, second.failure.previous_task),
        (2, Some(first.id)),
        "linked through the fetched original's header: {:?}",
        second.failure.ingest_note
    );
}

/// The `Failed` task of route `route` for a message from `topic` (partition 0, offset
/// 5), enqueued directly: the task a re-failure names.
async fn stored_task(store: &redrive::Store, route: &str, topic: &str) -> redrive::TaskId {
    let mut task = redrive::NewTask::new("log", b"v".to_vec());
    task.failure.route = Some(route.into());
    task.failure.original = Some(
        redrive::SourceCoordinates {
            topic: topic.into(),
            partition: 0,
            offset: 5,
        }
        .into(),
    );
    store.enqueue(&task).await.unwrap().id()
}

/// Spring dead-letter headers of a record from `topic` at partition 0, `offset`.
fn spring(topic: &str, offset: i64) -> Vec<Header> {
    vec![
        Header::new("kafka_dlt-original-topic", topic.as_bytes().to_vec()),
        Header::new("kafka_dlt-original-partition", 0i32.to_be_bytes().to_vec()),
        Header::new("kafka_dlt-original-offset", offset.to_be_bytes().to_vec()),
    ]
}

/// Regression: a share-group dead letter whose "original" is itself a headers-only
/// record was republished as an empty record; so was one whose topic header is not
/// readable, to the route's `republish_topic`. Both are unavailable originals now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_headers_only_original_or_an_unreadable_topic_is_unavailable_never_republished_empty() {
    let mut billing = route(&["billing.dlq"], RouteMode::Capture, "republish");
    billing.republish_topic = Some("billing.retry".into());
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        settings,
    } = KafkaCase::new(
        &[("billing", 1), ("billing.dlq", 1), ("billing.retry", 1)],
        vec![billing],
    )
    .await;
    let producer = producer(&bootstrap);
    // Itself a share group's dead letter: headers only.
    let empty = headers_only(share_group_headers(b"elsewhere", b"0", b"3"));
    produce(&producer, "billing", &empty).await;
    let pointing_at_it = headers_only(share_group_headers(b"billing", b"0", b"0"));
    produce(&producer, "billing.dlq", &pointing_at_it).await;
    let no_topic = headers_only(share_group_headers(b" ", b"0", b"0"));
    produce(&producer, "billing.dlq", &no_topic).await;

    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "both tasks final", || async {
        let counts = store.status_counts().await.unwrap();
        counts.resolved + counts.permanent_failure == 2
    })
    .await;
    running.stop().await;
    let whys = [
        "the original record at billing[0]@0 holds no key and no value",
        "the dead letter carried no key, no value and no readable original topic",
    ];
    for (offset, why) in whys.into_iter().enumerate() {
        let task = task_at(&store, "billing.dlq", 0, offset as i64).await;
        assert_eq!(task.status, Status::PermanentFailure, "{why}");
        assert_eq!(task.attempts, 0, "never republished: {why}");
        assert_eq!(
            task.failure.error_class.as_deref(),
            Some("redrive.OriginalUnavailable")
        );
        let error = task.failure.error_message.clone().unwrap();
        assert!(error.starts_with(why), "{why}: {error}");
        assert!(!task.failure.payload_stored);
    }
}

/// Regression: the ingest note said "republished to the original topic" on tasks that
/// never would be (stored PERMANENT_FAILURE, or of a route whose handler is not
/// `republish`), and said nothing on a stopped re-failure. Each note now ends with what
/// happens to its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ingest_note_says_what_happens_to_the_task() {
    let mut orders = route(&["orders.dlt"], RouteMode::Capture, "republish");
    orders.name = "orders".into();
    orders.max_generations = Some(1);
    orders.parking_topic = Some("orders.parking".into());
    let mut audit = route(&["audit.dlt"], RouteMode::Capture, "log");
    audit.name = "audit".into();
    let topics = [
        ("orders", 1),
        ("orders.dlt", 1),
        ("orders.parking", 1),
        ("audit.dlt", 1),
    ];
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(&topics, vec![orders, audit]).await;
    settings.worker.enabled = false;
    let ancestor = stored_task(&store, "orders", "orders").await;
    let producer = producer(&bootstrap);
    produce(&producer, "orders", &headers_only(Vec::new())).await;
    let topic_alone = vec![Header::new("kafka_dlt-original-topic", b"orders".to_vec())];
    let mut refailure = spring("orders", 5);
    refailure.push(Header::new(
        "redrive-task-id",
        ancestor.to_string().into_bytes(),
    ));
    let letters = [
        Sample {
            value: Some(b"v".to_vec()),
            headers: topic_alone.clone(),
            ..Sample::default()
        },
        headers_only(share_group_headers(b"orders", b"0", b"1000")),
        headers_only(share_group_headers(b"orders", b"0", b"0")),
        Sample {
            value: Some(b"v".to_vec()),
            headers: refailure,
            ..Sample::default()
        },
        Sample {
            value: Some(b"v".to_vec()),
            headers: spring("orders.dlt", 0),
            ..Sample::default()
        },
    ];
    for letter in &letters {
        produce(&producer, "orders.dlt", letter).await;
    }
    let audited = Sample {
        value: Some(b"v".to_vec()),
        headers: vec![Header::new("kafka_dlt-original-topic", b"audit".to_vec())],
        ..Sample::default()
    };
    produce(&producer, "audit.dlt", &audited).await;
    run_until_stored(&settings, &store, 7).await;

    let parked = "parked to \"orders.parking\"";
    let expected: [(&str, i64, Status, &str, String); 6] = [
        (
            "orders.dlt",
            0,
            Status::Failed,
            "spring headers incomplete",
            "to be republished to \"orders\" (the task's original topic)".into(),
        ),
        (
            "orders.dlt",
            1,
            Status::PermanentFailure,
            "could not be fetched: offset 1000 is past the partition's end",
            format!("stored PERMANENT_FAILURE, never attempted; {parked}"),
        ),
        (
            "orders.dlt",
            2,
            Status::PermanentFailure,
            "the original record at orders[0]@0 holds no key and no value",
            format!("stored PERMANENT_FAILURE, never attempted; {parked}"),
        ),
        (
            "orders.dlt",
            3,
            Status::PermanentFailure,
            "stored PERMANENT_FAILURE (failed again after 1 redrives)",
            format!("stored PERMANENT_FAILURE (failed again after 1 redrives), never attempted; {parked}"),
        ),
        (
            "orders.dlt",
            4,
            Status::Failed,
            "republish to \"orders.dlt\" refused: it is consumed by capture route \"orders\"",
            format!("republish will end it PERMANENT_FAILURE at its first attempt, producing nothing; {parked}"),
        ),
        (
            "audit.dlt",
            0,
            Status::Failed,
            "spring headers incomplete",
            "to be retried by handler \"log\"".into(),
        ),
    ];
    for (topic, offset, status, says, ends) in expected {
        let task = task_at(&store, topic, 0, offset).await;
        let note = task.failure.ingest_note.clone().unwrap_or_default();
        assert_eq!(task.status, status, "{topic}@{offset}: {note}");
        assert!(
            note.contains(says) && note.ends_with(&ends),
            "{topic}@{offset}: {note}"
        );
        assert!(
            !note.contains("republished to the original topic"),
            "{note}"
        );
    }
}

/// Regression: of two copies of a dead-letter header, the last was taken silently. The
/// first copy is the record's first origin (Spring's recoverer keeps it first when a
/// record passes through several dead-letter topics); it is taken, and the note says
/// the copies disagreed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_headers_take_the_first_copy_and_the_note_says_they_disagreed() {
    let mut orders = route(&["orders.dlt"], RouteMode::Capture, "log");
    orders.name = "orders".into();
    let billing = route(&["billing.dlq"], RouteMode::Capture, "log");
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders.dlt", 1), ("billing", 1), ("billing.dlq", 1)],
        vec![orders, billing],
    )
    .await;
    settings.worker.enabled = false;
    let ancestor = stored_task(&store, "orders", "orders").await;
    let producer = producer(&bootstrap);

    let mut two_topics = spring("orders", 5);
    two_topics.extend(spring("orders.retry-0", 5));
    let mut two_ids = spring("orders", 5);
    two_ids.push(Header::new(
        "redrive-task-id",
        ancestor.to_string().into_bytes(),
    ));
    two_ids.push(Header::new("redrive-task-id", b"999999".to_vec()));
    for headers in [two_topics, two_ids] {
        let letter = Sample {
            value: Some(b"v".to_vec()),
            headers,
            ..Sample::default()
        };
        produce(&producer, "orders.dlt", &letter).await;
    }
    for value in ["first", "second"] {
        let record = Sample {
            value: Some(value.into()),
            ..Sample::default()
        };
        produce(&producer, "billing", &record).await;
    }
    let mut two_offsets = share_group_headers(b"billing", b"0", b"0");
    two_offsets.push(Header::new("__dlq.errors.offset", b"1".to_vec()));
    produce(&producer, "billing.dlq", &headers_only(two_offsets)).await;

    run_until_stored(&settings, &store, 4).await;

    let first = task_at(&store, "orders.dlt", 0, 0).await;
    assert_eq!(first.failure.original.unwrap().topic, "orders");
    let note = first.failure.ingest_note.unwrap_or_default();
    assert!(
        note.contains(
            "two kafka_dlt-original-topic headers disagree (\"orders\", then \
             \"orders.retry-0\"): the first is taken"
        ),
        "{note}"
    );
    let linked = task_at(&store, "orders.dlt", 0, 1).await;
    assert_eq!(
        (linked.failure.generation, linked.failure.previous_task),
        (2, Some(ancestor))
    );
    let note = linked.failure.ingest_note.unwrap_or_default();
    assert!(
        note.contains(&format!(
            "two redrive-task-id headers disagree (\"{ancestor}\", then \"999999\"): the first is taken"
        )),
        "{note}"
    );
    let fetched = task_at(&store, "billing.dlq", 0, 0).await;
    assert_eq!(fetched.failure.value.as_deref(), Some(&b"first"[..]));
    let note = fetched.failure.ingest_note.unwrap_or_default();
    assert!(
        note.contains("two __dlq.errors.offset headers disagree (\"0\", then \"1\")"),
        "{note}"
    );
}

/// Regression: the error class and message of a dead letter's headers were stored
/// whole, however large: even for a message over `ingest.max_message_bytes`, stored in
/// minimal form "without key, value and headers", a 100 kB exception message came in
/// as its error (and went out again in every parked record's headers). They are cut
/// like the stack trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_error_headers_are_cut_even_in_minimal_form() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders.dlt", 1)],
        vec![route(&["orders.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.max_message_bytes = 50_000;
    let producer = producer(&bootstrap);
    let huge = "x".repeat(100_000);
    let mut headers = spring("orders", 1);
    headers.push(Header::new(
        "kafka_dlt-exception-fqcn",
        huge.clone().into_bytes(),
    ));
    headers.push(Header::new(
        "kafka_dlt-exception-message",
        huge.into_bytes(),
    ));
    let letter = Sample {
        value: Some(b"v".to_vec()),
        headers,
        ..Sample::default()
    };
    produce(&producer, "orders.dlt", &letter).await;
    run_until_stored(&settings, &store, 1).await;
    let task = task_at(&store, "orders.dlt", 0, 0).await;
    assert!(!task.failure.payload_stored, "over the limit: minimal form");
    for text in [task.failure.error_class, task.failure.error_message] {
        let text = text.unwrap_or_default();
        assert!(
            text.len() <= 8 * 1024 + "\n... (truncated)".len() && text.ends_with("(truncated)"),
            "{} bytes",
            text.len()
        );
    }
}

/// A refused fetch's task: PERMANENT_FAILURE `redrive.OriginalUnavailable`, never
/// attempted, nothing stored from the record, and an error that says `why`.
fn assert_refused_fetch(task: &redrive::Task, why: &str) {
    assert_eq!(task.status, Status::PermanentFailure, "{why}");
    assert_eq!(task.attempts, 0, "never republished: {why}");
    assert_eq!(
        task.failure.error_class.as_deref(),
        Some("redrive.OriginalUnavailable")
    );
    let error = task.failure.error_message.clone().unwrap();
    assert!(error.contains(why), "{why}: {error}");
    assert_eq!((&task.failure.key, &task.failure.value), (&None, &None));
    assert!(!task.failure.payload_stored);
}

/// Regression: whoever could write a headers-only record to a captured dead-letter topic
/// had the fleet fetch any topic it may read (`secrets[0]@0`), store the record and
/// republish it. With `fetch_originals_from`, only the listed topics are fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_original_outside_fetch_originals_from_is_not_fetched() {
    let (broker, store, mut settings) =
        billing_dlq(&[("billing", 1), ("billing.dlq", 1), ("secrets", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    settings.routes[0].fetch_originals_from = Some(vec!["billing".into()]);
    let producer = producer(&bootstrap);
    let secret = Sample {
        value: Some(b"top secret".to_vec()),
        ..Sample::default()
    };
    produce(&producer, "secrets", &secret).await;
    let invoice = Sample {
        value: Some(b"invoice".to_vec()),
        ..Sample::default()
    };
    produce(&producer, "billing", &invoice).await;
    let stolen = headers_only(share_group_headers(b"secrets", b"0", b"0"));
    produce(&producer, "billing.dlq", &stolen).await;
    let allowed = headers_only(share_group_headers(b"billing", b"0", b"0"));
    produce(&producer, "billing.dlq", &allowed).await;

    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "both tasks final", || async {
        let counts = store.status_counts().await.unwrap();
        (counts.resolved, counts.permanent_failure) == (1, 1)
    })
    .await;
    running.stop().await;

    let refused = task_at(&store, "billing.dlq", 0, 0).await;
    assert_refused_fetch(
        &refused,
        "topic \"secrets\" is not in routes[0].fetch_originals_from",
    );
    let fetched = task_at(&store, "billing.dlq", 0, 1).await;
    assert_eq!(
        fetched.failure.value, invoice.value,
        "a listed topic is fetched"
    );
    let on_secrets = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "secrets", 1, 2, Duration::from_secs(5))
    })
    .await
    .unwrap();
    assert_eq!(on_secrets.len(), 1, "nothing republished to secrets");
}

/// Without `fetch_originals_from`, an original is never fetched from one of Kafka's
/// internal topics nor from a dead-letter topic this fleet captures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn originals_are_not_fetched_from_internal_or_captured_topics_by_default() {
    let (broker, store, mut settings) = billing_dlq(&[("billing.dlq", 1), ("orders.dlt", 1)]).await;
    let bootstrap = broker.bootstrap_servers();
    settings
        .routes
        .push(route(&["orders.dlt"], RouteMode::Capture, "log"));
    settings.worker.enabled = false;
    let producer = producer(&bootstrap);
    let captured = Sample {
        value: Some(b"someone else's failure".to_vec()),
        headers: spring("orders", 0),
        ..Sample::default()
    };
    produce(&producer, "orders.dlt", &captured).await;
    let letters: [&[u8]; 3] = [b"__consumer_offsets", b"orders.dlt", b"billing.dlq"];
    for topic in letters {
        let letter = headers_only(share_group_headers(topic, b"0", b"0"));
        produce(&producer, "billing.dlq", &letter).await;
    }

    run_until_stored(&settings, &store, 4).await;

    let whys = [
        "\"__consumer_offsets\" is Kafka's internal topic",
        "\"orders.dlt\" is consumed by capture route routes[1].topics",
        "\"billing.dlq\" is consumed by capture route routes[0].topics",
    ];
    for (offset, why) in whys.into_iter().enumerate() {
        let task = task_at(&store, "billing.dlq", 0, offset as i64).await;
        assert_refused_fetch(&task, why);
        let error = task.failure.error_message.unwrap();
        assert!(error.contains("routes[0].fetch_originals_from"), "{error}");
    }
}

/// Found by an attack: a dead letter stored in minimal form (over
/// `ingest.max_message_bytes`) for the republish handler had a note ending "to be
/// republished to ...", yet its first attempt ends it PERMANENT_FAILURE: there is no
/// payload to produce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_does_not_promise_a_republish_of_a_payload_not_stored() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders.dlt", 1)],
        vec![route(&["orders.dlt"], RouteMode::Capture, "republish")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.max_message_bytes = 50_000;
    let letter = Sample {
        value: Some(vec![b'v'; 60_000]),
        headers: spring("orders", 1),
        ..Sample::default()
    };
    produce(&producer(&bootstrap), "orders.dlt", &letter).await;
    run_until_stored(&settings, &store, 1).await;
    let task = task_at(&store, "orders.dlt", 0, 0).await;
    assert!(!task.failure.payload_stored, "over the limit: minimal form");
    let note = task.failure.ingest_note.unwrap_or_default();
    assert!(
        note.contains("the payload was not stored")
            && note.contains("republish will end it PERMANENT_FAILURE at its first attempt")
            && !note.contains("to be republished"),
        "{note}"
    );
}
