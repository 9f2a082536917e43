//! Replay through the mock cluster: byte for byte, resumed after SIGKILL without a
//! duplicate, refused before producing when a topic is missing, run by a fleet member
//! when started over HTTP.

use rdkafka::message::Message;
use redrive::headers::Header;
use redrive::{Failure, Fleet, NewTask, SourceCoordinates, Store};
use serde_json::Value;
use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use crate::support::broker::{cluster, consume, headers_of};
use crate::support::cli::{redrive, run};
use crate::support::{eventually, fresh_store, scalar, Member};

/// Stores `count` tasks whose original topic is `orders`, with odd bytes in keys,
/// values and header names.
async fn stored_failures(store: &Store, count: usize) -> HashMap<Vec<u8>, NewTask> {
    let tasks: Vec<NewTask> = (0..count)
        .map(|i| NewTask {
            handler: "log".into(),
            failure: Failure {
                key: Some(format!("key-{i}").into_bytes()),
                value: Some(vec![0xff, 0x00, (i % 251) as u8, b'\n']),
                headers: vec![
                    Header::new(b"trace\xffid".to_vec(), format!("t{i}").into_bytes()),
                    Header {
                        name: b"empty".to_vec(),
                        value: None,
                    },
                ],
                original: Some(
                    SourceCoordinates {
                        topic: "orders".into(),
                        partition: 0,
                        offset: i as i64,
                    }
                    .into(),
                ),
                ..Failure::default()
            },
            ..NewTask::default()
        })
        .collect();
    for chunk in tasks.chunks(1000) {
        store.enqueue_many(chunk).await.unwrap();
    }
    tasks
        .into_iter()
        .map(|t| (t.failure.key.clone().unwrap(), t))
        .collect()
}

/// Runs `job` in this process as runner "runner" until it stops; its final state.
async fn run_to_end(
    store: &Store,
    settings: &redrive::Settings,
    job: redrive::store::ReplayJob,
) -> redrive::store::ReplayJob {
    let replayer = redrive::replay::Replayer::new(
        store.clone(),
        settings.kafka.clone(),
        settings.ingest.max_message_bytes,
        "runner".into(),
        Vec::new(),
    );
    replayer
        .run(job, &|_, _| {}, &tokio_util::sync::CancellationToken::new())
        .await
        .unwrap()
}

/// Checks that `topic` holds each stored failure exactly once, byte for byte (plus
/// redrive's own two headers).
fn assert_replayed_once(bootstrap: &str, topic: &str, expected: &HashMap<Vec<u8>, NewTask>) {
    let messages = consume(
        bootstrap,
        topic,
        3,
        expected.len() + 1,
        Duration::from_secs(20),
    );
    let mut per_key: HashMap<Vec<u8>, usize> = HashMap::new();
    for message in &messages {
        let key = message.key().unwrap().to_vec();
        *per_key.entry(key.clone()).or_default() += 1;
        let task = &expected[&key];
        assert_eq!(message.payload(), task.failure.value.as_deref());
        let headers = headers_of(message);
        let (own, theirs): (Vec<Header>, Vec<Header>) = headers
            .into_iter()
            .partition(|h| h.name.starts_with(b"redrive-"));
        assert_eq!(theirs, task.failure.headers);
        let names: Vec<&[u8]> = own.iter().map(|h| h.name.as_slice()).collect();
        let expected_names: [&[u8]; 4] = [
            b"redrive-task-id",
            b"redrive-replay",
            b"redrive-job",
            b"redrive-generation",
        ];
        assert_eq!(names, expected_names, "{own:?}");
    }
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "produced twice: {} keys", twice.len());
    assert_eq!(per_key.len(), expected.len(), "every task replayed");
    assert_eq!(messages.len(), expected.len());
}

/// Starts a replay with `args` and SIGKILLs its process while a batch after its first
/// is being produced (resuming and killing again if the batch was acknowledged in
/// between, at most three tries: at the rates the tests use a batch takes most of a
/// second). Answers the job's id.
async fn kill_mid_batch(settings: &redrive::Settings, store: &Store, args: &[&str]) -> i64 {
    let mut job_id = None;
    for _ in 0..3 {
        let mut command = redrive(settings);
        match job_id {
            None => command.args(args),
            Some(id) => command.args(["replays", "resume", &format!("{id}")]),
        };
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A batch after the first is being produced: the runner records the batch
        // before producing it and clears it with the cursor once it is acknowledged.
        crate::support::eventually(Duration::from_secs(30), "a batch in flight", || async {
            scalar(
                store,
                "SELECT count(*) FROM recovery_replay WHERE pending_upto IS NOT NULL \
                 AND cursor > 0",
            )
            .await
                == 1
        })
        .await;
        // `Child::kill` is SIGKILL: nothing of the runner's own clean-up runs.
        child.kill().unwrap();
        child.wait().unwrap();
        job_id = Some(scalar(store, "SELECT max(id) FROM recovery_replay").await);
        let pending = scalar(
            store,
            "SELECT count(*) FROM recovery_replay WHERE pending_upto IS NOT NULL",
        )
        .await;
        if pending == 1 {
            break;
        }
    }
    job_id.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_replay_killed_mid_batch_resumes_without_producing_twice() {
    let kafka = cluster(&[("orders", 3), ("replayed", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let expected = stored_failures(&store, 1_500).await;

    let id = kill_mid_batch(
        &settings,
        &store,
        &[
            "tasks", "replay", "--all", "--to", "replayed", "--rate", "300", "--yes",
        ],
    )
    .await;
    let pending = scalar(
        &store,
        "SELECT count(*) FROM recovery_replay WHERE pending_upto IS NOT NULL",
    )
    .await;
    assert_eq!(pending, 1, "the kill left a batch pending");
    let produced = scalar(
        &store,
        &format!("SELECT produced FROM recovery_replay WHERE id = {id}"),
    )
    .await;
    assert!(produced < 1_500, "killed before the end ({produced})");

    let out = run(&settings, &["replays", "resume", &id.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1500 produced"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_replayed_once(&bootstrap, "replayed", &expected);

    let list: Value =
        serde_json::from_slice(&run(&settings, &["replays", "list", "--json"]).stdout).unwrap();
    let list = &list["items"];
    assert_eq!(list[0]["status"], "done");
    assert_eq!(
        (list[0]["produced"].as_i64(), list[0]["total"].as_i64()),
        (Some(1_500), Some(1_500))
    );
    let audit: Value =
        serde_json::from_slice(&run(&settings, &["audit", "--json", "--action", "replay"]).stdout)
            .unwrap();
    assert_eq!(audit["items"][0]["count"], 1_500, "{audit}");
    // The tasks themselves are untouched.
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'failed'"
        )
        .await,
        1_500
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_a_missing_topic_fails_before_producing_anything() {
    let kafka = cluster(&[("orders", 3)]);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = kafka.bootstrap_servers();
    stored_failures(&store, 10).await;
    let out = run(
        &settings,
        &["tasks", "replay", "--all", "--to", "no-such-topic", "--yes"],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"no-such-topic\" does not exist"),
        "{stderr}"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
    assert!(consume(
        &kafka.bootstrap_servers(),
        "orders",
        3,
        1,
        Duration::from_secs(2)
    )
    .is_empty());
}

/// A replay's target is held to the rules of the configured targets: a name Kafka
/// would refuse, or one of Kafka's internal topics, is refused naming the reason before
/// anything is recorded (it went to the broker, to be refused there with its words, or,
/// for an internal topic, written into).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_an_internal_or_malformed_topic_is_refused_before_anything_runs() {
    let kafka = cluster(&[("orders", 1)]);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = kafka.bootstrap_servers();
    stored_failures(&store, 3).await;
    for (target, reason) in [
        ("__consumer_offsets", "is Kafka's internal topic"),
        ("orders retry", "is not a topic name"),
        ("..", "is not a topic name Kafka accepts"),
    ] {
        let out = run(
            &settings,
            &["tasks", "replay", "--all", "--to", target, "--yes"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{target}: {stderr}");
        assert!(stderr.contains(reason), "{target}: {stderr}");
    }
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
}

/// Started over HTTP, a replay to each task's original topic is run by a fleet member,
/// which marks the tasks resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_detached_replay_is_run_by_a_fleet_member() {
    let kafka = cluster(&[("orders", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    settings.worker.enabled = false;
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    settings.admin.listen = Some(address);
    let expected = stored_failures(&store, 300).await;
    let fleet = redrive::Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);

    let client = reqwest::Client::new();
    let mut response = None;
    for _ in 0..100 {
        match client
            .post(format!("http://{address}/api/v1/tasks/replay"))
            .json(&serde_json::json!({"all": true, "mark_resolved": true, "reason": "downstream fixed"}))
            .send()
            .await
        {
            Ok(r) => {
                response = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let response = response.expect("the API answers");
    assert_eq!(response.status(), 202);
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["detached"], true);

    crate::support::eventually(Duration::from_secs(30), "the replay to finish", || {
        let store = store.clone();
        async move {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_replay WHERE status = 'done'",
            )
            .await
                == 1
        }
    })
    .await;
    assert_replayed_once(&bootstrap, "orders", &expected);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'"
        )
        .await,
        300
    );
    member.stop().await;
}

/// A replay to a topic a capture route consumes would come back as new tasks, which the
/// same selection replays again: refused before anything is recorded or produced, named
/// by `--to` and when it is a task's original topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_a_topic_a_capture_route_consumes_is_refused() {
    use std::io::Write;
    let kafka = cluster(&[("orders", 3), ("orders.dlt", 3)]);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = kafka.bootstrap_servers();
    stored_failures(&store, 10).await;
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    write!(
        config,
        "[[routes]]\npattern = \"^.*\\\\.dlt\"\nmode = \"capture\"\nhandler = \"log\"\n"
    )
    .unwrap();
    let config = config.path().to_str().unwrap().to_owned();
    let replay = |to: &[&str]| {
        let mut args = vec!["--config", &config, "tasks", "replay", "--all", "--yes"];
        args.extend_from_slice(to);
        run(&settings, &args)
    };

    let out = replay(&["--to", "orders.dlt"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("\"orders.dlt\" is consumed by capture route routes[0].pattern")
            && stderr.contains("endless loop"),
        "{stderr}"
    );
    // Each task's original topic is checked too.
    sqlx::query("UPDATE recovery_task SET original_topic = 'orders.dlt' WHERE id % 2 = 0")
        .execute(store.pool())
        .await
        .unwrap();
    let out = replay(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("endless loop"), "{stderr}");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
    assert!(consume(
        &kafka.bootstrap_servers(),
        "orders.dlt",
        3,
        1,
        Duration::from_secs(2)
    )
    .is_empty());
    // A topic the route does not consume (its pattern matches whole names) is fine.
    let out = replay(&["--to", "orders", "--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Found by an attack: a replay to each task's original topic produced into
/// `__transaction_state` when a dead letter's header had named it (the republish
/// handler refused it, the replay did not). A replay of such tasks is refused with the
/// topic named, dry run included, and nothing is produced there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_an_internal_original_topic_is_refused() {
    let kafka = cluster(&[("orders", 1), ("__transaction_state", 1)]);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = kafka.bootstrap_servers();
    stored_failures(&store, 4).await;
    sqlx::query("UPDATE recovery_task SET original_topic = '__transaction_state' WHERE id = 2")
        .execute(store.pool())
        .await
        .unwrap();
    for dry_run in [true, false] {
        let mut args = vec!["tasks", "replay", "--all", "--yes"];
        if dry_run {
            args.push("--dry-run");
        }
        let out = run(&settings, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("\"__transaction_state\", Kafka's internal topic"),
            "{stderr}"
        );
    }
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
    assert!(consume(
        &kafka.bootstrap_servers(),
        "__transaction_state",
        1,
        1,
        Duration::from_secs(2)
    )
    .is_empty());
}

/// Regression: resuming a pending batch re-read `(cursor, pending_upto]` with the usual
/// page limit and then moved the cursor to `pending_upto`. When more tasks matched in
/// that range than when the batch began (workers failing tasks during a
/// `--status permanent_failure` replay), everything after the re-read's page was
/// skipped, tasks of the original batch among them: "done 201/200".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_resumed_batch_whose_selection_grew_produces_every_task_once() {
    let kafka = cluster(&[("orders", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let expected = stored_failures(&store, 400).await;
    // Every other task has failed for good: the replay's first batch is those 200.
    sqlx::query(
        "UPDATE recovery_task SET status = 'permanent_failure', \
         finished_at = now() WHERE id % 2 = 1",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let operator = redrive::store::Operator {
        actor: "test".into(),
        reason: None,
    };
    let replay = redrive::store::NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: redrive::store::TaskFilter {
            status: vec![redrive::Status::PermanentFailure],
            ..Default::default()
        },
        target_topic: None,
        mark_resolved: false,
        rate: None,
        detached: false,
        approval: None,
        most: None,
    };
    let job = store
        .create_replay(&operator, &replay, "runner")
        .await
        .unwrap();
    let first_batch_end =
        scalar(&store, "SELECT max(id) FROM recovery_task WHERE id % 2 = 1").await;
    let nothing_produced: redrive::store::Marks =
        [("orders".to_owned(), (0..3).map(|p| (p, 0)).collect())].into();
    // The runner began that batch and stopped before producing any of it.
    assert!(store
        .begin_replay_batch(job.id, "runner", first_batch_end, &nothing_produced)
        .await
        .unwrap());
    // Meanwhile the other 200 failed for good too.
    sqlx::query(
        "UPDATE recovery_task SET status = 'permanent_failure', \
         finished_at = now() WHERE status = 'failed'",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let job = store.replay(job.id).await.unwrap().unwrap();
    let done = run_to_end(&store, &settings, job).await;
    assert_eq!(done.status, "done");
    assert_eq!(done.produced, 400, "{done:?}");
    assert_replayed_once(&bootstrap, "orders", &expected);
}

/// A selected task whose row cannot be read (malformed stored headers) is skipped and
/// counted; the job goes on past it, even when a whole page is unreadable, and ends done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_task_that_cannot_be_read_is_skipped_and_the_replay_goes_on() {
    let kafka = cluster(&[("orders", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let mut expected = stored_failures(&store, 300).await;
    // The first page (200 tasks) is unreadable but for its first task, and one more
    // task further on.
    let unreadable: Vec<Vec<u8>> = sqlx::query_scalar(
        "UPDATE recovery_task SET msg_headers = '\\x0100'::bytea \
         WHERE id IN (SELECT id FROM recovery_task ORDER BY id OFFSET 1 LIMIT 199) \
            OR id = (SELECT id FROM recovery_task ORDER BY id OFFSET 250 LIMIT 1) \
         RETURNING msg_key",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(unreadable.len(), 200);
    for key in unreadable {
        expected.remove(&key);
    }
    let operator = redrive::store::Operator {
        actor: "test".into(),
        reason: None,
    };
    let replay = redrive::store::NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: Default::default(),
        target_topic: None,
        mark_resolved: false,
        rate: None,
        detached: false,
        approval: None,
        most: None,
    };
    let job = store
        .create_replay(&operator, &replay, "runner")
        .await
        .unwrap();
    let done = run_to_end(&store, &settings, job).await;
    assert_eq!(
        (done.status.as_str(), done.produced, done.skipped),
        ("done", 100, 200),
        "{done:?}"
    );
    assert_replayed_once(&bootstrap, "orders", &expected);
}

/// The loop check holds on every path that runs a job, not only where it is created: a
/// job recorded before the route existed (or by a CLI run without the fleet's config),
/// then resumed with `replays resume`, or picked up by a member whose configuration
/// consumes its topic, fails naming the route and produces nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_into_a_consumed_topic_is_refused_on_resume_and_on_pickup() {
    use std::io::Write;
    let kafka = cluster(&[("orders", 3), ("orders.dlt", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    stored_failures(&store, 10).await;
    let operator = redrive::store::Operator {
        actor: "elsewhere".into(),
        reason: None,
    };
    let into_dlt = |detached| redrive::store::NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: redrive::store::TaskFilter::default(),
        target_topic: Some("orders.dlt".into()),
        mark_resolved: false,
        rate: None,
        detached,
        approval: None,
        most: None,
    };
    let refused = |job: &Value| {
        job["status"] == "failed"
            && job["error"]
                .as_str()
                .is_some_and(|e| e.contains("routes[0].pattern") && e.contains("endless loop"))
    };

    // Resumed by the CLI with a configuration whose capture route consumes the topic.
    let job = store
        .create_replay(&operator, &into_dlt(false), "runner")
        .await
        .unwrap();
    store
        .finish_replay(job.id, "runner", Some("stopped"))
        .await
        .unwrap();
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    write!(
        config,
        "[[routes]]\npattern = \"^.*\\\\.dlt\"\nmode = \"capture\"\nhandler = \"log\"\n"
    )
    .unwrap();
    let config_path = config.path().to_str().unwrap().to_owned();
    let out = run(
        &settings,
        &[
            "--config",
            &config_path,
            "replays",
            "resume",
            &job.id.to_string(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("endless loop"), "{stderr}");
    let list: Value =
        serde_json::from_slice(&run(&settings, &["replays", "list", "--json"]).stdout).unwrap();
    assert!(refused(&list["items"][0]), "{list}");

    // Picked up by a member whose configuration consumes the topic.
    let job = store
        .create_replay(&operator, &into_dlt(true), "elsewhere")
        .await
        .unwrap();
    let mut member = settings.clone();
    member.worker.enabled = false;
    member.routes = redrive::Settings::load(Some(config.path()), None)
        .unwrap()
        .routes;
    let fleet = redrive::Fleet::builder(member)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(fleet.run_with_store(store.clone(), stop.clone()));
    crate::support::eventually(
        Duration::from_secs(30),
        "the member to take the job",
        || {
            let store = store.clone();
            async move {
                let job = store.replay(job.id).await.unwrap().unwrap();
                job.status != "pending" && job.status != "running"
            }
        },
    )
    .await;
    let job = serde_json::to_value(store.replay(job.id).await.unwrap().unwrap()).unwrap();
    assert!(refused(&job), "{job}");
    stop.cancel();
    running.await.unwrap().unwrap();
    assert!(consume(&bootstrap, "orders.dlt", 3, 1, Duration::from_secs(2)).is_empty());
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        10,
        "nothing came back as a new task"
    );
}

/// SIGKILLed mid-batch, then resumed while its selection grew (workers failing more
/// tasks for good, inside the pending batch and past it): the resumed job produces
/// every task its cursor had not passed, the pending batch's new ones included, each
/// exactly once; tasks that started matching behind the cursor are not in this replay
/// (docs/operating.md, "What a replay covers").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_replay_killed_mid_batch_and_resumed_while_its_selection_grew_produces_each_once() {
    let kafka = cluster(&[("orders", 3), ("replayed", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let all = stored_failures(&store, 1_200).await;
    sqlx::query(
        "UPDATE recovery_task SET status = 'permanent_failure', \
         finished_at = now() WHERE id % 2 = 1",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let id = kill_mid_batch(
        &settings,
        &store,
        &[
            "tasks",
            "replay",
            "--status",
            "permanent_failure",
            "--to",
            "replayed",
            "--rate",
            "300",
            "--yes",
        ],
    )
    .await;
    let (cursor, pending_upto): (i64, Option<i64>) =
        sqlx::query_as("SELECT cursor, pending_upto FROM recovery_replay WHERE id = $1")
            .bind(id)
            .fetch_one(store.pool())
            .await
            .unwrap();
    let pending_upto = pending_upto.expect("the kill left a batch pending");
    // Every other task fails for good now, behind the cursor, inside the pending batch
    // and past it.
    sqlx::query(
        "UPDATE recovery_task SET status = 'permanent_failure', finished_at = now() \
         WHERE status = 'failed'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let inside: i64 = scalar(
        &store,
        &format!(
            "SELECT count(*) FROM recovery_task WHERE id % 2 = 0 \
             AND id > {cursor} AND id <= {pending_upto}"
        ),
    )
    .await;
    assert!(inside > 0, "the pending batch's range grew");

    let out = run(&settings, &["replays", "resume", &id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let keys: Vec<(i64, Vec<u8>)> = sqlx::query_as("SELECT id, msg_key FROM recovery_task")
        .fetch_all(store.pool())
        .await
        .unwrap();
    let expected: HashMap<Vec<u8>, NewTask> = keys
        .into_iter()
        .filter(|(task, _)| task % 2 == 1 || *task > cursor)
        .map(|(_, key)| (key.clone(), all[&key].clone()))
        .collect();
    let job = store.replay(id).await.unwrap().unwrap();
    assert_eq!(
        (job.status.as_str(), job.produced),
        ("done", expected.len() as i64),
        "{job:?}"
    );
    assert_replayed_once(&bootstrap, "replayed", &expected);
}

/// Found by the issue 16 attack: a replay cancelled mid-batch went on producing until
/// its next heartbeat (5 s), and the messages of that batch were never counted (nor,
/// with mark_resolved, resolved), so the job said fewer than the topic held. The runner
/// now learns of a cancel within about a second and records what it produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_replay_cancelled_mid_batch_stops_soon_and_counts_every_message_it_produced() {
    let kafka = cluster(&[("orders", 3)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    stored_failures(&store, 1000).await;
    let operator = redrive::store::Operator {
        actor: "ops".into(),
        reason: None,
    };
    let replay = redrive::store::NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: redrive::store::TaskFilter::default(),
        target_topic: None,
        mark_resolved: true,
        rate: Some(150.0),
        detached: false,
        approval: None,
        most: None,
    };
    let job = store
        .create_replay(&operator, &replay, "runner")
        .await
        .unwrap();
    let id = job.id;
    let running = tokio::spawn({
        let (store, settings) = (store.clone(), settings.clone());
        async move { run_to_end(&store, &settings, job).await }
    });
    // Inside the second batch of 200 (at 150 a second, a batch takes 1.3 s).
    crate::support::eventually(Duration::from_secs(30), "a batch produced", || async {
        scalar(
            &store,
            &format!("SELECT cursor FROM recovery_replay WHERE id = {id}"),
        )
        .await
            > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    store.cancel_replay(&operator, id).await.unwrap();
    let cancelled = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the runner stops")
        .unwrap();
    assert_eq!(ended.status.to_string(), "cancelled");
    assert!(
        cancelled.elapsed() < Duration::from_secs(3),
        "stopped {:?} after the cancel",
        cancelled.elapsed()
    );
    let job = store.replay(id).await.unwrap().unwrap();
    let on_topic = consume(
        &bootstrap,
        "orders",
        3,
        job.produced as usize + 1,
        Duration::from_secs(10),
    );
    assert!(
        job.produced < 1000,
        "cancelled before the end: {}",
        job.produced
    );
    assert_eq!(
        on_topic.len() as i64,
        job.produced,
        "the job counts what the topic holds"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'"
        )
        .await,
        job.produced,
        "mark_resolved resolved what was produced"
    );
}

/// Found by an operator during a Kafka outage: a replay against a cluster that could
/// not be reached took 30 s (the topic check's metadata wait) and said only that Kafka
/// failed. The check is bounded, and its answer names the bootstrap servers and what
/// failed, through the API and the CLI; nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_replay_against_an_unreachable_cluster_answers_within_seconds_with_the_reason() {
    use crate::support::api::{with_tokens, Api, OPERATE};
    use std::time::Instant;

    // A cluster that stopped: nothing listens at its address any more.
    let kafka = cluster(&[("replayed", 1)]);
    let bootstrap = kafka.bootstrap_servers();
    drop(kafka);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let settings = with_tokens(settings);
    stored_failures(&store, 3).await;

    let api = Api::start(&store, &settings).await;
    let started = Instant::now();
    let (status, answer) = api
        .post(
            "/api/v1/tasks/replay",
            Some(OPERATE),
            serde_json::json!({ "all": true, "to": "replayed", "reason": "outage drill" }),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(status, 503, "{answer}");
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("bootstrap servers {bootstrap}"))
            && error.contains("\"replayed\"")
            && error.contains("nothing was recorded"),
        "{error}"
    );

    let started = Instant::now();
    let out = run(
        &settings,
        &["tasks", "replay", "--all", "--to", "replayed", "--yes"],
    );
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    assert!(
        stderr.contains(&format!("bootstrap servers {bootstrap}")),
        "{stderr}"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
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
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: redrive::store::TaskFilter::default(),
        target_topic: None,
        mark_resolved: false,
        rate: Some(1e-20),
        detached: true,
        approval: None,
        most: None,
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
