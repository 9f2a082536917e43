//! The bad-deploy brake of process-mode routes: when most messages fail inline, the
//! route stops consuming instead of turning its topic into tasks; it resumes after the
//! cool-down or when an operator releases it (audited), losing and repeating nothing.

use async_trait::async_trait;
use redrive::config::{BrakeSettings, BreakerSettings, HandlerSettings, RouteMode};
use redrive::{Fleet, Handler, HandlerContext, HandlerError, Settings, Store, Task};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::{committed, produce, producer, route, KafkaCase, Sample};
use crate::support::{eventually, scalar, Member};
use crate::support::{Bounded, CHILD_LIMIT};

/// A handler whose deploy is broken (every call fails) until fixed.
struct Deploy {
    broken: Arc<AtomicBool>,
}

#[async_trait]
impl Handler for Deploy {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(HandlerError::transient("NullPointerException in v2.3.1"));
        }
        Ok(())
    }
}

const MESSAGES: i64 = 300;
const BATCH: u32 = 10;

/// A process-mode route on "payments" (2 partitions) with `brake`, `MESSAGES` produced.
async fn braked_route(brake: BrakeSettings) -> (Broker, Store, Settings, String) {
    let mut payments = route(&["payments"], RouteMode::Process, "deploy");
    payments.brake = Some(brake);
    let KafkaCase {
        broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(&[("payments", 2)], vec![payments]).await;
    settings.ingest.batch_size = BATCH;
    // The stored failures stay as they are: this is about ingest.
    settings.worker.enabled = false;
    let producer = producer(&bootstrap);
    for i in 0..MESSAGES {
        produce(
            &producer,
            "payments",
            &Sample {
                key: Some(format!("k{i}").into()),
                value: Some(format!("payment {i}").into()),
                ..Sample::default()
            },
        )
        .await;
    }
    (broker, store, settings, bootstrap)
}

type Broker = rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

fn start(
    settings: &Settings,
    store: &Store,
    broken: &Arc<AtomicBool>,
) -> (Member, redrive::telemetry::Metrics) {
    let fleet = Fleet::builder(settings.clone())
        .handler(
            "deploy",
            Deploy {
                broken: broken.clone(),
            },
        )
        .build()
        .unwrap();
    let metrics = fleet.metrics().clone();
    (Member::start(fleet, store), metrics)
}

async fn committed_total(bootstrap: &str, group: &str) -> i64 {
    let (bootstrap, group) = (bootstrap.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || committed(&bootstrap, &group, "payments", 2))
        .await
        .unwrap()
        .iter()
        .map(|&o| o.max(0))
        .sum()
}

async fn tasks(store: &Store) -> i64 {
    scalar(store, "SELECT count(*) FROM recovery_task").await
}

/// Most failures an engaged brake lets through: the window's messages, the batches
/// being stored when it engaged, and the one being filled.
const LET_THROUGH: i64 = 20 + 5 * BATCH as i64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_bad_deploy_pauses_the_route_until_an_operator_releases_it() {
    let (_broker, store, settings, bootstrap) = braked_route(BrakeSettings {
        failure_ratio: 0.8,
        window: Duration::from_secs(60),
        min_messages: 20,
        cool_down: Duration::from_secs(3600),
    })
    .await;
    let broken = Arc::new(AtomicBool::new(true));
    let (running, metrics) = start(&settings, &store, &broken);
    eventually(Duration::from_secs(30), "the brake engaged", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_brake WHERE engaged_until > now()",
        )
        .await
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = tasks(&store).await;
    assert!(
        (20..=LET_THROUGH).contains(&stored),
        "{stored} failures stored of {MESSAGES}: the brake let too many through"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        tasks(&store).await,
        stored,
        "nothing consumed while engaged"
    );
    let group = settings.kafka.group_id.clone();
    assert!(committed_total(&bootstrap, &group).await < MESSAGES);
    assert_eq!(
        metrics.brake_engaged.with_label_values(&["payments"]).get(),
        1
    );
    assert_eq!(
        metrics.brake_trips.with_label_values(&["payments"]).get(),
        1
    );

    // The deploy is rolled back; an operator releases the brake.
    broken.store(false, Ordering::SeqCst);
    let released = crate::support::cli::redrive(&settings)
        .args([
            "brake",
            "release",
            "payments",
            "--reason",
            "rolled back v2.3.1",
        ])
        .output_within(CHILD_LIMIT)
        .unwrap();
    let out = String::from_utf8_lossy(&released.stdout);
    assert!(
        released.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&released.stderr)
    );
    assert!(out.contains("brake of payments released"), "{out}");
    eventually(
        Duration::from_secs(30),
        "every offset committed",
        || async { committed_total(&bootstrap, &group).await == MESSAGES },
    )
    .await;
    assert_eq!(tasks(&store).await, stored, "the rest succeeded inline");
    assert_eq!(
        metrics.brake_engaged.with_label_values(&["payments"]).get(),
        0
    );
    running.stop().await;
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_audit WHERE action = 'brake_release' \
             AND reason = 'rolled back v2.3.1'"
        )
        .await,
        1
    );
    let again = crate::support::cli::redrive(&settings)
        .args(["brake", "release", "payments", "--reason", "twice"])
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not engaged"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_route_resumes_after_the_cool_down_and_brakes_again_while_still_broken() {
    let (_broker, store, settings, _) = braked_route(BrakeSettings {
        failure_ratio: 1.0,
        window: Duration::from_secs(60),
        min_messages: 20,
        cool_down: Duration::from_secs(2),
    })
    .await;
    let broken = Arc::new(AtomicBool::new(true));
    let (running, _) = start(&settings, &store, &broken);
    eventually(Duration::from_secs(40), "a second trip", || async {
        scalar(
            &store,
            "SELECT coalesce(max(trips), 0)::bigint FROM recovery_brake",
        )
        .await
            >= 2
    })
    .await;
    let stored = tasks(&store).await;
    running.stop().await;
    assert!(
        stored <= 3 * LET_THROUGH,
        "{stored} failures stored over two or three trips"
    );
    let listed = crate::support::cli::redrive(&settings)
        .args(["brake", "list"])
        .output_within(CHILD_LIMIT)
        .unwrap();
    let out = String::from_utf8_lossy(&listed.stdout);
    assert!(
        out.contains("payments") && out.contains("failed inline"),
        "{out}"
    );
}

/// A handler in front of a downstream, with a circuit breaker: `answer` says how each
/// call ends.
struct Fronting {
    answer: fn(&Task) -> Result<(), HandlerError>,
}

#[async_trait]
impl Handler for Fronting {
    async fn handle(&self, _: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        (self.answer)(task)
    }
}

/// A member on a braked route whose handler (with a breaker) answers with `answer`.
async fn fronting_run(
    answer: fn(&Task) -> Result<(), HandlerError>,
) -> (Broker, Store, Settings, String, Member) {
    let (broker, store, mut settings, bootstrap) = braked_route(BrakeSettings {
        failure_ratio: 0.8,
        window: Duration::from_secs(60),
        min_messages: 20,
        cool_down: Duration::from_secs(3600),
    })
    .await;
    settings.handlers.insert(
        "deploy".into(),
        HandlerSettings {
            breaker: Some(BreakerSettings::default()),
            ..HandlerSettings::default()
        },
    );
    let fleet = Fleet::builder(settings.clone())
        .handler("deploy", Fronting { answer })
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    (broker, store, settings, bootstrap, member)
}

async fn brakes_engaged(store: &Store) -> i64 {
    scalar(store, "SELECT count(*) FROM recovery_brake").await
}

/// A downstream answering 503 fails every inline call transiently: that is the
/// breaker's business, not a bad deploy. The route keeps consuming (each failure a task,
/// for the pool to retry once the downstream is back) and the brake stays off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_downstream_outage_does_not_engage_the_brake_of_a_handler_with_a_breaker() {
    let (_broker, store, settings, bootstrap, member) = fronting_run(|_| {
        Err(HandlerError::transient(
            "503 Service Unavailable from https://payments.internal",
        ))
    })
    .await;
    let group = settings.kafka.group_id.clone();
    eventually(
        Duration::from_secs(40),
        "every message consumed (an engaged brake stops the route short)",
        || async { committed_total(&bootstrap, &group).await == MESSAGES },
    )
    .await;
    member.stop().await;
    assert_eq!(brakes_engaged(&store).await, 0, "the brake engaged");
    assert_eq!(tasks(&store).await, MESSAGES, "every failure is a task");
}

/// A new version that fails messages itself (permanent verdicts, panics) engages the
/// brake even though its handler has a breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_handler_failing_messages_itself_engages_the_brake_despite_its_breaker() {
    let (_broker, store, _settings, _bootstrap, member) = fronting_run(|task| {
        let value = task.failure.value.as_deref().unwrap_or_default();
        if value.last().is_some_and(|b| b % 2 == 0) {
            panic!("index out of bounds in v2.3.1");
        }
        Err(HandlerError::permanent("missing field `amount` (v2.3.1)"))
    })
    .await;
    eventually(Duration::from_secs(30), "the brake engaged", || async {
        brakes_engaged(&store).await == 1
    })
    .await;
    member.stop().await;
    let stored = tasks(&store).await;
    assert!(
        stored <= LET_THROUGH,
        "{stored} failures stored of {MESSAGES}: the brake let too many through"
    );
}

async fn tasks_on(store: &Store, topic: &str) -> i64 {
    scalar(
        store,
        &format!("SELECT count(*) FROM recovery_task WHERE source_topic = '{topic}'"),
    )
    .await
}

async fn produce_events(bootstrap: &str, from: i64, to: i64) {
    let producer = producer(bootstrap);
    for i in from..to {
        let sample = Sample {
            key: Some(format!("k{i}").into()),
            value: Some(format!("failure report {i}").into()),
            ..Sample::default()
        };
        produce(&producer, "reports", &sample).await;
    }
}

/// An operator engages the brake of a capture route on purpose (an incident): every
/// member stops consuming it, so what is produced meanwhile is neither stored nor
/// committed, until the brake is released; then it is stored, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_operator_engages_a_capture_routes_brake_and_it_stops_consuming_until_released() {
    use crate::support::api::{with_tokens, Api, OPERATE, READ};
    use serde_json::json;
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("reports", 2)],
        vec![route(&["reports"], RouteMode::Capture, "log")],
    )
    .await;
    settings.worker.enabled = false;
    let settings = with_tokens(settings);
    let api = Api::start(&store, &settings).await;
    let fleet = Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap();
    let metrics = fleet.metrics().clone();
    let member = Member::start(fleet, &store);
    produce_events(&bootstrap, 0, 10).await;
    eventually(
        Duration::from_secs(30),
        "the first reports stored",
        || async { tasks_on(&store, "reports").await == 10 },
    )
    .await;

    let engage = json!({"reason": "billing incident", "for": "10m"});
    let path = "/api/v1/brakes/reports/engage";
    let (status, body) = api.post(path, Some(READ), engage.clone()).await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{body}");
    let (status, body) = api.post(path, Some(OPERATE), engage).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert_eq!(body["engaged_by"], "ops");
    assert_eq!(body["reason"], "billing incident");
    eventually(
        Duration::from_secs(30),
        "the member paused the route",
        || async { metrics.brake_engaged.with_label_values(&["reports"]).get() == 1 },
    )
    .await;

    produce_events(&bootstrap, 10, 30).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        tasks_on(&store, "reports").await,
        10,
        "nothing stored while engaged"
    );
    let group = settings.kafka.group_id.clone();
    let committed = |bootstrap: String, group: String| async move {
        tokio::task::spawn_blocking(move || committed(&bootstrap, &group, "reports", 2))
            .await
            .unwrap()
            .iter()
            .map(|&o| o.max(0))
            .sum::<i64>()
    };
    assert_eq!(
        committed(bootstrap.clone(), group.clone()).await,
        10,
        "nothing new committed while engaged"
    );

    let (status, body) = api
        .post(
            "/api/v1/brakes/reports/release",
            Some(OPERATE),
            json!({"reason": "incident over"}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    eventually(
        Duration::from_secs(30),
        "every report stored once",
        || async { tasks_on(&store, "reports").await == 30 },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "every offset committed",
        || async { committed(bootstrap.clone(), group.clone()).await == 30 },
    )
    .await;
    member.stop().await;
    assert_eq!(tasks_on(&store, "reports").await, 30);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_audit WHERE action IN ('brake_engage', 'brake_release') \
             AND actor = 'ops'"
        )
        .await,
        2
    );
}
