//! `redrive bench ingest`: messages persisted per second, from the first message consumed
//! to the last offset committed, through librdkafka's mock cluster into PostgreSQL.

use anyhow::Context;
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{fresh_store, median};
use crate::config::{RouteMode, RouteSettings, Settings};
use crate::fleet::Fleet;
use crate::handlers::LogHandler;
use crate::output::outln;

const TOPIC: &str = "bench.dlt";

/// Options of `redrive bench ingest`.
#[derive(Debug, Clone, Args)]
pub struct IngestBenchOptions {
    /// Messages produced, then ingested, per run.
    #[arg(long, default_value_t = 200_000)]
    pub messages: usize,
    /// Bytes of each message value.
    #[arg(long, default_value_t = 512)]
    pub value_bytes: usize,
    /// Partitions of the topic. The mock broker keeps only about 5 MB per partition, so
    /// the messages must be spread over enough partitions to be kept until consumed.
    #[arg(long, default_value_t = 32)]
    pub partitions: i32,
    /// Messages per insert statement (ingest.batch_size).
    #[arg(long, default_value_t = 500)]
    pub batch_size: u32,
    /// Runs; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// Runs the ingest benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &IngestBenchOptions) -> anyhow::Result<()> {
    outln!(
        "redrive bench ingest: {} messages of {} bytes on {} partitions, batch {}, {} run(s), median shown",
        options.messages, options.value_bytes, options.partitions, options.batch_size, options.runs
    );
    let mut rates = Vec::new();
    for run in 1..=options.runs.max(1) {
        let rate = one_run(settings, options).await?;
        outln!("  run {run}: {rate:.0} messages/s persisted");
        rates.push(rate);
    }
    outln!(
        "ingest: {:.0} messages/s persisted (median)",
        median(&rates)
    );
    Ok(())
}

async fn one_run(base: &Settings, options: &IngestBenchOptions) -> anyhow::Result<f64> {
    let broker = MockCluster::new(1)?;
    broker.create_topic(TOPIC, options.partitions, 1)?;
    let bootstrap = broker.bootstrap_servers();
    produce(&bootstrap, options)?;

    let mut settings = base.clone();
    settings.kafka.bootstrap_servers = bootstrap.clone();
    settings.kafka.group_id = format!("bench-{:x}", rand::random::<u32>());
    settings.ingest.batch_size = options.batch_size;
    settings.worker.enabled = false;
    settings.routes = vec![RouteSettings::new(&[TOPIC], RouteMode::Capture, "log")];
    let store = fresh_store(&settings).await?;
    let fleet = Fleet::builder(settings.clone())
        .handler("log", LogHandler)
        .build()?;
    // Capture mode: no handler is called inline, no breaker followed.
    let breakers = fleet.breaker_follower(store.clone());
    let ingest = (fleet.ingest(store.clone(), breakers)).context("the bench route")?;
    let progress = ingest.progress();
    let stop = CancellationToken::new();
    let running = tokio::spawn(ingest.run(stop.clone()));

    let watcher = committed_watcher(&bootstrap, &settings.kafka.group_id)?;
    let target = options.messages as i64;
    let limit = Instant::now() + Duration::from_secs(600);
    loop {
        let committed =
            tokio::task::block_in_place(|| committed_total(&watcher, options.partitions))?;
        if committed >= target {
            break;
        }
        anyhow::ensure!(Instant::now() < limit, "ingest took over 10 minutes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let finished = Instant::now();
    let first = *progress.first_consumed.get().context("nothing consumed")?;
    stop.cancel();
    running.await??;
    let stored = store.status_counts().await?.total();
    anyhow::ensure!(stored == target, "{stored} tasks for {target} messages");
    super::drop_schema(&store).await?;
    Ok(options.messages as f64 / (finished - first).as_secs_f64())
}

/// Produces the messages as fast as the producer goes.
fn produce(bootstrap: &str, options: &IngestBenchOptions) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let value = vec![b'v'; options.value_bytes];
    for i in 0..options.messages {
        let key = i.to_string();
        let mut record = BaseRecord::to(TOPIC).key(&key).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

/// A consumer of `group` that never joins it, to read its committed offsets.
fn committed_watcher(bootstrap: &str, group: &str) -> anyhow::Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()?)
}

fn committed_total(watcher: &BaseConsumer, partitions: i32) -> anyhow::Result<i64> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(TOPIC, p);
    }
    let committed = watcher.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum())
}
