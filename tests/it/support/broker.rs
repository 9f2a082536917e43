//! Kafka for tests: librdkafka's mock cluster, a real Kafka-protocol broker in-process.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedHeaders, OwnedMessage};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use redrive::config::{RouteMode, RouteSettings};
use redrive::{Header, Settings, Store};
use std::time::{Duration, Instant};

/// A mock cluster with `topics` (name, partitions) created.
pub fn cluster(topics: &[(&str, i32)]) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("mock cluster");
    for (topic, partitions) in topics {
        cluster
            .create_topic(topic, *partitions, 1)
            .expect("create topic");
    }
    cluster
}

/// Points `settings` at the cluster with a fresh consumer group and quick group timings.
pub fn use_cluster(settings: &mut Settings, bootstrap: &str, routes: Vec<RouteSettings>) {
    settings.kafka.bootstrap_servers = bootstrap.to_owned();
    settings.kafka.group_id = format!("g-{:x}", rand::random::<u32>());
    for (key, value) in [
        ("session.timeout.ms", "6000"),
        ("heartbeat.interval.ms", "500"),
        ("topic.metadata.refresh.interval.ms", "1000"),
        ("message.max.bytes", "10485760"),
    ] {
        settings.kafka.properties.insert(key.into(), value.into());
    }
    settings.routes = routes;
    settings.ingest.linger = Duration::from_millis(10);
}

/// One Kafka case, the preamble of a test against the mock cluster: the cluster with its
/// topics, its bootstrap servers, a fresh store, and settings pointing at both with the
/// test's routes. A test that wants more of the settings changes them afterwards. The
/// cluster stops when `broker` is dropped: a test keeps it bound (`broker: _broker`)
/// for as long as it runs.
pub struct KafkaCase {
    pub broker: MockCluster<'static, DefaultProducerContext>,
    pub bootstrap: String,
    pub store: Store,
    pub settings: Settings,
}

impl KafkaCase {
    /// A mock cluster with `topics` (name, partitions) created, a migrated store in a
    /// schema of its own, and settings that consume `routes` from the cluster in a fresh
    /// consumer group ([`use_cluster`]).
    pub async fn new(topics: &[(&str, i32)], routes: Vec<RouteSettings>) -> KafkaCase {
        let broker = cluster(topics);
        let bootstrap = broker.bootstrap_servers();
        let (store, mut settings) = super::fresh_store().await;
        use_cluster(&mut settings, &bootstrap, routes);
        KafkaCase {
            broker,
            bootstrap,
            store,
            settings,
        }
    }
}

/// A route of `topics` in `mode` to `handler`.
pub fn route(topics: &[&str], mode: RouteMode, handler: &str) -> RouteSettings {
    RouteSettings::new(topics, mode, handler)
}

/// A producer for the test's own messages.
pub fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.max.bytes", "10485760")
        .create()
        .expect("producer")
}

/// A message to produce.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<Header>,
    pub partition: Option<i32>,
}

/// Produces `sample`; returns its (partition, offset).
pub async fn produce(producer: &FutureProducer, topic: &str, sample: &Sample) -> (i32, i64) {
    let mut headers = OwnedHeaders::new();
    for h in &sample.headers {
        add_raw_header(&mut headers, &h.name, h.value.as_deref());
    }
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
    if let Some(key) = &sample.key {
        record = record.key(key);
    }
    if let Some(value) = &sample.value {
        record = record.payload(value);
    }
    if let Some(partition) = sample.partition {
        record = record.partition(partition);
    }
    let delivery = producer
        .send(record, Timeout::After(Duration::from_secs(30)))
        .await;
    let delivery = delivery.expect("delivered");
    (delivery.partition, delivery.offset)
}

/// Reads `count` messages of `topic` (all partitions, from the start) within `limit`.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    count: usize,
    limit: Duration,
) -> Vec<OwnedMessage> {
    let consumer = reader(bootstrap);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let start = Instant::now();
    let mut messages = Vec::new();
    while messages.len() < count && start.elapsed() < limit {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            messages.push(m.detach());
        }
    }
    messages
}

/// A consumer of its own group that commits nothing, to read topics by assignment.
fn reader(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{:x}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// Every message on `topic` now: each of its `partitions` read from the beginning to the
/// high watermark it has when called, within `limit` (panics naming how far each got).
/// Unlike [`consume`] with a large count, it neither waits out its limit nor ends short
/// on a slow machine.
pub fn consume_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    limit: Duration,
) -> Vec<OwnedMessage> {
    let consumer = reader(bootstrap);
    let start = Instant::now();
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, limit)
            .unwrap_or_else(|e| panic!("the end of {topic}/{p}: {e}"));
        ends.push(high);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut next = vec![0i64; partitions as usize];
    let mut messages = Vec::new();
    while next.iter().zip(&ends).any(|(n, end)| n < end) {
        assert!(
            start.elapsed() < limit,
            "read {topic} to offsets {next:?} of {ends:?} within {limit:?}"
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            next[m.partition() as usize] = m.offset() + 1;
            messages.push(m.detach());
        }
    }
    messages
}

/// The native list behind `headers` (the address `as_borrowed` views).
fn native(headers: &OwnedHeaders) -> *mut rdkafka_sys::rd_kafka_headers_t {
    std::ptr::from_ref(headers.as_borrowed()).cast_mut().cast()
}

/// Adds a header whose name is any bytes (rdkafka's `insert` takes `&str` names).
pub fn add_raw_header(headers: &mut OwnedHeaders, name: &[u8], value: Option<&[u8]>) {
    let (ptr, len) = value.map_or((std::ptr::null(), 0), |v| (v.as_ptr(), v.len() as isize));
    // SAFETY: the live list `headers` owns, borrowed mutably; librdkafka copies both.
    let err = unsafe {
        rdkafka_sys::rd_kafka_header_add(
            native(headers),
            name.as_ptr().cast(),
            name.len() as isize,
            ptr.cast(),
            len,
        )
    };
    assert_eq!(
        err,
        rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
}

/// Headers of a consumed message as redrive stores them, names as bytes (rdkafka's
/// safe accessor panics on a name that is not UTF-8).
pub fn headers_of(message: &OwnedMessage) -> Vec<Header> {
    let Some(headers) = message.headers() else {
        return Vec::new();
    };
    let list = native(headers);
    let mut read = Vec::new();
    for index in 0.. {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::os::raw::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: reading the list `message` owns, while it lives.
        unsafe {
            let err =
                rdkafka_sys::rd_kafka_header_get_all(list, index, &mut name, &mut value, &mut size);
            if err != rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                break;
            }
            read.push(Header {
                name: std::ffi::CStr::from_ptr(name).to_bytes().to_vec(),
                value: (!value.is_null())
                    .then(|| std::slice::from_raw_parts(value.cast::<u8>(), size).to_vec()),
            });
        }
    }
    read
}

/// The committed offsets of `group` on `topic`, partition by partition.
pub fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    (0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            },
        )
        .collect()
}

/// Stands for `message.payload()` etc. in assertions.
pub fn bytes(m: &OwnedMessage) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    (m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec))
}
