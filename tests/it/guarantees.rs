//! Regression tests of the ingest guarantees: every path that once lost, dropped or
//! stalled a failure.

use async_trait::async_trait;
use redrive::config::RouteMode;
use redrive::{Fleet, Handler, HandlerContext, HandlerError, NewTask, SourceCoordinates, Status};
use redrive::{Settings, Store, Task};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::broker::{consume, produce, producer, route, KafkaCase, Sample};
use crate::support::{eventually, fresh_store, scalar, Member};
use crate::support::{fleet, task_at};
use crate::support::{Bounded, CHILD_LIMIT};

fn value(text: &str) -> Sample {
    Sample {
        value: Some(text.as_bytes().to_vec()),
        ..Sample::default()
    }
}

/// Waits until `group` committed `expected` on the partitions of `topic`.
async fn committed_reaches(settings: &Settings, topic: &'static str, expected: Vec<i64>) {
    let bootstrap = settings.kafka.bootstrap_servers.clone();
    let group = settings.kafka.group_id.clone();
    let partitions = expected.len() as i32;
    eventually(Duration::from_secs(30), "offsets committed", || {
        let (bootstrap, group, expected) = (bootstrap.clone(), group.clone(), expected.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                crate::support::broker::committed(&bootstrap, &group, topic, partitions)
            })
            .await
            .unwrap()
                == expected
        }
    })
    .await;
}

async fn committed_now(settings: &Settings, topic: &'static str, partitions: i32) -> Vec<i64> {
    let bootstrap = settings.kafka.bootstrap_servers.clone();
    let group = settings.kafka.group_id.clone();
    tokio::task::spawn_blocking(move || {
        crate::support::broker::committed(&bootstrap, &group, topic, partitions)
    })
    .await
    .unwrap()
}

async fn tasks(store: &Store) -> i64 {
    scalar(store, "SELECT count(*) FROM recovery_task").await
}

/// Regression: the pattern `orders` was subscribed as librdkafka's `^orders`, which
/// also delivered `orders.dlt`; the route table matched whole names only, so those
/// messages were logged, dropped and their offsets committed. Now both sides read one
/// anchored pattern: `orders.dlt` is not consumed at all (and not committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_route_consumes_exactly_the_topics_it_claims() {
    let mut by_pattern = route(&[], RouteMode::Capture, "log");
    by_pattern.pattern = Some("orders".into());
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(&[("orders", 1), ("orders.dlt", 1)], vec![by_pattern]).await;
    settings.worker.enabled = false;
    let producer = producer(&broker.bootstrap_servers());
    for topic in ["orders", "orders.dlt", "orders", "orders.dlt"] {
        produce(&producer, topic, &value("x")).await;
    }
    let running = Member::start(fleet(&settings), &store);
    committed_reaches(&settings, "orders", vec![2]).await;
    running.stop().await;
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE source_topic = 'orders'"
        )
        .await,
        2
    );
    assert_eq!(tasks(&store).await, 2);
    assert_eq!(
        committed_now(&settings, "orders.dlt", 1).await,
        vec![0],
        "a topic no route claims is never committed"
    );
}

/// Regression: at shutdown, a flush still retrying its insert returned nothing and the
/// loop could go on to commit a later batch whose offsets covered the unstored one.
/// The database refuses one message (a trigger raising a non-data error, as in an
/// outage) until after shutdown; nothing at or after it may be committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_unstored_batch_is_a_barrier_for_every_later_commit() {
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("dlt", 1)],
        vec![route(&["dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.batch_size = 1;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.msg_value = 'poison' THEN
             RAISE EXCEPTION 'injected outage' USING ERRCODE = '08006';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_poison BEFORE INSERT ON recovery_task
           FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let producer = producer(&broker.bootstrap_servers());
    for text in ["a", "poison", "b", "c", "d", "e"] {
        produce(&producer, "dlt", &value(text)).await;
    }
    let running = Member::start(fleet(&settings), &store);
    eventually(
        Duration::from_secs(30),
        "the batches after it stored",
        || async { tasks(&store).await >= 3 },
    )
    .await;
    running.stop().await;
    let committed = committed_now(&settings, "dlt", 1).await;
    assert!(
        committed[0] <= 1,
        "committed {committed:?} passes the unstored message at offset 1"
    );

    sqlx::raw_sql("DROP TRIGGER refuse_poison ON recovery_task")
        .execute(store.pool())
        .await
        .unwrap();
    let running = Member::start(fleet(&settings), &store);
    committed_reaches(&settings, "dlt", vec![6]).await;
    running.stop().await;
    assert_eq!(tasks(&store).await, 6, "every message exactly once");
}

/// Regression: a different message at coordinates that already hold a task (a topic
/// deleted and recreated, two clusters on one database) was logged as a conflict and
/// dropped. It is stored as a task of its own; its redelivery creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_new_message_at_old_coordinates_is_stored_not_dropped() {
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("dlt", 1)],
        vec![route(&["dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    let mut old = NewTask::new("log", b"from the old topic".to_vec());
    old.failure.source = Some(SourceCoordinates {
        topic: "dlt".into(),
        partition: 0,
        offset: 0,
    });
    let old_id = store.enqueue(&old).await.unwrap().id();
    let producer = producer(&broker.bootstrap_servers());
    produce(&producer, "dlt", &value("from the new topic")).await;

    for run in 0..2 {
        if run == 1 {
            // A new group reads the topic again: a redelivery of the same message.
            settings.kafka.group_id = format!("again-{:x}", rand::random::<u32>());
        }
        let fleet = fleet(&settings);
        let metrics = fleet.metrics().clone();
        let running = Member::start(fleet, &store);
        committed_reaches(&settings, "dlt", vec![1]).await;
        running.stop().await;
        let ingested = |outcome: &str| metrics.ingested.with_label_values(&["dlt", outcome]).get();
        assert_eq!(
            (ingested("collision"), ingested("redelivered")),
            if run == 0 { (1, 0) } else { (0, 1) }
        );
    }
    assert_eq!(tasks(&store).await, 2);
    let new: i64 = sqlx::query_scalar("SELECT id FROM recovery_task WHERE id <> $1")
        .bind(old_id.0)
        .fetch_one(store.pool())
        .await
        .unwrap();
    let new = store.get(redrive::TaskId(new)).await.unwrap().unwrap();
    assert_eq!(
        new.failure.value.as_deref(),
        Some(&b"from the new topic"[..])
    );
    assert!(new.dedup_key.unwrap().starts_with("kafka:dlt:0:0#"));
    assert!(new
        .failure
        .ingest_note
        .unwrap()
        .contains(&format!("task {old_id} already records these coordinates")));
}

/// Acts on a message as its value says.
struct Verdicts {
    seen_sizes: Arc<Mutex<Vec<usize>>>,
}

#[async_trait]
impl Handler for Verdicts {
    async fn handle(&self, _ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let value = task.failure.value.clone().unwrap_or_default();
        self.seen_sizes.lock().unwrap().push(value.len());
        match value.as_slice() {
            b"panic" => panic!("handler bug"),
            b"bad" => Err(HandlerError::permanent("invalid order")),
            b"later" => Err(HandlerError::retry_after(Duration::from_secs(3600), "429")),
            b"hang" => {
                std::future::pending::<()>().await;
                Ok(())
            }
            v if v.len() > 100 => Err(HandlerError::transient("too big for the downstream")),
            _ => Ok(()),
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(3600))
    }
}

fn verdicts(settings: &Settings) -> (Fleet, Arc<Mutex<Vec<usize>>>) {
    let seen_sizes = Arc::default();
    let fleet = Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .handler(
            "verdicts",
            Verdicts {
                seen_sizes: Arc::clone(&seen_sizes),
            },
        )
        .build()
        .unwrap();
    (fleet, seen_sizes)
}

/// Regression: a panicking process-mode handler stopped ingest (the member exited and
/// crash-looped on the redelivered message), and the inline verdict was lost: a
/// permanent error was retried, a Retry-After ignored, no history row written. Process
/// mode now calls handlers the way the worker does and keeps the verdict. A message too
/// large to store is shown whole to the handler and stored without its payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_mode_survives_panics_and_keeps_each_verdict() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders", 1), ("orders.parking", 1)],
        vec![route(&["orders"], RouteMode::Process, "verdicts")],
    )
    .await;
    settings.worker.enabled = false;
    settings.parking.topic = Some("orders.parking".into());
    settings.ingest.max_message_bytes = 200;
    let producer = producer(&bootstrap);
    let big = "x".repeat(300);
    for text in ["panic", "ok", "bad", "later", big.as_str()] {
        produce(&producer, "orders", &value(text)).await;
    }
    let (fleet, seen_sizes) = verdicts(&settings);
    let running = Member::start(fleet, &store);
    committed_reaches(&settings, "orders", vec![5]).await;
    running.stop().await;
    assert_eq!(tasks(&store).await, 4, "the success is not stored");

    let panicked = task_at(&store, "orders", 0, 0).await;
    assert_eq!((panicked.status, panicked.attempts), (Status::Failed, 1));
    assert!(panicked.last_error.unwrap().contains("handler panicked"));

    let bad = task_at(&store, "orders", 0, 2).await;
    assert_eq!(bad.status, Status::PermanentFailure);
    assert!(bad.finished_at.is_some());
    let history = store.attempts(bad.id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].attempt, history[0].outcome.as_str()),
        (1, "permanent_failure")
    );
    let parked = consume(&bootstrap, "orders.parking", 1, 1, Duration::from_secs(10));
    assert_eq!(parked.len(), 1, "the permanent failure is parked");

    let later = task_at(&store, "orders", 0, 3).await;
    let wait = later.next_attempt_at - chrono::Utc::now();
    assert!(
        wait > chrono::Duration::minutes(55),
        "Retry-After kept: {wait}"
    );
    assert_eq!(store.attempts(later.id).await.unwrap()[0].outcome, "retry");

    let oversize = task_at(&store, "orders", 0, 4).await;
    assert!(!oversize.failure.payload_stored && oversize.failure.value.is_none());
    assert!(
        seen_sizes.lock().unwrap().contains(&300),
        "the inline handler saw the whole message"
    );
}

/// Regression: with a downstream that hangs, a batch of process-mode calls could take
/// longer than librdkafka's max.poll.interval.ms; the member was evicted and the calls
/// ran again on redelivery, forever. A batch's inline calls now share a time budget;
/// messages not attempted in time are stored for the worker pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_downstream_cannot_hold_a_batch_past_its_budget() {
    let KafkaCase {
        broker: _broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("orders", 1)],
        vec![route(&["orders"], RouteMode::Process, "verdicts")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.process_budget = Duration::from_millis(500);
    settings.ingest.process_concurrency = 2;
    settings.ingest.linger = Duration::from_millis(300);
    let producer = producer(&settings.kafka.bootstrap_servers);
    for _ in 0..6 {
        produce(&producer, "orders", &value("hang")).await;
    }
    let (fleet, _) = verdicts(&settings);
    let running = Member::start(fleet, &store);
    committed_reaches(&settings, "orders", vec![6]).await;
    running.stop().await;
    assert_eq!(tasks(&store).await, 6);
    let attempted = scalar(
        &store,
        "SELECT count(*) FROM recovery_task WHERE attempts = 1 AND last_error LIKE '%timed out%'",
    )
    .await;
    let deferred = scalar(
        &store,
        "SELECT count(*) FROM recovery_task WHERE attempts = 0 AND ingest_note LIKE '%time budget%'",
    )
    .await;
    assert_eq!(
        attempted + deferred,
        6,
        "{attempted} cut off, {deferred} deferred"
    );
    assert!(attempted >= 2, "the first calls ran until the budget");
}

/// Regression: batches closed by count only, so one insert could bind gigabytes. Many
/// messages near the size limit, spread over partitions, are all stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_near_the_size_limit_are_batched_by_bytes() {
    let KafkaCase {
        broker: _broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("big", 4)],
        vec![route(&["big"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.max_message_bytes = 600_000;
    settings.ingest.batch_bytes = 1_000_000;
    let producer = producer(&settings.kafka.bootstrap_servers);
    for i in 0..16u8 {
        let sample = Sample {
            value: Some(vec![i; 590_000]),
            partition: Some(i32::from(i % 4)),
            ..Sample::default()
        };
        produce(&producer, "big", &sample).await;
    }
    let running = Member::start(fleet(&settings), &store);
    committed_reaches(&settings, "big", vec![4, 4, 4, 4]).await;
    running.stop().await;
    assert_eq!(
        scalar(
            &store,
            "SELECT count(DISTINCT dedup_key) FROM recovery_task \
             WHERE payload_stored AND octet_length(msg_value) = 590000"
        )
        .await,
        16
    );
    assert_eq!(tasks(&store).await, 16);
}

/// A sink that takes its time: shutdown must wait for it.
struct SlowSink(Arc<AtomicUsize>);

#[async_trait]
impl redrive::finals::FinalSink for SlowSink {
    async fn permanent_failure(&self, _task: &Task, _error: Option<&str>) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Regression: parking ran fire-and-forget and was lost at shutdown. Reports of
/// permanent failures are tracked and waited for.
#[tokio::test]
async fn shutdown_waits_for_permanent_failure_reports() {
    let (store, settings) = fresh_store().await;
    let reported = Arc::new(AtomicUsize::new(0));
    let (fleet, _) = {
        let seen_sizes = Arc::default();
        let fleet = Fleet::builder(settings.clone())
            .handler("verdicts", Verdicts { seen_sizes })
            .final_sink(SlowSink(reported.clone()))
            .build()
            .unwrap();
        (fleet, ())
    };
    let id = store
        .enqueue(&NewTask::new("verdicts", b"bad".to_vec()))
        .await
        .unwrap()
        .id();
    let running = Member::start(fleet, &store);
    eventually(Duration::from_secs(10), "the permanent failure", || async {
        store.get(id).await.unwrap().unwrap().status == Status::PermanentFailure
    })
    .await;
    running.stop().await;
    assert_eq!(reported.load(Ordering::SeqCst), 1);
}

/// Whether POSIX extended regex (what librdkafka matches subscriptions with on this
/// platform) finds `pattern` in `text`.
fn posix_matches(pattern: &str, text: &str) -> bool {
    use std::ffi::CString;
    let pattern = CString::new(pattern).unwrap();
    let text = CString::new(text).unwrap();
    // SAFETY: a regex compiled, used and freed here, on NUL-terminated strings.
    unsafe {
        let mut re: libc::regex_t = std::mem::zeroed();
        let flags = libc::REG_EXTENDED | libc::REG_NOSUB;
        assert_eq!(
            libc::regcomp(&mut re, pattern.as_ptr(), flags),
            0,
            "{pattern:?}"
        );
        let found = libc::regexec(&re, text.as_ptr(), 0, std::ptr::null_mut(), 0) == 0;
        libc::regfree(&mut re);
        found
    }
}

/// Every pattern redrive accepts is read alike by librdkafka's regex engine and by
/// the route table: random patterns from the accepted syntax, random topic names.
#[test]
fn accepted_patterns_mean_the_same_to_librdkafka_and_the_route_table() {
    use rand::{Rng, SeedableRng};
    use redrive::config::pattern;
    let seed = rand::random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let atoms = [
        "a", "b", "-", "_", ".", r"\.", "[ab]", "[^a]", "[a-c_]", "(a|b.)", "(x)",
    ];
    let quantifiers = ["", "", "*", "+", "?"];
    for _ in 0..500 {
        let mut p = String::new();
        for _ in 0..rng.random_range(1..5) {
            p.push_str(atoms[rng.random_range(0..atoms.len())]);
            p.push_str(quantifiers[rng.random_range(0..quantifiers.len())]);
        }
        if rng.random_bool(0.2) {
            p = format!("{p}|{}", atoms[rng.random_range(0..atoms.len())]);
        }
        if pattern::check(&p).is_err() {
            continue;
        }
        let subscribed = pattern::anchored(&p);
        let rust = regex::Regex::new(&subscribed).unwrap();
        for _ in 0..20 {
            let topic: String = (0..rng.random_range(1..6))
                .map(|_| ['a', 'b', 'c', 'x', '.', '-', '_'][rng.random_range(0..7)])
                .collect();
            assert_eq!(
                posix_matches(&subscribed, &topic),
                rust.is_match(&topic),
                "seed {seed}: pattern {p:?} on topic {topic:?}"
            );
        }
    }
}

/// Regression: a task stored in minimal form (payload left out) was republished as an
/// empty record (a delete on a compacted topic) and marked resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_refuses_a_task_whose_payload_was_not_stored() {
    let KafkaCase {
        broker: _broker,
        store,
        settings,
        ..
    } = KafkaCase::new(&[("orders", 1)], Vec::new()).await;
    let mut minimal = NewTask {
        handler: "republish".into(),
        failure: redrive::task::Failure {
            payload_stored: false,
            value_size: Some(20_000_000),
            ..Default::default()
        },
        ..NewTask::default()
    };
    minimal.failure.original = Some(
        SourceCoordinates {
            topic: "orders".into(),
            partition: 0,
            offset: 7,
        }
        .into(),
    );
    let id = store.enqueue(&minimal).await.unwrap().id();
    let pool = fleet(&settings).worker_pool(store.clone());
    let processed = pool.process_next().await.unwrap().unwrap();
    assert_eq!(
        processed.outcome,
        redrive::task::FinishOutcome::PermanentFailure
    );
    let task = store.get(id).await.unwrap().unwrap();
    assert!(task.last_error.unwrap().contains("payload was not stored"));
    let produced = consume(
        &settings.kafka.bootstrap_servers,
        "orders",
        1,
        1,
        Duration::from_secs(2),
    );
    assert!(produced.is_empty(), "nothing produced");
}

/// `redrive run` with the worker pool off and no routes has nothing to do: it refuses
/// to start (a supervisor would otherwise keep an idle process "healthy").
#[tokio::test]
async fn run_with_nothing_to_do_refuses_to_start() {
    let (_store, settings) = fresh_store().await;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("run")
        .env("REDRIVE__DATABASE__URL", crate::support::database_url())
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .env("REDRIVE__WORKER__ENABLED", "false")
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("nothing to do"), "{stderr}");
}

/// Regression: enqueueing with a dedup key that exists, but another max attempts or
/// correlation id, silently kept the first task's values. It is a conflict now.
#[tokio::test]
async fn a_repeat_with_other_policy_or_correlation_is_a_conflict() {
    let (store, _settings) = fresh_store().await;
    let mut first = NewTask::new("log", b"order 7".to_vec());
    first.dedup_key = Some("order-7".into());
    first.max_attempts = Some(3);
    first.failure.correlation_id = Some("c-1".into());
    let id = store.enqueue(&first).await.unwrap().id();
    assert_eq!(
        store.enqueue(&first).await.unwrap(),
        redrive::Enqueued::Existing(id)
    );
    let mut more_attempts = first.clone();
    more_attempts.max_attempts = Some(5);
    let mut other_correlation = first.clone();
    other_correlation.failure.correlation_id = Some("c-2".into());
    for changed in [more_attempts, other_correlation] {
        assert!(matches!(
            store.enqueue(&changed).await,
            Err(redrive::StoreError::Conflict { existing, .. }) if existing == id
        ));
    }
}

/// Regression: librdkafka was built without zstd, so a zstd-compressed dead letter was
/// never captured and its partition stalled. Every codec a Kafka producer may use is
/// captured; the binary's librdkafka lists them among its builtin features.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_every_compression_codec_are_captured() {
    let features = rdkafka::ClientConfig::new()
        .create_native_config()
        .unwrap()
        .get("builtin.features")
        .unwrap();
    for feature in ["gzip", "snappy", "lz4", "zstd", "ssl", "sasl_scram"] {
        assert!(
            features.contains(feature),
            "{feature} missing from {features}"
        );
    }
    let codecs = ["zstd", "lz4", "snappy", "gzip"];
    let KafkaCase {
        broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[("packed", 1)],
        vec![route(&["packed"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    let compressible = "the same failure, again and again; ".repeat(100);
    for codec in codecs {
        let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .set("compression.type", codec)
            .create()
            .unwrap();
        produce(
            &producer,
            "packed",
            &value(&format!("{codec}: {compressible}")),
        )
        .await;
    }
    let running = Member::start(fleet(&settings), &store);
    committed_reaches(&settings, "packed", vec![4]).await;
    running.stop().await;
    for (offset, codec) in codecs.iter().enumerate() {
        let task = task_at(&store, "packed", 0, offset as i64).await;
        let stored = task.failure.value.unwrap();
        assert_eq!(stored, format!("{codec}: {compressible}").into_bytes());
    }
}

/// Regression: header names that were not UTF-8 were stored and republished with
/// U+FFFD, and the republish producer kept librdkafka's 1,000,000-byte
/// `message.max.bytes` while capture accepted far larger messages. A message just under
/// the capture limit, with odd header names, goes out exactly as it came in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn odd_header_names_and_large_messages_are_republished_byte_for_byte() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("in.dlt", 1), ("out", 1)],
        vec![route(&["in.dlt"], RouteMode::Capture, "republish")],
    )
    .await;
    settings.republish.target_topic = Some("out".into());
    settings.kafka.properties.remove("message.max.bytes");
    settings.ingest.max_message_bytes = 2_000_000;
    let headers = vec![
        redrive::Header::new(b"bad\xff\xfe name".to_vec(), b"v".to_vec()),
        redrive::Header::new(b"\xc3\x28".to_vec(), vec![0, 1, 2]),
        redrive::Header::new("plain", b"p".to_vec()),
    ];
    let header_bytes: usize = headers
        .iter()
        .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
        .sum();
    let sample = Sample {
        key: Some(b"k".to_vec()),
        value: Some(vec![7; 2_000_000 - header_bytes - 1]),
        headers: headers.clone(),
        partition: None,
    };
    let producer = producer(&bootstrap);
    produce(&producer, "in.dlt", &sample).await;
    let running = Member::start(fleet(&settings), &store);
    let out = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "out", 1, 1, Duration::from_secs(30))
    })
    .await
    .unwrap();
    running.stop().await;
    let task = task_at(&store, "in.dlt", 0, 0).await;
    assert!(
        task.failure.payload_stored,
        "just under the limit: stored whole"
    );
    assert_eq!(task.failure.headers, headers, "names stored as bytes");
    assert_eq!(out.len(), 1, "republished");
    assert_eq!(
        crate::support::broker::bytes(&out[0]),
        (sample.key, sample.value)
    );
    let republished = crate::support::broker::headers_of(&out[0]);
    assert_eq!(
        &republished[..3],
        &headers[..],
        "names republished as bytes"
    );
}
