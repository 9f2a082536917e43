//! Ingest under random faults: inserts that fail or stall, members that join (a
//! rebalance) and shut down, batches of random sizes. Afterwards every produced message
//! is exactly one task, and at every check the committed offsets never passed a message
//! that was not stored.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redrive::config::RouteMode;
use redrive::{Settings, Store};
use std::time::Duration;

use crate::support::broker::{produce, producer, route, KafkaCase, Sample};
use crate::support::fleet;
use crate::support::{eventually, scalar, Member};

const TOPIC: &str = "faults";
const PARTITIONS: i32 = 4;

/// Makes inserts into the task table fail (as in an outage) or stall, at random.
async fn inject_faults(store: &Store) {
    sqlx::raw_sql(
        "CREATE TABLE fault_rates (fail float8 NOT NULL, stall float8 NOT NULL);
         INSERT INTO fault_rates VALUES (0.2, 0.2);
         CREATE FUNCTION random_fault() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE r fault_rates;
         BEGIN
           SELECT * INTO r FROM fault_rates;
           IF random() < r.stall THEN PERFORM pg_sleep(random() * 0.3); END IF;
           IF random() < r.fail THEN
             RAISE EXCEPTION 'injected fault' USING ERRCODE = '40001';
           END IF;
           RETURN NULL;
         END $$;
         CREATE TRIGGER random_fault BEFORE INSERT ON recovery_task
           FOR EACH STATEMENT EXECUTE FUNCTION random_fault();",
    )
    .execute(store.pool())
    .await
    .unwrap();
}

/// Checks that every offset below each committed offset is stored as a task.
async fn committed_never_passes_an_unstored_message(store: &Store, settings: &Settings, seed: u64) {
    let (bootstrap, group) = (
        settings.kafka.bootstrap_servers.clone(),
        settings.kafka.group_id.clone(),
    );
    let committed = tokio::task::spawn_blocking(move || {
        crate::support::broker::committed(&bootstrap, &group, TOPIC, PARTITIONS)
    })
    .await
    .unwrap();
    for (partition, committed) in committed.into_iter().enumerate() {
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT source_offset) FROM recovery_task \
             WHERE source_partition = $1 AND source_offset < $2",
        )
        .bind(partition as i32)
        .bind(committed)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(
            stored, committed,
            "seed {seed}: partition {partition} committed {committed} with only {stored} stored below it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn random_faults_rebalances_and_shutdowns_lose_and_duplicate_nothing() {
    let seed: u64 = std::env::var("REDRIVE_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let KafkaCase {
        broker: _broker,
        store,
        mut settings,
        ..
    } = KafkaCase::new(
        &[(TOPIC, PARTITIONS)],
        vec![route(&[TOPIC], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    inject_faults(&store).await;

    let producer = producer(&settings.kafka.bootstrap_servers);
    let total = 400;
    let feeding = tokio::spawn(async move {
        for i in 0..total {
            let sample = Sample {
                value: Some(format!("failure {i}").into_bytes()),
                partition: Some(i % PARTITIONS),
                ..Sample::default()
            };
            produce(&producer, TOPIC, &sample).await;
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    let mut members: Vec<Member> = Vec::new();
    for _round in 0..8 {
        let join = members.is_empty() || (members.len() < 3 && rng.random_bool(0.6));
        if join {
            let mut member = settings.clone();
            member.ingest.batch_size = rng.random_range(1..=60);
            member.ingest.linger = Duration::from_millis(rng.random_range(5..=100));
            members.push(Member::start(fleet(&member), &store));
        } else {
            let leaving = members.remove(rng.random_range(0..members.len()));
            leaving.stop().await;
            committed_never_passes_an_unstored_message(&store, &settings, seed).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..=1200))).await;
        committed_never_passes_an_unstored_message(&store, &settings, seed).await;
    }
    feeding.await.unwrap();

    sqlx::query("UPDATE fault_rates SET fail = 0, stall = 0")
        .execute(store.pool())
        .await
        .unwrap();
    let per_partition = i64::from(total / PARTITIONS);
    let (bootstrap, group) = (
        settings.kafka.bootstrap_servers.clone(),
        settings.kafka.group_id.clone(),
    );
    if members.is_empty() {
        members.push(Member::start(fleet(&settings), &store));
    }
    eventually(Duration::from_secs(60), "every offset committed", || {
        let (bootstrap, group) = (bootstrap.clone(), group.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                crate::support::broker::committed(&bootstrap, &group, TOPIC, PARTITIONS)
            })
            .await
            .unwrap()
                == vec![per_partition; PARTITIONS as usize]
        }
    })
    .await;
    for member in members {
        member.stop().await;
    }
    committed_never_passes_an_unstored_message(&store, &settings, seed).await;
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        i64::from(total),
        "seed {seed}: one task per message"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(DISTINCT (source_partition, source_offset)) FROM recovery_task"
        )
        .await,
        i64::from(total),
        "seed {seed}: no duplicates"
    );
}

/// Regression: an offset commit the broker refused was never tried again while its
/// partition stayed idle, so the group's committed offset stayed behind what was
/// stored (lag for ever, and a redelivery at the next rebalance or restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_refused_commit_is_tried_again_though_no_message_follows() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let KafkaCase {
        broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("idle.dlt", 1)],
        vec![route(&["idle.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    let group = settings.kafka.group_id.clone();
    let member = Member::start(fleet(&settings), &store);
    let producer = producer(&bootstrap);
    produce(&producer, "idle.dlt", &Sample::default()).await;
    eventually(
        Duration::from_secs(30),
        "the first message committed",
        || async {
            crate::support::broker::committed(&bootstrap, &group, "idle.dlt", 1) == vec![1]
        },
    )
    .await;
    broker.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 3],
    );
    for _ in 0..5 {
        produce(&producer, "idle.dlt", &Sample::default()).await;
    }
    eventually(Duration::from_secs(30), "all six stored", || async {
        scalar(&store, "SELECT count(*) FROM recovery_task").await == 6
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the refused commit tried again until it is taken",
        || async {
            crate::support::broker::committed(&bootstrap, &group, "idle.dlt", 1) == vec![6]
        },
    )
    .await;
    member.stop().await;
}
