//! The paced replay of `redrive bench redrive-pace`, through librdkafka's mock cluster:
//! the job produces the tasks to `orders`, whose consumer (the downstream) fails on what
//! it reads while it fails and dead-letters it to `orders.dlt` with its headers copied,
//! as Spring does. A member captures that topic, so each re-failure comes back as a task
//! linked to the one the job replayed, which is what the job judges.

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{pause_then_resume, seed, Downstream, Measured, PaceBenchOptions};
use crate::bench::{drop_schema, fresh_store};
use crate::config::{RouteMode, RouteSettings, Settings};
use crate::fleet::Fleet;
use crate::handlers::LogHandler;
use crate::operations::{Actor, FilterParams, ReplayRequest, Runner, StatusNames};
use crate::replay::Replayer;

/// The topic replayed to, and its consumer's dead-letter topic.
const ORDERS: &str = "orders";
const DLT: &str = "orders.dlt";
/// The handler of the replayed tasks and of the captured re-failures.
const HANDLER: &str = "orders";

/// A paced replay of the options' tasks into a consumer failing from the start, or
/// after `fail_after` messages.
pub(super) async fn scenario(
    base: &Settings,
    options: &PaceBenchOptions,
    fail_after: Option<u64>,
) -> anyhow::Result<Result<Measured, String>> {
    let broker = MockCluster::new(1)?;
    broker.create_topic(ORDERS, 1, 1)?;
    broker.create_topic(DLT, 1, 1)?;
    let bootstrap = broker.bootstrap_servers();
    let mut settings = base.clone();
    settings.kafka.bootstrap_servers = bootstrap.clone();
    settings.kafka.group_id = format!("bench-{:x}", rand::random::<u32>());
    // The re-failures are only recorded: nothing republishes them.
    settings.worker.enabled = false;
    settings.routes = vec![RouteSettings::new(&[DLT], RouteMode::Capture, HANDLER)];
    let store = fresh_store(&settings).await?;
    seed(&store, options.tasks, HANDLER, ORDERS).await?;
    let fleet = Fleet::builder(settings.clone())
        .handler(HANDLER, LogHandler)
        .build()?;
    let breakers = fleet.breaker_follower(store.clone());
    let ingest = (fleet.ingest(store.clone(), breakers)).context("the capture route")?;
    let stop_ingest = CancellationToken::new();
    let ingesting = tokio::spawn(ingest.run(stop_ingest.clone()));

    let downstream = Downstream::new(fail_after);
    let stop_consumer = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let consumer = std::thread::spawn({
        let (downstream, stop, ready) = (downstream.clone(), stop_consumer.clone(), ready.clone());
        let bootstrap = bootstrap.clone();
        move || consume(&bootstrap, &downstream, &stop, &ready)
    });
    // Both consumers in their groups before the job starts: a probe dead letter is
    // captured, and the downstream has its partition.
    probe(&bootstrap)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM recovery_task")
            .fetch_one(store.pool())
            .await?;
        if stored > i64::try_from(options.tasks)? && ready.load(Ordering::SeqCst) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the member and the downstream were not in their groups within a minute"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let request = ReplayRequest {
        filter: Some(FilterParams {
            handler: Some(HANDLER.into()),
            status: Some(StatusNames(vec!["permanent_failure".into()])),
            ..FilterParams::default()
        }),
        pace: Some(options.pace()),
        reason: Some("bench".into()),
        ..ReplayRequest::default()
    };
    let operations = fleet.operations(store.clone());
    let job = (operations.start_replay(&Actor::shell(), &request, Runner::Here("bench"))).await?;
    let replayer = Replayer::new(
        store.clone(),
        settings.kafka.clone(),
        settings.ingest.max_message_bytes,
        "bench".into(),
        settings.routes.clone(),
    );
    // Every message the job produced read by the downstream.
    let tasks = u64::try_from(options.tasks)?;
    let read = |_| {
        let downstream = downstream.clone();
        async move { Ok(downstream.calls.load(Ordering::SeqCst) >= tasks) }
    };
    let measured = pause_then_resume(&operations, &replayer, job, &downstream, read).await;
    stop_consumer.store(true, Ordering::SeqCst);
    let consumed = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("the consumer panicked"))?;
    stop_ingest.cancel();
    ingesting.await??;
    consumed?;
    drop_schema(&store).await?;
    measured
}

/// A dead letter with no link to a task: captured once the member is in its group.
fn probe(bootstrap: &str) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    producer
        .send(BaseRecord::to(DLT).key("probe").payload("probe"))
        .map_err(|(error, _)| error)?;
    producer.flush(Duration::from_secs(10))?;
    Ok(())
}

/// The downstream: reads `orders` until `stop`; each message it fails on is
/// dead-lettered with its headers and Spring's. Sets `ready` once it has its partition.
fn consume(
    bootstrap: &str,
    downstream: &Downstream,
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> anyhow::Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "downstream")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[ORDERS])?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()?;
    while !stop.load(Ordering::SeqCst) {
        producer.poll(Duration::ZERO);
        if !ready.load(Ordering::SeqCst) && consumer.assignment()?.count() > 0 {
            ready.store(true, Ordering::SeqCst);
        }
        let Some(message) = consumer.poll(Duration::from_millis(20)) else {
            continue;
        };
        let message = message?;
        if !downstream.call() {
            continue;
        }
        let mut headers = OwnedHeaders::new();
        for header in message.headers().iter().flat_map(|h| h.iter()) {
            headers = headers.insert(header);
        }
        for (key, value) in [
            ("kafka_dlt-original-topic", ORDERS),
            ("kafka_dlt-exception-message", "schema mismatch"),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(DLT).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(value) = message.payload() {
            record = record.payload(value);
        }
        while let Err((error, back)) = producer.send(record) {
            anyhow::ensure!(
                matches!(
                    error,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::error::RDKafkaErrorCode::QueueFull
                    )
                ),
                "dead-lettering: {error}"
            );
            record = back;
            producer.poll(Duration::from_millis(5));
        }
    }
    producer.flush(Duration::from_secs(10))?;
    Ok(())
}
