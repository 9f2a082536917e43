//! The `redrive` binary end to end: migrate, enqueue, run, stop, refuse bad config.

use secrecy::ExposeSecret;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{eventually, fresh_store, scalar};
use crate::support::{Bounded, CHILD_LIMIT};

fn redrive(settings: &redrive::Settings) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrive"));
    command
        .env(
            "REDRIVE__DATABASE__URL",
            settings.database.url.expose_secret(),
        )
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .env("REDRIVE__WORKER__POLL_INTERVAL", "200ms")
        .env("RUST_LOG", "warn");
    command
}

fn enqueue(settings: &redrive::Settings, args: &[&str], input: &[u8]) -> std::process::Output {
    let mut child = redrive(settings)
        .arg("enqueue")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    crate::support::wait_with_output_within(child, CHILD_LIMIT, "redrive with input")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_then_run_resolves_tasks_and_sigterm_stops_cleanly() {
    let (store, settings) = fresh_store().await;
    let out = enqueue(
        &settings,
        &["--handler", "log", "--lines"],
        b"first\nsecond\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("created task")
            .count(),
        2
    );

    let binary = [0xff, 0x00, 0xc3, 0x28];
    let keyed = [
        "--handler",
        "log",
        "--dedup-key",
        "bin-1",
        "--header",
        "a=1",
    ];
    let out = enqueue(&settings, &keyed, &binary);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = enqueue(&settings, &keyed, &binary);
    assert!(String::from_utf8_lossy(&again.stdout).contains("already exists"));
    let value: Vec<u8> =
        sqlx::query_scalar("SELECT msg_value FROM recovery_task WHERE dedup_key = 'bin-1'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(value, binary, "non-UTF-8 input stored byte for byte");

    let mut run = redrive(&settings)
        .arg("run")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(30), "three tasks resolved", || async {
        store.status_counts().await.unwrap().resolved == 3
    })
    .await;
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGTERM) }, 0);
    let status =
        tokio::task::spawn_blocking(move || crate::support::wait_within(&mut run, CHILD_LIMIT))
            .await
            .unwrap()
            .expect("the member stops within the bound after SIGTERM");
    assert!(status.success());
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt").await,
        3
    );
}

/// Found by an attack: the demo exited ("pool timed out while waiting for an open
/// connection") after a few seconds of database outage, taking its broker with it,
/// while the member inside it waited for the database as every member does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_demo_waits_out_a_database_outage_and_finishes() {
    let (_store, settings) = fresh_store().await;
    let proxy = crate::support::PgProxy::start().await;
    let through = proxy.route(&settings);
    let mut demo = tokio::process::Command::from(redrive(&through));
    demo.args([
        "demo",
        "--messages",
        "300",
        "--rate",
        "60",
        "--transient",
        "0",
        "--permanent",
        "0",
    ])
    .env("DATABASE_URL", through.database.url.expose_secret())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let child = demo.spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(8)).await;
    proxy.restore();
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the demo finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ingested = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("tasks ingested"))
        .and_then(|l| l.split_whitespace().find_map(|w| w.parse::<i64>().ok()));
    assert_eq!(ingested, Some(300), "{stdout}");
}

#[tokio::test]
async fn bad_input_is_refused_with_the_key_or_name_and_a_non_zero_exit() {
    let (_store, settings) = fresh_store().await;
    let out = redrive(&settings)
        .arg("run")
        .env("REDRIVE__WORKER__BATCH_SIZE", "0")
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("worker.batch_size: must be at least 1"),
        "{stderr}"
    );

    let out = enqueue(&settings, &["--handler", "nope"], b"x");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown handler \"nope\""));

    let out = redrive(&settings)
        .args(["run", "--help"])
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--no-migrate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_demo_runs_the_whole_loop_and_stops_by_itself() {
    let (_store, settings) = fresh_store().await;
    use secrecy::ExposeSecret;
    let out = redrive(&settings)
        .args([
            "demo",
            "--messages",
            "60",
            "--rate",
            "500",
            "--transient",
            "0.3",
            "--permanent",
            "0.1",
        ])
        .env("DATABASE_URL", settings.database.url.expose_secret())
        .output_within(CHILD_LIMIT)
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Kafka-protocol broker (in-process): 127.0.0.1:"),
        "{stdout}"
    );
    let figure = |label: &str| -> i64 {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("{label} in {stdout}"));
        line.split_whitespace()
            .find_map(|w| w.parse().ok())
            .unwrap()
    };
    assert_eq!(figure("tasks ingested"), 60);
    assert_eq!(figure("resolved") + figure("permanent failures"), 60);
    assert_eq!(figure("still failed"), 0);
}

/// Runs `command` with `input` on standard input.
fn with_input(mut command: Command, input: &[u8]) -> std::process::Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    crate::support::wait_with_output_within(child, CHILD_LIMIT, "redrive with input")
}

/// Standard error of a run that must fail.
fn failed_stderr(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[tokio::test]
async fn planted_secrets_never_reach_standard_error() {
    let (_store, settings) = fresh_store().await;
    let secret = "hunter2-binary";
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(file, "[kafka.properties]\n\"sasl.pasword\" = \"{secret}\"").unwrap();
    let from_file = redrive(&settings)
        .arg("run")
        .arg("--config")
        .arg(file.path())
        .output_within(CHILD_LIMIT)
        .unwrap();
    let from_env = redrive(&settings)
        .arg("run")
        .env("REDRIVE__KAFKA__PROPERTIES__SASL_PASWORD", secret)
        .output_within(CHILD_LIMIT)
        .unwrap();
    for out in [from_file, from_env] {
        let stderr = failed_stderr(&out);
        assert!(stderr.contains("kafka.properties.sasl.pasword"), "{stderr}");
        assert!(!stderr.contains(secret), "{stderr}");
    }

    let out = redrive(&settings)
        .arg("run")
        .env(
            "REDRIVE__KAFKA__PROPERTIES__SECURITY_PROTOCOL",
            "SASL_PLAINTEXT",
        )
        .env("REDRIVE__KAFKA__PROPERTIES__SASL_MECHANISMS", "BOGUS")
        .env("REDRIVE__KAFKA__PROPERTIES__SASL_PASSWORD", secret)
        .output_within(CHILD_LIMIT)
        .unwrap();
    let stderr = failed_stderr(&out);
    assert!(stderr.contains("kafka.properties"), "{stderr}");
    assert!(!stderr.contains(secret), "{stderr}");

    for url in [
        format!("postgres://postgres:{secret}@no-such-host.invalid:5432/x"),
        format!("postgres://postgres@127.0.0.1:5432/x?pasword={secret}"),
    ] {
        let out = redrive(&settings)
            .arg("migrate")
            .env("REDRIVE__DATABASE__URL", url)
            .env("REDRIVE__DATABASE__CONNECT_TIMEOUT", "2s")
            .env("RUST_LOG", "debug")
            .output_within(CHILD_LIMIT)
            .unwrap();
        let stderr = failed_stderr(&out);
        assert!(!stderr.contains(secret), "{stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(secret));
    }
}

#[tokio::test]
async fn every_verb_reads_database_url() {
    let (store, settings) = fresh_store().await;
    // DATABASE_URL beats the file's URL (which leads nowhere) for `migrate` too.
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(
        file,
        "[database]\nurl = \"postgres://postgres@127.0.0.1:1/nowhere\""
    )
    .unwrap();
    let schema = crate::support::unique_schema();
    let out = redrive(&settings)
        .arg("migrate")
        .arg("--config")
        .arg(file.path())
        .env_remove("REDRIVE__DATABASE__URL")
        .env("DATABASE_URL", settings.database.url.expose_secret())
        .env("REDRIVE__DATABASE__SCHEMA", &schema)
        .env("REDRIVE__DATABASE__CONNECT_TIMEOUT", "2s")
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn enqueue_refuses_a_delay_beyond_ten_years() {
    let (store, settings) = fresh_store().await;
    let out = enqueue(&settings, &["--handler", "log", "--delay", "300000y"], b"x");
    let stderr = failed_stderr(&out);
    assert!(
        stderr.contains("--delay") && stderr.contains("at most 10years"),
        "{stderr}"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        0
    );
    let out = enqueue(&settings, &["--handler", "log", "--delay", "9years"], b"x");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn enqueue_refuses_empty_input_unless_allowed() {
    let (store, settings) = fresh_store().await;
    let out = enqueue(&settings, &["--handler", "log"], b"");
    let stderr = failed_stderr(&out);
    assert!(
        stderr.contains("empty") && stderr.contains("--allow-empty"),
        "{stderr}"
    );
    let out = enqueue(&settings, &["--handler", "log", "--lines"], b"\n\n");
    let stderr = failed_stderr(&out);
    assert!(stderr.contains("no line"), "{stderr}");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        0
    );

    let out = enqueue(&settings, &["--handler", "log", "--allow-empty"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let length: i64 =
        sqlx::query_scalar("SELECT sum(length(msg_value))::bigint FROM recovery_task")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(length, 0, "one empty task");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        1
    );
}

#[tokio::test]
async fn enqueue_refuses_input_over_the_message_size_limit() {
    let (store, settings) = fresh_store().await;
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&[b'x'; 101]).unwrap();
    let limited = |args: &[&str], input: &[u8]| {
        let mut command = redrive(&settings);
        command
            .env("REDRIVE__INGEST__MAX_MESSAGE_BYTES", "100")
            .arg("enqueue")
            .args(args);
        with_input(command, input)
    };
    let path = file.path().to_str().unwrap();
    let out = limited(&["--handler", "log", "--file", path], b"");
    let stderr = failed_stderr(&out);
    assert!(stderr.contains("ingest.max_message_bytes"), "{stderr}");
    let mut lines = b"short\n".to_vec();
    lines.extend_from_slice(&[b'y'; 101]);
    let out = limited(&["--handler", "log", "--lines"], &lines);
    let stderr = failed_stderr(&out);
    assert!(
        stderr.contains("line 2") && stderr.contains("ingest.max_message_bytes"),
        "{stderr}"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        0,
        "nothing stored"
    );
    let out = limited(&["--handler", "log"], &[b'z'; 100]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Regression: repeating an enqueue with the same dedup key but another `--delay`
/// silently kept the first due time. The same delay is a repeat; another is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn enqueue_with_another_delay_for_an_existing_key_is_refused() {
    let (store, settings) = fresh_store().await;
    let args = ["--handler", "log", "--dedup-key", "k-1", "--delay", "1h"];
    assert!(enqueue(&settings, &args, b"x").status.success());
    let again = enqueue(&settings, &args, b"x");
    assert!(again.status.success(), "{again:?}");
    let other = ["--handler", "log", "--dedup-key", "k-1", "--delay", "5h"];
    let refused = enqueue(&settings, &other, b"x");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("asks for another time"));
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        1
    );
}

/// Regression (attack on the release binary): `bench --batch-sizes 0` panicked in the
/// claimer and then hung; a huge one aborted allocating; `--tasks 0` failed obscurely.
#[test]
fn bench_refuses_sizes_out_of_range_before_it_starts() {
    for args in [
        &["--batch-sizes", "0"][..],
        &["--batch-sizes", "2147483647"],
        &["--tasks", "0"],
        &["--concurrency", "0"],
        &["--runs", "0"],
        &["console", "--drain-window", "0s"],
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_redrive"))
            .arg("bench")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output_within(CHILD_LIMIT)
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        let flag = args[args.len() - 2];
        assert!(stderr.contains(flag), "{args:?} names its flag: {stderr}");
    }
}

/// Runs `redrive bench ARGS...` to its end and answers what it printed; fails the test
/// with both outputs when it fails.
fn bench_stdout(settings: &redrive::Settings, args: &[&str]) -> String {
    let output = redrive(settings)
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .output_within(CHILD_LIMIT)
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// `redrive bench` at tiny sizes, with its steady stream on a store never analysed:
/// every figure is printed and every streamed task checked resolved once. No rate is
/// asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bench_queue_runs_at_tiny_sizes_with_its_stream_on_a_store_never_analysed() {
    let (_store, settings) = fresh_store().await;
    let stdout = bench_stdout(
        &settings,
        &[
            "--tasks",
            "200",
            "--batch-sizes",
            "50",
            "--runs",
            "1",
            "--pickup-samples",
            "0",
            "--stream-rate",
            "300",
            "--stream-seconds",
            "3",
        ],
    );
    for line in [
        "steady stream on a store never analysed: 300 tasks/s offered for 3 s",
        "backlog",
        "stream's end:",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

/// `redrive bench webhook` at tiny sizes: its code path (the answering server on its
/// own thread, the interleaved drains, the CPU accounting, the breaker's held backlog and
/// the final check of every task) keeps working. No figure is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bench_webhook_runs_at_tiny_sizes_and_checks_its_tasks() {
    let (_store, settings) = fresh_store().await;
    let stdout = bench_stdout(
        &settings,
        &[
            "webhook",
            "--tasks",
            "300",
            "--concurrency",
            "8",
            "--runs",
            "1",
        ],
    );
    for expected in [
        "share of no-op",
        "CPU microseconds per task",
        "breaker isolation at concurrency 256",
        "checked: each task of every drain was resolved exactly once",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    let row = stdout
        .lines()
        .find(|line| line.split_whitespace().next() == Some("8"))
        .unwrap_or_else(|| panic!("no row for concurrency 8 in:\n{stdout}"));
    assert_eq!(row.split_whitespace().count(), 5, "{row}");
}

/// `redrive bench console` at tiny sizes: its code path (seeding, the admin router over
/// HTTP with a console sign-in, every timed query, the bulk action beside a drain and
/// both final checks) keeps working. No figure is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bench_console_runs_at_tiny_sizes_and_checks_its_tasks() {
    let (_store, settings) = fresh_store().await;
    let stdout = bench_stdout(
        &settings,
        &[
            "console",
            "--tasks",
            "2000",
            "--requests",
            "5",
            "--warmup",
            "1",
            "--bulk-tasks",
            "60000",
            "--drain-tasks",
            "100",
            "--rounds",
            "2",
            "--drain-window",
            "1s",
        ],
    );
    for line in [
        "console  unfiltered",
        "api      key_prefix=customer-4242:",
        "after VACUUM (ANALYZE)",
        "window  8: beside back-to-back requests",
        "beside a console in use: ",
        "of the drain alone beside it (median of 2;",
        "drained tasks resolved exactly once, ",
        "checked: the 2000 seeded tasks",
        "discard progress:",
        "ratio",
        "checked: 400 drained tasks resolved exactly once; 60000 bulk tasks failed",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

/// `redrive bench scale` on tiny stores: every size figure and member row is printed, and
/// the final check covers at least every task its drains were asked for. No rate is
/// asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bench_scale_prints_each_size_and_member_count_and_checks_its_tasks() {
    let (_store, settings) = fresh_store().await;
    let stdout = bench_stdout(
        &settings,
        &[
            "scale",
            "--backlogs",
            "200,500",
            "--final-rows",
            "300",
            "--drain",
            "200",
            "--members",
            "1,2",
            "--members-backlog",
            "300",
            "--batch",
            "20",
        ],
    );
    for line in [
        "-- 200 due: filled",
        "-- 500 due: filled",
        "-- 200 due + 300 final: filled",
        "spread of the drain over the store sizes",
        "-- members on one PostgreSQL",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    let member_rows = stdout
        .lines()
        .filter(|line| line.trim_start().starts_with("1 ") || line.trim_start().starts_with("2 "))
        .count();
    assert!(member_rows >= 2, "a row per member count:\n{stdout}");
    let checked: i64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("checked: each of the "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no final check in:\n{stdout}"));
    assert!(checked >= 200 * 3 + 300 * 2, "{checked} checked:\n{stdout}");
}

/// `redrive bench scale --members` with no count leaves the member figures out, as its
/// help says (an empty list used to be refused as "cannot parse integer").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bench_scale_without_member_counts_prints_only_the_sizes() {
    let (_store, settings) = fresh_store().await;
    let stdout = bench_stdout(
        &settings,
        &[
            "scale",
            "--backlogs",
            "200",
            "--final-rows",
            "0",
            "--drain",
            "200",
            "--members",
        ],
    );
    assert!(stdout.contains("-- 200 due: filled"), "{stdout}");
    assert!(!stdout.contains("-- members on one PostgreSQL"), "{stdout}");
}

/// `redrive bench horizon` at tiny lengths: a private server started with a setting of
/// the bench's (`--pg-set`), the stream, the snapshot held and released, the summary,
/// and the final check that each task was resolved once. No figure is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bench_horizon_runs_on_a_private_server_and_checks_its_tasks() {
    let (_store, settings) = fresh_store().await;
    let stdout = bench_stdout(
        &settings,
        &[
            "horizon",
            "--rate",
            "300",
            "--pg-set",
            "autovacuum=off",
            "--before",
            "2s",
            "--pin",
            "2s",
            "--after",
            "2s",
            "--window",
            "1s",
        ],
    );
    for line in [
        "on a private PostgreSQL server",
        "autovacuum=off",
        "-- snapshot taken",
        "-- snapshot released at 4s",
        "drain before the pin",
        "at its peak",
        "checked: each of the",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    for refused in [["--window", "0s"], ["--pg-set", "autovacuum"]] {
        let output = redrive(&settings)
            .args(["bench", "horizon"])
            .args(refused)
            .stdin(Stdio::null())
            .output_within(CHILD_LIMIT)
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{refused:?}");
        assert!(
            stderr.contains(refused[0]) || stderr.contains("name=value"),
            "{refused:?}: {stderr}"
        );
    }
}

/// On a fresh machine with no database server running (a network of its own, where
/// nothing answers at 127.0.0.1:5432) and no URL given, the demo starts a private
/// throwaway PostgreSQL from the server programs on the machine, says so, runs the
/// whole loop on it and removes it as it ends.
#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
fn the_demo_starts_a_private_postgresql_when_none_answers_and_no_url_is_given() {
    let isolated = Command::new("unshare")
        .args(["-n", "true"])
        .output()
        .expect("unshare (util-linux) runs");
    assert!(
        isolated.status.success(),
        "this test needs a network namespace of its own (root, or unprivileged namespaces): {}",
        String::from_utf8_lossy(&isolated.stderr)
    );
    let before = private_data_dirs();
    let mut demo = Command::new("unshare");
    demo.args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_redrive"))
        .args(["demo", "--messages", "40", "--rate", "400", "--no-console"])
        .args(["--transient", "0.2", "--permanent", "0.1"])
        .env_remove("DATABASE_URL")
        .env_remove("REDRIVE__DATABASE__URL")
        .env_remove("REDRIVE_CONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    let out = demo.output_within(Duration::from_secs(180)).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("none answers at 127.0.0.1:5432 and no DATABASE_URL is given")
            && stdout.contains("private throwaway server"),
        "{stdout}"
    );
    assert!(stdout.contains("tasks ingested          40"), "{stdout}");
    assert_eq!(
        private_data_dirs(),
        before,
        "the private server's data is removed"
    );
}

/// Without a server answering, a URL, or the server programs to start one (a mount of
/// its own hides `/usr/lib/postgresql`), the demo says how to get one and stops.
#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
fn the_demo_without_a_database_or_its_programs_says_how_to_get_one() {
    let empty = tempfile::tempdir().unwrap();
    let script = format!(
        "ip link set lo up && mount --bind {} /usr/lib/postgresql && exec \"$0\" \"$@\"",
        empty.path().display()
    );
    let out = Command::new("unshare")
        .args(["-m", "-n", "sh", "-c", &script])
        .arg(env!("CARGO_BIN_EXE_redrive"))
        .args(["demo", "--messages", "10", "--no-console"])
        .env_remove("DATABASE_URL")
        .env_remove("REDRIVE__DATABASE__URL")
        .env_remove("REDRIVE_CONFIG")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output_within(CHILD_LIMIT)
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no PostgreSQL server programs (initdb)")
            && stderr.contains("apt-get install postgresql")
            && stderr.contains("docker compose up"),
        "{stderr}"
    );
}

/// The private servers' data folders now in the temporary directory.
fn private_data_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("redrive-pg-"))
        .collect();
    dirs.sort();
    dirs
}
