//! Failures of the parts around redrive: a killed ingest process, a rebalance, a
//! PostgreSQL outage. Every consumed message ends as exactly one task.

use redrive::config::RouteMode;
use redrive::Store;
use std::time::Duration;

use crate::support::broker::{committed, produce, producer, route, KafkaCase, Sample};
use crate::support::fleet;
use crate::support::{eventually, fresh_store, scalar, Member, PgProxy, Spawn};

async fn tasks(store: &Store) -> i64 {
    scalar(store, "SELECT count(*) FROM recovery_task").await
}

async fn produce_range(bootstrap: &str, topic: &str, range: std::ops::Range<usize>) {
    let producer = producer(bootstrap);
    for i in range {
        let sample = Sample {
            value: Some(format!("failure {i}").into()),
            ..Sample::default()
        };
        produce(&producer, topic, &sample).await;
    }
}

async fn committed_total(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> i64 {
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        committed(&bootstrap, &group, &topic, partitions)
            .iter()
            .sum()
    })
    .await
    .unwrap()
}

/// Each value `failure N` for N in 0..total is stored exactly once.
async fn assert_each_message_once(store: &Store, total: usize) {
    let values: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT msg_value FROM recovery_task ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let mut seen: Vec<String> = values
        .iter()
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    seen.sort();
    let mut expected: Vec<String> = (0..total).map(|i| format!("failure {i}")).collect();
    expected.sort();
    assert_eq!(seen, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_ingest_process_killed_mid_stream_loses_and_duplicates_nothing() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        settings,
    } = KafkaCase::new(&[("stream.dlt", 3)], Vec::new()).await;
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    let toml = format!(
        "[worker]\nenabled = false\n[ingest]\nbatch_size = 50\nlinger = \"5ms\"\n\
         [kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"{}\"\n\
         [kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
         [[routes]]\ntopics = [\"stream.dlt\"]\nmode = \"capture\"\nhandler = \"log\"\n",
        settings.kafka.group_id
    );
    std::fs::write(config.path(), toml).unwrap();
    let start = || Spawn::binary(&settings).config(config.path()).start();
    produce_range(&bootstrap, "stream.dlt", 0..3000).await;
    let mut first = start();
    eventually(Duration::from_secs(60), "ingest under way", || async {
        let n = tasks(&store).await;
        n > 0 && n < 3000
    })
    .await;
    first.kill();
    let at_kill = tasks(&store).await;
    produce_range(&bootstrap, "stream.dlt", 3000..4000).await;
    let mut second = start();
    eventually(Duration::from_secs(90), "4000 tasks", || async {
        tasks(&store).await == 4000
    })
    .await;
    let group = settings.kafka.group_id.clone();
    eventually(
        Duration::from_secs(30),
        "every offset committed",
        || async { committed_total(&bootstrap, &group, "stream.dlt", 3).await == 4000 },
    )
    .await;
    second.stop(Duration::from_secs(30)).await;
    assert!(at_kill < 4000, "killed mid-stream ({at_kill} stored)");
    assert_each_message_once(&store, 4000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_joining_mid_stream_shares_partitions_without_duplicates() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("shared.dlt", 4)],
        vec![route(&["shared.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.batch_size = 20;
    produce_range(&bootstrap, "shared.dlt", 0..1000).await;
    let first = Member::start(fleet(&settings), &store);
    eventually(Duration::from_secs(60), "ingest under way", || async {
        tasks(&store).await > 0
    })
    .await;
    let second = Member::start(fleet(&settings), &store);
    produce_range(&bootstrap, "shared.dlt", 1000..2000).await;
    eventually(Duration::from_secs(90), "2000 tasks", || async {
        tasks(&store).await == 2000
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "every offset committed",
        || async {
            committed_total(&bootstrap, &settings.kafka.group_id, "shared.dlt", 4).await == 2000
        },
    )
    .await;
    first.stop().await;
    second.stop().await;
    assert_each_message_once(&store, 2000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_postgres_outage_stops_commits_then_ingest_resumes_with_nothing_lost() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        settings,
    } = KafkaCase::new(
        &[("pg.dlt", 2)],
        vec![route(&["pg.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    let proxy = PgProxy::start().await;
    let mut through_proxy = proxy.route(&settings);
    through_proxy.worker.enabled = false;
    let group = through_proxy.kafka.group_id.clone();
    let proxied_store = Store::connect(&through_proxy.database).await.unwrap();
    let running = Member::start(fleet(&through_proxy), &proxied_store);
    produce_range(&bootstrap, "pg.dlt", 0..200).await;
    eventually(Duration::from_secs(60), "200 tasks", || async {
        tasks(&store).await == 200
    })
    .await;

    proxy.cut();
    produce_range(&bootstrap, "pg.dlt", 200..400).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stored = tasks(&store).await;
    let committed_during = committed_total(&bootstrap, &group, "pg.dlt", 2).await;
    assert!(
        committed_during <= stored,
        "committed {committed_during} offsets but stored {stored} tasks"
    );
    assert_eq!(
        stored, 200,
        "nothing stored while the database is unreachable"
    );

    proxy.restore();
    eventually(Duration::from_secs(60), "400 tasks", || async {
        tasks(&store).await == 400
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "every offset committed",
        || async { committed_total(&bootstrap, &group, "pg.dlt", 2).await == 400 },
    )
    .await;
    running.stop().await;
    assert_each_message_once(&store, 400).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_pauses_the_worker_pool_which_then_finishes_every_task_once() {
    let (store, settings) = fresh_store().await;
    let proxy = PgProxy::start().await;
    let mut through_proxy = proxy.route(&settings);
    through_proxy.worker.lease = std::time::Duration::from_secs(3);
    through_proxy.worker.heartbeat = std::time::Duration::from_secs(1);
    let tasks_in: Vec<redrive::NewTask> = (0..300)
        .map(|i| redrive::NewTask::new("log", format!("failure {i}")))
        .collect();
    store.enqueue_many(&tasks_in[..100]).await.unwrap();
    let proxied_store = Store::connect(&through_proxy.database).await.unwrap();
    let running = Member::start(fleet(&through_proxy), &proxied_store);
    eventually(
        Duration::from_secs(30),
        "the first 100 resolved",
        || async { store.status_counts().await.unwrap().resolved == 100 },
    )
    .await;
    proxy.cut();
    store.enqueue_many(&tasks_in[100..]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        store.status_counts().await.unwrap().resolved,
        100,
        "no work while cut off"
    );
    proxy.restore();
    eventually(Duration::from_secs(60), "all 300 resolved", || async {
        store.status_counts().await.unwrap().resolved == 300
    })
    .await;
    running.stop().await;
    assert_each_message_once(&store, 300).await;
    let resolved_attempts = scalar(
        &store,
        "SELECT count(*) FROM recovery_attempt WHERE outcome = 'resolved'",
    )
    .await;
    assert_eq!(resolved_attempts, 300, "each task finished once");
}

/// Regression (found by the chaos suite): `redrive run` exited with status 1 when its
/// database connection failed during start-up. It waits for PostgreSQL now; an error
/// waiting cannot cure (a database that does not exist) still stops it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_started_while_postgres_is_down_waits_for_it_then_works() {
    use secrecy::ExposeSecret;
    let (store, settings) = fresh_store().await;
    let id = store
        .enqueue(&redrive::NewTask::new("log", "waited"))
        .await
        .unwrap()
        .id();
    let proxy = PgProxy::start().await;
    proxy.cut();
    let routed = proxy.route(&settings);
    let run = |settings: &redrive::Settings| {
        Spawn::binary(settings)
            .env("REDRIVE__DATABASE__CONNECT_TIMEOUT", "1s")
            .env("REDRIVE__WORKER__POLL_INTERVAL", "100ms")
            .start()
    };
    let mut member = run(&routed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        member.exited().is_none(),
        "the member gave up while the database was down"
    );
    proxy.restore();
    eventually(Duration::from_secs(30), "the task resolved", || async {
        store.get(id).await.unwrap().unwrap().status == redrive::Status::Resolved
    })
    .await;
    member.kill();

    let mut missing = settings.clone();
    missing.database.url = (settings.database.url.expose_secret())
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/no_such_database_here"))
        .unwrap()
        .into();
    let mut member = run(&missing);
    assert!(!member.wait(Duration::from_secs(30)).await.success());
    assert!(
        !member.log_lines("no_such_database_here").is_empty(),
        "{}",
        member.log_tail()
    );
}

/// A member cut off from PostgreSQL gave nothing up: its partitions stood still for the
/// whole cut (librdkafka keeps the assignment of a member that polls) while the others
/// sat idle. After `ingest.release_partitions_after` it leaves the group, the others
/// store its partitions' messages, and it takes its share back once the database
/// answers: nothing lost, nothing stored twice, nothing committed unstored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_cut_off_from_postgres_gives_its_partitions_to_the_group_and_takes_them_back() {
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("cut.dlt", 4)],
        vec![route(&["cut.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    settings.ingest.release_partitions_after = Duration::from_secs(3);
    let group = settings.kafka.group_id.clone();
    let proxy = PgProxy::start().await;
    let through_proxy = proxy.route(&settings);
    let proxied_store = Store::connect(&through_proxy.database).await.unwrap();
    let healthy = Member::start(fleet(&settings), &store);
    let cut_fleet = fleet(&through_proxy);
    let released = cut_fleet.metrics().ingest_released.clone();
    let stored_by_cut = cut_fleet
        .metrics()
        .ingested
        .with_label_values(&["cut.dlt", "stored"]);
    let cut_off = Member::start(cut_fleet, &proxied_store);
    // Until the group has given the member to be cut a share of the partitions.
    let mut produced = 0;
    while stored_by_cut.get() == 0 {
        assert!(
            produced < 4000,
            "the member to be cut was given no partition"
        );
        produce_spread(&bootstrap, produced..produced + 100).await;
        produced += 100;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eventually(
        Duration::from_secs(60),
        "every task before the cut",
        || async { tasks(&store).await == produced as i64 },
    )
    .await;

    proxy.cut();
    let cut_at = std::time::Instant::now();
    produce_spread(&bootstrap, produced..produced + 400).await;
    produced += 400;
    let limit = Duration::from_secs(60);
    loop {
        // Committed first: the healthy member stores and commits between the two
        // readings, and an offset is committed only after its task is stored, so
        // what was committed before a count can never exceed it.
        let committed = committed_total(&bootstrap, &group, "cut.dlt", 4).await;
        let stored = tasks(&store).await;
        assert!(
            committed <= stored,
            "committed {committed} but stored {stored}"
        );
        if stored == produced as i64 {
            break;
        }
        assert!(
            cut_at.elapsed() < limit,
            "the cut member's partitions stood still: {stored} of {produced} stored after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stood_still = cut_at.elapsed();
    eprintln!("partitions of the cut member stood still for {stood_still:?} (release after 3s)");
    assert_eq!(
        released.get(),
        1,
        "the cut member says it released its partitions"
    );

    proxy.restore();
    eventually(
        Duration::from_secs(30),
        "the cut member joins again",
        || async { released.get() == 0 },
    )
    .await;
    // Its new consumer joins the group in cooperative steps (the healthy member gives
    // partitions up, then the group hands them on): seconds apart, more on a busy
    // machine. Messages keep coming until it stores some, as before the cut; its
    // counter moves only after its rows commit, so the loop reads it again.
    let before_rejoining = stored_by_cut.get();
    let rejoined_at = std::time::Instant::now();
    while stored_by_cut.get() == before_rejoining {
        assert!(
            rejoined_at.elapsed() < Duration::from_secs(90),
            "the member took no share of the partitions back in 90 s"
        );
        produce_spread(&bootstrap, produced..produced + 100).await;
        produced += 100;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eventually(Duration::from_secs(60), "every task", || async {
        tasks(&store).await == produced as i64
    })
    .await;
    eventually(
        Duration::from_secs(60),
        "every offset committed",
        || async { committed_total(&bootstrap, &group, "cut.dlt", 4).await == produced as i64 },
    )
    .await;
    cut_off.stop().await;
    healthy.stop().await;
    assert_each_message_once(&store, produced).await;
}

/// Produces `failure N` for N in `range` to `cut.dlt`, partition N % 4.
async fn produce_spread(bootstrap: &str, range: std::ops::Range<usize>) {
    let producer = producer(bootstrap);
    for i in range {
        let sample = Sample {
            value: Some(format!("failure {i}").into()),
            partition: Some((i % 4) as i32),
            ..Sample::default()
        };
        produce(&producer, "cut.dlt", &sample).await;
    }
}
