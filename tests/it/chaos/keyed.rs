//! The chaos suite's process-mode route with `ordering = "key"`: three `redrive run`
//! members consume keyed messages (every key's versions 1, 2, 3, … in order) and apply
//! them inline through the webhook handler to an upsert downstream, while members are
//! killed with SIGKILL and restarted at random moments. The downstream answers 503 to
//! about a quarter of the calls, so failures become tasks, later messages of their key
//! are held behind them, and the pool retries them.
//!
//! At the end every key's downstream value is its newest version (no old message was
//! applied after a newer one for good), and every message was applied at least once.
//!
//! Reads `REDRIVE_CHAOS_SEED` (the downstream's answers and the kill schedule; printed)
//! and `REDRIVE_CHAOS_SECS` (kills go on for half of it, 15 s by default).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::util::Timeout;
use redrive::Settings;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::fleet::Fleet;
use super::Knobs;
use crate::support::broker::{cluster, committed, producer};
use crate::support::http_server::{Recorded, Reply, TestServer};
use crate::support::{fresh_store, scalar};

const TOPIC: &str = "keyed.dlt";
const PARTITIONS: i32 = 3;
const MEMBERS: usize = 3;
const HANDLER: &str = "upsert";
/// Keys, each sent `VERSIONS` messages.
const KEYS: usize = 24;
const VERSIONS: u32 = 20;
/// The share of calls the downstream answers 503.
const UNAVAILABLE: f64 = 0.1;

/// How the broker refuses a commit.
const TIMED_OUT: RDKafkaRespErr = RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT;

/// What the downstream applied for one key.
#[derive(Debug, Default, Clone)]
struct Applied {
    /// The value it holds: the last version applied.
    last: u32,
    /// Every version applied, in order.
    all: Vec<u32>,
}

/// An upsert downstream: per key, the last version applied wins.
struct Upsert {
    rng: Mutex<StdRng>,
    keys: Mutex<BTreeMap<String, Applied>>,
    unavailable: AtomicUsize,
}

impl Upsert {
    fn answer(&self, request: &Recorded) -> Reply {
        let envelope = request.json();
        let key = envelope["key"]["data"].as_str().expect("a key").to_owned();
        let version: u32 = (envelope["value"]["data"].as_str())
            .and_then(|v| v.parse().ok())
            .expect("a version as the value");
        if self.rng.lock().unwrap().random_bool(UNAVAILABLE) {
            self.unavailable.fetch_add(1, Ordering::SeqCst);
            return Reply::status(503);
        }
        let mut keys = self.keys.lock().unwrap();
        let applied = keys.entry(key).or_default();
        applied.last = version;
        applied.all.push(version);
        Reply::status(200)
    }
}

/// The members' configuration: `TOPIC` processed inline by the webhook `HANDLER`, in
/// order per key; short group and lease timings, so kills cost little time.
fn config_file(bootstrap: &str, group: &str, url: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    let text = format!(
        r#"[database]
max_connections = 6

[worker]
concurrency = 8
batch_size = 8
lease = "3s"
heartbeat = "1s"
poll_interval = "100ms"
shutdown_timeout = "5s"

[retry]
max_attempts = 100
backoff_base = "100ms"
backoff_cap = "500ms"
jitter = "equal"

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"

[kafka.properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "250"
"topic.metadata.refresh.interval.ms" = "1000"

[ingest]
batch_size = 20
linger = "20ms"

[[routes]]
topics = ["{TOPIC}"]
mode = "process"
handler = "{HANDLER}"
ordering = "key"

[webhooks.{HANDLER}]
url = "{url}"
timeout = "2s"
connect_timeout = "1s"
"#
    );
    std::fs::write(file.path(), text).unwrap();
    file
}

/// Sends version `version` of every key; waits until each is acknowledged, so that a
/// key's versions are in order in its partition.
async fn send_round(producer: &FutureProducer, version: u32) -> Vec<(i32, i64)> {
    let sends = (0..KEYS).map(|k| async move {
        let (key, value) = (format!("key-{k:02}"), version.to_string());
        let record: FutureRecord<'_, str, str> = FutureRecord::to(TOPIC)
            .key(key.as_str())
            .payload(value.as_str());
        let delivery = (producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await)
            .expect("delivered");
        (delivery.partition, delivery.offset)
    });
    futures::future::join_all(sends).await
}

/// Produces every version of every key over `over`; the end offset of each partition.
async fn produce(bootstrap: String, over: Duration) -> Vec<i64> {
    let producer = producer(&bootstrap);
    let pace = over / VERSIONS;
    let mut ends = vec![0i64; PARTITIONS as usize];
    for version in 1..=VERSIONS {
        let next = tokio::time::Instant::now() + pace;
        for (partition, offset) in send_round(&producer, version).await {
            ends[partition as usize] = ends[partition as usize].max(offset + 1);
        }
        tokio::time::sleep_until(next).await;
    }
    ends
}

/// Every task of `key`, oldest first: offset, status, attempts, the last error.
async fn tasks_of(store: &redrive::Store, key: &str) -> Vec<(i64, String, i32, Option<String>)> {
    sqlx::query_as(
        "SELECT source_offset, status, attempts, last_error FROM recovery_task \
         WHERE msg_key = $1 ORDER BY source_offset",
    )
    .bind(key.as_bytes())
    .fetch_all(store.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_key_ordered_process_route_under_kills_ends_every_key_on_its_newest_message() {
    let knobs = Knobs::from_env();
    let chaos_for = Duration::from_secs(knobs.secs) / 2;
    println!(
        "keyed chaos: {KEYS} keys x {VERSIONS} versions, kills for {chaos_for:?}, seed {}",
        knobs.seed
    );
    let (store, defaults) = fresh_store().await;
    let upsert = Arc::new(Upsert {
        rng: Mutex::new(StdRng::seed_from_u64(knobs.seed ^ 0x5eed)),
        keys: Mutex::new(BTreeMap::new()),
        unavailable: AtomicUsize::new(0),
    });
    let server = TestServer::start({
        let upsert = upsert.clone();
        move |request| upsert.answer(request)
    })
    .await;
    let broker = cluster(&[(TOPIC, PARTITIONS)]);
    let bootstrap = broker.bootstrap_servers();
    let group = format!("keyed-{:x}", rand::random::<u32>());
    let config = config_file(&bootstrap, &group, &server.url("/upsert"));
    let mut settings = Settings::load(Some(config.path()), None).unwrap();
    settings.database = defaults.database.clone();
    let tag = format!("redrive-keyed-{}", settings.database.schema);
    let mut fleet = Fleet::start(MEMBERS, &settings, config.path(), &tag);

    let began = Instant::now();
    let production = tokio::spawn(produce(bootstrap.clone(), chaos_for * 2 / 3));
    let mut rng = StdRng::seed_from_u64(knobs.seed);
    let mut next_kill = began + Duration::from_secs(1);
    let mut commit_refusals = 0;
    while began.elapsed() < chaos_for || !production.is_finished() {
        fleet.tend();
        let alive = fleet.alive();
        if Instant::now() >= next_kill && alive.len() > 1 {
            if rng.random_bool(0.5) {
                // Commits lost for a while: what the members store meanwhile is
                // redelivered after the next kill.
                let refused = rng.random_range(5..40);
                broker.request_errors(RDKafkaApiKey::OffsetCommit, &vec![TIMED_OUT; refused]);
                commit_refusals += refused;
            } else {
                let slot = alive[rng.random_range(0..alive.len())];
                fleet.kill(slot, Duration::from_millis(rng.random_range(300..2500)));
            }
            next_kill = Instant::now() + Duration::from_millis(rng.random_range(1000..3000));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ends = production.await.unwrap();
    let kills = fleet.killed().len();
    println!(
        "keyed chaos: +{:.1}s chaos over, {kills} SIGKILLs, {commit_refusals} commits refused",
        began.elapsed().as_secs_f64()
    );

    // Every member back; every offset committed and every task final. A killed member's
    // keys wait out its leases and a rebalance, hence the generous limit.
    let limit = Duration::from_secs(120);
    let drained = Instant::now();
    while committed(&bootstrap, &group, TOPIC, PARTITIONS) != ends
        || scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'failed'",
        )
        .await
            > 0
    {
        fleet.tend();
        assert!(
            drained.elapsed() < limit,
            "not drained within {limit:?}: committed {:?} of {ends:?}, {} tasks open",
            committed(&bootstrap, &group, TOPIC, PARTITIONS),
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'failed'"
            )
            .await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fleet.stop(Duration::from_secs(30)).await;
    fleet.no_member_exited_by_itself();

    let applied = upsert.keys.lock().unwrap().clone();
    let calls = server.requests().len();
    let tasks = scalar(&store, "SELECT count(*) FROM recovery_task").await;
    let mut behind = 0;
    for all in applied.values().map(|a| &a.all) {
        behind += (1..all.len())
            .filter(|&i| all[..i].iter().any(|&v| v > all[i]))
            .count();
    }
    let applications: usize = applied.values().map(|a| a.all.len()).sum();
    println!(
        "keyed chaos report (seed {}): {kills} SIGKILLs, {} member starts; {calls} calls, \
         {} answered 503; {tasks} tasks; {applications} applications of {} messages, \
         {behind} of an older version after a newer one",
        knobs.seed,
        fleet.logs.len(),
        upsert.unavailable.load(Ordering::SeqCst),
        KEYS * VERSIONS as usize
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status <> 'resolved'"
        )
        .await,
        0,
        "every task resolved"
    );
    let mut wrong: HashMap<String, Applied> = HashMap::new();
    for k in 0..KEYS {
        let key = format!("key-{k:02}");
        let got = applied.get(&key).cloned().unwrap_or_default();
        let every = (1..=VERSIONS).all(|v| got.all.contains(&v));
        if got.last != VERSIONS || !every {
            wrong.insert(key, got);
        }
    }
    for (key, got) in &wrong {
        println!(
            "  {key}: ends on {} (applied {:?}); tasks (offset, status, attempts, error): {:?}",
            got.last,
            got.all,
            tasks_of(&store, key).await
        );
    }
    assert!(
        wrong.is_empty(),
        "keys not on their newest version {VERSIONS}, or with a version never applied: {:?} \
         (seed {}; logs {tag}-*.log)",
        wrong.keys().collect::<Vec<_>>(),
        knobs.seed
    );
    fleet.remove_logs();
}
