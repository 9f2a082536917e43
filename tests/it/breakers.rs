//! Circuit breakers shared through PostgreSQL, bulkheads and fleet-wide rate limits.

use async_trait::async_trait;
use redrive::config::{BreakerSettings, HandlerSettings, WebhookSettings};
use redrive::resilience::breaker::BreakerState;
use redrive::store::{Action, BreakerCommand, Budget, Due, Operator, Selection};
use redrive::{
    Fleet, Handler, HandlerContext, HandlerError, Jitter, NewTask, Settings, Store, Task,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::http_server::{Reply, TestServer};
use crate::support::{eventually, fresh_store, scalar, Member};
use crate::support::{Bounded, CHILD_LIMIT};

fn fast_retries(settings: &mut Settings) {
    settings.retry.backoff_base = Duration::from_millis(20);
    settings.retry.backoff_cap = Duration::from_millis(100);
    settings.retry.jitter = Jitter::None;
    settings.retry.max_attempts = 1000;
    settings.worker.concurrency = 8;
    settings.worker.batch_size = 8;
    settings.worker.poll_interval = Duration::from_millis(50);
}

fn breaker(consecutive_failures: u32, cool_down: Duration) -> HandlerSettings {
    HandlerSettings {
        breaker: Some(BreakerSettings {
            consecutive_failures,
            cool_down,
            probes: 1,
            ..BreakerSettings::default()
        }),
        ..HandlerSettings::default()
    }
}

async fn breaker_state(store: &Store, handler: &str) -> Option<BreakerState> {
    let handlers = [handler.to_owned()];
    store
        .breakers(Some(&handlers))
        .await
        .unwrap()
        .pop()
        .map(|b| b.state)
}

#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_down_server_opens_the_breaker_for_the_fleet_and_tasks_wait_without_using_attempts() {
    let (store, mut settings) = fresh_store().await;
    fast_retries(&mut settings);
    let down = Arc::new(AtomicBool::new(true));
    let server = TestServer::start({
        let down = down.clone();
        move |_| match down.load(Ordering::SeqCst) {
            true => Reply::status(503),
            false => Reply::status(200),
        }
    })
    .await;
    settings.webhooks.insert(
        "hook".into(),
        WebhookSettings {
            url: Some(server.url("/")),
            ..WebhookSettings::default()
        },
    );
    let cool_down = Duration::from_secs(3);
    settings
        .handlers
        .insert("hook".into(), breaker(5, cool_down));
    let fleet = || {
        Fleet::builder(settings.clone())
            .with_builtin_handlers()
            .build()
            .unwrap()
    };
    let members = [
        Member::start(fleet(), &store),
        Member::start(fleet(), &store),
    ];
    let tasks: Vec<NewTask> = (0..200)
        .map(|i| NewTask::new("hook", format!("t{i}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();

    eventually(Duration::from_secs(10), "the breaker opened", || async {
        breaker_state(&store, "hook").await == Some(BreakerState::Open)
    })
    .await;
    let opened = Instant::now();
    // Calls already running when it opened end; then nothing reaches the server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (calls, attempts) = (
        server.requests().len(),
        scalar(&store, "SELECT sum(attempts)::bigint FROM recovery_task").await,
    );
    tokio::time::sleep(cool_down - opened.elapsed() - Duration::from_millis(300)).await;
    assert_eq!(
        breaker_state(&store, "hook").await,
        Some(BreakerState::Open)
    );
    assert_eq!(
        server.requests().len(),
        calls,
        "no call while the breaker is open"
    );
    assert_eq!(
        scalar(&store, "SELECT sum(attempts)::bigint FROM recovery_task").await,
        attempts,
        "no attempt used while the breaker is open"
    );
    // Every waiting task is held until the cool-down ends, but for results of calls that
    // were running as it opened, written concurrently (at most one per slot).
    let unheld = scalar(
        &store,
        "SELECT count(*) FROM recovery_task t, recovery_breaker b \
         WHERE t.status = 'failed' AND t.lease_owner IS NULL AND t.next_attempt_at < b.hold_until",
    )
    .await;
    assert!(unheld <= 16, "{unheld} tasks due while the breaker is open");
    assert!(
        attempts < 200 + 16,
        "most tasks never ran: {attempts} attempts"
    );

    // The server comes back: a probe succeeds, the breaker closes, everything resolves.
    down.store(false, Ordering::SeqCst);
    eventually(Duration::from_secs(20), "every task resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 200
    })
    .await;
    assert_eq!(
        breaker_state(&store, "hook").await,
        Some(BreakerState::Closed)
    );
    for member in members {
        member.stop().await;
    }
}

#[tokio::test]
async fn a_failed_probe_reopens_and_permanent_errors_never_open_it() {
    let (store, mut settings) = fresh_store().await;
    fast_retries(&mut settings);
    let server = TestServer::start(|request| match request.json()["value"]["data"].as_str() {
        Some(v) if v.starts_with("bad") => Reply::status(400),
        _ => Reply::status(503),
    })
    .await;
    settings.webhooks.insert(
        "hook".into(),
        WebhookSettings {
            url: Some(server.url("/")),
            ..WebhookSettings::default()
        },
    );
    settings
        .handlers
        .insert("hook".into(), breaker(3, Duration::from_millis(800)));
    let fleet = Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap();
    // 100 permanent errors first: answers from a live server, not failures.
    let bad: Vec<NewTask> = (0..100)
        .map(|i| NewTask::new("hook", format!("bad{i}")))
        .collect();
    store.enqueue_many(&bad).await.unwrap();
    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(10), "every bad task ended", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'permanent_failure'",
        )
        .await
            == 100
    })
    .await;
    assert_ne!(
        breaker_state(&store, "hook").await,
        Some(BreakerState::Open)
    );

    store.enqueue(&NewTask::new("hook", "down")).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "opened, probed, reopened",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_attempt a JOIN recovery_task t ON t.id = a.task_id \
             WHERE t.msg_value = 'down'",
            )
            .await
                >= 6
        },
    )
    .await;
    // Each probe after a cool-down is one attempt: far fewer than unchecked retries.
    let attempts = scalar(
        &store,
        "SELECT attempts::bigint FROM recovery_task WHERE msg_value = 'down'",
    )
    .await;
    assert!(attempts < 15, "{attempts} attempts in a few cool-downs");
    member.stop().await;
}

#[tokio::test]
async fn operators_force_a_breaker_open_and_release_it_with_an_audit_row() {
    let (store, settings) = fresh_store().await;
    let id = store.enqueue(&NewTask::new("h", "x")).await.unwrap().id();
    let settings_b = BreakerSettings::default();
    let operator = Operator {
        actor: "cli:test".into(),
        reason: Some("downstream maintenance".into()),
    };
    let (forced, transition) = store
        .command_breaker("h", BreakerCommand::Open, &settings_b, &operator)
        .await
        .unwrap();
    assert_eq!(
        (forced.state, forced.forced),
        (BreakerState::Open, Some(BreakerState::Open))
    );
    assert!(transition
        .unwrap()
        .reason
        .contains("downstream maintenance"));
    let handlers = ["h".to_owned()];
    let due = store
        .claim(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(due.is_empty(), "held while forced open");
    // A task stored while open is held too.
    let later = store.enqueue(&NewTask::new("h", "y")).await.unwrap().id();
    let held = store.get(later).await.unwrap().unwrap();
    assert!(held.next_attempt_at > chrono::Utc::now() + chrono::Duration::seconds(20));

    store
        .command_breaker("h", BreakerCommand::Release, &settings_b, &operator)
        .await
        .unwrap();
    let due = store
        .claim(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let mut ids: Vec<_> = due.iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids, [id, later]);
    let audit = scalar(
        &store,
        "SELECT count(*) FROM recovery_audit WHERE action IN ('breaker_open', 'breaker_release')",
    )
    .await;
    assert_eq!(audit, 2);
    drop(settings);
}

/// Found by the third issue 16 attack: a member that starts while an operator holds a
/// breaker open (its hold lapsed while no member ran, its tasks due) called the handler
/// until its first read of the breakers: a breaker not read yet counted as closed. A
/// breaker not read yet now counts as open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_starting_under_a_forced_open_breaker_calls_nothing() {
    let (store, mut settings) = fresh_store().await;
    fast_retries(&mut settings);
    settings
        .handlers
        .insert("h".into(), breaker(5, Duration::from_secs(60)));
    let tasks: Vec<NewTask> = (0..40)
        .map(|i| NewTask::new("h", format!("t{i}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let operator = Operator {
        actor: "cli:test".into(),
        reason: Some("protect h".into()),
    };
    store
        .command_breaker(
            "h",
            BreakerCommand::Open,
            &BreakerSettings::default(),
            &operator,
        )
        .await
        .unwrap();
    // No member ran while the hold lapsed: the tasks are due again.
    sqlx::query("UPDATE recovery_breaker SET hold_until = now() - interval '1 second'")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE recovery_task SET next_attempt_at = now() - interval '1 second'")
        .execute(store.pool())
        .await
        .unwrap();
    for round in 0..3 {
        let calls = Arc::new(AtomicUsize::new(0));
        let fleet = Fleet::builder(settings.clone())
            .handler("h", Counted(calls.clone()))
            .build()
            .unwrap();
        let member = Member::start(fleet, &store);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        member.stop().await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "start {round}: calls through a forced-open breaker"
        );
        sqlx::query("UPDATE recovery_task SET next_attempt_at = now() - interval '1 second'")
            .execute(store.pool())
            .await
            .unwrap();
    }
    assert_eq!(breaker_state(&store, "h").await, Some(BreakerState::Open));
}

/// An operator's retry does not call a handler its breaker holds back: the retried
/// tasks (final or waiting, asked for now or for a time before the hold) are due at
/// the breaker's hold, as tasks stored or failed meanwhile are.
#[tokio::test]
async fn an_operators_retry_waits_for_the_handlers_open_breaker() {
    let (store, _) = fresh_store().await;
    let operator = Operator {
        actor: "ops".into(),
        reason: None,
    };
    let waiting = store.enqueue(&NewTask::new("h", "a")).await.unwrap().id();
    let ended = store.enqueue(&NewTask::new("h", "b")).await.unwrap().id();
    store
        .act(&operator, &Action::Discard, &Selection::Ids(vec![ended]))
        .await
        .unwrap();
    let hour = BreakerSettings {
        cool_down: Duration::from_secs(3600),
        ..BreakerSettings::default()
    };
    store
        .command_breaker("h", BreakerCommand::Open, &hour, &operator)
        .await
        .unwrap();
    let stored = store.breakers(None).await.unwrap();
    let hold = stored[0].hold_until.unwrap();
    for at in [None, Some(Due::In(Duration::from_secs(60)))] {
        let retry = Action::Retry {
            at,
            budget: Budget::Fresh,
            force: false,
        };
        store
            .act(&operator, &retry, &Selection::Ids(vec![waiting, ended]))
            .await
            .unwrap();
        for id in [waiting, ended] {
            let task = store.get(id).await.unwrap().unwrap();
            assert_eq!(
                task.next_attempt_at, hold,
                "retried {at:?}: due at the breaker's hold"
            );
        }
    }
}

/// Sleeps, counting how many calls run at once and when each started.
#[derive(Default)]
struct Gauge {
    running: AtomicUsize,
    most: AtomicUsize,
    starts: Mutex<Vec<Instant>>,
}

struct Slow(Arc<Gauge>, Duration);

#[async_trait]
impl Handler for Slow {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.starts.lock().unwrap().push(Instant::now());
        let now = self.0.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.0.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.1).await;
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn a_bulkhead_caps_one_handler_while_others_use_the_rest() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.concurrency = 16;
    settings.worker.poll_interval = Duration::from_millis(50);
    settings.handlers.insert(
        "slow".into(),
        HandlerSettings {
            max_concurrency: Some(2),
            ..HandlerSettings::default()
        },
    );
    let (slow, fast) = (Arc::new(Gauge::default()), Arc::new(Gauge::default()));
    let fleet = Fleet::builder(settings)
        .handler("slow", Slow(slow.clone(), Duration::from_millis(200)))
        .handler("fast", Slow(fast.clone(), Duration::from_millis(50)))
        .build()
        .unwrap();
    let mut tasks: Vec<NewTask> = (0..12)
        .map(|i| NewTask::new("slow", format!("{i}")))
        .collect();
    tasks.extend((0..100).map(|i| NewTask::new("fast", format!("{i}"))));
    store.enqueue_many(&tasks).await.unwrap();
    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(20), "all resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 112
    })
    .await;
    member.stop().await;
    assert_eq!(slow.most.load(Ordering::SeqCst), 2, "the bulkhead holds");
    let fast_most = fast.most.load(Ordering::SeqCst);
    assert!(
        fast_most > 2,
        "the other handler used the free slots: {fast_most}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_fleet_rate_is_shared_among_live_members() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    let rate = 20.0;
    settings.handlers.insert(
        "paced".into(),
        HandlerSettings {
            rate_limit: Some(rate),
            ..HandlerSettings::default()
        },
    );
    let gauge = Arc::new(Gauge::default());
    let fleet = || {
        Fleet::builder(settings.clone())
            .handler("paced", Slow(gauge.clone(), Duration::ZERO))
            .build()
            .unwrap()
    };
    let members = [
        Member::start(fleet(), &store),
        Member::start(fleet(), &store),
    ];
    // Both members see each other before the work arrives.
    eventually(Duration::from_secs(5), "two live members", || async {
        store.live_members().await.unwrap().len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let tasks: Vec<NewTask> = (0..100)
        .map(|i| NewTask::new("paced", format!("{i}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    eventually(Duration::from_secs(30), "all resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 100
    })
    .await;
    for member in members {
        member.stop().await;
    }
    let mut starts = gauge.starts.lock().unwrap().clone();
    starts.sort();
    // In any second, at most the fleet rate plus each member's burst of its share.
    let burst = 2.0 * (rate / 2.0);
    let most_in_a_second = starts
        .iter()
        .map(|t| {
            starts
                .iter()
                .filter(|s| **s >= *t && **s < *t + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most_in_a_second as f64 <= rate + burst,
        "{most_in_a_second} calls in one second against a fleet rate of {rate}"
    );
    let span = starts
        .last()
        .unwrap()
        .duration_since(starts[0])
        .as_secs_f64();
    assert!(
        span >= (100.0 - rate - burst) / rate,
        "100 calls took only {span:.2}s"
    );
}

/// Regression: a fleet rate was divided among every live worker member, also those
/// that do not serve its handler: here the one member that calls `paced` ran at half
/// the fleet's rate.
/// A member whose only due work is a rate-limited handler's backlog looks again every
/// 100 ms (`BLOCKED_RECHECK`), not in a loop: the backlog's tasks are due now, but the
/// rate leaves no room for them, so "the next task is due in 0 ms" must not wake the
/// claim loops at once (found by an attack: 2,200 transactions a second, a quarter of a
/// core, for an idle member).
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_rate_limited_backlog_does_not_spin_an_idle_member() {
    let (store, mut settings) = fresh_store().await;
    settings.handlers.insert(
        "paced".into(),
        HandlerSettings {
            rate_limit: Some(2.0),
            ..HandlerSettings::default()
        },
    );
    let tasks: Vec<NewTask> = (0..200)
        .map(|i| NewTask::new("paced", format!("{i}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let fleet = Fleet::builder(settings)
        .handler("paced", Slow(Arc::new(Gauge::default()), Duration::ZERO))
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Each claim and each look for the next due task is one scan of the due index.
    let scans = || {
        scalar(
            &store,
            "SELECT idx_scan FROM pg_stat_user_indexes \
             WHERE schemaname = current_schema() AND indexrelname = 'recovery_task_due_by_handler'",
        )
    };
    let before = scans().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let scanned = scans().await - before;
    member.stop().await;
    assert!(
        scanned < 300,
        "{scanned} scans of the due index in 3 s by a member with nothing it may claim"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_fleet_rate_is_shared_only_among_members_serving_the_handler() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    let rate = 20.0;
    settings.handlers.insert(
        "paced".into(),
        HandlerSettings {
            rate_limit: Some(rate),
            ..HandlerSettings::default()
        },
    );
    let gauge = Arc::new(Gauge::default());
    let member = |serves: &str| {
        let mut settings = settings.clone();
        settings.worker.handlers = vec![serves.to_owned()];
        let fleet = Fleet::builder(settings)
            .handler("paced", Slow(gauge.clone(), Duration::ZERO))
            .handler("other", Slow(Arc::default(), Duration::ZERO))
            .build()
            .unwrap();
        Member::start(fleet, &store)
    };
    let members = [member("paced"), member("other")];
    eventually(Duration::from_secs(5), "two live members", || async {
        store.live_members().await.unwrap().len() == 2
    })
    .await;
    // Shares are recounted every 2 s.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let tasks: Vec<NewTask> = (0..80)
        .map(|i| NewTask::new("paced", format!("{i}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    eventually(Duration::from_secs(30), "all resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 80
    })
    .await;
    for member in members {
        member.stop().await;
    }
    let mut starts = gauge.starts.lock().unwrap().clone();
    starts.sort();
    // After the first second's burst, calls start at the full rate (20/s), not half.
    let span = starts
        .last()
        .unwrap()
        .duration_since(starts[0])
        .as_secs_f64();
    let at_half_rate = (80.0 - rate) / (rate / 2.0);
    assert!(
        span < at_half_rate * 0.75,
        "80 calls took {span:.2}s; at half the rate they take {at_half_rate:.1}s"
    );
}

#[tokio::test]
async fn redrive_breakers_lists_forces_and_releases_through_the_binary() {
    let (store, settings) = fresh_store().await;
    let id = store.enqueue(&NewTask::new("log", "x")).await.unwrap().id();
    let cli = |args: &[&str]| {
        let out = crate::support::cli::redrive(&settings)
            .env("REDRIVE__HANDLERS__LOG__BREAKER__COOL_DOWN", "10m")
            .args(args)
            .output_within(CHILD_LIMIT)
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let (ok, listed, _) = cli(&["breakers", "list", "--json"]);
    assert!(ok);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["items"][0]["handler"], "log");
    assert_eq!(listed["items"][0]["state"], "closed");

    let (ok, out, err) = cli(&["breakers", "open", "log", "--reason", "billing maintenance"]);
    assert!(ok, "{err}");
    assert!(out.contains("open (forced open)"), "{out}");
    let (_, table, _) = cli(&["breakers", "list"]);
    assert!(
        table.contains("open") && table.contains("billing maintenance"),
        "{table}"
    );
    let task = store.get(id).await.unwrap().unwrap();
    assert!(task.next_attempt_at > chrono::Utc::now() + chrono::Duration::minutes(9));

    let (ok, _, err) = cli(&["breakers", "release", "log", "--reason", "done"]);
    assert!(ok, "{err}");
    let task = store.get(id).await.unwrap().unwrap();
    assert!(
        task.next_attempt_at <= chrono::Utc::now(),
        "due again once released"
    );
    let (_, audit, _) = cli(&["audit", "--action", "breaker_open"]);
    assert!(audit.contains("billing maintenance"), "{audit}");

    let (ok, _, err) = cli(&["breakers", "open", "republish", "--reason", "x"]);
    assert!(!ok);
    assert!(err.contains("[handlers.republish.breaker]"), "{err}");
}

/// Counts its calls; succeeds.
struct Counted(Arc<AtomicUsize>);

#[async_trait]
impl Handler for Counted {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Process mode does not call a handler inline while its breaker is open: the messages
/// are stored unattempted, held, and run by the pool once the breaker lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_mode_does_not_call_a_handler_inline_while_its_breaker_is_open() {
    use crate::support::broker::{produce, producer, route, KafkaCase, Sample};
    use redrive::config::RouteMode;
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("payments", 1)],
        vec![route(&["payments"], RouteMode::Process, "pay")],
    )
    .await;
    fast_retries(&mut settings);
    let cool_down = Duration::from_secs(3600);
    settings
        .handlers
        .insert("pay".into(), breaker(5, cool_down));
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("payments provider down".into()),
    };
    let breaker_settings = settings.handlers["pay"].breaker.clone().unwrap();
    store
        .command_breaker("pay", BreakerCommand::Open, &breaker_settings, &operator)
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let fleet = Fleet::builder(settings.clone())
        .handler("pay", Counted(calls.clone()))
        .build()
        .unwrap();
    let running = Member::start(fleet, &store);
    // The member reads the breakers within half a second of starting.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let producer = producer(&bootstrap);
    for i in 0..10 {
        produce(
            &producer,
            "payments",
            &Sample {
                value: Some(format!("payment {i}").into()),
                ..Sample::default()
            },
        )
        .await;
    }
    eventually(Duration::from_secs(30), "10 tasks stored", || async {
        scalar(&store, "SELECT count(*) FROM recovery_task").await == 10
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no inline call while open");
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE attempts = 0 \
             AND next_attempt_at > now() + interval '30 minutes' \
             AND ingest_note LIKE '%circuit breaker is open%'"
        )
        .await,
        10,
        "stored unattempted, held behind the breaker"
    );
    store
        .command_breaker("pay", BreakerCommand::Release, &breaker_settings, &operator)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "all resolved by the pool",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
            )
            .await
                == 10
        },
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    running.stop().await;
}

/// Counts its calls and fails each transiently (a downstream that is down).
struct CountedDown(Arc<AtomicUsize>);

#[async_trait]
impl Handler for CountedDown {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::transient("503 from the provider"))
    }
}

/// Process mode's inline calls count towards the handler's breaker as the pool's do:
/// with no pool running, a downstream that fails every inline call opens the breaker,
/// and the messages after it are stored unattempted (the inline calls went on hitting
/// the downstream at the full rate of the topic, the breaker shut until the pool's own
/// retries failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn failed_inline_calls_open_the_handlers_breaker() {
    use crate::support::broker::{produce, producer, route, KafkaCase, Sample};
    use redrive::config::RouteMode;
    let KafkaCase {
        broker: _broker,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("payments", 1)],
        vec![route(&["payments"], RouteMode::Process, "pay")],
    )
    .await;
    settings.worker.enabled = false;
    settings
        .handlers
        .insert("pay".into(), breaker(3, Duration::from_secs(3600)));
    let calls = Arc::new(AtomicUsize::new(0));
    let fleet = Fleet::builder(settings.clone())
        .handler("pay", CountedDown(calls.clone()))
        .build()
        .unwrap();
    let running = Member::start(fleet, &store);
    let producer = producer(&bootstrap);
    let produce_payments = |range: std::ops::Range<usize>| {
        let producer = producer.clone();
        async move {
            for i in range {
                let value = Some(format!("payment {i}").into());
                let sample = Sample {
                    value,
                    ..Sample::default()
                };
                produce(&producer, "payments", &sample).await;
            }
        }
    };
    produce_payments(0..5).await;
    eventually(Duration::from_secs(30), "the breaker opened", || async {
        breaker_state(&store, "pay").await == Some(BreakerState::Open)
    })
    .await;
    // The member reads the breakers within half a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = calls.load(Ordering::SeqCst);
    produce_payments(5..10).await;
    eventually(Duration::from_secs(30), "10 tasks stored", || async {
        scalar(&store, "SELECT count(*) FROM recovery_task").await == 10
    })
    .await;
    running.stop().await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "no inline call once the breaker opened"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE attempts = 0 \
             AND ingest_note LIKE '%circuit breaker is open%'"
        )
        .await,
        5
    );
}

/// The preloaded library that gives a child process a clock of its own.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Regression: a breaker's times came from the member's clock while claims compare
/// with PostgreSQL's: a member an hour behind opened the breaker with a hold that had
/// ended an hour ago, so it held nothing. Every breaker time is PostgreSQL's now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_clock_is_behind_opens_a_breaker_that_holds() {
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: apt-get install libfaketime"
    );
    let (store, settings) = fresh_store().await;
    let server = TestServer::start(|_| Reply::status(503)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[worker]
poll_interval = "100ms"
concurrency = 1
[retry]
backoff_base = "50ms"
backoff_cap = "50ms"
max_attempts = 100
[webhooks.billing]
url = "{url}"
[handlers.billing.breaker]
consecutive_failures = 3
cool_down = "60s"
"#,
            url = server.url("/charge"),
        ),
    )
    .unwrap();
    let tasks: Vec<NewTask> = (0..5)
        .map(|i| NewTask::new("billing", format!("{i}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let mut member = crate::support::cli::redrive(&settings)
        .arg("--config")
        .arg(&config)
        .arg("run")
        .env("LD_PRELOAD", FAKETIME)
        .env("FAKETIME", "-1h")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(30), "the breaker open", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_breaker WHERE state = 'open'",
        )
        .await
            == 1
    })
    .await;
    let calls = server.requests().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    member.kill().unwrap();
    member.wait().unwrap();
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_breaker \
             WHERE hold_until > now() + interval '50 seconds'",
        )
        .await,
        1,
        "the hold ends a cool-down from now by PostgreSQL's clock"
    );
    // The one call running as the breaker opened may have written its retry before the
    // hold (docs/resilience.md); every other task waits for the hold.
    assert!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task \
             WHERE status = 'failed' AND next_attempt_at > now() + interval '50 seconds'",
        )
        .await
            >= 4,
        "the tasks wait for the hold"
    );
    assert!(
        server.requests().len() <= calls + 1,
        "no calls while open: {} then {}",
        calls,
        server.requests().len()
    );
}

/// Found by an operator: a breaker forced open over one that a failed probe had opened
/// was shown in every face as "a probe failed", held until a time that moved on every
/// cool-down. Each face now says who forced it open and why, and that it holds until
/// released; a retry of its tasks warns that none of them runs before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_forced_open_says_who_and_why_everywhere_and_a_retry_of_its_tasks_warns() {
    use crate::support::api::{with_tokens, Api, OPERATE, READ};
    use crate::support::console::session;
    use crate::support::console::Console;
    use redrive::resilience::breaker::Tally;

    let (store, settings) = fresh_store().await;
    let mut settings = with_tokens(settings);
    settings
        .handlers
        .insert("log".into(), breaker(1, Duration::from_millis(50)));
    let id = store.enqueue(&NewTask::new("log", "x")).await.unwrap().id();
    // Opened by a failure, half-open after its cool-down, open again: a probe failed.
    let quick = settings.handlers["log"].breaker.clone().unwrap();
    let failed = Tally {
        successes: 0,
        failures: 1,
        trailing_failures: 1,
    };
    store.record_calls("log", failed, &quick).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.advance_breaker("log", &quick).await.unwrap();
    let (probed, _) = store.record_calls("log", failed, &quick).await.unwrap();
    assert_eq!(probed.reason.as_deref(), Some("a probe failed"));

    let cli = |args: &[&str]| {
        let out = crate::support::cli::redrive(&settings)
            .env("REDRIVE__HANDLERS__LOG__BREAKER__COOL_DOWN", "50ms")
            .args(args)
            .output_within(CHILD_LIMIT)
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    cli(&["breakers", "open", "log", "--reason", "billing maintenance"]);
    // A member renews the hold of the forced breaker meanwhile.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (renewed, _) = store.advance_breaker("log", &quick).await.unwrap();
    assert!(renewed.hold_until.is_some());
    let why = renewed.reason.clone().unwrap();
    assert!(
        why.starts_with("forced open by cli:") && why.ends_with(": billing maintenance"),
        "{why}"
    );

    // The CLI.
    let (table, _) = cli(&["breakers", "list"]);
    // (A cell is cut at 60 characters: the whole reason is in the JSON.)
    assert!(
        table.contains("forced open by cli:") && table.contains("until released"),
        "{table}"
    );
    assert!(!table.contains("probe"), "{table}");
    let (listed, _) = cli(&["breakers", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["items"][0]["reason"], why.as_str(), "{listed}");
    assert!(listed["items"][0]["hold_until"].is_null(), "{listed}");
    let (shown, _) = cli(&["tasks", "show", &id.to_string()]);
    assert!(
        shown.contains(&format!(
            "the breaker of `log` is {why}; its tasks wait until it is released"
        )),
        "{shown}"
    );
    assert!(!shown.contains("held until"), "{shown}");
    // The dry run's report says so too, with what it would change (a review read the
    // report alone and missed it on standard error).
    let (previewed, _) = cli(&["tasks", "retry", &id.to_string(), "--dry-run"]);
    assert!(
        previewed.contains("none of the retried tasks of `log` will run until it is released"),
        "{previewed}"
    );
    let (_, warned) = cli(&["tasks", "retry", &id.to_string(), "--yes"]);
    assert!(
        warned.contains("none of the retried tasks of `log` will run until it is released"),
        "{warned}"
    );

    // The API.
    let api = Api::start(&store, &settings).await;
    let (status, breakers) = api.get("/api/v1/breakers", Some(READ)).await;
    assert_eq!(status, 200, "{breakers}");
    let log = &breakers["items"][0];
    assert_eq!(log["handler"], "log", "{breakers}");
    assert_eq!(log["reason"], why.as_str(), "{breakers}");
    assert!(log["hold_until"].is_null(), "{breakers}");
    let (_, detail) = api.get(&format!("/api/v1/tasks/{id}"), Some(READ)).await;
    assert_eq!(detail["waiting"]["state"], "breaker_open", "{detail}");
    assert!(detail["waiting"].get("until").is_none(), "{detail}");
    assert_eq!(detail["waiting"]["reason"], why.as_str(), "{detail}");
    let (status, retried) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            serde_json::json!({ "ids": [id.0] }),
        )
        .await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(
        retried["held_by_breakers"][0]["handler"], "log",
        "{retried}"
    );
    assert_eq!(retried["held_by_breakers"][0]["reason"], why.as_str());
    // Other handlers' tasks are not warned about.
    let other = store.enqueue(&NewTask::new("h", "y")).await.unwrap().id();
    let (_, quiet) = api
        .post(
            "/api/v1/tasks/retry",
            Some(OPERATE),
            serde_json::json!({ "ids": [other.0] }),
        )
        .await;
    assert!(quiet.get("held_by_breakers").is_none(), "{quiet}");

    // The console: the fleet page, the task's page and a retry's confirm page.
    let console = Console::start(&settings, false).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let cookie = session(&client, &console, OPERATE).await;
    let page = |path: &str| {
        let request = client.get(console.url(path)).header("cookie", &cookie);
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    let escaped = why.replace('\'', "&#39;");
    let fleet = page("/console/fleet").await;
    assert!(
        fleet.contains(&escaped) && fleet.contains("until released"),
        "{fleet}"
    );
    assert!(!fleet.contains("a probe failed"), "{fleet}");
    let task_page = page(&format!("/console/tasks/{id}")).await;
    assert!(
        task_page.contains(&format!(
            "is {escaped}; its tasks wait until it is released"
        )),
        "{task_page}"
    );
    assert!(!task_page.contains("held until"), "{task_page}");
    let confirm = client
        .post(console.url("/console/actions/preview"))
        .header("cookie", &cookie)
        .form(&[("verb", "retry"), ("id", &id.to_string())])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        confirm.contains(
            "none of the retried tasks of <code>log</code> will run until it is released"
        ),
        "{confirm}"
    );
}
