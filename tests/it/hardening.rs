//! Hardening: paths where a task could be burned unrun, a failure swallowed or a member
//! stopped by one value (issue "Hardening 2"). Each test failed before its fix.

use async_trait::async_trait;
use redrive::config::HandlerSettings;
use redrive::{Fleet, Handler, HandlerContext, HandlerError, NewTask, Task};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{eventually, fresh_store, scalar, Member, MemberProcess, Spawn};

/// Counts its calls and succeeds.
#[derive(Clone, Default)]
struct Counting(Arc<AtomicUsize>);

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Regression: a claim round ran the shared claim, then each limited handler's claim,
/// with `?` between them. When the limited claim failed, the tasks the shared claim had
/// already leased (attempt counted) were dropped unstarted; they came back after their
/// leases, lost an attempt each time, and ended "no attempts left" without a call.
#[tokio::test]
async fn a_claim_round_that_fails_half_way_starts_what_it_claimed() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    settings.worker.lease = Duration::from_secs(60);
    settings.handlers.insert(
        "limited".into(),
        HandlerSettings {
            max_concurrency: Some(2),
            ..HandlerSettings::default()
        },
    );
    let (plain, limited) = (Counting::default(), Counting::default());
    let fleet = Fleet::builder(settings)
        .handler("plain", plain.clone())
        .handler("limited", limited.clone())
        .build()
        .unwrap();
    // Every claim of a `limited` task fails, as a data error would.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_limited() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'planted fault' USING ERRCODE = '22003'; END $$; \
         CREATE TRIGGER refuse_limited BEFORE UPDATE ON recovery_task FOR EACH ROW \
         WHEN (NEW.handler = 'limited' AND NEW.lease_owner IS NOT NULL) \
         EXECUTE FUNCTION refuse_limited()",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let mut tasks: Vec<NewTask> = (0..3)
        .map(|i| NewTask {
            max_attempts: Some(2),
            dedup_key: Some(format!("{i}")),
            ..NewTask::new("plain", format!("{i}"))
        })
        .collect();
    tasks.push(NewTask {
        dedup_key: Some("x".into()),
        ..NewTask::new("limited", "x")
    });
    store.enqueue_many(&tasks).await.unwrap();

    let member = Member::start(fleet, &store);
    eventually(
        Duration::from_secs(15),
        "the plain tasks resolved",
        || async {
            scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE handler = 'plain' AND status = 'resolved'",
        )
        .await
            == 3
        },
    )
    .await;
    member.stop().await;
    assert_eq!(
        plain.0.load(Ordering::SeqCst),
        3,
        "each plain task called once"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_attempt WHERE outcome = 'lease_expired'",
        )
        .await,
        0,
        "no lease lapsed"
    );
    assert_eq!(limited.0.load(Ordering::SeqCst), 0);
}

/// Regression: a task whose attempt count was at the integer limit made every claim of
/// its handler fail ("integer out of range"), so nothing else of that handler ran.
#[tokio::test]
async fn a_task_at_the_attempt_counters_limit_does_not_stop_its_handlers_claims() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    let counting = Counting::default();
    let fleet = Fleet::builder(settings)
        .handler("plain", counting.clone())
        .build()
        .unwrap();
    let tasks: Vec<NewTask> = (0..3)
        .map(|i| NewTask {
            dedup_key: Some(format!("{i}")),
            ..NewTask::new("plain", format!("{i}"))
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    sqlx::query(
        "UPDATE recovery_task SET attempts = 2147483647 \
         WHERE dedup_key = '0'",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(15), "every task final", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status <> 'failed'",
        )
        .await
            == 3
    })
    .await;
    member.stop().await;
    assert_eq!(
        counting.0.load(Ordering::SeqCst),
        2,
        "the other two ran; the one out of attempts did not"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'permanent_failure' AND dedup_key = '0'",
        )
        .await,
        1
    );
}

/// Regression: the half-open probe claim waited for the breaker row with no lock
/// timeout while the tasks the same round had already claimed sat unstarted (their
/// leases running down, another member free to take them over once they lapsed).
#[tokio::test]
async fn a_probe_claim_stuck_on_the_breaker_row_does_not_hold_up_claimed_tasks() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    settings.handlers.insert(
        "guarded".into(),
        HandlerSettings {
            breaker: Some(redrive::config::BreakerSettings::default()),
            ..HandlerSettings::default()
        },
    );
    let (plain, guarded) = (Counting::default(), Counting::default());
    let fleet = Fleet::builder(settings)
        .handler("plain", plain.clone())
        .handler("guarded", guarded.clone())
        .build()
        .unwrap();
    sqlx::query(
        "INSERT INTO recovery_breaker (handler, state, hold_until) \
         VALUES ('guarded', 'half_open', now())",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store
        .enqueue_many(&[NewTask {
            dedup_key: Some("g".into()),
            ..NewTask::new("guarded", "g")
        }])
        .await
        .unwrap();
    // Another session holds the breaker row, as a member updating it would.
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM recovery_breaker WHERE handler = 'guarded' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();

    let member = Member::start(fleet, &store);
    // Let the member see the breaker half-open, then give it plain work.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tasks: Vec<NewTask> = (0..5)
        .map(|i| NewTask {
            dedup_key: Some(format!("{i}")),
            ..NewTask::new("plain", format!("{i}"))
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the plain tasks resolved while the breaker row is locked",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE handler = 'plain' AND status = 'resolved'",
            )
            .await
                == 5
        },
    )
    .await;
    holder.rollback().await.unwrap();
    member.stop().await;
    assert_eq!(plain.0.load(Ordering::SeqCst), 5);
}

/// Regression: `--rate 1e-20` passed the replay's check (> 0) and panicked every member
/// that picked the job up (`Duration::from_secs_f64(1.0 / rate)`).
#[tokio::test]
async fn a_replay_rate_out_of_range_is_refused_naming_the_range() {
    let (_store, settings) = fresh_store().await;
    for rate in ["1e-20", "0", "NaN", "1e400"] {
        let out = crate::support::cli::run(
            &settings,
            &["tasks", "replay", "--all", "--rate", rate, "--yes"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{rate}: {stderr}");
        assert!(
            stderr.contains("rate must be a number per second from 0.001"),
            "{rate}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{rate}: {stderr}");
    }
}

/// Regression: a stored replay job with a rate no check would pass now (written by an
/// older version or by hand) panicked the member that picked it up, and the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_replay_with_a_hostile_rate_does_not_stop_the_member() {
    let kafka = crate::support::broker::cluster(&[("orders", 1)]);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = kafka.bootstrap_servers();
    settings.worker.enabled = false;
    settings.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    let tasks: Vec<NewTask> = (0..3)
        .map(|i| NewTask {
            dedup_key: Some(format!("{i}")),
            failure: redrive::Failure {
                original: Some(
                    redrive::SourceCoordinates {
                        topic: "orders".into(),
                        partition: 0,
                        offset: i,
                    }
                    .into(),
                ),
                ..redrive::Failure::with_value(format!("{i}"))
            },
            ..NewTask::new("log", format!("{i}"))
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let operator = redrive::store::Operator {
        actor: "test".into(),
        reason: None,
    };
    let replay = redrive::store::NewReplay {
        filter: redrive::store::TaskFilter::default(),
        target_topic: None,
        mark_resolved: false,
        rate: Some(1e-20),
        detached: true,
    };
    store
        .create_replay(&operator, &replay, "test")
        .await
        .unwrap();
    let fleet = Fleet::builder(settings)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    eventually(
        Duration::from_secs(20),
        "the job to be picked up",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_replay WHERE status = 'running'",
            )
            .await
                == 1
        },
    )
    .await;
    // The first message leaves at once; the next waits for its (clamped) turn.
    let produced = crate::support::broker::consume(
        &kafka.bootstrap_servers(),
        "orders",
        1,
        1,
        Duration::from_secs(20),
    );
    assert_eq!(produced.len(), 1);
    member.stop().await;
}

/// A process-mode `ordering = "key"` route of the topic `accounts` into a webhook to
/// `url`, for members of the group `redelivery`; short retries.
fn redelivery_config(dir: &std::path::Path, bootstrap: &str, url: &str) -> std::path::PathBuf {
    let config = dir.join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "redelivery"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
[ingest]
linger = "10ms"
[worker]
poll_interval = "100ms"
[retry]
backoff_base = "200ms"
backoff_cap = "200ms"
jitter = "none"
[webhooks.accounts]
url = "{url}"
[[routes]]
topics = ["accounts"]
mode = "process"
handler = "accounts"
ordering = "key"
"#
        ),
    )
    .unwrap();
    config
}

/// A webhook downstream whose first call for `value` fails (503); every other call
/// succeeds.
async fn failing_once_for(value: &'static str) -> crate::support::http_server::TestServer {
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    crate::support::http_server::TestServer::start(move |request| {
        let data = request.json()["value"]["data"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if data == value && !failed_once.swap(true, Ordering::SeqCst) {
            crate::support::http_server::Reply::status(503)
        } else {
            crate::support::http_server::Reply::status(200)
        }
    })
    .await
}

/// The values the downstream received from the `from`th call on.
fn values_called(server: &crate::support::http_server::TestServer, from: usize) -> Vec<String> {
    server.requests()[from..]
        .iter()
        .map(|r| r.json()["value"]["data"].as_str().unwrap().to_owned())
        .collect()
}

/// Kills `first` after the broker refused its every offset commit, then runs a second
/// member on the same group until the redelivered messages are committed (`end`): the
/// values the downstream received from the second member.
async fn redeliver(
    broker: &rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    mut first: crate::support::MemberProcess,
    second: impl FnOnce() -> crate::support::MemberProcess,
    server: &crate::support::http_server::TestServer,
    end: i64,
) -> Vec<String> {
    use rdkafka::types::RDKafkaApiKey;
    first.kill();
    broker.clear_request_errors(RDKafkaApiKey::OffsetCommit);
    let before = server.requests().len();
    let mut second = second();
    let bootstrap = broker.bootstrap_servers();
    eventually(
        Duration::from_secs(30),
        "the redelivered messages committed",
        || async {
            crate::support::broker::committed(&bootstrap, "redelivery", "accounts", 1) == vec![end]
        },
    )
    .await;
    second.kill();
    values_called(server, before)
}

/// Makes the broker refuse every offset commit until [`redeliver`].
fn refuse_commits(
    broker: &rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
) {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    broker.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 10_000],
    );
}

/// A message of the key `alice` with the value `value`.
fn alice(value: &str) -> crate::support::broker::Sample {
    crate::support::broker::Sample {
        key: Some("alice".into()),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// Regression: process mode ran every redelivered message inline again before finding
/// that its task existed, so after a member died between storing and committing, an old
/// message was re-applied after a newer one of its key, and a failure of that re-run
/// was dropped. Here the broker refuses every offset commit of the first member, which
/// is then SIGKILLed: the second member gets everything again. The message that has a
/// task is not run again; the downstream ends on each key's newest message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_redelivered_process_mode_message_that_has_a_task_is_not_run_again() {
    let broker = crate::support::broker::cluster(&[("accounts", 1)]);
    let bootstrap = broker.bootstrap_servers();
    let (store, settings) = fresh_store().await;
    let server = failing_once_for("v1").await;
    let dir = tempfile::tempdir().unwrap();
    let config = redelivery_config(dir.path(), &bootstrap, &server.url("/balance"));
    let member = || {
        Spawn::binary(&settings)
            .config(&config)
            .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", &bootstrap)
            .start()
    };
    refuse_commits(&broker);
    let first = member();
    let producer = crate::support::broker::producer(&bootstrap);
    crate::support::broker::produce(&producer, "accounts", &alice("v1")).await;
    eventually(
        Duration::from_secs(30),
        "v1 failed inline, then resolved by the pool",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
            )
            .await
                == 1
        },
    )
    .await;
    crate::support::broker::produce(&producer, "accounts", &alice("v2")).await;
    eventually(Duration::from_secs(30), "v2 applied inline", || async {
        values_called(&server, 0).contains(&"v2".to_owned())
    })
    .await;

    let calls = redeliver(&broker, first, member, &server, 2).await;
    assert!(!calls.contains(&"v1".to_owned()), "v1 ran again: {calls:?}");
    let last = server.requests().last().unwrap().json();
    assert_eq!(
        last["value"]["data"], "v2",
        "the downstream ends on the newest"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        1,
        "nothing recorded twice"
    );
}

/// Found by the keyed chaos suite (`chaos::keyed`): a redelivered message that
/// succeeded inline has no task, so it ran inline again, after a newer message of its
/// key had been applied by the pool: the downstream ended on the old message, for good.
/// v1 succeeds inline (no task), v2 fails inline (a task) and the pool applies it; the
/// commits were refused, the member is SIGKILLed, the next one gets both again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_redelivered_message_without_a_task_is_not_applied_after_a_newer_one_of_its_key() {
    let broker = crate::support::broker::cluster(&[("accounts", 1)]);
    let bootstrap = broker.bootstrap_servers();
    let (store, settings) = fresh_store().await;
    let server = failing_once_for("v2").await;
    let dir = tempfile::tempdir().unwrap();
    let config = redelivery_config(dir.path(), &bootstrap, &server.url("/balance"));
    let member = || {
        Spawn::binary(&settings)
            .config(&config)
            .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", &bootstrap)
            .start()
    };
    refuse_commits(&broker);
    let first = member();
    let producer = crate::support::broker::producer(&bootstrap);
    crate::support::broker::produce(&producer, "accounts", &alice("v1")).await;
    eventually(Duration::from_secs(30), "v1 applied inline", || async {
        values_called(&server, 0) == ["v1"]
    })
    .await;
    crate::support::broker::produce(&producer, "accounts", &alice("v2")).await;
    eventually(
        Duration::from_secs(30),
        "v2 failed inline, then resolved by the pool",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
            )
            .await
                == 1
        },
    )
    .await;

    let calls = redeliver(&broker, first, member, &server, 2).await;
    let last = server.requests().last().unwrap().json();
    assert_eq!(
        last["value"]["data"], "v2",
        "the downstream ends on the newest; calls after the kill: {calls:?}"
    );
}

/// Sleeps without watching its context's token, then records a side effect.
#[derive(Clone, Default)]
struct Deaf {
    started: Arc<AtomicUsize>,
    effects: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Deaf {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(4)).await;
        self.effects.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }
}

/// Regression: a handler that ignored its token ran on after its lease was taken
/// over, and its side effect landed after the new owner's attempt began.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_call_whose_lease_was_taken_over_is_stopped_even_if_it_ignores_its_token() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.lease = Duration::from_secs(10);
    settings.worker.heartbeat = Duration::from_millis(100);
    settings.worker.poll_interval = Duration::from_millis(50);
    let deaf = Deaf::default();
    let fleet = Fleet::builder(settings)
        .handler("deaf", deaf.clone())
        .build()
        .unwrap();
    store.enqueue(&NewTask::new("deaf", "x")).await.unwrap();
    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(10), "the call started", || async {
        deaf.started.load(Ordering::SeqCst) == 1
    })
    .await;
    sqlx::query(
        "UPDATE recovery_task SET lease_version = lease_version + 1, lease_owner = 'rival'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // Past the end of the 4 s call.
    tokio::time::sleep(Duration::from_secs(5)).await;
    member.stop().await;
    assert_eq!(
        deaf.effects.load(Ordering::SeqCst),
        0,
        "the call was stopped"
    );
}

/// Regression: a member cut off from PostgreSQL had no local lease deadline: its call
/// ran on past the lease, while another member could take the task (and the next task
/// of its key) over. The call is stopped once its lease could not be renewed in time.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_cut_off_from_the_database_stops_calls_whose_lease_ran_out() {
    let (store, settings) = fresh_store().await;
    let proxy = crate::support::PgProxy::start().await;
    let mut settings = proxy.route(&settings);
    settings.worker.lease = Duration::from_secs(2);
    settings.worker.heartbeat = Duration::from_millis(200);
    settings.worker.poll_interval = Duration::from_millis(50);
    let proxied = redrive::Store::connect(&settings.database).await.unwrap();
    let deaf = Deaf::default();
    let fleet = Fleet::builder(settings)
        .handler("deaf", deaf.clone())
        .build()
        .unwrap();
    store.enqueue(&NewTask::new("deaf", "x")).await.unwrap();
    let member = Member::start(fleet, &proxied);
    eventually(Duration::from_secs(10), "the call started", || async {
        deaf.started.load(Ordering::SeqCst) == 1
    })
    .await;
    proxy.cut();
    // The call would end 4 s after it started; the lease ends after 2 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        deaf.effects.load(Ordering::SeqCst),
        0,
        "the call was stopped"
    );
    proxy.restore();
    member.stop().await;
}

/// Issue 15 item 7: a member gives a partition up only once the flushes holding its
/// messages are done and their offsets committed, so the partition's new owner never
/// runs a message the old owner is still running inline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_revoked_partitions_inline_call_ends_before_its_new_owner_starts() {
    // Well within the revoke's wait for flushes (10 s, `REVOKED_FLUSH_WAIT`) however
    // late the second member joins: a call as long as the wait could outlast it (a
    // longer call is the documented limit, not this test's subject).
    const CALL: Duration = Duration::from_secs(4);
    let broker = crate::support::broker::cluster(&[("orders", 2)]);
    let bootstrap = broker.bootstrap_servers();
    let (_store, settings) = fresh_store().await;
    // Every call takes CALL; each call's message and start are noted.
    let starts = Arc::new(std::sync::Mutex::new(
        Vec::<(String, std::time::Instant)>::new(),
    ));
    let server = crate::support::http_server::TestServer::start({
        let starts = starts.clone();
        move |request| {
            let value = request.json()["value"]["data"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            starts
                .lock()
                .unwrap()
                .push((value, std::time::Instant::now()));
            crate::support::http_server::Reply::status(200).after(CALL)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "revoked"
[log]
format = "text"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "300"
[ingest]
linger = "10ms"
[webhooks.orders]
url = "{url}"
[[routes]]
topics = ["orders"]
mode = "process"
handler = "orders"
"#,
            url = server.url("/orders"),
        ),
    )
    .unwrap();
    let member = |log: &std::path::Path| {
        crate::support::cli::redrive(&settings)
            .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", &bootstrap)
            .env("RUST_LOG", "info")
            .arg("--config")
            .arg(&config)
            .arg("run")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    };
    let mut first = member(&dir.path().join("first.log"));
    let producer = crate::support::broker::producer(&bootstrap);
    for partition in 0..2 {
        let sample = crate::support::broker::Sample {
            key: Some(format!("k{partition}").into()),
            value: Some(format!("p{partition}").into()),
            partition: Some(partition),
            ..Default::default()
        };
        crate::support::broker::produce(&producer, "orders", &sample).await;
    }
    eventually(
        Duration::from_secs(30),
        "the first member calls both messages",
        || async { starts.lock().unwrap().len() >= 2 },
    )
    .await;
    // A second member joins while both calls are running: one partition moves to it.
    let second_log = dir.path().join("second.log");
    let mut second = member(&second_log);
    let moved = |log: &str| log.contains("orders[");
    let settled = tokio::time::Instant::now() + Duration::from_secs(60);
    while !(moved(&std::fs::read_to_string(&second_log).unwrap_or_default())
        && crate::support::broker::committed(&bootstrap, "revoked", "orders", 2) == vec![1, 1])
    {
        if tokio::time::Instant::now() > settled {
            for child in [&mut first, &mut second] {
                let _ = child.kill();
            }
            panic!(
                "no partition moved, or the offsets were not committed ({:?}); calls {:?}\n\
                 first member's log:\n{}\nsecond member's log:\n{}",
                crate::support::broker::committed(&bootstrap, "revoked", "orders", 2),
                starts.lock().unwrap(),
                std::fs::read_to_string(dir.path().join("first.log")).unwrap_or_default(),
                std::fs::read_to_string(&second_log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for child in [&mut first, &mut second] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let starts = starts.lock().unwrap().clone();
    let first_log = std::fs::read_to_string(dir.path().join("first.log")).unwrap_or_default();
    let logs = format!(
        "first member's log:\n{first_log}\nsecond member's log:\n{}",
        std::fs::read_to_string(&second_log).unwrap_or_default()
    );
    for value in ["p0", "p1"] {
        let at: Vec<std::time::Instant> = starts
            .iter()
            .filter(|(v, _)| v == value)
            .map(|(_, at)| *at)
            .collect();
        for pair in at.windows(2) {
            assert!(
                pair[1].duration_since(pair[0]) >= CALL,
                "{value} was called by its new owner while its old owner's call ran: {starts:?}\n{logs}"
            );
        }
    }
    // A message runs again only when the broker refused its old owner's commit: a
    // commit that meets a rebalance in progress is refused (the coordinator answers
    // REBALANCE_IN_PROGRESS or an old generation), and the new owner starts from the
    // offset committed before. Then it runs after the first call ended, never beside it
    // (asserted above); without such a refusal, each message runs once.
    let refused = first_log.contains("committing the revoked partitions' offsets failed");
    assert!(
        starts.len() == 2 || (refused && starts.len() == 3),
        "each message ran once, or a refused commit let the moved one run again: \
         {starts:?}\n{logs}"
    );
}

/// Where a [`child_kafka_cluster`] writes its bootstrap servers.
const CLUSTER_FILE: &str = "REDRIVE_TEST_CLUSTER_FILE";

/// Entry point of a child process that hosts a mock Kafka cluster (three brokers, the
/// topic `orders.dlt` of four partitions) until it is killed, so that a test can kill
/// its brokers the hard way; not a test of its own: without `REDRIVE_TEST_CLUSTER_FILE`
/// it returns at once.
#[test]
fn child_kafka_cluster() {
    let Ok(file) = std::env::var(CLUSTER_FILE) else {
        return;
    };
    let cluster = rdkafka::mocking::MockCluster::new(3).unwrap();
    cluster.create_topic("orders.dlt", 4, 3).unwrap();
    std::fs::write(format!("{file}.part"), cluster.bootstrap_servers()).unwrap();
    std::fs::rename(format!("{file}.part"), &file).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A member capturing `orders.dlt` from brokers in a child process it can kill, with
/// 40 dead letters produced to it; `linger` is how long it holds a batch.
struct CutOff {
    store: redrive::Store,
    member: MemberProcess,
    brokers: MemberProcess,
    _dir: tempfile::TempDir,
}

async fn a_member_of_brokers_a_test_can_kill(linger: &str) -> CutOff {
    let (store, settings) = fresh_store().await;
    let dir = tempfile::tempdir().unwrap();
    let bootstrap_file = dir.path().join("bootstrap");
    let brokers = Spawn::test_child("hardening::child_kafka_cluster", &settings)
        .env(CLUSTER_FILE, bootstrap_file.display().to_string())
        .start();
    eventually(Duration::from_secs(30), "the brokers up", || async {
        bootstrap_file.exists()
    })
    .await;
    let bootstrap = std::fs::read_to_string(&bootstrap_file).unwrap();
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "cut-off"
[ingest]
linger = "{linger}"
batch_size = 1000
[worker]
enabled = false
[[routes]]
topics = ["orders.dlt"]
mode = "capture"
handler = "log"
"#
        ),
    )
    .unwrap();
    let member = Spawn::binary(&settings).config(&config).start();
    eventually(Duration::from_secs(30), "partitions assigned", || async {
        !member.log_lines("partitions assigned").is_empty()
    })
    .await;
    let producer = crate::support::broker::producer(&bootstrap);
    for i in 0..40 {
        let letter = crate::support::broker::Sample {
            value: Some(format!("failure {i}").into()),
            partition: Some(i % 4),
            ..Default::default()
        };
        crate::support::broker::produce(&producer, "orders.dlt", &letter).await;
    }
    CutOff {
        store,
        member,
        brokers,
        _dir: dir,
    }
}

/// Found by the issue 17 attack: a member told to stop while its brokers died never
/// exited. Closing its consumer ran the revoke, whose synchronous offset commit
/// (librdkafka's, with no timeout) waited for a coordinator for ever. The close now has
/// a bound: the member stops, says why, and its uncommitted messages are delivered
/// again (and deduplicated) once the group moves its partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_whose_brokers_die_as_it_stops_still_exits() {
    let CutOff {
        store,
        mut member,
        mut brokers,
        ..
    } = a_member_of_brokers_a_test_can_kill("10ms").await;
    eventually(
        Duration::from_secs(30),
        "the dead letters stored",
        || async { scalar(&store, "SELECT count(*) FROM recovery_task").await == 40 },
    )
    .await;
    member.signal(libc::SIGTERM);
    brokers.kill();
    member.stopped(Duration::from_secs(45)).await;
}

/// A member stopping stores the batch it still holds, then commits its offsets. The
/// commit was synchronous, and with the brokers gone librdkafka's synchronous commit
/// waits for a coordinator for ever: the member never exited (a flake of the test
/// above, whenever the brokers died before its last commit). The batch is stored, the
/// commit is left to the bounded close, and the member exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_holding_a_batch_when_its_brokers_die_stores_it_and_exits() {
    let CutOff {
        store,
        mut member,
        mut brokers,
        ..
    } = a_member_of_brokers_a_test_can_kill("1min").await;
    // Nothing shows a consumed batch that is not stored yet: give the member time to
    // fetch the 40 messages (milliseconds on this host); the count below fails if not.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        0,
        "a batch lingering for a minute is not stored yet"
    );
    brokers.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    member.signal(libc::SIGTERM);
    member.stopped(Duration::from_secs(45)).await;
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        40,
        "the batch held at the stop is stored"
    );
}
