//! `redrive bench rebalance`: how long ingest pauses when a fleet member dies. Real
//! `redrive run` processes (this executable) ingest a steadily produced topic of an
//! in-process mock cluster; one is killed with SIGKILL and replaced at once, as a
//! supervisor would, several times over. Per kill it reports the longest interval in
//! which no task was stored fleet-wide, and when every partition (the dead member's
//! too) was consumed again. Its schema is `<schema>_bench_rebalance`, so that it can run
//! beside the other benchmarks.

use anyhow::Context;
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use secrecy::ExposeSecret;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{fresh_store, median};
use crate::config::{parse_duration, DatabaseSettings, Settings};
use crate::output::outln;
use crate::store::Store;

const TOPIC: &str = "bench.rebalance";

/// Options of `redrive bench rebalance`.
#[derive(Debug, Clone, Args)]
pub struct RebalanceBenchOptions {
    /// Fleet members: `redrive run` processes of this executable.
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// Members killed with SIGKILL, one at a time; each is replaced at once.
    #[arg(long, default_value_t = 4)]
    pub kills: usize,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
    /// Messages produced per second, spread evenly over the partitions.
    #[arg(long, default_value_t = 600)]
    pub rate: u32,
    /// A librdkafka property for the members, `KEY=VALUE`, after `kafka.properties`
    /// (repeatable). librdkafka's own defaults, for comparison:
    /// `--property session.timeout.ms=45000 --property partition.assignment.strategy=range,roundrobin`.
    #[arg(long = "property", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
    /// Longest wait for the group to settle after a start or a kill.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub limit: Duration,
}

fn parse_property(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Figures of one kill, in seconds.
struct KillFigures {
    /// Longest interval without a new task, from the kill until the group settled.
    pause: f64,
    /// From the kill until every partition had a new task again.
    recovered: f64,
    /// From the kill until the replacement held partitions and all were held.
    settled: f64,
}

/// Runs the rebalance benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &RebalanceBenchOptions) -> anyhow::Result<()> {
    anyhow::ensure!(options.members >= 2, "--members: at least 2");
    anyhow::ensure!(options.partitions >= 1, "--partitions: at least 1");
    let mut settings = settings.clone();
    settings.database.schema.push_str("_rebalance");
    let settings = &settings;
    let store = fresh_store(settings).await?;
    sqlx::query("CREATE INDEX ON recovery_task (created_at)")
        .execute(store.pool())
        .await?;
    let broker = MockCluster::new(1)?;
    broker.create_topic(TOPIC, options.partitions, 1)?;
    let bootstrap = broker.bootstrap_servers();
    let dir = std::env::temp_dir().join(format!("redrive-bench-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir)?;
    // The members' librdkafka properties: `kafka.properties`, then `--property`.
    let mut properties = settings.kafka.properties.clone();
    properties.extend(options.properties.iter().cloned());
    outln!(
        "redrive bench rebalance: {} members, {} partitions, {} messages/s, {} kill(s); properties: {}",
        options.members,
        options.partitions,
        options.rate,
        options.kills,
        if properties.is_empty() {
            "redrive's defaults".to_owned()
        } else {
            let pairs: Vec<String> = properties.iter().map(|(k, v)| format!("{k}={v}")).collect();
            pairs.join(" ")
        }
    );
    let fleet = Fleet {
        config: write_config(&dir, &properties)?,
        dir: dir.clone(),
        database: settings.database.clone(),
        bootstrap: bootstrap.clone(),
    };
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (bootstrap, producing, options) =
            (bootstrap.clone(), producing.clone(), options.clone());
        std::thread::spawn(move || produce(&bootstrap, &options, &producing))
    };
    let mut members = Vec::new();
    let result = measure(&fleet, &mut members, &store, options).await;
    producing.store(false, Ordering::SeqCst);
    let produced = producer.join().expect("the producer thread");
    let figures = result.with_context(|| format!("member logs in {}", dir.display()))?;
    produced?;
    wait_stored(&store, fleet.produced(options.partitions)?, options).await?;
    drop(members);
    super::drop_schema(&store).await?;
    let _ = std::fs::remove_dir_all(&dir);
    print_summary(&figures);
    Ok(())
}

/// Starts the fleet into `members`, then kills and replaces members one at a time.
async fn measure(
    fleet: &Fleet,
    members: &mut Vec<Member>,
    store: &Store,
    options: &RebalanceBenchOptions,
) -> anyhow::Result<Vec<KillFigures>> {
    for _ in 0..options.members {
        members.push(fleet.start()?);
    }
    let started = Instant::now();
    wait_settled(members, options, started).await?;
    let formed = started.elapsed().as_secs_f64();
    let quiet_from = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let quiet = longest_pause(store, quiet_from, chrono::Utc::now()).await?;
    outln!("  group formed after {formed:.1} s; longest pause in 10 s without kills: {quiet:.1} s");
    let mut figures = Vec::new();
    for kill in 1..=options.kills {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let victim = (kill - 1) % members.len();
        let killed_at = chrono::Utc::now();
        let clock = Instant::now();
        members[victim].kill()?;
        members[victim] = fleet.start()?;
        let recovered = wait_recovered(store, killed_at, options, clock).await?;
        wait_settled(members, options, clock).await?;
        let settled = clock.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pause = longest_pause(store, killed_at, chrono::Utc::now()).await?;
        outln!(
            "  kill {kill}: longest fleet-wide pause {pause:.1} s; every partition consumed again after {recovered:.1} s; group settled after {settled:.1} s"
        );
        figures.push(KillFigures {
            pause,
            recovered,
            settled,
        });
    }
    Ok(figures)
}

fn print_summary(figures: &[KillFigures]) {
    type Figure = fn(&KillFigures) -> f64;
    let rows: [(&str, Figure); 3] = [
        ("longest fleet-wide pause per kill", |f| f.pause),
        ("dead member's partitions consumed again", |f| f.recovered),
        ("group settled with the replacement", |f| f.settled),
    ];
    for (what, figure) in rows {
        let values: Vec<f64> = figures.iter().map(figure).collect();
        let max = values.iter().copied().fold(0.0, f64::max);
        if !values.is_empty() {
            outln!("{what}: median {:.1} s, max {max:.1} s", median(&values));
        }
    }
}

/// Writes the members' configuration: the properties, the capture route, no workers.
fn write_config(dir: &Path, properties: &BTreeMap<String, String>) -> anyhow::Result<PathBuf> {
    let quote = |text: &str| serde_json::to_string(text).expect("a string");
    let mut toml = format!(
        "[kafka]\ngroup_id = {}\n\n[kafka.properties]\n",
        quote(&format!("bench-{:x}", rand::random::<u32>()))
    );
    for (key, value) in properties {
        toml.push_str(&format!("{} = {}\n", quote(key), quote(value)));
    }
    toml.push_str(&format!(
        "\n[worker]\nenabled = false\n\n[[routes]]\ntopics = [{}]\nmode = \"capture\"\nhandler = \"log\"\n",
        quote(TOPIC)
    ));
    let path = dir.join("members.toml");
    std::fs::write(&path, toml)?;
    Ok(path)
}

/// How to start a member.
struct Fleet {
    config: PathBuf,
    dir: PathBuf,
    database: DatabaseSettings,
    bootstrap: String,
}

impl Fleet {
    /// Starts `redrive run` (this executable), logging its rebalances to a file.
    fn start(&self) -> anyhow::Result<Member> {
        let log = self
            .dir
            .join(format!("member-{:x}.log", rand::random::<u64>()));
        let child = Command::new(std::env::current_exe().context("this executable")?)
            .arg("--config")
            .arg(&self.config)
            .args(["run", "--no-migrate"])
            .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("REDRIVE__DATABASE__URL", self.database.url.expose_secret())
            .env("REDRIVE__DATABASE__SCHEMA", &self.database.schema)
            .env("RUST_LOG", "warn,redrive::ingest=info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting a member")?;
        Ok(Member { child, log })
    }

    /// Messages in the topic: the sum of its partitions' high watermarks.
    fn produced(&self, partitions: i32) -> anyhow::Result<i64> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let mut total = 0;
        for partition in 0..partitions {
            let (_, high) = consumer.fetch_watermarks(TOPIC, partition, Duration::from_secs(10))?;
            total += high;
        }
        Ok(total)
    }
}

/// A member process; killed when dropped.
struct Member {
    child: Child,
    log: PathBuf,
}

impl Member {
    fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill()?; // SIGKILL
        self.child.wait()?;
        Ok(())
    }

    /// Partitions held after the member's last rebalance, from its log; an error if it
    /// exited.
    fn partitions_held(&mut self) -> anyhow::Result<usize> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!("a member exited ({status}):\n{text}");
        }
        Ok(text
            .lines()
            .rev()
            .find(|line| line.contains("partitions held"))
            .and_then(|line| line.split("count=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|count| count.parse().ok())
            .unwrap_or(0))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every member, a replacement too, holds partitions, and all are held.
async fn wait_settled(
    members: &mut [Member],
    options: &RebalanceBenchOptions,
    since: Instant,
) -> anyhow::Result<()> {
    loop {
        let held = members
            .iter_mut()
            .map(Member::partitions_held)
            .collect::<anyhow::Result<Vec<usize>>>()?;
        if held.iter().all(|&h| h > 0) && held.iter().sum::<usize>() == options.partitions as usize
        {
            return Ok(());
        }
        anyhow::ensure!(
            since.elapsed() < options.limit,
            "the group did not settle within --limit (partitions held: {held:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every partition has a task stored after `killed_at`; returns the seconds
/// from `killed_at` to the last partition's first such task.
async fn wait_recovered(
    store: &Store,
    killed_at: chrono::DateTime<chrono::Utc>,
    options: &RebalanceBenchOptions,
    since: Instant,
) -> anyhow::Result<f64> {
    loop {
        let (partitions, seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM max(first) - $1)::float8 \
             FROM (SELECT min(created_at) AS first FROM recovery_task \
                   WHERE created_at > $1 GROUP BY source_partition) s",
        )
        .bind(killed_at)
        .fetch_one(store.pool())
        .await?;
        if partitions == i64::from(options.partitions) {
            return Ok(seconds.unwrap_or_default());
        }
        anyhow::ensure!(
            since.elapsed() < options.limit,
            "{partitions} of {} partitions consumed again within --limit",
            options.partitions
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The longest interval in `[from, to]` in which no task was stored, in seconds.
async fn longest_pause(
    store: &Store,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<f64> {
    let seconds: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(at - previous))::float8 FROM ( \
           SELECT at, lag(at) OVER (ORDER BY at) AS previous FROM ( \
             SELECT created_at AS at FROM recovery_task WHERE created_at BETWEEN $1 AND $2 \
             UNION SELECT $1 UNION SELECT $2) stamps) gaps",
    )
    .bind(from)
    .bind(to)
    .fetch_one(store.pool())
    .await?;
    Ok(seconds.unwrap_or_default())
}

/// Waits until `produced` tasks are stored (no more: one per message).
async fn wait_stored(
    store: &Store,
    produced: i64,
    options: &RebalanceBenchOptions,
) -> anyhow::Result<()> {
    let since = Instant::now();
    loop {
        let stored = store.status_counts().await?.total();
        anyhow::ensure!(stored <= produced, "{stored} tasks for {produced} messages");
        if stored == produced {
            outln!("  {produced} messages produced, {stored} tasks stored");
            return Ok(());
        }
        anyhow::ensure!(
            since.elapsed() < options.limit,
            "{stored} tasks for {produced} messages after --limit"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Produces `options.rate` messages per second, partition by partition in turn, until
/// `producing` is cleared; then flushes.
fn produce(
    bootstrap: &str,
    options: &RebalanceBenchOptions,
    producing: &AtomicBool,
) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()?;
    let value = vec![b'v'; 64];
    let started = Instant::now();
    let mut sent: u64 = 0;
    while producing.load(Ordering::SeqCst) {
        let due = (started.elapsed().as_secs_f64() * f64::from(options.rate)) as u64;
        while sent < due {
            let partition = (sent % options.partitions as u64) as i32;
            let record = BaseRecord::<(), _>::to(TOPIC)
                .partition(partition)
                .payload(&value);
            match producer.send(record) {
                Ok(()) => sent += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => break,
                Err((error, _)) => return Err(error.into()),
            }
        }
        producer.poll(Duration::from_millis(10));
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}
