//! The chaos suite: three real `redrive run` processes capture 20,000 failures from the
//! mock cluster and deliver them to a flaky HTTP downstream through the webhook handler,
//! while members are killed with SIGKILL and restarted, their PostgreSQL backends are
//! terminated, and the downstream goes fully down long enough for the fleet-wide circuit
//! breaker to open. At the end it checks, and prints, that every task is final, none was
//! lost or recorded twice, no stale write was applied, permanent errors ended their task
//! at once, deliveries per key are bounded by the interruptions they suffered, and the
//! breaker opened while the downstream was down and held the calls back.
//!
//! The downstream (a [`TestServer`]) answers 503 to about 20% of calls (some with
//! `Retry-After`, some slowly, 2% only after the client's timeout), 400 to every call for
//! one order in 41, 200 to the rest (some slowly), and records every call with its
//! `Idempotency-Key`, task id and attempt number.
//!
//! The run has a database of its own (`redrive_chaos_<random>`, dropped when the test
//! passes), so that terminating the members' backends (`pg_terminate_backend` of every
//! backend of that database whose `application_name` is redrive's) reaches this test's
//! fleet and nothing else; the test watches through connections of another name. The
//! members' logs are `$TMPDIR/<database>-*.log`; a failing run keeps both.
//!
//! The fleet of killable members is `fleet`; `keyed` runs a process-mode route with
//! `ordering = "key"` under kills.
//!
//! Knobs (environment variables):
//! - `REDRIVE_CHAOS_TASKS` (default 20000): failures produced.
//! - `REDRIVE_CHAOS_SECS` (default 30): kills and terminations go on for at least this
//!   long, and beyond it until 80% of the tasks are final (at most three times as long);
//!   the failures are produced over its first third. The default run takes 60 to 80 s
//!   on two cores; `REDRIVE_CHAOS_TASKS=60000 REDRIVE_CHAOS_SECS=120` about three
//!   minutes, and `REDRIVE_CHAOS_TASKS=200000 REDRIVE_CHAOS_SECS=600` makes a long run.
//! - `REDRIVE_CHAOS_SEED`: seeds the downstream's answers and the chaos schedule (the
//!   interleaving of the processes is not reproducible; the seed is printed).
//! - `REDRIVE_CHAOS_KEEP=1`: keeps the database and the logs of a passing run too.

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod fleet;
mod keyed;

use fleet::{Event, Fleet};

use crate::support::broker::{cluster, committed, producer};
use crate::support::cli::redrive;
use crate::support::database_url;
use crate::support::http_server::{Recorded, Reply, TestServer};
use crate::support::{Bounded, CHILD_LIMIT};
use redrive::config::{CLAIM_LOOPS, FLUSHES_IN_FLIGHT};

const TOPIC: &str = "chaos.dlt";
const PARTITIONS: i32 = 6;
const MEMBERS: usize = 3;
const HANDLER: &str = "hook";
const SCHEMA: &str = "chaos";

// The members' settings (their configuration file), small so that the bounds are tight;
// the bounds also read redrive's fixed amounts in flight, `CLAIM_LOOPS` (claim loops per
// pool) and `FLUSHES_IN_FLIGHT` (ingest batches a member writes at once).
/// `worker.concurrency`: tasks a member holds at once, from claim to written result.
const CONCURRENCY: usize = 16;
/// `worker.batch_size`: tasks per claim statement.
const BATCH: usize = 16;
/// `ingest.batch_size`.
const INGEST_BATCH: usize = 50;
/// `worker.lease`, ...
const LEASE: Duration = Duration::from_secs(10);
/// ... and `worker.heartbeat`.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// `retry.max_attempts`: far more than random 503s ever need.
const MAX_ATTEMPTS: i32 = 100;
/// `webhooks.hook.timeout`.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(2);
/// `handlers.hook.breaker`: opens after this many transient failures in a row, ...
const BREAKER_FAILURES: u32 = 12;
/// ... stays open this long, then lets `PROBES` attempts through.
const COOL_DOWN: Duration = Duration::from_secs(2);
const PROBES: usize = 1;
/// How long the downstream is fully down.
const DOWN_FOR: Duration = Duration::from_secs(8);

/// The downstream answers 400 to these orders, always (but while it is down).
fn permanent(order: u32) -> bool {
    order % 41 == 7
}

struct Knobs {
    tasks: u32,
    secs: u64,
    seed: u64,
}

impl Knobs {
    fn from_env() -> Knobs {
        let read = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name}={v}")))
        };
        Knobs {
            tasks: read("REDRIVE_CHAOS_TASKS").map_or(20_000, |n| n as u32),
            secs: read("REDRIVE_CHAOS_SECS").unwrap_or(30),
            seed: read("REDRIVE_CHAOS_SEED").unwrap_or_else(rand::random),
        }
    }
}

// ---------------------------------------------------------------- the downstream

/// What the downstream answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Answer {
    /// 200, at once or after a delay well within the client's timeout.
    Ok,
    /// 400: a permanent error.
    Refused,
    /// 503, at once or after a delay within the timeout.
    Unavailable,
    /// 503 only after the client's timeout: the client sees a timeout.
    Late,
}

/// One call the downstream received.
#[derive(Debug, Clone)]
struct Call {
    at: DateTime<Utc>,
    order: u32,
    task_id: i64,
    attempt: i32,
    idempotency_key: String,
    answer: Answer,
    down: bool,
}

/// The flaky downstream: whether it is down, its dice, every call.
struct Downstream {
    down: AtomicBool,
    rng: Mutex<StdRng>,
    calls: Mutex<Vec<Call>>,
}

impl Downstream {
    fn answer(&self, request: &Recorded) -> Reply {
        let order: u32 = request.json()["key"]["data"]
            .as_str()
            .and_then(|k| k.strip_prefix("order-"))
            .and_then(|n| n.parse().ok())
            .expect("an order key in the envelope");
        let number = |name: &str| -> i64 {
            request
                .header(name)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("header {name}"))
        };
        let down = self.down.load(Ordering::SeqCst);
        let (answer, reply) = if down {
            (Answer::Unavailable, Reply::status(503))
        } else if permanent(order) {
            (Answer::Refused, Reply::status(400).body("order refused"))
        } else {
            let mut rng = self.rng.lock().unwrap();
            let roll: f64 = rng.random();
            let slow = Duration::from_millis(rng.random_range(100..700));
            match roll {
                r if r < 0.02 => (
                    Answer::Late,
                    Reply::status(503).after(WEBHOOK_TIMEOUT + Duration::from_millis(1500)),
                ),
                r if r < 0.06 => (Answer::Unavailable, Reply::status(503).after(slow)),
                r if r < 0.10 => (Answer::Ok, Reply::status(200).after(slow)),
                r if r < 0.16 => (Answer::Unavailable, Reply::status(503)),
                r if r < 0.20 => (
                    Answer::Unavailable,
                    Reply::status(503).header("retry-after", "1"),
                ),
                _ => (Answer::Ok, Reply::status(200)),
            }
        };
        let call = Call {
            at: Utc::now(),
            order,
            task_id: number("x-redrive-task-id"),
            attempt: number("x-redrive-attempt") as i32,
            idempotency_key: request
                .header("idempotency-key")
                .expect("an Idempotency-Key")
                .to_owned(),
            answer,
            down,
        };
        self.calls.lock().unwrap().push(call);
        reply
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------- the fleet

/// The members' configuration: `TOPIC` captured into the webhook handler `hook`, whose
/// breaker opens quickly and cools down quickly; short group and lease timings.
fn config_file(bootstrap: &str, group: &str, url: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    let lease = LEASE.as_secs();
    let heartbeat = HEARTBEAT.as_secs();
    let timeout = WEBHOOK_TIMEOUT.as_secs();
    let cool_down = COOL_DOWN.as_secs();
    write!(
        file,
        r#"[database]
max_connections = 6

[worker]
concurrency = {CONCURRENCY}
batch_size = {BATCH}
lease = "{lease}s"
heartbeat = "{heartbeat}s"
poll_interval = "200ms"
shutdown_timeout = "5s"

[retry]
max_attempts = {MAX_ATTEMPTS}
backoff_base = "100ms"
backoff_cap = "1s"
jitter = "equal"

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"

[kafka.properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "250"
"topic.metadata.refresh.interval.ms" = "1000"

[ingest]
batch_size = {INGEST_BATCH}
linger = "20ms"

[[routes]]
topics = ["{TOPIC}"]
mode = "capture"
handler = "{HANDLER}"

[webhooks.{HANDLER}]
url = "{url}"
timeout = "{timeout}s"
connect_timeout = "1s"
retry_after_max = "2s"

[handlers.{HANDLER}.breaker]
consecutive_failures = {BREAKER_FAILURES}
failure_ratio = 0.9
min_calls = 50
window = "5s"
cool_down = "{cool_down}s"
probes = {PROBES}
"#
    )
    .unwrap();
    file
}

// ---------------------------------------------------------------- the database

/// Runs `sql` in the server's `postgres` database.
async fn admin(sql: &str) {
    let url = database_url();
    let (server, _) = url.rsplit_once('/').expect("URL has a database name");
    let mut admin = PgConnection::connect(&format!("{server}/postgres"))
        .await
        .expect("PostgreSQL is reachable");
    sqlx::query(sql).execute(&mut admin).await.expect(sql);
}

/// Test instrumentation in the run's schema: every change of the breaker's state or hold
/// is logged, and so is any update that changes a final task or moves a fencing token
/// back (what a stale write would do).
const INSTRUMENT: &str = r#"
CREATE TABLE chaos_breaker_log (
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state text, to_state text NOT NULL, hold_until timestamptz, reason text);
CREATE FUNCTION chaos_log_breaker() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.state IS DISTINCT FROM NEW.state
       OR OLD.hold_until IS DISTINCT FROM NEW.hold_until THEN
        INSERT INTO chaos_breaker_log (from_state, to_state, hold_until, reason)
        VALUES (CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.hold_until,
                NEW.reason);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_log_breaker AFTER INSERT OR UPDATE ON recovery_breaker
    FOR EACH ROW EXECUTE FUNCTION chaos_log_breaker();

CREATE TABLE chaos_anomaly (
    at timestamptz NOT NULL DEFAULT clock_timestamp(), task_id bigint NOT NULL,
    old_status text, new_status text, old_version bigint, new_version bigint);
CREATE FUNCTION chaos_note_anomaly() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_anomaly (task_id, old_status, new_status, old_version, new_version)
    VALUES (OLD.id, OLD.status, NEW.status, OLD.lease_version, NEW.lease_version);
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_note_anomaly AFTER UPDATE ON recovery_task FOR EACH ROW
    WHEN (NEW.lease_version < OLD.lease_version
          OR (OLD.status <> 'failed' AND OLD.* IS DISTINCT FROM NEW.*))
    EXECUTE FUNCTION chaos_note_anomaly();
"#;

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

async fn breaker_state(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM recovery_breaker WHERE handler = $1")
        .bind(HANDLER)
        .fetch_optional(pool)
        .await
        .unwrap()
}

// ---------------------------------------------------------------- the run

/// When the downstream was down, and when the test first saw the breaker open (or
/// half-open: it opened).
struct Outage {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    seen_open: DateTime<Utc>,
}

struct Run {
    knobs: Knobs,
    began: Instant,
    database: String,
    observer: PgPool,
    downstream: Arc<Downstream>,
    server: TestServer,
    bootstrap: String,
    group: String,
    config: tempfile::NamedTempFile,
    /// The members' settings, for the `redrive` commands the test runs.
    settings: redrive::Settings,
    fleet: Fleet,
    _broker: MockCluster<'static, DefaultProducerContext>,
}

impl Run {
    /// The database, the downstream, the broker and three members.
    async fn start(knobs: Knobs) -> Run {
        let began = Instant::now();
        let database = format!("redrive_chaos_{:08x}", rand::random::<u32>());
        admin(&format!("CREATE DATABASE {database}")).await;
        let url = database_url().rsplit_once('/').unwrap().0.to_owned() + "/" + &database;
        let env = HashMap::from([
            ("REDRIVE__DATABASE__URL".to_owned(), url.clone()),
            ("REDRIVE__DATABASE__SCHEMA".to_owned(), SCHEMA.to_owned()),
        ]);
        let defaults = redrive::Settings::load(None, Some(env.clone())).unwrap();
        let store = redrive::Store::connect(&defaults.database).await.unwrap();
        store.migrate().await.unwrap();
        store.pool().close().await;
        let options = PgConnectOptions::from_str(&url).unwrap();
        let observer = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(
                (options.options([("search_path", SCHEMA)])).application_name("chaos-observer"),
            )
            .await
            .unwrap();
        sqlx::raw_sql(INSTRUMENT).execute(&observer).await.unwrap();

        let downstream = Arc::new(Downstream {
            down: AtomicBool::new(false),
            rng: Mutex::new(StdRng::seed_from_u64(knobs.seed ^ 0x5eed)),
            calls: Mutex::new(Vec::new()),
        });
        let server = TestServer::start({
            let downstream = downstream.clone();
            move |request| downstream.answer(request)
        })
        .await;
        let broker = cluster(&[(TOPIC, PARTITIONS)]);
        let bootstrap = broker.bootstrap_servers();
        let group = format!("chaos-{:x}", rand::random::<u32>());
        let config = config_file(&bootstrap, &group, &server.url("/orders"));
        let settings = redrive::Settings::load(Some(config.path()), Some(env)).unwrap();
        let log_pattern = std::env::temp_dir().join(format!("{database}-*.log"));
        println!("chaos: database {database}, logs {}", log_pattern.display());
        let fleet = Fleet::start(MEMBERS, &settings, config.path(), &database);
        Run {
            knobs,
            began,
            database,
            observer,
            downstream,
            server,
            bootstrap,
            group,
            config,
            settings,
            fleet,
            _broker: broker,
        }
    }

    fn log(&self, what: std::fmt::Arguments<'_>) {
        println!("chaos: +{:.1}s {what}", self.began.elapsed().as_secs_f64());
    }

    /// Terminates every backend of the fleet: application `redrive` in this database.
    async fn terminate_backends(&mut self) {
        let backends: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND application_name = 'redrive' AND pid <> pg_backend_pid()",
        )
        .bind(&self.database)
        .fetch_one(&self.observer)
        .await
        .unwrap();
        let event = Event::Terminated { backends };
        self.fleet.events.push((Utc::now(), event));
    }

    /// Produces the failures and runs the chaos; answers the coordinates produced.
    ///
    /// From the first stored task on, every 3 to 6 s: a kill (the member restarted 0.5 to
    /// 3 s later) or a termination of every member's backends. Once 30% of the failures
    /// are stored the downstream goes down for `DOWN_FOR`, with a termination and a kill
    /// inside. The chaos lasts until 80% of the tasks are final (and `secs` at least,
    /// `3 secs` at most), so it overlaps most of the work.
    async fn chaos(&mut self) -> (Vec<(i32, i64)>, Outage) {
        let (total, secs) = (self.knobs.tasks, Duration::from_secs(self.knobs.secs));
        let production = tokio::spawn(produce(self.bootstrap.clone(), total, secs / 3));
        let mut rng = StdRng::seed_from_u64(self.knobs.seed);
        let mut next_event: Option<Instant> = None;
        let mut down: Option<(Instant, DateTime<Utc>)> = None;
        let (mut end, mut seen_open) = (None, None);
        let mut forced = [false; 2];
        let mut progress = Instant::now();
        loop {
            self.fleet.tend();
            let now = Instant::now();
            let stored = scalar(&self.observer, "SELECT count(*) FROM recovery_task").await;
            match down {
                None if stored >= i64::from(total) * 3 / 10 => {
                    self.downstream.down.store(true, Ordering::SeqCst);
                    down = Some((now, Utc::now()));
                    self.log(format_args!("downstream down ({stored} stored)"));
                }
                Some((since, _)) if end.is_none() => {
                    let state = breaker_state(&self.observer).await;
                    if seen_open.is_none() && state.is_some_and(|s| s != "closed") {
                        seen_open = Some(Utc::now());
                    }
                    if !forced[0] && now >= since + DOWN_FOR / 3 {
                        forced[0] = true;
                        self.terminate_backends().await;
                    }
                    if !forced[1] && now >= since + DOWN_FOR / 2 {
                        forced[1] = true;
                        if let Some(&slot) = self.fleet.alive().first() {
                            self.fleet.kill(slot, Duration::from_secs(1));
                        }
                    }
                    if now >= since + DOWN_FOR {
                        self.downstream.down.store(false, Ordering::SeqCst);
                        end = Some(Utc::now());
                        self.log(format_args!("downstream back"));
                    }
                }
                _ => {}
            }
            if next_event.is_none() && stored > 0 {
                next_event = Some(now + Duration::from_secs(1));
            }
            if next_event.is_some_and(|at| now >= at) {
                let alive = self.fleet.alive();
                if rng.random_bool(0.5) && alive.len() > 1 {
                    let slot = alive[rng.random_range(0..alive.len())];
                    let back = Duration::from_millis(rng.random_range(500..3000));
                    self.fleet.kill(slot, back);
                } else {
                    self.terminate_backends().await;
                }
                next_event = Some(now + Duration::from_millis(rng.random_range(3000..6000)));
            }
            let finals = scalar(
                &self.observer,
                "SELECT count(*) FROM recovery_task WHERE status <> 'failed'",
            )
            .await;
            if progress.elapsed() >= Duration::from_secs(5) {
                progress = Instant::now();
                let breaker = breaker_state(&self.observer).await;
                let calls = self.downstream.calls.lock().unwrap().len();
                let alive = self.fleet.alive().len();
                self.log(format_args!(
                    "stored {stored}, final {finals}, calls {calls}, breaker {breaker:?}, {alive} alive"
                ));
            }
            let elapsed = self.began.elapsed();
            let mostly_done = finals >= i64::from(total) * 8 / 10;
            if (mostly_done || elapsed >= 3 * secs)
                && elapsed >= secs
                && production.is_finished()
                && end.is_some()
            {
                break;
            }
            assert!(
                elapsed < 3 * secs + Duration::from_secs(120),
                "the outage never came: {stored} of {total} stored"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.log(format_args!("chaos over"));
        let outage = Outage {
            start: down.unwrap().1,
            end: end.unwrap(),
            seen_open: seen_open.expect("the breaker was seen open during the outage"),
        };
        (production.await.unwrap(), outage)
    }

    /// Waits until every failure is stored and final, and every offset committed.
    async fn drain(&mut self, coordinates: &[(i32, i64)]) {
        let limit = Instant::now() + Duration::from_secs(240);
        let mut progress = Instant::now();
        loop {
            self.fleet.tend();
            let (total, open): (i64, i64) = sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE status = 'failed') FROM recovery_task",
            )
            .fetch_one(&self.observer)
            .await
            .unwrap();
            if total == i64::from(self.knobs.tasks) && open == 0 {
                break;
            }
            assert!(
                Instant::now() < limit,
                "{total} of {} stored, {open} not final; breaker {:?}",
                self.knobs.tasks,
                breaker_state(&self.observer).await
            );
            if progress.elapsed() >= Duration::from_secs(5) {
                progress = Instant::now();
                self.log(format_args!("stored {total}, not final {open}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.log(format_args!("every task final"));
        let mut ends = vec![0i64; PARTITIONS as usize];
        for &(partition, offset) in coordinates {
            ends[partition as usize] = ends[partition as usize].max(offset + 1);
        }
        let limit = Instant::now() + Duration::from_secs(30);
        while committed(&self.bootstrap, &self.group, TOPIC, PARTITIONS) != ends {
            assert!(Instant::now() < limit, "offsets never all committed");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Produces `total` failures (keys `order-N`) to `TOPIC` in chunks over `over`; their
/// coordinates.
async fn produce(bootstrap: String, total: u32, over: Duration) -> Vec<(i32, i64)> {
    let producer = producer(&bootstrap);
    let chunk = 500;
    let pace = over / total.div_ceil(chunk).max(1);
    let mut coordinates = Vec::with_capacity(total as usize);
    for start in (0..total).step_by(chunk as usize) {
        let next = tokio::time::Instant::now() + pace;
        let orders = start..(start + chunk).min(total);
        let sends = orders.map(|order| send(&producer, order));
        coordinates.extend(futures::future::join_all(sends).await);
        tokio::time::sleep_until(next).await;
    }
    coordinates
}

async fn send(producer: &FutureProducer, order: u32) -> (i32, i64) {
    let key = format!("order-{order}");
    let value = format!(r#"{{"order":{order},"amount":{}}}"#, order % 997);
    let record: FutureRecord<'_, str, str> = FutureRecord::to(TOPIC)
        .key(key.as_str())
        .payload(value.as_str());
    let delivery = (producer
        .send(record, Timeout::After(Duration::from_secs(60)))
        .await)
        .expect("delivered");
    (delivery.partition, delivery.offset)
}

// ---------------------------------------------------------------- what is stored

#[derive(Debug)]
struct TaskRow {
    order: u32,
    status: String,
    attempts: i32,
    lease_version: i64,
    coordinates: (i32, i64),
}

#[derive(Debug)]
struct AttemptRow {
    lease_version: i64,
    worker: String,
    outcome: String,
    error: String,
}

impl AttemptRow {
    /// Ended by the client's or the invocation's timeout: an answer may have come unseen.
    fn timed_out(&self) -> bool {
        self.outcome == "retry" && self.error.contains("timed out")
    }

    fn interrupted(&self) -> bool {
        self.outcome == "lease_expired" || self.timed_out()
    }
}

struct Stored {
    tasks: HashMap<i64, TaskRow>,
    /// By task and attempt number.
    attempts: HashMap<(i64, i32), AttemptRow>,
}

impl Stored {
    async fn load(pool: &PgPool) -> Stored {
        type Task = (i64, Vec<u8>, String, i32, i64, Option<String>, i32, i64);
        let rows: Vec<Task> = sqlx::query_as(
            "SELECT id, msg_key, status, attempts, lease_version, source_topic, \
                    source_partition, source_offset FROM recovery_task",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let mut tasks = HashMap::new();
        for (id, key, status, attempts, lease_version, topic, partition, offset) in rows {
            assert_eq!(topic.as_deref(), Some(TOPIC));
            let key = String::from_utf8(key).unwrap();
            let task = TaskRow {
                order: key.strip_prefix("order-").unwrap().parse().unwrap(),
                status,
                attempts,
                lease_version,
                coordinates: (partition, offset),
            };
            tasks.insert(id, task);
        }
        let rows: Vec<(i64, i64, i32, String, String, String)> = sqlx::query_as(
            "SELECT task_id, lease_version, attempt, worker, outcome, coalesce(error, '') \
             FROM recovery_attempt",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let mut attempts = HashMap::new();
        for (task_id, lease_version, attempt, worker, outcome, error) in rows {
            let row = AttemptRow {
                lease_version,
                worker,
                outcome,
                error,
            };
            // Attempt numbers repeat only after a lease given back at shutdown, and no
            // member stops with a task unfinished here.
            if let Some(other) = attempts.insert((task_id, attempt), row) {
                panic!("task {task_id}: two history rows for attempt {attempt}: {other:?}");
            }
        }
        Stored { tasks, attempts }
    }

    fn outcomes(&self) -> BTreeMap<&str, usize> {
        let mut outcomes = BTreeMap::new();
        for row in self.attempts.values() {
            *outcomes.entry(row.outcome.as_str()).or_default() += 1;
        }
        outcomes
    }
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_fleet_under_kills_terminations_and_an_outage_loses_and_repeats_nothing() {
    let knobs = Knobs::from_env();
    println!(
        "chaos: {} failures, chaos for {} s at least, seed {}",
        knobs.tasks, knobs.secs, knobs.seed
    );
    let mut run = Run::start(knobs).await;
    let (coordinates, outage) = run.chaos().await;
    run.drain(&coordinates).await;
    run.fleet.stop(Duration::from_secs(30)).await;
    println!("chaos report (seed {}):", run.knobs.seed);
    // No member exits by itself: not even one whose start-up (connecting and migrating)
    // loses its connection to a termination (it waits for the database; it exited with
    // status 1 before that was fixed).
    run.fleet.no_member_exited_by_itself();
    let calls = run.downstream.calls();
    assert_eq!(run.server.requests().len(), calls.len());
    let stored = Stored::load(&run.observer).await;
    let kills = run.fleet.killed().len();
    let terminations = (run.fleet.events.iter())
        .filter_map(|(_, e)| match e {
            Event::Terminated { backends } => Some(*backends),
            _ => None,
        })
        .collect::<Vec<_>>();
    let starts = run.fleet.logs.len();
    println!(
        "  {:.0} s; {kills} SIGKILLs, {starts} member starts, {} terminations ({} backends)",
        run.began.elapsed().as_secs_f64(),
        terminations.len(),
        terminations.iter().sum::<i64>()
    );

    nothing_lost_nor_recorded_twice(&run, &stored, &coordinates);
    no_stale_write(&run, &stored).await;
    deliveries_bounded_by_interruptions(&run, &stored, &calls);
    permanent_errors_end_at_once(&stored, &calls);
    the_breaker_held_the_outage(&run, &outage, &calls).await;

    let Run {
        database,
        observer,
        fleet,
        ..
    } = run;
    observer.close().await;
    if std::env::var_os("REDRIVE_CHAOS_KEEP").is_none() {
        fleet.remove_logs();
        admin(&format!("DROP DATABASE {database} WITH (FORCE)")).await;
    }
}

/// Every task final; the stored coordinates are exactly those produced, once each.
fn nothing_lost_nor_recorded_twice(run: &Run, stored: &Stored, coordinates: &[(i32, i64)]) {
    let total = run.knobs.tasks as usize;
    let produced: HashSet<(i32, i64)> = coordinates.iter().copied().collect();
    assert_eq!(
        produced.len(),
        total,
        "the broker acknowledged each failure once"
    );
    let tasks = stored.tasks.values();
    let distinct: HashSet<(i32, i64)> = tasks.clone().map(|t| t.coordinates).collect();
    assert_eq!(
        distinct.len(),
        stored.tasks.len(),
        "a failure recorded twice"
    );
    let lost: Vec<_> = produced.difference(&distinct).take(10).collect();
    let invented: Vec<_> = distinct.difference(&produced).take(10).collect();
    assert!(
        lost.is_empty() && invented.is_empty(),
        "lost (partition, offset): {lost:?}; stored but never produced: {invented:?}"
    );
    let orders: HashSet<u32> = tasks.clone().map(|t| t.order).collect();
    assert_eq!(orders.len(), total, "an order lost or recorded twice");
    let not_final = tasks.clone().filter(|t| t.status == "failed").count();
    assert_eq!(not_final, 0, "tasks not final");
    let resolved = tasks.clone().filter(|t| t.status == "resolved").count();
    println!(
        "  tasks: {total} produced, {} stored, {} distinct coordinates, every offset committed; \
         {resolved} resolved, {} permanent_failure, 0 failed",
        stored.tasks.len(),
        distinct.len(),
        stored.tasks.len() - resolved
    );
}

/// No stale write applied: no final task changed and no fencing token went back (the
/// triggers); each task was decided once, by its last attempt, under its last lease;
/// every counted attempt has its history row; `redrive tasks check` finds nothing.
async fn no_stale_write(run: &Run, stored: &Stored) {
    let anomalies: Vec<(i64, String, String, i64, i64)> = sqlx::query_as(
        "SELECT task_id, old_status, new_status, old_version, new_version FROM chaos_anomaly \
         LIMIT 20",
    )
    .fetch_all(&run.observer)
    .await
    .unwrap();
    assert!(
        anomalies.is_empty(),
        "a final task changed, or a token went back: {anomalies:?}"
    );
    for (id, task) in &stored.tasks {
        let history: Vec<(i32, &AttemptRow)> = (1..=task.attempts)
            .map(|n| (n, stored.attempts.get(&(*id, n))))
            .map(|(n, row)| {
                (
                    n,
                    row.unwrap_or_else(|| panic!("task {id}: no row for attempt {n}")),
                )
            })
            .collect();
        let decisive: Vec<&(i32, &AttemptRow)> = (history.iter())
            .filter(|(_, row)| {
                matches!(
                    row.outcome.as_str(),
                    "resolved" | "permanent_failure" | "not_called"
                )
            })
            .collect();
        assert_eq!(
            decisive.len(),
            1,
            "task {id} decided {} times: {history:?}",
            decisive.len()
        );
        let (n, row) = decisive[0];
        assert_eq!(
            *n, task.attempts,
            "task {id} decided by attempt {n}, not its last"
        );
        assert_eq!(
            row.lease_version, task.lease_version,
            "task {id} decided under an old lease"
        );
        // An attempt that found no budget left ends its task a permanent failure unrun.
        let decided = match row.outcome.as_str() {
            "not_called" => "permanent_failure",
            outcome => outcome,
        };
        assert_eq!(decided, task.status, "task {id}: history and status differ");
    }
    let counted: usize = stored.tasks.values().map(|t| t.attempts as usize).sum();
    assert_eq!(
        stored.attempts.len(),
        counted,
        "history rows of no counted attempt"
    );
    let check = redrive(&run.settings)
        .arg("--config")
        .arg(run.config.path())
        .args(["tasks", "check"])
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(
        check.status.success(),
        "redrive tasks check: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    println!(
        "  history: {:?}; no final task changed, no token went back, each task decided once \
         by its last lease; redrive tasks check: ok",
        stored.outcomes()
    );
}

/// Each call the downstream received belongs to a counted attempt of the task it names,
/// carries one `Idempotency-Key` of its own on every call, and was acted on as answered:
/// a 200 resolved the task, a 400 ended it, a 503 or a timeout scheduled a retry, unless
/// the attempt was interrupted (its member killed, or its lease lost, and the next claim
/// recorded it `lease_expired`; or the client gave up first, a timeout).
///
/// Hence the bound on deliveries: a key is delivered (answered 200) once by the attempt
/// that resolves it, and again only by interrupted attempts, so deliveries(k) <= 1 +
/// interrupted(k). Interruptions are bounded by the chaos: a killed member held at most
/// `CONCURRENCY` leases (a slot is taken before a claim); a member never killed loses a
/// lease only when a termination cost it a claim's answer, at most `CLAIM_LOOPS` claims
/// of `BATCH` tasks in flight per member per termination.
fn deliveries_bounded_by_interruptions(run: &Run, stored: &Stored, calls: &[Call]) {
    let mut per_attempt = HashSet::new();
    let mut key_of_task: HashMap<i64, &str> = HashMap::new();
    let mut task_of_key: HashMap<&str, i64> = HashMap::new();
    let mut answered: HashMap<(i64, Answer), usize> = HashMap::new();
    let mut unseen = 0;
    for call in calls {
        let task = &stored.tasks[&call.task_id];
        assert_eq!(
            task.order, call.order,
            "{call:?} names another order's task"
        );
        let key = call.idempotency_key.as_str();
        let per_task = *key_of_task.entry(call.task_id).or_insert(key);
        let per_key = *task_of_key.entry(key).or_insert(call.task_id);
        assert!(
            per_task == key && per_key == call.task_id,
            "{call:?}: one Idempotency-Key per task"
        );
        let fresh = per_attempt.insert((call.task_id, call.attempt));
        assert!(fresh, "two calls for one attempt: {call:?}");
        let row = (stored.attempts.get(&(call.task_id, call.attempt)))
            .unwrap_or_else(|| panic!("{call:?} belongs to no counted attempt"));
        let acted_on = match call.answer {
            Answer::Ok => row.outcome == "resolved",
            Answer::Refused => row.outcome == "permanent_failure",
            Answer::Unavailable | Answer::Late => row.outcome == "retry",
        };
        assert!(
            acted_on || row.interrupted(),
            "{call:?} recorded as {row:?}"
        );
        unseen += usize::from(!acted_on && matches!(call.answer, Answer::Ok | Answer::Refused));
        *answered.entry((call.task_id, call.answer)).or_default() += 1;
    }
    let mut interrupted: HashMap<i64, usize> = HashMap::new();
    let mut expired_by_pid: HashMap<i32, usize> = HashMap::new();
    for ((task_id, _), row) in &stored.attempts {
        if row.outcome == "lease_expired" {
            let pid = (row.worker.rsplit('-').nth(1))
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("a worker id of host-pid-suffix: {}", row.worker));
            *expired_by_pid.entry(pid).or_default() += 1;
        }
        *interrupted.entry(*task_id).or_default() += usize::from(row.interrupted());
    }
    let mut deliveries: Vec<usize> = Vec::new();
    for (&(id, answer), &count) in &answered {
        if matches!(answer, Answer::Ok | Answer::Refused) {
            let bound = 1 + interrupted.get(&id).copied().unwrap_or(0);
            assert!(
                count <= bound,
                "task {id}: {count} {answer:?} answers, bound {bound}"
            );
        }
        if answer == Answer::Ok {
            deliveries.push(count);
        }
    }
    let killed = run.fleet.killed();
    let (mut of_killed, mut of_live) = (0, 0);
    for (pid, count) in expired_by_pid {
        if killed.contains(&pid) {
            assert!(
                count <= CONCURRENCY,
                "killed member {pid} lost {count} leases"
            );
            of_killed += count;
        } else {
            of_live += count;
        }
    }
    let terminations = (run.fleet.events.iter())
        .filter(|(_, e)| matches!(e, Event::Terminated { .. }))
        .count();
    let live_bound = terminations * MEMBERS * CLAIM_LOOPS * BATCH;
    assert!(
        of_live <= live_bound,
        "{of_live} leases of live members lapsed, bound {live_bound}"
    );
    let twice = deliveries.iter().filter(|&&n| n > 1).count();
    let extra: usize = deliveries.iter().map(|n| n - 1).sum();
    println!(
        "  downstream: {} calls, one Idempotency-Key per task, each answer acted on as given \
         or its attempt interrupted ({unseen} answers unseen); deliveries per key at most {} \
         (<= 1 + its interruptions): {twice} keys delivered twice, {extra} extra deliveries",
        calls.len(),
        deliveries.iter().max().unwrap_or(&0)
    );
    println!(
        "  leases lapsed: {of_killed} of killed members (at most {CONCURRENCY} each), \
         {of_live} of live members (bound {live_bound})"
    );
}

/// Every refused order ended PERMANENT_FAILURE at the first 400 its worker saw: any
/// earlier attempt was interrupted, or met the outage or a transport error, never a 400.
fn permanent_errors_end_at_once(stored: &Stored, calls: &[Call]) {
    let refused: HashSet<(i64, i32)> = (calls.iter())
        .filter(|c| c.answer == Answer::Refused)
        .map(|c| (c.task_id, c.attempt))
        .collect();
    let (mut permanent_tasks, mut single) = (0, 0);
    for (id, task) in &stored.tasks {
        if !permanent(task.order) {
            assert_eq!(task.status, "resolved", "task {id}: {task:?}");
            continue;
        }
        permanent_tasks += 1;
        assert_eq!(task.status, "permanent_failure", "task {id}: {task:?}");
        for n in 1..task.attempts {
            let row = &stored.attempts[&(*id, n)];
            assert!(
                row.interrupted() || !refused.contains(&(*id, n)),
                "task {id}: attempt {n} got a 400 and was {row:?}"
            );
        }
        single += usize::from(task.attempts == 1);
    }
    assert!(permanent_tasks > 0);
    println!(
        "  permanent errors: {permanent_tasks} refused orders all PERMANENT_FAILURE at their \
         first 400 seen, {single} after exactly one attempt (the rest met the outage or an \
         interruption first)"
    );
}

/// The breaker opened while the downstream was down, and from the moment the test saw it
/// open until the downstream came back, calls reached the downstream only within a
/// bound: once the opening is committed the handler's waiting tasks are held (pushed
/// past the cool-down), so a member still believing the breaker closed (for up to a tick,
/// longer while its own database calls fail, or just restarted) can only claim what is
/// due regardless: the attempts in hand (`CONCURRENCY` per member), retries written by
/// finishes racing the opening (one per slot), ingest batches inserted as it opened,
/// leases that lapse (of killed members, or claims whose answer a termination cost), and
/// the probes of each half-open period.
async fn the_breaker_held_the_outage(run: &Run, outage: &Outage, calls: &[Call]) {
    let log: Vec<(DateTime<Utc>, String)> =
        sqlx::query_as("SELECT at, to_state FROM chaos_breaker_log ORDER BY at")
            .fetch_all(&run.observer)
            .await
            .unwrap();
    let during = |at: &DateTime<Utc>| *at >= outage.start && *at <= outage.end;
    let opened = (log.iter())
        .find(|(at, to)| to == "open" && during(at))
        .unwrap_or_else(|| panic!("the breaker did not open during the outage: {log:?}"))
        .0;
    let openings = log
        .iter()
        .filter(|(at, to)| to == "open" && during(at))
        .count();
    let periods = (log.iter())
        .filter(|(at, to)| to != "closed" && *at >= outage.seen_open && *at <= outage.end)
        .count();
    let warned = run.fleet.log_lines("circuit breaker opened");
    assert!(warned >= 1, "no member logged the breaker opening");
    let down: Vec<&Call> = calls.iter().filter(|c| c.down).collect();
    let before = down.iter().filter(|c| c.at < outage.seen_open).count();
    let after = down.len() - before;
    let near = outage.start - chrono::Duration::from_std(LEASE).unwrap();
    let kills = run
        .fleet
        .count(|e| matches!(e, Event::Killed { .. }), near, outage.end);
    let terminations =
        (run.fleet).count(|e| matches!(e, Event::Terminated { .. }), near, outage.end);
    let bound = MEMBERS * (2 * CONCURRENCY + FLUSHES_IN_FLIGHT * INGEST_BATCH)
        + kills * CONCURRENCY
        + terminations * MEMBERS * CLAIM_LOOPS * BATCH
        + PROBES * (periods + 1);
    assert!(
        after <= bound,
        "{after} calls reached the downstream after the breaker opened, bound {bound}"
    );
    let waited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM recovery_task WHERE created_at < $1 AND finished_at > $1",
    )
    .bind(outage.end)
    .fetch_one(&run.observer)
    .await
    .unwrap();
    let seconds = |at: DateTime<Utc>| (at - outage.start).num_milliseconds() as f64 / 1000.0;
    println!(
        "  outage of {:.1} s: the breaker opened {:.2} s in (seen {:.2} s in), {openings} \
         openings, {warned} WARN lines; calls while down: {before} before it opened, {after} \
         after (bound {bound}) while {waited} tasks waited through it",
        seconds(outage.end),
        seconds(opened),
        seconds(outage.seen_open)
    );
}
