//! A member stopping while its Kafka brokers die (brokers hosted in a child process the
//! test kills): it stores the batch it holds and exits; its close is bounded.

use std::time::Duration;

use crate::support::{eventually, fresh_store, scalar, MemberProcess, Spawn};

/// Where a [`child_kafka_cluster`] writes its bootstrap servers.
const CLUSTER_FILE: &str = "REDRIVE_TEST_CLUSTER_FILE";

/// Entry point of a child process that hosts a mock Kafka cluster (three brokers, the
/// topic `orders.dlt` of four partitions) until it is killed, so that a test can kill
/// its brokers the hard way; not a test of its own: without `REDRIVE_TEST_CLUSTER_FILE`
/// it returns at once.
#[test]
fn child_kafka_cluster() {
    let Ok(file) = std::env::var(CLUSTER_FILE) else {
        return;
    };
    let cluster = rdkafka::mocking::MockCluster::new(3).unwrap();
    cluster.create_topic("orders.dlt", 4, 3).unwrap();
    std::fs::write(format!("{file}.part"), cluster.bootstrap_servers()).unwrap();
    std::fs::rename(format!("{file}.part"), &file).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A member capturing `orders.dlt` from brokers in a child process it can kill, with
/// 40 dead letters produced to it; `linger` is how long it holds a batch.
struct CutOff {
    store: redrive::Store,
    member: MemberProcess,
    brokers: MemberProcess,
    _dir: tempfile::TempDir,
}

async fn a_member_of_brokers_a_test_can_kill(linger: &str) -> CutOff {
    let (store, settings) = fresh_store().await;
    let dir = tempfile::tempdir().unwrap();
    let bootstrap_file = dir.path().join("bootstrap");
    let brokers = Spawn::test_child("ingest_shutdown::child_kafka_cluster", &settings)
        .env(CLUSTER_FILE, bootstrap_file.display().to_string())
        .start();
    eventually(Duration::from_secs(30), "the brokers up", || async {
        bootstrap_file.exists()
    })
    .await;
    let bootstrap = std::fs::read_to_string(&bootstrap_file).unwrap();
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "cut-off"
[ingest]
linger = "{linger}"
batch_size = 1000
[worker]
enabled = false
[[routes]]
topics = ["orders.dlt"]
mode = "capture"
handler = "log"
"#
        ),
    )
    .unwrap();
    let member = Spawn::binary(&settings).config(&config).start();
    eventually(Duration::from_secs(30), "partitions assigned", || async {
        !member.log_lines("partitions assigned").is_empty()
    })
    .await;
    let producer = crate::support::broker::producer(&bootstrap);
    for i in 0..40 {
        let letter = crate::support::broker::Sample {
            value: Some(format!("failure {i}").into()),
            partition: Some(i % 4),
            ..Default::default()
        };
        crate::support::broker::produce(&producer, "orders.dlt", &letter).await;
    }
    CutOff {
        store,
        member,
        brokers,
        _dir: dir,
    }
}

/// Found by the issue 17 attack: a member told to stop while its brokers died never
/// exited. Closing its consumer ran the revoke, whose synchronous offset commit
/// (librdkafka's, with no timeout) waited for a coordinator for ever. The close now has
/// a bound: the member stops, says why, and its uncommitted messages are delivered
/// again (and deduplicated) once the group moves its partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_whose_brokers_die_as_it_stops_still_exits() {
    let CutOff {
        store,
        mut member,
        mut brokers,
        ..
    } = a_member_of_brokers_a_test_can_kill("10ms").await;
    eventually(
        Duration::from_secs(30),
        "the dead letters stored",
        || async { scalar(&store, "SELECT count(*) FROM recovery_task").await == 40 },
    )
    .await;
    member.signal(libc::SIGTERM);
    brokers.kill();
    member.stopped(Duration::from_secs(45)).await;
}

/// A member stopping stores the batch it still holds, then commits its offsets. The
/// commit was synchronous, and with the brokers gone librdkafka's synchronous commit
/// waits for a coordinator for ever: the member never exited (a flake of the test
/// above, whenever the brokers died before its last commit). The batch is stored, the
/// commit is left to the bounded close, and the member exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_holding_a_batch_when_its_brokers_die_stores_it_and_exits() {
    let CutOff {
        store,
        mut member,
        mut brokers,
        ..
    } = a_member_of_brokers_a_test_can_kill("1min").await;
    // Nothing shows a consumed batch that is not stored yet: give the member time to
    // fetch the 40 messages (milliseconds on this host); the count below fails if not.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        0,
        "a batch lingering for a minute is not stored yet"
    );
    brokers.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    member.signal(libc::SIGTERM);
    member.stopped(Duration::from_secs(45)).await;
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        40,
        "the batch held at the stop is stored"
    );
}
