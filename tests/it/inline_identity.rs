//! Process mode's inline attempt has the identity its failure is stored under: a task
//! id reserved before the call (in `task.id` and the webhook's `X-Redrive-Task-Id`),
//! the dedup key it will be stored under (`task.idempotency_key()`, the same on every
//! delivery of the message), and a checkpoint it saves is kept with the stored failure
//! for the retry.

use async_trait::async_trait;
use redrive::config::{RouteMode, WebhookBody, WebhookSettings};
use redrive::{Fleet, Handler, HandlerContext, HandlerError, Store, Task};
use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::broker::{cluster, committed, produce, producer, route, KafkaCase, Sample};
use crate::support::http_server::{Reply, TestServer};
use crate::support::task_at;
use crate::support::{eventually, fresh_store, Member, Spawn};

/// Produces `values` to the single partition of `topic`.
async fn produce_values(bootstrap: &str, topic: &str, values: &[&str]) {
    let producer = producer(bootstrap);
    for value in values {
        let sample = Sample {
            value: Some(value.as_bytes().to_vec()),
            ..Sample::default()
        };
        produce(&producer, topic, &sample).await;
    }
}

/// Waits until the group has committed `offset` on partition 0 of `topic`.
async fn wait_committed(bootstrap: &str, group: &str, topic: &'static str, offset: i64) {
    eventually(Duration::from_secs(30), "the batch committed", || {
        let (bootstrap, group) = (bootstrap.to_owned(), group.to_owned());
        async move {
            tokio::task::spawn_blocking(move || committed(&bootstrap, &group, topic, 1))
                .await
                .unwrap()
                == vec![offset]
        }
    })
    .await;
}

async fn stored_ids(store: &Store) -> BTreeSet<i64> {
    sqlx::query_scalar("SELECT id FROM recovery_task")
        .fetch_all(store.pool())
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_inline_webhook_call_has_its_own_task_id_and_a_failure_is_stored_under_it() {
    let server = TestServer::start(|request| match &request.body[..] {
        b"good" => Reply::status(200),
        _ => Reply::status(503),
    })
    .await;
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders", 1)],
        vec![route(&["orders"], RouteMode::Process, "hook")],
    )
    .await;
    settings.worker.enabled = false;
    settings.webhooks.insert(
        "hook".into(),
        WebhookSettings {
            url: Some(server.url("/hook")),
            body: Some(WebhookBody::Raw),
            ..WebhookSettings::default()
        },
    );
    let values = ["good", "bad 1", "good", "bad 2", "good", "bad 3"];
    produce_values(&bootstrap, "orders", &values).await;
    let fleet = Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    wait_committed(&bootstrap, &settings.kafka.group_id, "orders", 6).await;
    member.stop().await;

    let calls: Vec<(String, i64)> = (server.requests().iter())
        .map(|r| {
            let id = r.header("X-Redrive-Task-Id").expect("a task id header");
            (
                String::from_utf8_lossy(&r.body).into_owned(),
                id.parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(calls.len(), 6, "one inline call per message: {calls:?}");
    let ids: BTreeSet<i64> = calls.iter().map(|(_, id)| *id).collect();
    assert_eq!(
        ids.len(),
        6,
        "every inline call has its own task id: {calls:?}"
    );
    assert!(
        !ids.contains(&0),
        "no inline call goes out as task 0: {calls:?}"
    );

    let failed: HashMap<String, i64> = calls.into_iter().filter(|(v, _)| v != "good").collect();
    assert_eq!(
        stored_ids(&store).await.len(),
        3,
        "only the failures are stored"
    );
    for (offset, value) in [(1, "bad 1"), (3, "bad 2"), (5, "bad 3")] {
        let task = task_at(&store, "orders", 0, offset).await;
        assert_eq!(
            task.id.0, failed[value],
            "{value} is stored under its inline call's id"
        );
    }
}

/// What an attempt saw: its number, its task's id and checkpoint.
type Seen = (u32, i64, Option<serde_json::Value>);

/// Saves a checkpoint, then fails transiently on its first attempt; records what each
/// attempt saw (attempt, task id, checkpoint) and resolves on the second.
#[derive(Clone, Default)]
struct StepThenFail {
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[async_trait]
impl Handler for StepThenFail {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        (self.seen.lock().unwrap()).push((ctx.attempt, task.id.0, task.checkpoint.clone()));
        if ctx.attempt > 1 {
            return Ok(());
        }
        ctx.save_checkpoint(&json!({ "steps_done": 1 })).await?;
        Err(HandlerError::transient("step 2 is down"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_saved_inline_is_stored_with_the_failure_and_seen_by_the_retry() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("checkout", 1)],
        vec![route(&["checkout"], RouteMode::Process, "checkout")],
    )
    .await;
    settings.retry.backoff_base = Duration::from_millis(10);
    settings.worker.poll_interval = Duration::from_millis(100);
    produce_values(&bootstrap, "checkout", &["order 7"]).await;
    let handler = StepThenFail::default();
    let fleet = Fleet::builder(settings.clone())
        .handler("checkout", handler.clone())
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    eventually(
        Duration::from_secs(30),
        "the retry resolved the task",
        || {
            let store = store.clone();
            async move {
                let status: Option<String> =
                    sqlx::query_scalar("SELECT status FROM recovery_task WHERE source_offset = 0")
                        .fetch_optional(store.pool())
                        .await
                        .unwrap();
                status.as_deref() == Some("resolved")
            }
        },
    )
    .await;
    member.stop().await;

    let seen = handler.seen.lock().unwrap().clone();
    let task = task_at(&store, "checkout", 0, 0).await;
    assert_eq!(
        seen,
        vec![
            (1, task.id.0, None),
            (2, task.id.0, Some(json!({ "steps_done": 1 }))),
        ],
        "the inline attempt ran as the stored task, and the retry started from its checkpoint"
    );
}

/// The checkout example on a process-mode route, SIGKILLed in the middle of its inline
/// attempt (after the payment): the message, delivered again, runs under a new task id
/// and from the first step (the checkpoint died with the member), under the same
/// idempotency key, so a downstream keyed on it takes one payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_again_after_a_crash_mid_call_keeps_its_idempotency_key() {
    let broker = cluster(&[("orders", 1)]);
    let bootstrap = broker.bootstrap_servers();
    let (store, settings) = fresh_store().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "checkout"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
[ingest]
linger = "10ms"
process_budget = "60s"
[[routes]]
topics = ["orders"]
mode = "process"
handler = "checkout"
"#
        ),
    )
    .unwrap();
    let member = |pause: bool| {
        let spawn = Spawn::example("checkout_saga", &settings)
            .config(&config)
            .env("CHECKOUT_LEDGER", ledger.display().to_string());
        match pause {
            true => spawn.env("CHECKOUT_PAUSE_AFTER", "take_payment"),
            false => spawn,
        }
        .start()
    };
    let lines = |path: &std::path::Path| -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    };

    let mut first = member(true);
    produce_values(&bootstrap, "orders", &[r#"{"order": 1}"#]).await;
    let paused = ledger.with_extension("paused");
    eventually(
        Duration::from_secs(30),
        "the inline attempt paid and paused",
        || async { lines(&paused).len() == 1 },
    )
    .await;
    first.kill();

    let mut second = member(false);
    eventually(Duration::from_secs(60), "the order published", || async {
        lines(&ledger).iter().any(|l| l.ends_with(" publish_event"))
    })
    .await;
    second.stop(Duration::from_secs(30)).await;

    let calls = lines(&ledger);
    assert_eq!(
        calls.len(),
        5,
        "two deliveries: saved and paid, then all three steps: {calls:?}"
    );
    let keys: BTreeSet<&str> = calls.iter().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        ["kafka:orders:0:0"],
        "both deliveries of the order call the downstream under one key: {calls:?}"
    );
    assert!(
        stored_ids(&store).await.is_empty(),
        "it succeeded inline: nothing stored"
    );
}

/// Records each attempt's idempotency key and fails it for good.
#[derive(Clone, Default)]
struct KeysSeen {
    keys: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Handler for KeysSeen {
    async fn handle(&self, _ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        self.keys.lock().unwrap().push(task.idempotency_key());
        Err(HandlerError::permanent("refused"))
    }
}

/// A topic recreated under the fleet: the new message at offset 0 finds its
/// coordinates held by the old message's task. Its inline attempt runs under the dedup
/// key it is stored under (with its content digest), never under the old task's key,
/// which a downstream would take for a repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_attempt_at_coordinates_another_task_holds_runs_under_its_own_key() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders", 1)],
        vec![route(&["orders"], RouteMode::Process, "orders")],
    )
    .await;
    let old = redrive::NewTask {
        dedup_key: Some("kafka:orders:0:0".into()),
        ..redrive::NewTask::new("orders", "the old topic's first message")
    };
    store.enqueue(&old).await.unwrap();
    settings.worker.enabled = false;
    produce_values(&bootstrap, "orders", &["the new topic's first message"]).await;
    let handler = KeysSeen::default();
    let fleet = Fleet::builder(settings.clone())
        .handler("orders", handler.clone())
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    wait_committed(&bootstrap, &settings.kafka.group_id, "orders", 1).await;
    member.stop().await;

    let stored: Vec<String> =
        sqlx::query_scalar("SELECT dedup_key FROM recovery_task WHERE source_topic = 'orders'")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let seen = handler.keys.lock().unwrap().clone();
    assert_eq!(
        seen, stored,
        "the attempt ran under the key it is stored under"
    );
    assert!(
        stored[0].starts_with("kafka:orders:0:0#"),
        "stored under its content digest: {stored:?}"
    );
}
