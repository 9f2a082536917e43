//! Recovery points: checkpoints saved under the lease, and a multi-step handler killed
//! between its steps.

use redrive::handlers::CheckpointError;
use redrive::store::Finish;
use redrive::task::FinishOutcome;
use redrive::{HandlerContext, NewTask};
use secrecy::ExposeSecret;
use serde_json::json;
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{eventually, fresh_store, scalar};
use crate::support::{Bounded, CHILD_LIMIT};

#[tokio::test]
async fn a_stale_attempts_checkpoint_is_refused_and_the_next_attempt_gets_the_last_one() {
    let (store, _) = fresh_store().await;
    let id = store.enqueue(&NewTask::new("h", "x")).await.unwrap().id();
    let handlers = ["h".to_owned()];
    let first = store
        .claim(&handlers, 1, "a", Duration::from_millis(50))
        .await
        .unwrap();
    assert!(store
        .save_checkpoint(first[0].lease(), &json!({"step": 1}))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The lease lapsed: another worker takes the task over and finds step 1.
    let second = store
        .claim(&handlers, 1, "b", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(second[0].checkpoint, Some(json!({"step": 1})));
    let stale = store
        .save_checkpoint(first[0].lease(), &json!({"step": 99}))
        .await
        .unwrap();
    assert!(!stale, "the stale attempt's checkpoint is refused");
    assert!(store
        .save_checkpoint(second[0].lease(), &json!({"step": 2}))
        .await
        .unwrap());
    let retry = Finish {
        cause: None,
        lease: second[0].lease(),
        outcome: FinishOutcome::Retry {
            at: chrono::Utc::now(),
        },
        started_at: chrono::Utc::now(),
        duration: Duration::ZERO,
        error: Some("later".into()),
        compensate: false,
    };
    store.finish("b", &[retry]).await.unwrap();
    let third = store
        .claim(&handlers, 1, "c", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(third[0].id, id);
    assert_eq!(third[0].checkpoint, Some(json!({"step": 2})));

    let detached = HandlerContext::new("w", 1, Default::default());
    assert!(matches!(
        detached.save_checkpoint(&json!({})).await,
        Err(CheckpointError::Unavailable)
    ));
}

/// The `checkout_saga` example's binary, which `cargo test` builds beside redrive's.
fn checkout(settings: &redrive::Settings, ledger: &std::path::Path, pause: bool) -> Child {
    checkout_with(settings, ledger, pause, &[])
}

/// [`checkout`] with more environment variables.
fn checkout_with(
    settings: &redrive::Settings,
    ledger: &std::path::Path,
    pause: bool,
    env: &[(&str, &str)],
) -> Child {
    let redrive = std::path::Path::new(env!("CARGO_BIN_EXE_redrive"));
    let example = redrive.parent().unwrap().join("examples/checkout_saga");
    let mut command = Command::new(&example);
    command
        .arg("run")
        .env(
            "REDRIVE__DATABASE__URL",
            settings.database.url.expose_secret(),
        )
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .env("REDRIVE__WORKER__LEASE", "2s")
        .env("REDRIVE__WORKER__HEARTBEAT", "500ms")
        .env("REDRIVE__WORKER__POLL_INTERVAL", "100ms")
        .env("CHECKOUT_LEDGER", ledger)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if pause {
        command.env("CHECKOUT_PAUSE_AFTER", "take_payment");
    }
    command.envs(env.iter().copied());
    command
        .spawn()
        .unwrap_or_else(|e| panic!("{} (built by cargo test): {e}", example.display()))
}

fn ledger_lines(ledger: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_checkout_example_killed_between_steps_repeats_no_side_effect() {
    let (store, settings) = fresh_store().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let tasks: Vec<NewTask> = (0..3)
        .map(|i| NewTask::new("checkout", format!("{{\"order\": {i}}}")))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();

    let mut paused = checkout(&settings, &ledger, true);
    let paused_marks = ledger.with_extension("paused");
    eventually(
        Duration::from_secs(30),
        "every task paid, checkpointed and paused",
        || async { ledger_lines(&paused_marks).len() == 3 },
    )
    .await;
    assert_eq!(ledger_lines(&ledger).len(), 6);
    // Killed between "take_payment" and "publish_event".
    paused.kill().unwrap();
    paused.wait().unwrap();

    let mut member = checkout(&settings, &ledger, false);
    eventually(Duration::from_secs(30), "every task resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 3
    })
    .await;
    member.kill().unwrap();
    member.wait().unwrap();

    let mut effects: BTreeMap<String, usize> = BTreeMap::new();
    for line in ledger_lines(&ledger) {
        *effects.entry(line).or_default() += 1;
    }
    assert_eq!(effects.len(), 9, "three steps of three tasks: {effects:?}");
    assert!(
        effects.values().all(|&n| n == 1),
        "a side effect repeated: {effects:?}"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE attempts = 2"
        )
        .await,
        3,
        "each task took the attempt that was killed and the one that finished"
    );
}

/// A refused order fails for good after its payment, with the process killed between
/// steps first: the compensation undoes exactly the steps done, last first, once, and
/// `redrive tasks show` tells it.
#[tokio::test]
async fn the_checkout_examples_refused_orders_are_compensated_once() {
    let (store, settings) = fresh_store().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let tasks = vec![
        NewTask::new("checkout", r#"{"order": 1, "refuse": true}"#),
        NewTask::new("checkout", r#"{"order": 2}"#),
    ];
    let ids: Vec<_> = store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();

    let mut paused = checkout(&settings, &ledger, true);
    let paused_marks = ledger.with_extension("paused");
    eventually(Duration::from_secs(30), "both tasks paused", || async {
        ledger_lines(&paused_marks).len() == 2
    })
    .await;
    paused.kill().unwrap();
    paused.wait().unwrap();

    let mut member = checkout(&settings, &ledger, false);
    eventually(
        Duration::from_secs(30),
        "the refund and cancellation",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_compensation WHERE state = 'compensated'",
            )
            .await
                == 1
        },
    )
    .await;
    member.kill().unwrap();
    member.wait().unwrap();

    let refused = ids[0].0;
    let lines: Vec<String> = ledger_lines(&ledger)
        .into_iter()
        .filter(|l| l.starts_with(&format!("task:{refused} ")))
        .collect();
    assert_eq!(
        lines,
        [
            "save_order",
            "take_payment",
            "refund_payment",
            "cancel_order"
        ]
        .map(|step| format!("task:{refused} {step}")),
        "each step once, undone last first"
    );
    assert_eq!(
        scalar(
            &store,
            &format!("SELECT count(*) FROM recovery_task WHERE id = {refused} AND status = 'permanent_failure'")
        )
        .await,
        1
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_compensation").await,
        1,
        "the resolved order owes nothing"
    );

    let shown = crate::support::cli::redrive(&settings)
        .args(["tasks", "show", &refused.to_string()])
        .output_within(CHILD_LIMIT)
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{text}");
    assert!(
        text.contains("compensation           compensated after 1 attempt(s)"),
        "{text}"
    );
}

/// Regression: a retry after the compensation ran resumed from the checkpoint the
/// compensation undid, publishing the event of a refunded, cancelled order. A plain
/// retry is now refused; a forced one starts over from the first step.
#[tokio::test]
async fn the_checkout_examples_compensated_order_is_retried_only_by_force_and_from_the_start() {
    let (store, settings) = fresh_store().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let id = store
        .enqueue(&NewTask::new("checkout", r#"{"order": 1, "refuse": true}"#))
        .await
        .unwrap()
        .id();
    let mut member = checkout(&settings, &ledger, false);
    eventually(Duration::from_secs(30), "the order compensated", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_compensation WHERE state = 'compensated'",
        )
        .await
            == 1
    })
    .await;
    member.kill().unwrap();
    member.wait().unwrap();
    let steps = |steps: &[&str]| -> Vec<String> {
        steps
            .iter()
            .map(|step| format!("task:{id} {step}"))
            .collect()
    };
    let undone = steps(&[
        "save_order",
        "take_payment",
        "refund_payment",
        "cancel_order",
    ]);
    assert_eq!(ledger_lines(&ledger), undone);

    // The downstream now accepts the order; an operator retries it.
    let mut member = checkout_with(
        &settings,
        &ledger,
        false,
        &[("CHECKOUT_ACCEPT_REFUSED", "1")],
    );
    let id_text = id.to_string();
    let plain = crate::support::cli::run(&settings, &["tasks", "retry", &id_text, "--yes"]);
    let said = String::from_utf8_lossy(&plain.stderr);
    assert!(!plain.status.success(), "a plain retry is refused: {said}");
    assert!(said.contains("--force"), "{said}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ledger_lines(&ledger), undone, "nothing ran");

    let forced =
        crate::support::cli::run(&settings, &["tasks", "retry", &id_text, "--force", "--yes"]);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    eventually(Duration::from_secs(30), "the order resolved", || async {
        store.get(id).await.unwrap().unwrap().status == redrive::Status::Resolved
    })
    .await;
    member.kill().unwrap();
    member.wait().unwrap();
    let mut expected = undone.clone();
    expected.extend(steps(&["save_order", "take_payment", "publish_event"]));
    assert_eq!(
        ledger_lines(&ledger),
        expected,
        "redone from the first step"
    );
}
