//! Ingest from the mock cluster into PostgreSQL: bytes, dead-letter context, modes.

use async_trait::async_trait;
use redrive::config::RouteMode;
use redrive::{Fleet, Handler, HandlerContext, HandlerError, Header, Store, Task};
use std::time::Duration;

use crate::support::broker::{produce, producer, route, KafkaCase, Sample};
use crate::support::{eventually, fleet, scalar, task_at, Member};

async fn count(store: &Store) -> i64 {
    scalar(store, "SELECT count(*) FROM recovery_task").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_keeps_every_byte_of_odd_messages() {
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("odd.dlt", 2)],
        vec![route(&["odd.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    let samples = vec![
        Sample {
            key: None,
            value: Some(Vec::new()),
            ..Sample::default()
        },
        Sample {
            key: Some(b"k".to_vec()),
            value: None,
            ..Sample::default()
        },
        Sample {
            key: Some(vec![0x00, 0xff]),
            value: Some(vec![0xc3, 0x28, 0xa0, 0xa1, 0x00, 0xfe]),
            headers: vec![
                Header::new("bin", vec![0x00, 0x01, 0xff]),
                Header {
                    name: "none".into(),
                    value: None,
                },
                Header::new("bin", b"second".to_vec()),
                Header::new("empty", Vec::new()),
            ],
            partition: Some(1),
        },
        Sample {
            key: Some(b"big".to_vec()),
            value: Some((0..1 << 20).map(|i| (i % 251) as u8).collect()),
            ..Sample::default()
        },
    ];
    let producer = producer(&broker.bootstrap_servers());
    let mut coordinates = Vec::new();
    for sample in &samples {
        coordinates.push(produce(&producer, "odd.dlt", sample).await);
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "4 tasks", || async {
        count(&store).await == 4
    })
    .await;
    running.stop().await;
    for (sample, (partition, offset)) in samples.iter().zip(coordinates) {
        let task = task_at(&store, "odd.dlt", partition, offset).await;
        assert_eq!(task.failure.key, sample.key, "key at {partition}/{offset}");
        assert_eq!(
            task.failure.value, sample.value,
            "value at {partition}/{offset}"
        );
        assert_eq!(
            task.failure.headers, sample.headers,
            "headers at {partition}/{offset}"
        );
        assert_eq!(
            task.failure.source_timestamp_type.as_deref(),
            Some("create_time")
        );
        assert!(task.failure.source_timestamp.is_some());
        assert_eq!(task.failure.route.as_deref(), Some("odd.dlt"));
        assert_eq!(
            task.dedup_key,
            Some(format!("kafka:odd.dlt:{partition}:{offset}"))
        );
    }
}

/// A producer may stamp a message with any time. One before 4713 BC (PostgreSQL's
/// first day) that chrono still holds must not stop the partition's ingest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_stamped_with_a_time_postgresql_cannot_store_is_stored_without_it() {
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("stamped.dlt", 1)],
        vec![route(&["stamped.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    let producer = producer(&broker.bootstrap_servers());
    let stamps: [i64; 4] = [
        -1_000_000_000_000_000,
        -210_866_803_200_001,
        1_700_000_000_000,
        -5,
    ];
    for (n, stamp) in stamps.iter().enumerate() {
        let value = format!("m{n}");
        let record: rdkafka::producer::FutureRecord<'_, [u8], [u8]> =
            rdkafka::producer::FutureRecord::to("stamped.dlt")
                .payload(value.as_bytes())
                .timestamp(*stamp);
        producer
            .send(
                record,
                rdkafka::util::Timeout::After(Duration::from_secs(30)),
            )
            .await
            .expect("delivered");
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "every message stored", || async {
        count(&store).await == stamps.len() as i64
    })
    .await;
    running.stop().await;
    for (offset, stamp) in stamps.iter().enumerate() {
        let task = task_at(&store, "stamped.dlt", 0, offset as i64).await;
        let stored = task.failure.source_timestamp.map(|t| t.timestamp_millis());
        let storable = *stamp >= -210_866_803_200_000;
        assert_eq!(stored, storable.then_some(*stamp), "offset {offset}");
        if !storable {
            let note = task.failure.ingest_note.unwrap_or_default();
            assert!(
                note.contains(&stamp.to_string()),
                "offset {offset}: {note:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_headers_fill_the_failure_context() {
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("mixed.dlt", 1)],
        vec![route(&["mixed.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.stacktrace_max_bytes = 64;
    let h = |n: &str, v: &[u8]| Header::new(n, v.to_vec());
    let formats: Vec<Vec<Header>> = vec![
        vec![
            h("kafka_dlt-original-topic", b"orders"),
            h("kafka_dlt-original-partition", &2i32.to_be_bytes()),
            h("kafka_dlt-original-offset", &40i64.to_be_bytes()),
            h(
                "kafka_dlt-exception-fqcn",
                b"org.example.ValidationException",
            ),
            h("kafka_dlt-exception-message", b"amount < 0"),
            h(
                "kafka_dlt-exception-stacktrace",
                "at org.example.Validator.check(Validator.java:12)\n"
                    .repeat(20)
                    .as_bytes(),
            ),
        ],
        vec![
            h("__connect.errors.topic", b"payments"),
            h("__connect.errors.partition", b"1"),
            h("__connect.errors.offset", b"7"),
            h(
                "__connect.errors.exception.class.name",
                b"org.apache.kafka.connect.errors.DataException",
            ),
            h("__connect.errors.exception.message", b"bad schema"),
        ],
        vec![
            h("original_topic", b"clicks"),
            h("original_partition", b"0"),
            h("original_offset", b"99"),
        ],
        vec![
            h("redrive-original-topic", b"orders"),
            h("redrive-original-partition", b"0"),
            h("redrive-original-offset", b"5"),
            h("redrive-error-message", b"gave up"),
        ],
        vec![
            h("kafka_dlt-original-topic", b"orders"),
            h("kafka_dlt-original-offset", b"\x01"),
        ],
        vec![h("traceparent", b"00-abc")],
    ];
    let producer = producer(&broker.bootstrap_servers());
    for headers in &formats {
        let sample = Sample {
            value: Some(b"{}".to_vec()),
            headers: headers.clone(),
            ..Sample::default()
        };
        produce(&producer, "mixed.dlt", &sample).await;
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "6 tasks", || async {
        count(&store).await == 6
    })
    .await;
    running.stop().await;

    let spring = task_at(&store, "mixed.dlt", 0, 0).await;
    let original = spring.failure.original.clone().unwrap();
    assert_eq!(
        (original.topic.as_str(), original.partition, original.offset),
        ("orders", Some(2), Some(40))
    );
    assert_eq!(
        spring.failure.error_class.as_deref(),
        Some("org.example.ValidationException")
    );
    assert_eq!(spring.failure.error_message.as_deref(), Some("amount < 0"));
    assert!(spring
        .failure
        .error_stacktrace
        .unwrap()
        .ends_with("(truncated)"));
    let connect = task_at(&store, "mixed.dlt", 0, 1).await;
    assert_eq!(connect.failure.original.unwrap().topic, "payments");
    assert_eq!(connect.failure.error_message.as_deref(), Some("bad schema"));
    let karafka = task_at(&store, "mixed.dlt", 0, 2).await;
    assert_eq!(karafka.failure.original.unwrap().offset, Some(99));
    let own = task_at(&store, "mixed.dlt", 0, 3).await;
    assert_eq!(own.failure.error_message.as_deref(), Some("gave up"));
    let malformed = task_at(&store, "mixed.dlt", 0, 4).await;
    let original = malformed.failure.original.clone().unwrap();
    assert_eq!(
        (original.topic.as_str(), original.partition, original.offset),
        ("orders", None, None),
        "the readable topic is kept"
    );
    assert!(malformed.failure.ingest_note.unwrap().contains(
        "spring headers incomplete: original topic read, partition missing, offset unreadable"
    ));
    assert_eq!(
        malformed.failure.value.as_deref(),
        Some(&b"{}"[..]),
        "stored all the same"
    );
    let unknown = task_at(&store, "mixed.dlt", 0, 5).await;
    assert_eq!(
        (
            unknown.failure.original,
            unknown.failure.error_class,
            unknown.failure.ingest_note
        ),
        (None, None, None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_stored_in_minimal_form() {
    // Subscribed by pattern, to cover pattern routes too.
    let mut by_pattern = route(&[], RouteMode::Capture, "log");
    by_pattern.pattern = Some(r"big\..*".into());
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(&[("big.dlt", 1)], vec![by_pattern]).await;
    settings.worker.enabled = false;
    settings.ingest.max_message_bytes = 1000;
    let producer = producer(&broker.bootstrap_servers());
    let big = Sample {
        key: Some(b"k".to_vec()),
        value: Some(vec![7; 2000]),
        ..Sample::default()
    };
    let small = Sample {
        value: Some(vec![7; 10]),
        ..Sample::default()
    };
    produce(&producer, "big.dlt", &big).await;
    produce(&producer, "big.dlt", &small).await;
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "2 tasks", || async {
        count(&store).await == 2
    })
    .await;
    running.stop().await;
    let task = task_at(&store, "big.dlt", 0, 0).await;
    assert_eq!(
        (
            task.failure.key,
            task.failure.value,
            task.failure.value_size
        ),
        (None, None, Some(2000))
    );
    assert!(task
        .failure
        .ingest_note
        .unwrap()
        .contains("exceeds ingest.max_message_bytes (1000)"));
    assert_eq!(
        task_at(&store, "big.dlt", 0, 1).await.failure.value,
        Some(vec![7; 10]),
        "the partition moved on"
    );
}

/// Fails messages whose value starts with "bad".
struct Validate;

#[async_trait]
impl Handler for Validate {
    async fn handle(&self, _ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        match task.failure.value.as_deref() {
            Some(v) if v.starts_with(b"bad") => {
                Err(HandlerError::transient("validation service said no"))
            }
            _ => Ok(()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_mode_stores_only_failures_as_their_first_attempt() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders", 1)],
        vec![route(&["orders"], RouteMode::Process, "validate")],
    )
    .await;
    settings.worker.enabled = false;
    let producer = producer(&bootstrap);
    for value in ["good 1", "bad 1", "good 2", "bad 2", "good 3"] {
        produce(
            &producer,
            "orders",
            &Sample {
                value: Some(value.into()),
                ..Sample::default()
            },
        )
        .await;
    }
    let fleet = Fleet::builder(settings.clone())
        .handler("validate", Validate)
        .build()
        .unwrap();
    let running = Member::start(fleet, &store);
    let group = settings.kafka.group_id.clone();
    eventually(Duration::from_secs(30), "all 5 offsets committed", || {
        let bootstrap = bootstrap.clone();
        let group = group.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                crate::support::broker::committed(&bootstrap, &group, "orders", 1)
            })
            .await
            .unwrap()
                == vec![5]
        }
    })
    .await;
    running.stop().await;
    assert_eq!(count(&store).await, 2, "only the failures are stored");
    for offset in [1, 3] {
        let task = task_at(&store, "orders", 0, offset).await;
        assert_eq!(task.attempts, 1);
        assert_eq!(
            task.last_error.as_deref(),
            Some("validation service said no")
        );
        assert_eq!(
            task.failure.original,
            task.failure.source.clone().map(Into::into)
        );
    }
}

/// Sleeps, then succeeds.
struct Slow;

#[async_trait]
impl Handler for Slow {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_policy_overrides_the_handlers() {
    let mut strict = route(&["slow.dlt"], RouteMode::Capture, "slow");
    strict.timeout = Some(Duration::from_millis(50));
    strict.max_attempts = Some(2);
    strict.backoff_base = Some(Duration::from_millis(10));
    let KafkaCase {
        broker,
        store,
        settings,
        ..
    } = KafkaCase::new(&[("slow.dlt", 1)], vec![strict]).await;
    produce(
        &producer(&broker.bootstrap_servers()),
        "slow.dlt",
        &Sample {
            value: Some(b"x".to_vec()),
            ..Sample::default()
        },
    )
    .await;
    let fleet = Fleet::builder(settings.clone())
        .handler("slow", Slow)
        .build()
        .unwrap();
    let running = Member::start(fleet, &store);
    eventually(Duration::from_secs(30), "a permanent failure", || async {
        store.status_counts().await.unwrap().permanent_failure == 1
    })
    .await;
    running.stop().await;
    let task = task_at(&store, "slow.dlt", 0, 0).await;
    assert_eq!((task.attempts, task.max_attempts), (2, Some(2)));
    assert!(task.last_error.unwrap().contains("timed out after 50ms"));
}
