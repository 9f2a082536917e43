//! A topic recreated under old offsets (here: the fleet pointed at a fresh cluster over
//! the same database, as after a cluster replacement): offsets start again, and no new
//! message may be taken for an old one, in any mode, ordered or not.
//!
//! Regression: an ordered process-mode route dropped new messages of known keys (none
//! called, none stored, only the `redelivered` counter moved): its rule "a newer message
//! of this key has a task" compared offsets across the topic's two lives.

use async_trait::async_trait;
use redrive::config::{Ordering, RouteMode};
use redrive::{Fleet, Handler, HandlerContext, HandlerError, Settings, Store, Task};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::broker::{cluster, committed, produce, producer, route, KafkaCase, Sample};
use crate::support::{eventually, scalar, Member};

/// Fails values that start with `fail`; records every value it is called with.
#[derive(Clone, Default)]
struct Judge {
    called: Arc<Mutex<Vec<Vec<u8>>>>,
}

#[async_trait]
impl Handler for Judge {
    async fn handle(&self, _: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let value = task.failure.value.clone().unwrap_or_default();
        self.called.lock().unwrap().push(value.clone());
        match value.starts_with(b"fail") {
            true => Err(HandlerError::permanent("refused")),
            false => Ok(()),
        }
    }
}

const KEYS: usize = 10;

/// Produces `count` messages of keys `k0`..`k9` to `topic`, valued `{prefix}-{i}`.
async fn produce_keyed(bootstrap: &str, count: usize, prefix: impl Fn(usize) -> String) {
    let producer = producer(bootstrap);
    for i in 0..count {
        let sample = Sample {
            key: Some(format!("k{}", i % KEYS).into_bytes()),
            value: Some(format!("{}-{i}", prefix(i)).into_bytes()),
            ..Sample::default()
        };
        produce(&producer, "pay", &sample).await;
    }
}

/// Runs a member until its group committed `count` on `pay`, then stops it.
async fn ingest_until_committed(settings: &Settings, store: &Store, judge: &Judge, count: i64) {
    let fleet = Fleet::builder(settings.clone())
        .handler("judge", judge.clone())
        .build()
        .unwrap();
    let member = Member::start(fleet, store);
    let (bootstrap, group) = (
        settings.kafka.bootstrap_servers.clone(),
        settings.kafka.group_id.clone(),
    );
    eventually(Duration::from_secs(60), "every message committed", || {
        let (bootstrap, group) = (bootstrap.clone(), group.clone());
        async move {
            tokio::task::spawn_blocking(move || committed(&bootstrap, &group, "pay", 1))
                .await
                .unwrap()
                == [count]
        }
    })
    .await;
    member.stop().await;
}

async fn new_messages_at_old_offsets_are_kept(mode: RouteMode, ordering: Ordering) {
    let mut pay = route(&["pay"], mode, "judge");
    pay.ordering = ordering;
    let KafkaCase {
        broker: first,
        store,
        mut settings,
        ..
    } = KafkaCase::new(&[("pay", 1)], vec![pay]).await;
    settings.worker.enabled = false;
    let judge = Judge::default();
    // The first life: 60 messages, every other one a failure with a task.
    produce_keyed(&first.bootstrap_servers(), 60, |i| {
        if i % 2 == 0 { "fail" } else { "ok" }.to_owned()
    })
    .await;
    ingest_until_committed(&settings, &store, &judge, 60).await;
    let old_tasks = scalar(&store, "SELECT count(*) FROM recovery_task").await;
    assert!(old_tasks >= 30, "{old_tasks}");
    // Finished, so that no key waits behind an open task.
    sqlx::query("UPDATE recovery_task SET status = 'resolved', finished_at = now()")
        .execute(store.pool())
        .await
        .unwrap();
    judge.called.lock().unwrap().clear();

    // The second life: the same topic name on a fresh cluster, the same group and
    // database; 20 new messages of the same keys at offsets the first life used.
    drop(first);
    let second = cluster(&[("pay", 1)]);
    settings.kafka.bootstrap_servers = second.bootstrap_servers();
    produce_keyed(&second.bootstrap_servers(), 20, |_| "new".to_owned()).await;
    ingest_until_committed(&settings, &store, &judge, 20).await;

    let stored = scalar(
        &store,
        "SELECT count(*) FROM recovery_task WHERE msg_value LIKE 'new-%'",
    )
    .await;
    let called: Vec<String> = (judge.called.lock().unwrap().iter())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    match mode {
        RouteMode::Capture => assert_eq!(stored, 20, "every dead letter is a task"),
        RouteMode::Process => {
            let mut new: Vec<&String> = called.iter().filter(|v| v.starts_with("new-")).collect();
            new.sort();
            new.dedup();
            assert_eq!(
                (new.len(), stored),
                (20, 0),
                "every new message called inline (and resolved), none dropped: {called:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_ordered_process_route_runs_new_messages_at_old_offsets() {
    new_messages_at_old_offsets_are_kept(RouteMode::Process, Ordering::Key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_unordered_process_route_runs_new_messages_at_old_offsets() {
    new_messages_at_old_offsets_are_kept(RouteMode::Process, Ordering::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_ordered_capture_route_stores_new_dead_letters_at_old_offsets() {
    new_messages_at_old_offsets_are_kept(RouteMode::Capture, Ordering::Key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_unordered_capture_route_stores_new_dead_letters_at_old_offsets() {
    new_messages_at_old_offsets_are_kept(RouteMode::Capture, Ordering::None).await;
}
