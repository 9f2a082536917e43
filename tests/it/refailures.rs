//! Re-failures through the mock cluster: a message redrive republished that its consumer
//! dead-letters again is linked to the task it came from; past the route's
//! `max_generations` it is parked with both errors, not republished; a forged or unknown
//! `redrive-task-id` is just a first failure.

use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use redrive::config::RouteMode;
use redrive::store::TaskFilter;
use redrive::{Header, Status, Store, TaskId};
use std::time::Duration;

use crate::support::broker::{consume, headers_of, produce, producer, route, KafkaCase, Sample};
use crate::support::cli::run;
use crate::support::{eventually, scalar, Member};
use crate::support::{fleet, task_at};

const DLT: &str = "orders.dlt";
const ORIGINAL: &str = "orders";
const PARKING: &str = "orders.parking";

/// The headers Spring's `DeadLetterPublishingRecoverer` adds to a record from `topic`
/// at (`partition`, `offset`) that failed with `error`.
fn spring(topic: &str, partition: i32, offset: i64, error: &str) -> Vec<Header> {
    vec![
        Header::new("kafka_dlt-original-topic", topic.as_bytes().to_vec()),
        Header::new(
            "kafka_dlt-original-partition",
            partition.to_be_bytes().to_vec(),
        ),
        Header::new("kafka_dlt-original-offset", offset.to_be_bytes().to_vec()),
        Header::new(
            "kafka_dlt-exception-fqcn",
            b"java.lang.IllegalStateException".to_vec(),
        ),
        Header::new("kafka_dlt-exception-message", error.as_bytes().to_vec()),
    ]
}

/// What a Spring consumer does when `message` fails again: the same key and value to the
/// dead-letter topic, its headers copied, the dead-letter headers added.
async fn dead_letter_again(producer: &FutureProducer, message: &OwnedMessage, error: &str) {
    let mut headers = headers_of(message);
    headers.extend(spring(
        message.topic(),
        message.partition(),
        message.offset(),
        error,
    ));
    let sample = Sample {
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec),
        headers,
        partition: None,
    };
    produce(producer, DLT, &sample).await;
}

/// Reads the `count` messages of `topic` (one partition) there are by then.
async fn read(bootstrap: &str, topic: &'static str, count: usize) -> Vec<OwnedMessage> {
    let bootstrap = bootstrap.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, topic, 1, count, Duration::from_secs(30))
    });
    let messages = read.await.unwrap();
    assert_eq!(messages.len(), count, "{count} messages on {topic}");
    messages
}

fn header(headers: &[Header], name: &str) -> String {
    let found = headers.iter().rev().find(|h| h.name_is(name));
    let value = found.and_then(|h| h.value.clone());
    String::from_utf8(value.unwrap_or_else(|| panic!("{name} in {headers:?}"))).unwrap()
}

async fn ids(store: &Store, filter: TaskFilter) -> Vec<TaskId> {
    let tasks = store.list(&filter, None, 100).await.unwrap();
    tasks.iter().map(|t| t.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_message_failing_again_links_generations_and_past_the_limit_is_parked_not_republished() {
    let mut orders = route(&[DLT], RouteMode::Capture, "republish");
    orders.name = "orders".into();
    orders.max_generations = Some(2);
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(&[(DLT, 1), (ORIGINAL, 1), (PARKING, 1)], vec![orders]).await;
    settings.parking.topic = Some(PARKING.into());
    let producer = producer(&bootstrap);
    let first = Sample {
        key: Some(b"order-7".to_vec()),
        value: Some(b"order 7".to_vec()),
        headers: spring(ORIGINAL, 0, 12, "consumer failed 1"),
        partition: None,
    };
    produce(&producer, DLT, &first).await;
    let member = fleet(&settings);
    let metrics = member.metrics().clone();
    let running = Member::start(member, &store);

    // Generations 1 and 2 are republished; each fails again in the "consumer".
    for generation in 1..=2 {
        let republished = read(&bootstrap, ORIGINAL, generation).await;
        let message = &republished[generation - 1];
        let task = task_at(&store, DLT, 0, generation as i64 - 1).await;
        assert_eq!(task.failure.generation, generation as i32);
        assert_eq!(
            header(&headers_of(message), "redrive-task-id"),
            task.id.to_string()
        );
        let error = format!("consumer failed {}", generation + 1);
        dead_letter_again(&producer, message, &error).await;
    }
    let parked = read(&bootstrap, PARKING, 1).await;
    running.stop().await;

    let tasks = [
        task_at(&store, DLT, 0, 0).await,
        task_at(&store, DLT, 0, 1).await,
        task_at(&store, DLT, 0, 2).await,
    ];
    let generations: Vec<i32> = tasks.iter().map(|t| t.failure.generation).collect();
    assert_eq!(generations, [1, 2, 3]);
    let previous: Vec<Option<TaskId>> = tasks.iter().map(|t| t.failure.previous_task).collect();
    assert_eq!(previous, [None, Some(tasks[0].id), Some(tasks[1].id)]);
    assert_eq!(
        tasks[2].failure.previous_error.as_deref(),
        Some("consumer failed 2")
    );
    let statuses: Vec<Status> = tasks.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [Status::Resolved, Status::Resolved, Status::PermanentFailure]
    );
    let stopped = &tasks[2];
    assert_eq!(
        stopped.last_error.as_deref(),
        Some("failed again after 2 redrives")
    );
    assert_eq!(stopped.attempts, 0, "not republished again");
    assert!(store.attempts(stopped.id).await.unwrap().is_empty());

    let parked_headers = headers_of(&parked[0]);
    assert_eq!(parked[0].payload(), Some(&b"order 7"[..]));
    for (name, value) in [
        ("redrive-task-id", stopped.id.to_string()),
        ("redrive-generation", "3".to_owned()),
        ("redrive-previous-task-id", tasks[1].id.to_string()),
        ("redrive-previous-error", "consumer failed 2".to_owned()),
        ("redrive-reported-error", "consumer failed 3".to_owned()),
        (
            "redrive-error-message",
            "failed again after 2 redrives".to_owned(),
        ),
    ] {
        assert_eq!(header(&parked_headers, name), value, "{name}");
    }
    let counted = |lineage: &str| {
        (metrics.refailures)
            .with_label_values(&["orders", lineage])
            .get()
    };
    assert_eq!((counted("linked"), counted("loop_stopped")), (1, 1));

    // Filterable in the store, the CLI and (the same filter) the API.
    let generation = |g| TaskFilter {
        generation: Some(g),
        ..TaskFilter::default()
    };
    assert_eq!(ids(&store, generation(1)).await, [tasks[0].id]);
    let refailures = TaskFilter {
        min_generation: Some(2),
        ..TaskFilter::default()
    };
    assert_eq!(ids(&store, refailures).await, [tasks[2].id, tasks[1].id]);
    let out = run(
        &settings,
        &[
            "tasks",
            "list",
            "--previous-task",
            &tasks[1].id.to_string(),
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["items"][0]["id"], stopped.id.0);
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let out = run(&settings, &["tasks", "show", &stopped.id.to_string()]);
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.contains("generation             3"), "{shown}");
    assert!(
        shown.contains(&format!("previous_task          {}", tasks[1].id)),
        "{shown}"
    );
    let out = run(&settings, &["tasks", "list", "--generation", "0"]);
    assert!(!out.status.success(), "generation 0 is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_forged_or_unknown_task_id_is_a_first_failure() {
    let mut orders = route(&[DLT], RouteMode::Capture, "log");
    orders.name = "orders".into();
    let mut payments = route(&["payments.dlt"], RouteMode::Capture, "log");
    payments.name = "payments".into();
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        settings,
    } = KafkaCase::new(&[(DLT, 1), ("payments.dlt", 1)], vec![orders, payments]).await;
    let producer = producer(&bootstrap);
    let payment = Sample {
        value: Some(b"payment".to_vec()),
        headers: spring("payments", 0, 1, "declined"),
        ..Sample::default()
    };
    produce(&producer, "payments.dlt", &payment).await;
    let running = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(30), "the payment's task", || async {
        scalar(&store, "SELECT count(*) FROM recovery_task").await == 1
    })
    .await;
    let foreign = task_at(&store, "payments.dlt", 0, 0).await.id.to_string();
    // An id drawn for no stored task (as for an inline attempt that succeeded).
    let reserved = store.reserve_ids(1).await.unwrap()[0].to_string();
    let forged: [(Option<&[u8]>, &str); 9] = [
        (Some(b"abc"), "is not a task id"),
        (Some(b"99999999999999999999999"), "is not a task id"),
        (Some(b"-1"), "is not a task id"),
        (Some(b"\xff\x00"), "is not a task id"),
        (None, "is not a task id"),
        (
            Some(b"424242"),
            "redrive-task-id 424242 names no task: this store has drawn no id that high yet",
        ),
        (
            Some(reserved.as_bytes()),
            "names no stored task: it was deleted",
        ),
        (Some(b"+5"), "is not a task id"),
        (
            Some(foreign.as_bytes()),
            "names a task of route \"payments\"",
        ),
    ];
    for (value, _) in &forged {
        let mut headers = spring(ORIGINAL, 0, 5, "consumer failed");
        headers.push(Header {
            name: b"redrive-task-id".to_vec(),
            value: value.map(<[u8]>::to_vec),
        });
        let sample = Sample {
            value: Some(b"order".to_vec()),
            headers,
            ..Sample::default()
        };
        produce(&producer, DLT, &sample).await;
    }
    eventually(Duration::from_secs(30), "every message stored", || async {
        scalar(&store, "SELECT count(*) FROM recovery_task").await == 1 + forged.len() as i64
    })
    .await;
    running.stop().await;
    for (offset, (value, note)) in forged.iter().enumerate() {
        let task = task_at(&store, DLT, 0, offset as i64).await;
        assert_eq!(
            (task.failure.generation, task.failure.previous_task),
            (1, None),
            "{value:?}"
        );
        let ingest_note = task.failure.ingest_note.unwrap_or_default();
        assert!(ingest_note.contains(note), "{value:?}: {ingest_note}");
    }
}
