//! `redrive tasks`, `redrive audit` and `redrive replays` through the real binary.

use serde_json::Value;
use std::process::{Command, Output, Stdio};

use crate::support::cli::{redrive, run};
use crate::support::{fresh_store, scalar};
use crate::support::{Bounded, CHILD_LIMIT};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs and expects success; stdout.
fn ok(settings: &redrive::Settings, args: &[&str]) -> String {
    let out = run(settings, args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs and expects failure; stderr.
fn fails(settings: &redrive::Settings, args: &[&str]) -> String {
    let out = run(settings, args);
    assert!(
        !out.status.success(),
        "{args:?} succeeded: {}",
        text(&out.stdout)
    );
    text(&out.stderr)
}

async fn seed(store: &redrive::Store) {
    sqlx::raw_sql(
        "INSERT INTO recovery_task (handler, msg_key, msg_value, last_error, source_topic, source_partition, source_offset) \
         SELECT CASE WHEN i % 2 = 0 THEN 'log' ELSE 'republish' END, ('key-' || i)::bytea, \
                CASE WHEN i = 1 THEN '\\xff00fe'::bytea ELSE ('value ' || i)::bytea END, \
                CASE WHEN i % 3 = 0 THEN 'Timeout talking to billing' END, 'orders', 0, i \
         FROM generate_series(1, 30) i",
    )
    .execute(store.pool())
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_act_by_ids_and_by_filter() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;

    // List: a filter and pages of JSON that walk every task once.
    let page: Value = serde_json::from_str(&ok(
        &settings,
        &[
            "tasks",
            "list",
            "--handler",
            "log",
            "--error",
            "TIMEOUT",
            "--json",
        ],
    ))
    .unwrap();
    let ids: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        [30, 24, 18, 12, 6],
        "even ids divisible by 3, newest first"
    );
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["tasks", "list", "--limit", "7", "--json"];
        if let Some(after) = &after {
            args.extend(["--after", after]);
        }
        let page: Value = serde_json::from_str(&ok(&settings, &args)).unwrap();
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_i64().unwrap()),
        );
        match page["next_cursor"].as_i64() {
            Some(cursor) => after = Some(cursor.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, (1..=30).rev().collect::<Vec<i64>>());
    let table = ok(
        &settings,
        &["tasks", "list", "--key-prefix", "key-2", "--limit", "3"],
    );
    assert!(table.starts_with("ID"), "{table}");
    assert_eq!(table.lines().count(), 4, "a header and three rows: {table}");

    // Show: binary as hex, text as text.
    let shown = ok(&settings, &["tasks", "show", "1"]);
    assert!(shown.contains("hex:ff00fe (3 bytes)"), "{shown}");
    assert!(shown.contains("key-1 (5 bytes)"), "{shown}");
    let detail: Value =
        serde_json::from_str(&ok(&settings, &["tasks", "show", "1", "--json"])).unwrap();
    assert_eq!(detail["value"]["encoding"], "hex");
    assert!(fails(&settings, &["tasks", "show", "999"]).contains("no such task: 999"));

    // Act by ids, then by filter.
    let out = ok(
        &settings,
        &[
            "tasks",
            "discard",
            "2",
            "4",
            "--reason",
            "duplicates",
            "--yes",
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["changed"], 2);
    let out = ok(
        &settings,
        &[
            "tasks",
            "resolve",
            "--handler",
            "republish",
            "--reason",
            "fixed upstream",
            "--yes",
        ],
    );
    assert!(out.contains("15 task(s) changed"), "{out}");
    let dry = ok(
        &settings,
        &[
            "tasks",
            "retry",
            "--status",
            "discarded,resolved",
            "--dry-run",
        ],
    );
    assert!(
        dry.contains("would change 2 task(s)"),
        "resolved ones are not retried: {dry}"
    );
    let out = ok(
        &settings,
        &[
            "tasks",
            "retry",
            "--status",
            "discarded",
            "--more-attempts",
            "2",
            "--yes",
        ],
    );
    assert!(out.contains("2 task(s) changed"), "{out}");
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'failed'"
        )
        .await,
        15
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT sum(attempt_grants) FROM recovery_task WHERE id IN (2, 4)"
        )
        .await,
        4
    );

    // Every action is in the audit log, with who, what and why.
    let audit: Value = serde_json::from_str(&ok(&settings, &["audit", "--json"])).unwrap();
    let audit = &audit["items"];
    let actions: Vec<(&str, i64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["count"].as_i64().unwrap()))
        .collect();
    assert_eq!(actions, [("retry", 2), ("resolve", 15), ("discard", 2)]);
    assert!(audit[2]["actor"].as_str().unwrap().starts_with("cli:"));
    assert_eq!(audit[1]["reason"], "fixed upstream");
    assert_eq!(audit[1]["filter"]["handler"], "republish");
    let filtered = ok(&settings, &["audit", "--action", "discard"]);
    assert_eq!(filtered.lines().count(), 2, "{filtered}");

    // Stats and check.
    let stats = ok(&settings, &["tasks", "stats"]);
    assert!(
        stats.contains("resolved") && stats.contains("OLDEST DUE FOR"),
        "{stats}"
    );
    assert!(ok(&settings, &["tasks", "check"]).contains("every invariant holds"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_a_reason_and_change_nothing() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    for (args, says) in [
        (&["tasks", "discard", "--reason", "x"][..], "pass --all"),
        (
            &["tasks", "discard", "1", "--handler", "log", "--reason", "x"],
            "not both",
        ),
        (
            &["tasks", "discard", "1", "424242", "--reason", "x"],
            "no such task: 424242",
        ),
        (&["tasks", "discard", "1"], "--reason"),
        (&["tasks", "list", "--status", "done"], "unknown status"),
        (&["tasks", "list", "--limit", "5000"], "5000"),
        (
            &["tasks", "list", "--created-after", "last tuesday"],
            "neither a time",
        ),
        (&["tasks", "retry", "1", "--more-attempts", "0"], "0"),
        (&["tasks", "replay", "--to", "t"], "pass --all"),
    ] {
        let error = fails(&settings, args);
        assert!(error.contains(says), "{args:?}: {error}");
    }
    let out = run(
        &settings,
        &["tasks", "discard", "--handler", "nobody", "--reason", "x"],
    );
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("no task matching the filter"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status <> 'failed'"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_audit").await,
        0
    );
}

/// An operator verb against a schema without redrive's tables says what to do.
#[tokio::test]
async fn a_verb_on_an_empty_schema_says_to_migrate() {
    let (_, mut settings) = fresh_store().await;
    settings.database.schema = crate::support::unique_schema();
    for args in [&["tasks", "list"][..], &["audit"], &["replays", "list"]] {
        let error = fails(&settings, args);
        assert!(
            error.contains("holds no redrive tables") && error.contains("redrive migrate"),
            "{args:?}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_exits_1_and_names_the_task_when_an_invariant_breaks() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    assert!(run(&settings, &["tasks", "check"]).status.success());
    sqlx::query("UPDATE recovery_task SET status = 'resolved' WHERE id = 7")
        .execute(store.pool())
        .await
        .unwrap();
    let out = run(&settings, &["tasks", "check"]);
    assert_eq!(out.status.code(), Some(1));
    let found = text(&out.stdout);
    assert!(
        found.contains("task 7: final_without_finish_time"),
        "{found}"
    );
}

/// A recovery store without autovacuum bloats until its drain stalls: `tasks check`
/// warns (without failing: no invariant is broken yet) when a table of redrive's has it
/// disabled, and when the server has it off; a member says so at start-up and in
/// `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_start_up_warn_when_autovacuum_is_off() {
    let (store, settings) = fresh_store().await;
    let server_off: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let server_off = server_off == "off";
    let warnings = |out: &Output| -> Vec<String> {
        (text(&out.stderr).lines())
            .filter(|l| l.starts_with("warning: "))
            .map(str::to_owned)
            .collect()
    };
    let out = run(&settings, &["tasks", "check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = warnings(&out);
    assert_eq!(
        said.iter()
            .any(|w| w.contains("autovacuum is off on this PostgreSQL server")),
        server_off,
        "the server's own setting, as it is: {said:?}"
    );
    assert!(!said.iter().any(|w| w.contains("on table")), "{said:?}");

    sqlx::query("ALTER TABLE recovery_task SET (autovacuum_enabled = 'no')")
        .execute(store.pool())
        .await
        .unwrap();
    let out = run(&settings, &["tasks", "check"]);
    assert!(out.status.success(), "a warning is no violation");
    let schema = &settings.database.schema;
    let expected = format!("warning: autovacuum is disabled on table {schema}.recovery_task: ALTER TABLE {schema}.recovery_task RESET (autovacuum_enabled)");
    assert!(warnings(&out).contains(&expected), "{:?}", warnings(&out));
    let json: Value =
        serde_json::from_slice(&run(&settings, &["tasks", "check", "--json"]).stdout).unwrap();
    assert!(
        json["warnings"].to_string().contains("recovery_task"),
        "{json}"
    );

    let metrics_at = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap()
    };
    let mut member = crate::support::Spawn::binary(&settings)
        .env("REDRIVE__METRICS__LISTEN", metrics_at.to_string())
        .start();
    crate::support::eventually(
        std::time::Duration::from_secs(30),
        "the member warned at start-up",
        || async {
            !member
                .log_lines("autovacuum is disabled on table")
                .is_empty()
        },
    )
    .await;
    // `/readyz` says it too, without taking the member out of service.
    let readyz = format!("http://{metrics_at}/readyz");
    crate::support::eventually(
        std::time::Duration::from_secs(30),
        "ready: a warning does not make a member unready",
        || async {
            let answer = reqwest::get(&readyz).await;
            answer.is_ok_and(|a| a.status() == 200)
        },
    )
    .await;
    let body: Value = reqwest::get(&readyz).await.unwrap().json().await.unwrap();
    let expected = format!("autovacuum is disabled on table {schema}.recovery_task");
    assert!(body["warnings"].to_string().contains(&expected), "{body}");
    member.stop(std::time::Duration::from_secs(30)).await;
}

/// Runs the binary with `retry.max_attempts` set, and expects success; stdout.
fn ok_with_budget(settings: &redrive::Settings, budget: &str, args: &[&str]) -> String {
    let out = redrive(settings)
        .env("REDRIVE__RETRY__MAX_ATTEMPTS", budget)
        .args(args)
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `tasks retry --at` takes a duration meaning that long from now, or an RFC 3339 time,
/// and refuses a time far off; `--more-attempts N` leaves a task that ended "no attempts
/// left" exactly N calls; the audit row records both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_at_means_from_now_more_attempts_counts_from_where_the_task_stands() {
    let (store, settings) = fresh_store().await;
    // Ended "no attempts left": 4 attempts counted against a budget of 3.
    sqlx::raw_sql(
        "INSERT INTO recovery_task (handler, msg_value, status, attempts, finished_at) \
         VALUES ('log', 'x', 'permanent_failure', 4, now()), \
                ('log', 'y', 'permanent_failure', 3, now())",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let retry = ["tasks", "retry", "1", "--at", "1h", "--more-attempts", "2"];
    ok_with_budget(&settings, "3", &[&retry[..], &["--yes"]].concat());
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE id = 1 AND status = 'failed' \
             AND next_attempt_at BETWEEN now() + interval '59 minutes' \
                                     AND now() + interval '61 minutes'"
        )
        .await,
        1,
        "due in an hour"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT 3 + attempt_grants::bigint - attempts FROM recovery_task WHERE id = 1"
        )
        .await,
        2,
        "calls left"
    );
    let audit: Value = serde_json::from_str(&ok(&settings, &["audit", "--json"])).unwrap();
    assert_eq!(
        audit["items"][0]["details"],
        serde_json::json!({"at": "1h", "more_attempts": 2})
    );

    let at = (chrono::Utc::now() + chrono::TimeDelta::hours(2)).to_rfc3339();
    ok_with_budget(
        &settings,
        "3",
        &["tasks", "retry", "2", "--at", &at, "--yes"],
    );
    let due: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT next_attempt_at FROM recovery_task WHERE id = 2")
            .fetch_one(store.pool())
            .await
            .unwrap();
    let asked: chrono::DateTime<chrono::Utc> = at.parse().unwrap();
    assert_eq!((due - asked).num_milliseconds(), 0, "due when asked");

    for (far, says) in [
        ("2999-01-01T00:00:00Z", "more than a year from now"),
        ("1999-01-01T00:00:00Z", "more than a day ago"),
        ("400d", "more than a year from now"),
        ("-1h", "negative"),
    ] {
        let at = format!("--at={far}");
        let error = fails(&settings, &["tasks", "retry", "1", &at, "--yes"]);
        assert!(
            error.contains("at: ") && error.contains(says),
            "{far}: {error}"
        );
    }
}

/// `tasks check` reads any budget a configuration may set, with grants on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_the_largest_budget() {
    let (store, settings) = fresh_store().await;
    sqlx::raw_sql(
        "INSERT INTO recovery_task (handler, msg_value, attempts, attempt_grants) \
         VALUES ('log', 'x', 0, 5)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    ok_with_budget(&settings, "2147483647", &["tasks", "check"]);
}

/// The peak resident memory of process `pid` so far (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs the binary to its end and answers its output and peak resident memory in bytes,
/// read from /proc while it runs. (`wait4`'s `ru_maxrss` would not do: Linux carries
/// the forking test process's own peak over into the child's.)
fn run_measured(mut command: Command) -> (Output, u64) {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(peak_rss(pid).unwrap_or(0));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            peak
        })
    };
    let out = crate::support::wait_with_output_within(child, CHILD_LIMIT, "redrive bench");
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = watcher.join().unwrap();
    assert!(peak > 0, "the child's memory was never read");
    (out, peak)
}

/// Bulk discard and retry of 100,000 tasks run in bounded memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bulk_actions_on_100_000_tasks_stay_under_100_mb() {
    let (store, settings) = fresh_store().await;
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_key, msg_value) \
         SELECT 'log', ('k' || i)::bytea, convert_to(repeat('x', 500), 'UTF8') \
         FROM generate_series(1, 100000) i",
    )
    .execute(store.pool())
    .await
    .unwrap();
    const LIMIT: u64 = 100 * 1024 * 1024;
    for (args, changed) in [
        (
            &[
                "tasks",
                "discard",
                "--handler",
                "log",
                "--reason",
                "bulk",
                "--yes",
                "--json",
            ][..],
            100_000,
        ),
        (
            &["tasks", "retry", "--status", "discarded", "--yes", "--json"],
            100_000,
        ),
    ] {
        let mut command = redrive(&settings);
        command.args(args);
        let (out, peak) = run_measured(command);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
        assert_eq!(report["changed"], changed, "{report}");
        println!("{args:?}: peak RSS {} MiB", peak / (1024 * 1024));
        assert!(peak < LIMIT, "{args:?}: peak RSS {peak} bytes");
    }
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'failed'"
        )
        .await,
        100_000
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt").await,
        200_000
    );
}

/// Regression: read-only verbs built the whole fleet, parking producer included: with
/// the broker down they logged librdkafka's warnings, and with a Kafka setting that
/// cannot make a client they failed. No read-only verb creates a Kafka client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_verbs_create_no_kafka_client() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    for args in [
        &["tasks", "list"][..],
        &["tasks", "list", "--json"],
        &["tasks", "show", "1"],
        &["tasks", "stats"],
        &["tasks", "check"],
        &["tasks", "retry", "--all", "--dry-run"],
        &["tasks", "replay", "--all", "--to", "t", "--dry-run"],
        &["replays", "list"],
        &["audit"],
        &["breakers", "list"],
        &["brake", "list"],
        &["members", "--json"],
    ] {
        let out = redrive(&settings)
            .args(args)
            .env("REDRIVE__PARKING__TOPIC", "parked")
            .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
            .env("REDRIVE__KAFKA__PROPERTIES__SECURITY_PROTOCOL", "ssl")
            .env(
                "REDRIVE__KAFKA__PROPERTIES__SSL_CA_LOCATION",
                "/nonexistent/ca.pem",
            )
            .output_within(CHILD_LIMIT)
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("librdkafka") && !stderr.to_lowercase().contains("kafka"),
            "{args:?}: {stderr}"
        );
    }
}

/// Regression: off a terminal, bulk verbs acted without asking (a 5,001-task retry ran
/// from a script). Without a terminal to ask on they need `--yes`, and change nothing
/// without it; a dry run needs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_verbs_off_a_terminal_act_only_with_yes() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    for args in [
        &["tasks", "retry", "--all"][..],
        &["tasks", "retry", "3", "5"],
        &["tasks", "discard", "--handler", "log", "--reason", "x"],
        &["tasks", "resolve", "7", "--reason", "x"],
    ] {
        let error = fails(&settings, args);
        assert!(
            error.contains("--yes") && error.contains("not a terminal"),
            "{args:?}: {error}"
        );
        assert!(!error.contains("panicked"), "{error}");
    }
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_audit").await,
        0,
        "nothing was done"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt").await,
        0
    );
    let dry = ok(
        &settings,
        &["tasks", "discard", "3", "--reason", "x", "--dry-run"],
    );
    assert!(dry.contains("would change 1 task(s)"), "{dry}");
    let done = ok(
        &settings,
        &["tasks", "discard", "3", "--reason", "x", "--yes"],
    );
    assert!(done.contains("1 task(s) changed"), "{done}");
}

/// Regression: `tasks list --json | head -c 100` exited 101 with a panic ("failed
/// printing to stdout"). A verb whose standard output is closed does its work,
/// discards what it would print and exits as it would have, without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verb_whose_output_is_closed_ends_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    for args in [
        &["tasks", "list", "--json"][..],
        &["tasks", "list"],
        &["tasks", "show", "1"],
        &["tasks", "stats"],
        &["tasks", "discard", "2", "--reason", "x", "--yes"],
    ] {
        // A pipe whose read end is closed before the verb starts.
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        drop(unsafe { OwnedFd::from_raw_fd(fds[0]) });
        let write = unsafe { OwnedFd::from_raw_fd(fds[1]) };
        let child = redrive(&settings)
            .args(args)
            .stdout(Stdio::from(write))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = crate::support::wait_with_output_within(
            child,
            CHILD_LIMIT,
            "redrive on a closed output",
        );

        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let stderr = text(&out.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Error"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'discarded'"
        )
        .await,
        1,
        "the discard was done though its report was discarded"
    );
}

/// `redrive brake engage` pauses any route of the configuration it runs with (not only
/// one with a bad-deploy brake), audited; a route it does not know is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brake_engage_pauses_a_configured_route_and_refuses_an_unknown_one() {
    let (store, settings) = fresh_store().await;
    let error = fails(
        &settings,
        &["brake", "engage", "orders", "--reason", "incident"],
    );
    assert!(
        error.contains("no route \"orders\"") && error.contains("configuration"),
        "{error}"
    );
    let mut config = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut config,
        b"[[routes]]\ntopics = [\"orders\"]\nmode = \"capture\"\nhandler = \"log\"\n",
    )
    .unwrap();
    let config = config.path().to_str().unwrap().to_owned();
    let with_config = |args: &[&str]| {
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        run(&settings, &all)
    };
    let out = with_config(&[
        "brake", "engage", "orders", "--reason", "incident", "--for", "2h",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("brake of orders engaged until"));
    let out = with_config(&["brake", "engage", "orders", "--reason", "x", "--for", "8d"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("for: "), "{}", text(&out.stderr));
    let listed: Value =
        serde_json::from_slice(&with_config(&["brake", "list", "--json"]).stdout).unwrap();
    let brake = &listed["items"][0];
    assert_eq!(
        (&brake["route"], &brake["reason"]),
        (&"orders".into(), &"incident".into())
    );
    assert!(brake["engaged_by"].as_str().unwrap().starts_with("cli:"));
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_brake WHERE engaged_until \
             BETWEEN now() + interval '119 minutes' AND now() + interval '121 minutes'"
        )
        .await,
        1
    );
    // Released without the configuration: the stored brake names the route.
    ok(
        &settings,
        &["brake", "release", "orders", "--reason", "over"],
    );
    let audit: Value = serde_json::from_str(&ok(&settings, &["audit", "--json"])).unwrap();
    let actions: Vec<&str> = (audit["items"].as_array().unwrap().iter())
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["brake_release", "brake_engage"]);
}

/// Found by an attack: `tasks show` printed the route, the source and original topics
/// and the handler as stored, so a row written by hand could make the operator's terminal
/// obey an escape sequence (the list and every other field of `show` escaped them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_show_writes_every_one_line_field_so_no_terminal_obeys_it() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    sqlx::query(
        "UPDATE recovery_task SET route = E'r\\x1b[2J', handler = E'h\\x1b]0;x\\x07', \
         source_topic = E't\\x1b[2JT', source_partition = 0, source_offset = 1, \
         original_topic = E'o\\nO', original_partition = 2, original_offset = 3 WHERE id = 1",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let shown = ok(&settings, &["tasks", "show", "1"]);
    assert!(
        !shown.contains('\x1b') && !shown.contains('\x07'),
        "{shown:?}"
    );
    for line in [
        "r\\u{001B}[2J",
        "h\\u{001B}]0;x\\u{0007}",
        "t\\u{001B}[2JT[0]@1",
        "o\\u{000A}O",
    ] {
        assert!(shown.contains(line), "{line} in {shown}");
    }
}

/// Found by an attack: the CLI's retry of a task whose row was written by hand (a due
/// time at `-infinity`) was refused, because its preview could not show the row, while
/// the API's retry of the same task changed it: the preview now names the row it cannot
/// show, and the action goes on (a retry is how an operator repairs such a row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_changes_a_row_its_preview_cannot_show_and_says_so() {
    let (store, settings) = fresh_store().await;
    seed(&store).await;
    sqlx::query(
        "UPDATE recovery_task SET status = 'failed', finished_at = NULL, \
         next_attempt_at = '-infinity' WHERE id = 2",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let preview = ok(&settings, &["tasks", "retry", "2", "--dry-run"]);
    assert!(
        preview.contains("task 2") && preview.contains("next_attempt_at"),
        "{preview}"
    );
    ok(&settings, &["tasks", "retry", "2", "--yes"]);
    let repaired = scalar(
        &store,
        "SELECT count(*) FROM recovery_task WHERE id = 2 AND isfinite(next_attempt_at)",
    )
    .await;
    assert_eq!(repaired, 1, "the retry gave the task a due time again");
}

/// Found by an attack: a replay job whose runner was killed while producing a batch,
/// then cancelled, answered "cancelled after 400 message(s)" while 537 had reached the
/// topic: the batch in flight is never counted once its runner is gone. The answer, the
/// list and the API now say that such a batch may have reached the topic uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_replay_says_its_batch_in_flight_may_have_been_produced_uncounted() {
    let (store, settings) = fresh_store().await;
    sqlx::query(
        "INSERT INTO recovery_replay (actor, filter, target_topic, detached, status, runner, \
         heartbeat_at, cursor, produced, total, pending_upto, pending_marks) \
         VALUES ('ops', '{}', 'orders', false, 'running', 'gone', now() - interval '1 hour', \
         400, 400, 1853, 845, '{}')",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let answer = ok(&settings, &["replays", "cancel", "1"]);
    assert!(
        answer.contains("cancelled after 400 message(s)")
            && answer.contains("tasks after id 400 up to 845")
            && answer.contains("uncounted"),
        "{answer}"
    );
    let list = ok(&settings, &["replays", "list"]);
    assert!(list.contains("400+?"), "{list}");
    let listed: Value =
        serde_json::from_str(&ok(&settings, &["replays", "list", "--json"])).unwrap();
    assert_eq!(listed["items"][0]["pending_upto"], 845, "{listed}");
}

/// `--error` matches the error a task shows (its last attempt's; before any attempt
/// failed, the one it was reported with), not the error it was first reported with:
/// "retry the 503s" must not retry a task whose last attempt said 422. `--first-error`
/// asks for the reported one, in the CLI as in the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_filter_matches_the_error_a_task_shows_and_first_error_the_reported_one() {
    let (store, settings) = fresh_store().await;
    sqlx::raw_sql(
        "INSERT INTO recovery_task (id, handler, error_message, last_error) OVERRIDING SYSTEM VALUE VALUES \
           (1, 'log', 'HTTP 503 from billing', 'HTTP 422 from billing: invalid payment'), \
           (2, 'log', 'HTTP 503 from billing', 'HTTP 503 from billing'), \
           (3, 'log', 'HTTP 503 from billing', NULL), \
           (4, 'log', NULL, NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let ids = |args: &[&str]| -> Vec<i64> {
        let mut all = vec!["tasks", "list", "--json"];
        all.extend(args);
        let page: Value = serde_json::from_str(&ok(&settings, &all)).unwrap();
        (page["items"].as_array().unwrap().iter())
            .map(|t| t["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&["--error", "503"]), [3, 2], "what each row shows");
    assert_eq!(ids(&["--error", "invalid PAYMENT"]), [1]);
    assert_eq!(
        ids(&["--first-error", "503"]),
        [3, 2, 1],
        "as first reported"
    );
    assert_eq!(ids(&["--first-error", "503", "--error", "422"]), [1]);
    // Found by an attack: an unknown disposition matched nothing, silently.
    let refused = fails(&settings, &["tasks", "list", "--disposition", "REJECTED"]);
    assert!(
        refused.contains("unknown disposition") && refused.contains("delivery_count_exceeded"),
        "{refused}"
    );
    let out = ok(
        &settings,
        &["tasks", "retry", "--error", "503", "--yes", "--json"],
    );
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["changed"], 2, "{report}");
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_attempt WHERE outcome = 'operator_retry' AND task_id = 1"
        )
        .await,
        0,
        "the task whose last attempt said 422 was not retried"
    );
}

/// Found by an attack: a confirmed (`--yes`) bulk verb that matched nothing wrote no
/// audit row, where the API's did: every confirmed action is on the record, count 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_cli_action_that_matches_nothing_is_audited_with_count_zero() {
    let (store, settings) = fresh_store().await;
    let out = ok(
        &settings,
        &[
            "tasks", "discard", "--route", "nowhere", "--reason", "sweep", "--yes", "--json",
        ],
    );
    let answer: Value = serde_json::from_str(&out).unwrap();
    let audit = answer["audit_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no audit id: {answer}"));
    assert_eq!(
        scalar(
            &store,
            &format!("SELECT count(*) FROM recovery_audit WHERE id = {audit} AND count = 0 AND reason = 'sweep'")
        )
        .await,
        1
    );
}
