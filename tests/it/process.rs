//! Real processes: two fleet members sharing the work, one killed with SIGKILL, one
//! stopped with SIGTERM, and the `redrive` binary itself; two ingesting members, one
//! killed, the other taking over its partitions.
//!
//! A fleet member here is this test binary started again with `REDRIVE_TEST_CHILD`
//! set, running [`child_fleet_member`]: the same `Fleet::run` as `redrive run`, with a
//! test handler that records every call, or one that never finishes.

use async_trait::async_trait;
use redrive::{Fleet, Handler, HandlerContext, HandlerError, NewTask, Settings, Store, Task};
use std::time::{Duration, Instant};

use crate::support::broker::{cluster, committed, produce, producer, Sample};
use crate::support::{eventually, fresh_store, scalar, MemberProcess, Spawn};

const CHILD_ROLE: &str = "REDRIVE_TEST_CHILD";

/// Records each call in `calls`, then resolves the task.
struct Record {
    store: Store,
}

#[async_trait]
impl Handler for Record {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO calls (task_id, lease_version, worker) VALUES ($1, $2, $3)")
            .bind(task.id.0)
            .bind(task.lease_version)
            .bind(&ctx.worker_id)
            .execute(self.store.pool())
            .await
            .map_err(HandlerError::transient)?;
        Ok(())
    }
}

/// Never returns.
struct Hang;

#[async_trait]
impl Handler for Hang {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        std::future::pending().await
    }
}

/// Entry point of a child fleet member, not a test of its own: in the ordinary test
/// run (no `REDRIVE_TEST_CHILD`) it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_fleet_member() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    redrive::telemetry::init_logging(redrive::config::LogFormat::Text, "info");
    let settings = Settings::load(None, None).expect("child settings");
    let builder = Fleet::builder(settings.clone());
    let builder = match role.as_str() {
        "record" => {
            let store = Store::connect(&settings.database).await.unwrap();
            builder.handler("work", Record { store })
        }
        "hang" => builder.handler("work", Hang),
        other => panic!("unknown child role {other}"),
    };
    builder.build().unwrap().run().await.unwrap();
}

/// A child fleet member of `role` ("record" or "hang") with the environment `env`.
fn child(role: &str, settings: &Settings, env: &[(&str, &str)]) -> MemberProcess {
    Spawn::test_child("process::child_fleet_member", settings)
        .env(CHILD_ROLE, role)
        .env("REDRIVE__WORKER__POLL_INTERVAL", "200ms")
        .envs(env)
        .start()
}

/// `redrive run` of the real binary with the TOML file `config`.
fn binary(config: &std::path::Path, settings: &Settings) -> MemberProcess {
    Spawn::binary(settings).config(config).start()
}

/// The partitions `member` holds after its last rebalance, per its log.
fn partitions_held(member: &MemberProcess) -> usize {
    member
        .log_lines("partitions held")
        .last()
        .and_then(|line| line.split("count=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map_or(0, |count| count.parse().expect("a count"))
}

async fn create_calls_table(store: &Store) {
    sqlx::query(
        "CREATE TABLE calls (task_id bigint NOT NULL, lease_version bigint NOT NULL, \
         worker text NOT NULL, called_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(store.pool())
    .await
    .unwrap();
}

async fn enqueue_work(store: &Store, count: usize) {
    let tasks: Vec<NewTask> = (0..count)
        .map(|i| NewTask::new("work", i.to_string()))
        .collect();
    for chunk in tasks.chunks(1000) {
        store.enqueue_many(chunk).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn two_processes_of_four_workers_handle_each_of_ten_thousand_tasks_once() {
    let (store, settings) = fresh_store().await;
    create_calls_table(&store).await;
    enqueue_work(&store, 5_000).await;
    let env = [
        ("REDRIVE__WORKER__CONCURRENCY", "4"),
        ("REDRIVE__WORKER__BATCH_SIZE", "4"),
    ];
    let mut members = [
        child("record", &settings, &env),
        child("record", &settings, &env),
    ];
    enqueue_work(&store, 5_000).await;
    eventually(
        Duration::from_secs(180),
        "10,000 tasks resolved",
        || async { store.status_counts().await.unwrap().resolved == 10_000 },
    )
    .await;
    for member in &members {
        member.signal(libc::SIGTERM);
    }
    for member in &mut members {
        member.stopped(Duration::from_secs(30)).await;
    }
    assert_eq!(scalar(&store, "SELECT count(*) FROM calls").await, 10_000);
    assert_eq!(
        scalar(&store, "SELECT count(DISTINCT task_id) FROM calls").await,
        10_000,
        "a task was handled twice"
    );
    assert_eq!(
        scalar(&store, "SELECT count(DISTINCT worker) FROM calls").await,
        2,
        "both members worked"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_attempt WHERE outcome = 'resolved'"
        )
        .await,
        10_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_a_member_killed_with_sigkill_are_finished_by_another_after_lease_expiry() {
    let (store, settings) = fresh_store().await;
    create_calls_table(&store).await;
    enqueue_work(&store, 20).await;
    let env = [
        ("REDRIVE__WORKER__CONCURRENCY", "8"),
        ("REDRIVE__WORKER__LEASE", "2s"),
        ("REDRIVE__WORKER__HEARTBEAT", "500ms"),
    ];
    let mut doomed = child("hang", &settings, &env);
    let leased = "SELECT count(*) FROM recovery_task WHERE lease_owner IS NOT NULL";
    eventually(
        Duration::from_secs(30),
        "8 tasks leased by the doomed member",
        || async { scalar(&store, leased).await == 8 },
    )
    .await;
    doomed.kill();
    let stranded: Vec<(i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT id, next_attempt_at FROM recovery_task WHERE lease_owner IS NOT NULL",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(stranded.len(), 8);

    let mut rescuer = child("record", &settings, &env);
    eventually(Duration::from_secs(60), "all 20 tasks resolved", || async {
        store.status_counts().await.unwrap().resolved == 20
    })
    .await;
    rescuer.stop(Duration::from_secs(30)).await;

    assert_eq!(
        scalar(&store, "SELECT count(DISTINCT task_id) FROM calls").await,
        20,
        "none lost"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM calls").await,
        20,
        "none handled twice"
    );
    for (id, lease_deadline) in stranded {
        let (attempts, called_at): (i32, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
            "SELECT t.attempts, c.called_at FROM recovery_task t JOIN calls c ON c.task_id = t.id WHERE t.id = $1",
        )
        .bind(id)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(attempts, 2, "task {id}: the killed attempt counts");
        assert!(
            called_at >= lease_deadline,
            "task {id} taken over before its lease lapsed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_claiming_and_releases_leases_after_the_deadline() {
    let (store, settings) = fresh_store().await;
    enqueue_work(&store, 6).await;
    let env = [
        ("REDRIVE__WORKER__CONCURRENCY", "4"),
        ("REDRIVE__WORKER__SHUTDOWN_TIMEOUT", "500ms"),
    ];
    let mut member = child("hang", &settings, &env);
    let leased = "SELECT count(*) FROM recovery_task WHERE lease_owner IS NOT NULL";
    eventually(Duration::from_secs(30), "4 tasks leased", || async {
        scalar(&store, leased).await == 4
    })
    .await;
    member.stop(Duration::from_secs(15)).await;
    assert_eq!(scalar(&store, leased).await, 0);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE attempts > 0"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_attempt WHERE outcome = 'released'"
        )
        .await,
        4
    );
    assert_eq!(
        store.status_counts().await.unwrap().failed,
        6,
        "nothing lost or finished"
    );
}

const REBALANCE_TOPIC: &str = "rebalance.dlt";
const REBALANCE_PARTITIONS: i32 = 6;

/// A configuration file for ingesting members of `group`: the rebalance topic captured
/// with the `log` handler, no worker pool, and the consumer group settings left to
/// redrive's defaults.
fn capture_config(bootstrap: &str, group: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    write!(
        file,
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"{group}\"\n\n\
         [worker]\nenabled = false\n\n\
         [ingest]\nlinger = \"10ms\"\n\n\
         [[routes]]\ntopics = [\"{REBALANCE_TOPIC}\"]\nmode = \"capture\"\nhandler = \"log\"\n"
    )
    .unwrap();
    file
}

/// Produces `per_partition` messages to every partition of the rebalance topic.
async fn produce_to_every_partition(
    producer: &rdkafka::producer::FutureProducer,
    per_partition: usize,
) {
    for i in 0..per_partition {
        for partition in 0..REBALANCE_PARTITIONS {
            let sample = Sample {
                value: Some(format!("message {i} of partition {partition}").into_bytes()),
                partition: Some(partition),
                ..Sample::default()
            };
            produce(producer, REBALANCE_TOPIC, &sample).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_killed_members_partitions_move_to_the_survivor_within_the_session_timeout() {
    let (store, settings) = fresh_store().await;
    let broker = cluster(&[(REBALANCE_TOPIC, REBALANCE_PARTITIONS)]);
    let bootstrap = broker.bootstrap_servers();
    let group = format!("g-{:x}", rand::random::<u32>());
    let config = capture_config(&bootstrap, &group);
    let mut doomed = binary(config.path(), &settings);
    let mut survivor = binary(config.path(), &settings);
    let producer = producer(&bootstrap);
    let per_partition = 20;
    let per_round = per_partition as i64 * REBALANCE_PARTITIONS as i64;
    produce_to_every_partition(&producer, per_partition).await;
    eventually(
        Duration::from_secs(90),
        "both members hold partitions, and every message is stored",
        || async {
            partitions_held(&doomed) > 0
                && partitions_held(&survivor) > 0
                && partitions_held(&doomed) + partitions_held(&survivor)
                    == REBALANCE_PARTITIONS as usize
                && scalar(&store, "SELECT count(*) FROM recovery_task").await == per_round
        },
    )
    .await;
    for member in [&doomed, &survivor] {
        assert!(
            !member
                .log_lines("partitions assigned protocol=cooperative")
                .is_empty(),
            "the group uses the cooperative protocol; log:\n{}",
            member.log_tail()
        );
    }
    let revoked_before = survivor.log_lines("partitions revoked").len();

    doomed.kill();
    let killed = Instant::now();
    produce_to_every_partition(&producer, per_partition).await;
    // The group notices a death after the session timeout; librdkafka's mock coordinator
    // then waits a session timeout less one second for the members to rejoin (a real
    // broker goes on as soon as they have), so about two session timeouts pass.
    let limit = 4 * redrive::config::SESSION_TIMEOUT;
    eventually(
        limit.saturating_sub(killed.elapsed()),
        "every message produced after the kill stored by the survivor",
        || async { scalar(&store, "SELECT count(*) FROM recovery_task").await == 2 * per_round },
    )
    .await;
    assert_eq!(partitions_held(&survivor), REBALANCE_PARTITIONS as usize);
    assert_eq!(
        survivor.log_lines("partitions revoked").len(),
        revoked_before,
        "the survivor kept its own partitions through the rebalance; log:\n{}",
        survivor.log_tail()
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(DISTINCT (source_partition, source_offset)) FROM recovery_task"
        )
        .await,
        2 * per_round,
        "every produced message is exactly one task"
    );
    // The partitions taken over were added to the survivor's assignment incrementally;
    // its commits (filtered by that assignment) cover them.
    eventually(
        Duration::from_secs(30),
        "every offset committed",
        || async {
            committed(&bootstrap, &group, REBALANCE_TOPIC, REBALANCE_PARTITIONS)
                == vec![2 * per_partition as i64; REBALANCE_PARTITIONS as usize]
        },
    )
    .await;

    survivor.stop(Duration::from_secs(30)).await;
}
