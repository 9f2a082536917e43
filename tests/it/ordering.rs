//! Per-key ordering (`ordering = "key"`): a task is never attempted while an older task
//! of its route and key is open, under random interleavings of enqueues, claims,
//! outcomes, lapsed leases and operator actions; process mode runs nothing inline
//! behind an open failure of its key; real members killed mid-run keep every key's
//! deliveries in order.

use async_trait::async_trait;
use chrono::Utc;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redrive::config::{Ordering, RouteMode};
use redrive::store::{
    Action, Budget, Budgets, Finish, Operator, Selection, TaskFilter, ACTION_BATCH,
};
use redrive::task::{order_key, FinishOutcome, Status};
use redrive::{
    Failure, Fleet, Handler, HandlerContext, HandlerError, NewTask, Store, Task, TaskId,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::broker::{cluster, produce, producer, route, KafkaCase, Sample};
use crate::support::http_server::{Reply, TestServer};
use crate::support::{self, eventually, fresh_store, scalar, Member};

const KEYS: [&str; 4] = ["alice", "bob", "carol", "dave"];

/// A task of route "r" for `key` (none: keyless), as an ordered route ingests it.
fn ordered(key: Option<&str>, value: String) -> NewTask {
    NewTask {
        order_key: key.map(|k| order_key("r", k.as_bytes())),
        failure: Failure {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Some(value.into_bytes()),
            route: Some("r".into()),
            ..Failure::default()
        },
        ..NewTask::new("h", Vec::new())
    }
}

/// Older open tasks of `task`'s key: there must be none when it is claimed.
async fn open_ahead(store: &Store, task: &Task) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM recovery_task \
         WHERE order_key = (SELECT order_key FROM recovery_task WHERE id = $1) \
           AND status = 'failed' AND id < $1",
    )
    .bind(task.id.0)
    .fetch_one(store.pool())
    .await
    .unwrap()
}

fn finish(task: &Task, outcome: FinishOutcome) -> Finish {
    Finish {
        cause: None,
        lease: task.lease(),
        outcome,
        started_at: Utc::now(),
        duration: Duration::ZERO,
        error: None,
        compensate: false,
    }
}

/// Seeded random interleavings of everything that opens, ends, claims or abandons a
/// task (leases that lapse stand for crashed members). After every claim: no older
/// open task of the claimed task's key; after every step: at most one unheld open
/// task per key, and `check` finds nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn random_interleavings_never_attempt_a_task_before_an_older_open_task_of_its_key() {
    let (store, _) = fresh_store().await;
    let handlers = ["h".to_owned()];
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("random".into()),
    };
    let budgets = Budgets {
        default: 1000,
        ..Budgets::default()
    };
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut leased: Vec<Task> = Vec::new();
        let mut claims = 0;
        for step in 0..150 {
            match rng.random_range(0..10) {
                0..=2 => {
                    let batch: Vec<NewTask> = (0..rng.random_range(1..5))
                        .map(|n| {
                            let key = (!rng.random_bool(0.15))
                                .then(|| KEYS[rng.random_range(0..KEYS.len())]);
                            ordered(key, format!("{seed}-{step}-{n}"))
                        })
                        .collect();
                    store.enqueue_many(&batch).await.unwrap();
                }
                3..=5 => {
                    // A short lease now and then: a member that dies with it.
                    let lease = if rng.random_bool(0.2) {
                        Duration::from_millis(1)
                    } else {
                        Duration::from_secs(60)
                    };
                    let claimed = store
                        .claim(&handlers, rng.random_range(1..4), "w", lease)
                        .await
                        .unwrap();
                    for task in claimed {
                        claims += 1;
                        assert_eq!(
                            open_ahead(&store, &task).await,
                            0,
                            "seed {seed} step {step}: task {} claimed behind an open task of its key",
                            task.id
                        );
                        assert!(!task.held);
                        if lease > Duration::from_secs(1) {
                            leased.push(task);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                6..=8 if !leased.is_empty() => {
                    let task = leased.swap_remove(rng.random_range(0..leased.len()));
                    let outcome = match rng.random_range(0..4) {
                        0 => FinishOutcome::Retry { at: Utc::now() },
                        1 => FinishOutcome::PermanentFailure,
                        _ => FinishOutcome::Resolved,
                    };
                    store.finish("w", &[finish(&task, outcome)]).await.unwrap();
                }
                _ => {
                    // An operator discards a random open task, held or not.
                    let open: Vec<i64> = sqlx::query_scalar(
                        "SELECT id FROM recovery_task WHERE status = 'failed' ORDER BY random() LIMIT 1",
                    )
                    .fetch_all(store.pool())
                    .await
                    .unwrap();
                    if let Some(id) = open.first() {
                        store
                            .act(
                                &operator,
                                &Action::Discard,
                                &Selection::Ids(vec![TaskId(*id)]),
                            )
                            .await
                            .unwrap();
                        // A worker holding it stops its call and says so.
                        if let Some(at) = leased.iter().position(|t| t.id.0 == *id) {
                            let fenced = leased.swap_remove(at);
                            store.calls_stopped(&[fenced.lease()]).await.unwrap();
                        }
                    }
                }
            }
            assert_eq!(
                scalar(
                    &store,
                    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM recovery_task \
                     WHERE order_key IS NOT NULL AND status = 'failed' AND NOT held \
                     GROUP BY order_key) k",
                )
                .await
                .max(1),
                1,
                "seed {seed} step {step}: two unheld open tasks of one key"
            );
        }
        assert!(claims > 25, "seed {seed}: only {claims} claims");
        assert_eq!(store.check(&budgets).await.unwrap().violations, []);
        // Drain: everything ends, in order, and nothing stays held.
        for task in leased.drain(..) {
            store
                .finish("w", &[finish(&task, FinishOutcome::Resolved)])
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        loop {
            let claimed = store
                .claim(&handlers, 10, "w", Duration::from_secs(60))
                .await
                .unwrap();
            if claimed.is_empty() {
                break;
            }
            for task in &claimed {
                assert_eq!(open_ahead(&store, task).await, 0, "seed {seed}: drain");
            }
            let done: Vec<Finish> = claimed
                .iter()
                .map(|t| finish(t, FinishOutcome::Resolved))
                .collect();
            store.finish("w", &done).await.unwrap();
        }
        assert_eq!(
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'failed'"
            )
            .await,
            0,
            "seed {seed}: a task stayed held"
        );
    }
}

#[tokio::test]
async fn an_operators_retry_of_a_held_task_keeps_it_behind_and_a_reopened_task_queues() {
    let (store, _) = fresh_store().await;
    let handlers = ["h".to_owned()];
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("now".into()),
    };
    let ids: Vec<TaskId> = store
        .enqueue_many(&[
            ordered(Some("k"), "1".into()),
            ordered(Some("k"), "2".into()),
            ordered(None, "keyless".into()),
        ])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();
    let retry_now = Action::Retry {
        at: None,
        budget: redrive::store::Budget::Fresh,
        force: false,
    };
    store
        .act(&operator, &retry_now, &Selection::Ids(vec![ids[1]]))
        .await
        .unwrap();
    let held = store.get(ids[1]).await.unwrap().unwrap();
    assert!(held.held, "still behind task 1");
    let claimed = store
        .claim(&handlers, 10, "w", Duration::from_secs(60))
        .await
        .unwrap();
    let mut claimed_ids: Vec<TaskId> = claimed.iter().map(|t| t.id).collect();
    claimed_ids.sort();
    assert_eq!(
        claimed_ids,
        [ids[0], ids[2]],
        "the keyless task is never held"
    );

    let first = claimed.iter().find(|t| t.id == ids[0]).unwrap();
    store
        .finish("w", &[finish(first, FinishOutcome::PermanentFailure)])
        .await
        .unwrap();
    let released = store.get(ids[1]).await.unwrap().unwrap();
    assert!(!released.held);
    assert!(released.next_attempt_at <= Utc::now());
    // Task 1 retried by an operator while task 2 is open: it queues behind task 2.
    store
        .act(&operator, &retry_now, &Selection::Ids(vec![ids[0]]))
        .await
        .unwrap();
    assert!(store.get(ids[0]).await.unwrap().unwrap().held);
    let claimed = store
        .claim(&handlers, 10, "w", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[1]]);
}

/// Fails `a1` on its first call (inline); records every call.
struct Ledger {
    calls: Arc<Mutex<Vec<(String, u32)>>>,
}

#[async_trait]
impl Handler for Ledger {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let value = String::from_utf8_lossy(task.failure.value.as_deref().unwrap_or_default());
        self.calls
            .lock()
            .unwrap()
            .push((value.to_string(), ctx.attempt));
        match (value.as_ref(), ctx.attempt) {
            ("a1" | "n1", 1) => Err(HandlerError::transient("balance service down")),
            _ => Ok(()),
        }
    }

    fn backoff(&self) -> Option<redrive::Backoff> {
        Some(redrive::Backoff {
            base: Duration::from_millis(1500),
            factor: 1.0,
            cap: Duration::from_millis(1500),
            jitter: redrive::Jitter::None,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn process_mode_runs_nothing_inline_behind_an_open_failure_of_its_key() {
    let mut ordered_route = route(&["balances"], RouteMode::Process, "ledger");
    ordered_route.ordering = Ordering::Key;
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(&[("balances", 1)], vec![ordered_route]).await;
    // Small batches: a key's messages land in several, each looking at the stored ones.
    settings.ingest.batch_size = 2;
    settings.worker.poll_interval = Duration::from_millis(100);
    let producer = producer(&bootstrap);
    let messages = [
        (Some("A"), "a1"),
        (Some("B"), "b1"),
        (Some("A"), "a2"),
        (None, "n1"),
        (None, "n2"),
        (Some("B"), "b2"),
        (Some("A"), "a3"),
    ];
    for (key, value) in messages {
        produce(
            &producer,
            "balances",
            &Sample {
                key: key.map(|k| k.as_bytes().to_vec()),
                value: Some(value.into()),
                ..Sample::default()
            },
        )
        .await;
    }
    let calls = Arc::new(Mutex::new(Vec::new()));
    let fleet = Fleet::builder(settings.clone())
        .handler(
            "ledger",
            Ledger {
                calls: calls.clone(),
            },
        )
        .build()
        .unwrap();
    let running = Member::start(fleet, &store);
    eventually(
        Duration::from_secs(30),
        "every stored task resolved",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
            )
            .await
                == 4
        },
    )
    .await;
    running.stop().await;

    let calls = calls.lock().unwrap().clone();
    let of = |prefix: &str| -> Vec<(String, u32)> {
        calls
            .iter()
            .filter(|(v, _)| v.starts_with(prefix))
            .cloned()
            .collect()
    };
    let expect = |list: &[(&str, u32)]| -> Vec<(String, u32)> {
        list.iter().map(|(v, a)| (v.to_string(), *a)).collect()
    };
    assert_eq!(
        of("a"),
        expect(&[("a1", 1), ("a1", 2), ("a2", 1), ("a3", 1)]),
        "a2 and a3 wait for a1, then run in order, from the pool"
    );
    assert_eq!(
        of("b"),
        expect(&[("b1", 1), ("b2", 1)]),
        "key B is not held by A"
    );
    assert_eq!(
        of("n"),
        expect(&[("n1", 1), ("n2", 1), ("n1", 2)]),
        "keyless messages are never held"
    );
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT convert_from(msg_value, 'UTF8') FROM recovery_task ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(stored, ["a1", "a2", "n1", "a3"]);
}

/// The value of an envelope call, and its key.
fn key_and_sequence(body: &serde_json::Value) -> (String, u64) {
    let key = body["key"]["data"].as_str().unwrap().to_owned();
    let value = body["value"]["data"].as_str().unwrap();
    (key, value.parse().unwrap())
}

/// Real `redrive run` members calling a webhook that fails a third of the calls; one
/// member killed with SIGKILL mid-run and started again. Per key, the calls the server
/// saw never go back to an earlier message, and every message was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn killed_members_keep_every_keys_deliveries_in_order() {
    const PER_KEY: u64 = 40;
    let broker = cluster(&[("accounts.dlt", 3)]);
    let (store, settings) = fresh_store().await;
    let bootstrap = broker.bootstrap_servers();
    let server = TestServer::start(|_| {
        if rand::random_bool(0.33) {
            Reply::status(503)
        } else {
            Reply::status(200).after(Duration::from_millis(rand::random_range(0..20)))
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "ordering-{group}"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
[ingest]
linger = "10ms"
batch_size = 20
[worker]
lease = "2s"
heartbeat = "500ms"
poll_interval = "100ms"
[retry]
max_attempts = 1000
backoff_base = "20ms"
backoff_cap = "100ms"
[webhooks.accounts]
url = "{url}"
[[routes]]
topics = ["accounts.dlt"]
mode = "capture"
handler = "accounts"
ordering = "key"
"#,
            group = rand::random::<u32>(),
            url = server.url("/balance"),
        ),
    )
    .unwrap();
    let member = || {
        crate::support::cli::redrive(&settings)
            .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", &bootstrap)
            .arg("--config")
            .arg(&config)
            .arg("run")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = member();
    let mut second = member();
    let producer = producer(&bootstrap);
    for seq in 0..PER_KEY {
        for key in KEYS {
            produce(
                &producer,
                "accounts.dlt",
                &Sample {
                    key: Some(key.into()),
                    value: Some(seq.to_string().into()),
                    ..Sample::default()
                },
            )
            .await;
        }
    }
    eventually(
        Duration::from_secs(60),
        "a third of the work done",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
            )
            .await
                > (PER_KEY as i64 * KEYS.len() as i64) / 3
        },
    )
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let mut third = member();
    let total = PER_KEY as i64 * KEYS.len() as i64;
    eventually(Duration::from_secs(120), "every task resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == total
    })
    .await;
    for child in [&mut second, &mut third] {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for request in server.requests() {
        let (key, seq) = key_and_sequence(&request.json());
        seen.entry(key).or_default().push(seq);
    }
    let mut delivered: HashMap<String, u64> = HashMap::new();
    for (key, sequence) in &seen {
        assert!(
            sequence.windows(2).all(|w| w[0] <= w[1]),
            "key {key} went back to an earlier message: {sequence:?}"
        );
        delivered.insert(key.clone(), sequence.last().copied().unwrap_or_default());
    }
    for key in KEYS {
        assert_eq!(
            delivered.get(key),
            Some(&(PER_KEY - 1)),
            "key {key}: {seen:?}"
        );
        let distinct: std::collections::BTreeSet<u64> = seen[key].iter().copied().collect();
        assert_eq!(
            distinct.len() as u64,
            PER_KEY,
            "key {key}: every message called"
        );
    }
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task WHERE held").await,
        0
    );
}

/// An operator batch that reopens many final tasks of one key makes the oldest due and
/// holds the rest behind it, whatever order the plan visits the rows in: with 64 kB of
/// `work_mem` the batch's join is a multi-batch hash join that reorders them.
#[tokio::test]
async fn a_batch_reopening_a_keys_tasks_makes_its_oldest_due_whatever_the_plan() {
    let (store, mut settings) = fresh_store().await;
    let url = format!("{}?options[work_mem]=64kB", support::database_url());
    settings.database.url = url.into();
    let small_memory = Store::connect(&settings.database).await.unwrap();
    let work_mem: String = sqlx::query_scalar("SHOW work_mem")
        .fetch_one(small_memory.pool())
        .await
        .unwrap();
    assert_eq!(work_mem, "64kB");
    // One batch of final tasks, most of them of key "k", then enough resolved tasks
    // (which a retry leaves alone) that the join's hash table needs several batches.
    let tasks: Vec<NewTask> = (0..ACTION_BATCH + 4000)
        .map(|i| NewTask {
            status: if i < ACTION_BATCH {
                Status::PermanentFailure
            } else {
                Status::Resolved
            },
            ..ordered((i % 5 != 0).then_some("k"), i.to_string())
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    sqlx::query("ANALYZE recovery_task")
        .execute(store.pool())
        .await
        .unwrap();
    let retry = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    let everything = Selection::Filter(TaskFilter::default());
    let operator = Operator {
        actor: "ops".into(),
        reason: None,
    };
    let report = small_memory
        .act(&operator, &retry, &everything)
        .await
        .unwrap();
    assert_eq!(report.changed, ACTION_BATCH);
    let unheld: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM recovery_task WHERE order_key IS NOT NULL AND status = 'failed' \
         AND NOT held ORDER BY id",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    let oldest: i64 = scalar(
        &store,
        "SELECT min(id) FROM recovery_task WHERE order_key IS NOT NULL AND status = 'failed'",
    )
    .await;
    assert_eq!(unheld, [oldest], "only the key's oldest task is due");
    let due = store.get(TaskId(oldest)).await.unwrap().unwrap();
    assert!(due.next_attempt_at <= Utc::now());
    let budgets = Budgets::default();
    assert_eq!(store.check(&budgets).await.unwrap().violations, []);
}
