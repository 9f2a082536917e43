//! `redrive demo`: the whole loop on a fresh machine. An in-process Kafka-protocol broker
//! (librdkafka's mock cluster), the local PostgreSQL (or, when none answers and no URL is
//! given, a private throwaway one started from the server programs on the machine), a
//! stream of sample failures on a dead-letter topic, and a fleet member that captures
//! them and republishes them behind a fault-injecting wrapper.

use anyhow::{bail, Context};
use clap::Args;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use secrecy::SecretString;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::{RouteMode, RouteSettings, Settings};
use crate::fleet::{cancel_on_signal, Fleet};
use crate::handlers::faults::FaultInjecting;
use crate::handlers::{LogHandler, RepublishHandler};
use crate::kafka::client_config;
use crate::output::{out, outln};
use crate::private_cluster::PrivateCluster;
use crate::store::{StatusCounts, Store};

const DEAD_LETTER_TOPIC: &str = "orders.dlt";
const TARGET_TOPIC: &str = "orders";
const PARKING_TOPIC: &str = "orders.parking";
/// The server of the default `database.url`, where the demo looks when no URL is given.
const DEFAULT_SERVER: &str = "127.0.0.1:5432";

/// Options of `redrive demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoOptions {
    /// Sample failures to produce; the demo stops once that many tasks are final.
    #[arg(long, default_value_t = 1000)]
    pub messages: usize,
    /// Sample failures produced per second.
    #[arg(long, default_value_t = 250)]
    pub rate: u32,
    /// Share of attempts that fail transiently (retried with backoff).
    #[arg(long, default_value_t = 0.3)]
    pub transient: f64,
    /// Share of attempts that fail permanently (parked).
    #[arg(long, default_value_t = 0.02)]
    pub permanent: f64,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Serve the console (and the admin API) on this loopback address; when it is
    /// taken, on a free port of the same host, as printed.
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub console: SocketAddr,
    /// Serve no console.
    #[arg(long)]
    pub no_console: bool,
    /// Keep running after the count is reached, until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
}

/// `wanted`, or when it is taken a free port of its host (the demo's console must not
/// fail because another program holds the port).
fn console_address(wanted: SocketAddr) -> anyhow::Result<SocketAddr> {
    match std::net::TcpListener::bind(wanted) {
        Ok(listener) => Ok(listener.local_addr()?),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
            let free = std::net::TcpListener::bind(SocketAddr::new(wanted.ip(), 0))?;
            Ok(free.local_addr()?)
        }
        Err(error) => Err(anyhow::anyhow!("--console {wanted}: {error}")),
    }
}

/// Runs the demo with `settings` (database, worker and retry tuning) as a base.
pub async fn run(settings: &Settings, options: &DemoOptions) -> anyhow::Result<()> {
    let broker = MockCluster::new(1).context("starting the in-process Kafka broker")?;
    for (topic, partitions) in [
        (DEAD_LETTER_TOPIC, 3),
        (TARGET_TOPIC, 3),
        (PARKING_TOPIC, 1),
    ] {
        broker.create_topic(topic, partitions, 1)?;
    }
    let bootstrap = broker.bootstrap_servers();
    let mut settings = demo_settings(settings, &bootstrap, options);
    if !options.no_console {
        anyhow::ensure!(
            options.console.ip().is_loopback(),
            "--console {}: the demo's console has no sign-in, so it listens on a loopback \
             address only (127.0.0.1:PORT)",
            options.console
        );
        settings.admin.listen = Some(console_address(options.console)?);
        settings.admin.tokens.clear();
    }
    let private = private_server(&mut settings).await?;
    let store = (Store::connect(&settings.database).await).with_context(|| {
        format!(
            "connecting to PostgreSQL (the URL from {})",
            settings.database.url_origin
        )
    })?;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", store.schema()))
        .execute(store.pool())
        .await?;
    store.migrate().await?;

    outln!("redrive demo");
    outln!("  Kafka-protocol broker (in-process): {bootstrap}");
    outln!("  dead-letter topic {DEAD_LETTER_TOPIC} -> republish to the original topic ({TARGET_TOPIC}); permanent failures parked on {PARKING_TOPIC}");
    outln!(
        "  PostgreSQL schema {:?} (recreated for this run)",
        store.schema()
    );
    if let Some(cluster) = &private {
        outln!(
            "  PostgreSQL: none answers at {DEFAULT_SERVER} and no DATABASE_URL is given, so \
             a private throwaway server runs on 127.0.0.1:{} (its programs from {}); it is \
             removed when the demo ends",
            cluster.port(),
            cluster.programs_shown()
        );
    }
    outln!(
        "  faults injected: {:.0}% transient, {:.0}% permanent",
        options.transient * 100.0,
        options.permanent * 100.0
    );
    outln!("  add your own failures while it runs: echo oops | kcat -b {bootstrap} -t {DEAD_LETTER_TOPIC} -P");
    if let Some(addr) = options.metrics {
        outln!("  metrics: http://{addr}/metrics");
    }
    if let Some(addr) = settings.admin.listen {
        outln!(
            "  console: http://{addr}/console/ (what broke, tasks, actions; no sign-in on \
             loopback; it stops with the demo, --keep-running keeps it)"
        );
    }
    outln!();

    let republish = RepublishHandler::new(&settings);
    let fleet = Fleet::builder(settings.clone())
        .handler("log", LogHandler)
        .handler(
            "republish",
            FaultInjecting::new(republish, options.transient, options.permanent),
        )
        .build()?;
    let metrics = fleet.metrics().clone();
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let member = tokio::spawn(fleet.run_with_store(store.clone(), shutdown.clone()));
    let producer: FutureProducer =
        client_config(&settings.kafka, crate::kafka::ClientRole::Producer).create()?;
    let feeding = tokio::spawn(feed(
        producer,
        options.messages,
        options.rate,
        shutdown.clone(),
    ));

    let started = Instant::now();
    let live = std::io::stdout().is_terminal();
    let mut ticker = tokio::time::interval(Duration::from_millis(500));
    let mut counts = StatusCounts::default();
    let mut ticks = 0u64;
    loop {
        ticks += 1;
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        // The member inside waits out a database outage, and so does this count.
        let read = async { anyhow::Ok((store.status_counts().await?, retrying(&store).await?)) };
        let retrying = match read.await {
            Ok((read, retrying)) => {
                counts = read;
                retrying
            }
            Err(error) => {
                let line = format!("the database does not answer ({error}); waiting for it");
                match live {
                    true => out!("\r{line}"),
                    false => outln!("{line}"),
                }
                continue;
            }
        };
        let line = format!(
            "ingested {:>6}   resolved {:>6}   retrying {:>5}   permanent {:>5}   ({:.0}s)",
            counts.total(),
            counts.resolved,
            retrying,
            counts.permanent_failure,
            started.elapsed().as_secs_f64()
        );
        if live {
            out!("\r{line}");
            std::io::stdout().flush()?;
        } else if ticks % 4 == 1 {
            outln!("{line}");
        }
        let finished = counts.total() - counts.failed;
        if !options.keep_running && counts.failed == 0 && finished >= options.messages as i64 {
            shutdown.cancel();
        }
    }
    if live {
        outln!();
    }
    feeding.abort();
    member.await??;
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM recovery_attempt")
        .fetch_one(store.pool())
        .await?;
    outln!("\nsummary after {:.1}s", started.elapsed().as_secs_f64());
    let parked = metrics.parked.with_label_values(&["produced"]).get();
    outln!("  tasks ingested          {}", counts.total());
    outln!("  resolved (republished)  {}", counts.resolved);
    outln!(
        "  permanent failures      {} (parked on {PARKING_TOPIC}: {parked})",
        counts.permanent_failure
    );
    outln!("  still failed            {}", counts.failed);
    outln!("  attempts made           {attempts}");
    match &private {
        None => next_commands(&store).await?,
        Some(_) => outln!(
            "\nthe private PostgreSQL server goes with the demo: look while it runs (the \
             console; --keep-running keeps both until Ctrl-C), or give DATABASE_URL to keep \
             what it leaves"
        ),
    }
    drop(broker);
    drop(store);
    drop(private);
    Ok(())
}

/// A private throwaway server when no URL is given and none answers at
/// [`DEFAULT_SERVER`], with `settings` pointed at it; `None` otherwise (the URL given,
/// or the server answering there, is used as it is).
async fn private_server(settings: &mut Settings) -> anyhow::Result<Option<PrivateCluster>> {
    if settings.database.url_given() {
        return Ok(None);
    }
    let probe = tokio::net::TcpStream::connect(DEFAULT_SERVER);
    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
        return Ok(None);
    }
    let Some(programs) = PrivateCluster::programs() else {
        bail!(
            "no PostgreSQL answers at {DEFAULT_SERVER} and no DATABASE_URL is given, and this \
             machine has no PostgreSQL server programs (initdb) to start a private one: \
             install them (apt-get install postgresql), run the whole stack with \
             `docker compose up`, or give DATABASE_URL"
        );
    };
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(Some(&programs), &[]))
        .await?
        .with_context(|| {
            format!(
                "no PostgreSQL answers at {DEFAULT_SERVER} and no DATABASE_URL is given; \
                 starting a private one"
            )
        })?;
    settings.database.url = SecretString::from(cluster.url());
    settings.database.url_origin = "the demo's private server".to_owned();
    Ok(Some(cluster))
}

/// Prints three commands to look at what the demo left, in its schema (kept until the
/// next run), with the program as it was invoked.
async fn next_commands(store: &Store) -> anyhow::Result<()> {
    let example: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM recovery_task ORDER BY status = 'permanent_failure' DESC, id LIMIT 1",
    )
    .fetch_optional(store.pool())
    .await?;
    let program = std::env::args().next().unwrap_or_else(|| "redrive".into());
    let run = format!("REDRIVE__DATABASE__SCHEMA={} {program}", store.schema());
    outln!(
        "\nnext (the demo's tasks stay in schema {:?} until the next run):",
        store.schema()
    );
    outln!("  {run} tasks stats");
    outln!("  {run} tasks list --status permanent_failure");
    match example {
        Some(id) => outln!("  {run} tasks show {id}"),
        None => outln!("  {run} tasks show ID"),
    }
    Ok(())
}

fn demo_settings(base: &Settings, bootstrap: &str, options: &DemoOptions) -> Settings {
    let mut settings = base.clone();
    settings.database.schema = format!("{}_demo", base.database.schema);
    settings.database.migrate_on_start = false;
    settings.kafka.bootstrap_servers = bootstrap.to_owned();
    settings.kafka.group_id = "redrive-demo".into();
    settings.worker.poll_interval = Duration::from_millis(200);
    settings.retry.max_attempts = 6;
    settings.retry.backoff_base = Duration::from_millis(200);
    settings.retry.backoff_cap = Duration::from_secs(3);
    settings.metrics.listen = options.metrics;
    settings.parking.topic = Some(PARKING_TOPIC.into());
    let mut route = RouteSettings::new(&[DEAD_LETTER_TOPIC], RouteMode::Capture, "republish");
    route.name = "orders".into();
    route.event_type = Some("order.sync_failed".into());
    settings.routes = vec![route];
    settings
}

async fn retrying(store: &Store) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM recovery_task WHERE status = 'failed' AND attempts > 0",
    )
    .fetch_one(store.pool())
    .await?)
}

/// Produces `count` sample failures, Spring Kafka style, at `rate` per second.
async fn feed(producer: FutureProducer, count: usize, rate: u32, stop: CancellationToken) {
    let exceptions = [
        (
            "org.springframework.web.client.HttpServerErrorException",
            "503 Service Unavailable from inventory",
        ),
        ("java.net.SocketTimeoutException", "Read timed out"),
        (
            "org.example.orders.ValidationException",
            "currency EURO is not ISO 4217",
        ),
    ];
    let pause = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    for i in 0..count {
        if stop.is_cancelled() {
            return;
        }
        let (class, message) = exceptions[i % exceptions.len()];
        let value: Vec<u8> = if i % 10 == 9 {
            vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0xff] // not UTF-8: kept byte for byte
        } else {
            format!(
                r#"{{"order_id":{i},"amount":{}.{:02},"currency":"EUR"}}"#,
                10 + i % 90,
                i % 100
            )
            .into_bytes()
        };
        let key = format!("order-{i}");
        let partition = (i % 3).to_string();
        let offset = (i / 3).to_string();
        let headers = OwnedHeaders::new()
            .insert(KafkaHeader {
                key: "kafka_dlt-original-topic",
                value: Some(TARGET_TOPIC),
            })
            .insert(KafkaHeader {
                key: "kafka_dlt-original-partition",
                value: Some(partition.as_str()),
            })
            .insert(KafkaHeader {
                key: "kafka_dlt-original-offset",
                value: Some(offset.as_str()),
            })
            .insert(KafkaHeader {
                key: "kafka_dlt-exception-fqcn",
                value: Some(class),
            })
            .insert(KafkaHeader {
                key: "kafka_dlt-exception-message",
                value: Some(message),
            });
        let record = FutureRecord::to(DEAD_LETTER_TOPIC)
            .key(&key)
            .payload(&value)
            .headers(headers);
        if let Err((error, _)) = producer
            .send(record, Timeout::After(Duration::from_secs(10)))
            .await
        {
            tracing::warn!(%error, "demo producer could not write a sample failure");
        }
        tokio::time::sleep(pause).await;
    }
}
