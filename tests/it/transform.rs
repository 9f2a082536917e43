//! Fixing payloads before redriving them: a dry run that counts and shows a diff and
//! changes nothing; new versions with the value as it came kept; every task transformed
//! whole or not at all (a failing op, a payload changed between read and write); clear
//! refusals of non-JSON payloads and bad transforms.

use redrive::operations::{Actor, FilterParams, OperationError, TransformRequest};
use redrive::store::NewPayload;
use redrive::{Failure, NewTask, Status, Store, TaskId};
use serde_json::json;

use crate::support::cli::run;
use crate::support::{fresh_store, raw, scalar};

async fn task(store: &Store, value: &[u8], status: Status) -> TaskId {
    let task = NewTask {
        handler: "h".into(),
        status,
        failure: Failure {
            value: Some(value.to_vec()),
            ..Failure::default()
        },
        ..NewTask::default()
    };
    store.enqueue(&task).await.unwrap().id()
}

async fn value(store: &Store, id: TaskId) -> Vec<u8> {
    store.get(id).await.unwrap().unwrap().failure.value.unwrap()
}

fn of_h(transform: serde_json::Value, dry_run: bool) -> TransformRequest {
    TransformRequest {
        filter: Some(FilterParams {
            handler: Some("h".into()),
            ..FilterParams::default()
        }),
        transform: raw(transform),
        reason: Some("the schema moved on".into()),
        dry_run,
        ..TransformRequest::default()
    }
}

fn rename() -> serde_json::Value {
    json!([{"op": "rename", "from": "/amount", "path": "/amount_cents"}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_counts_and_shows_a_diff_and_the_transform_keeps_the_original() {
    let (store, settings) = fresh_store().await;
    let fleet = redrive::Fleet::builder(settings.clone()).build().unwrap();
    let operations = fleet.operations(store.clone());
    let old = br#"{"id":12345678901234567890123,"amount":1.50,"x":"\u00e9"}"#;
    let changes = task(&store, old, Status::PermanentFailure).await;
    let leaves = task(&store, br#"{"other":1}"#, Status::Failed).await;
    let not_json = task(&store, b"\xff\xfe not json", Status::Discarded).await;
    let done = task(&store, br#"{"amount":1}"#, Status::Resolved).await;

    let preview = operations
        .transform(&Actor::shell(), &of_h(rename(), true))
        .await
        .unwrap();
    assert_eq!(
        (
            preview.matched,
            preview.changed,
            preview.unchanged,
            preview.failed
        ),
        (3, 1, 1, 1),
        "{preview:?}"
    );
    assert_eq!(preview.sample[0].task, changes.0);
    let diff: Vec<String> = preview.sample[0]
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert!(diff.iter().any(|d| d.contains("/amount_cents")), "{diff:?}");
    assert_eq!(preview.failures[0].task, not_json.0);
    assert!(
        preview.failures[0].reason.contains("not"),
        "{:?}",
        preview.failures
    );
    assert_eq!(preview.audit_id, None);
    assert_eq!(
        value(&store, changes).await,
        old.to_vec(),
        "a dry run changes nothing"
    );

    let answer = operations
        .transform(&Actor::shell(), &of_h(rename(), false))
        .await
        .unwrap();
    assert_eq!((answer.changed, answer.unchanged, answer.failed), (1, 1, 1));
    // Untouched parts kept as written: the big number, 1.50, the escape.
    assert_eq!(
        value(&store, changes).await,
        br#"{"id":12345678901234567890123,"amount_cents":1.50,"x":"\u00e9"}"#.to_vec()
    );
    let detail = operations.show(changes.0).await.unwrap();
    assert_eq!(detail.payload_version, 2);
    assert_eq!(
        detail.original_value.unwrap().line(),
        String::from_utf8_lossy(old)
    );
    for (id, bytes) in [
        (leaves, &br#"{"other":1}"#[..]),
        (not_json, &b"\xff\xfe not json"[..]),
        (done, &br#"{"amount":1}"#[..]),
    ] {
        assert_eq!(
            value(&store, id).await,
            bytes.to_vec(),
            "task {id} untouched"
        );
    }
    let audit_count = scalar(
        &store,
        &format!(
            "SELECT count FROM recovery_audit WHERE id = {}",
            answer.audit_id.unwrap()
        ),
    )
    .await;
    assert_eq!(audit_count, 1);

    // Again: nothing left to rename; no new version.
    let again = operations
        .transform(&Actor::shell(), &of_h(rename(), false))
        .await
        .unwrap();
    assert_eq!((again.changed, again.unchanged), (0, 2));
    assert_eq!(operations.show(changes.0).await.unwrap().payload_version, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_failing_on_some_tasks_or_racing_a_change_leaves_each_whole_or_untouched() {
    let (store, settings) = fresh_store().await;
    let fleet = redrive::Fleet::builder(settings.clone()).build().unwrap();
    let operations = fleet.operations(store.clone());
    let with_customer = task(&store, br#"{"a":1,"customer":{}}"#, Status::Failed).await;
    let without = task(&store, br#"{"a":1}"#, Status::Failed).await;
    // The first op applies to both; the second fails where /customer is missing.
    let two = json!([
        {"op": "set", "path": "/a", "value": 2},
        {"op": "set", "path": "/customer/tier", "value": "gold"}
    ]);
    let answer = operations
        .transform(&Actor::shell(), &of_h(two, false))
        .await
        .unwrap();
    assert_eq!((answer.changed, answer.failed), (1, 1), "{answer:?}");
    assert_eq!(
        value(&store, with_customer).await,
        br#"{"a":2,"customer":{"tier":"gold"}}"#.to_vec()
    );
    assert_eq!(
        value(&store, without).await,
        br#"{"a":1}"#.to_vec(),
        "untouched, op 1 too"
    );

    // A payload changed between the read and the write is not overwritten.
    let audit = scalar(&store, "SELECT max(id) FROM recovery_audit").await;
    let stale = NewPayload {
        id: without,
        old: br#"{"a":0}"#.to_vec(),
        new: br#"{"a":9}"#.to_vec(),
    };
    let written = store.write_payloads(audit, &[stale]).await.unwrap();
    assert!(written.is_empty());
    assert_eq!(value(&store, without).await, br#"{"a":1}"#.to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transforms_and_hostile_payloads_get_clear_answers() {
    let (store, settings) = fresh_store().await;
    let fleet = redrive::Fleet::builder(settings.clone()).build().unwrap();
    let operations = fleet.operations(store.clone());
    let huge = vec![b'['; 1_000_000];
    let deep = task(&store, &huge, Status::Failed).await;
    let big_text = format!(r#"{{"amount":1,"blob":"{}"}}"#, "x".repeat(2_000_000));
    let big = task(&store, big_text.as_bytes(), Status::Failed).await;
    let answer = operations
        .transform(&Actor::shell(), &of_h(rename(), false))
        .await
        .unwrap();
    assert_eq!((answer.changed, answer.failed), (1, 1), "{answer:?}");
    assert_eq!(answer.failures[0].task, deep.0);
    assert!(value(&store, big)
        .await
        .starts_with(br#"{"amount_cents":1,"#));

    for (transform, expected) in [
        (json!([]), "transform:"),
        (json!([{"op": "explode", "path": "/a"}]), "op"),
        (
            json!([{"op": "set", "path": "", "value": 1}]),
            "op 0 (set): path",
        ),
        (json!({"op": "set"}), "transform:"),
    ] {
        match operations
            .transform(&Actor::shell(), &of_h(transform.clone(), true))
            .await
        {
            Err(OperationError::BadRequest(why)) => {
                assert!(why.contains(expected), "{transform}: {why}")
            }
            other => panic!("{transform}: {other:?}"),
        }
    }
    let no_reason = TransformRequest {
        reason: None,
        ..of_h(rename(), false)
    };
    let refused = operations.transform(&Actor::shell(), &no_reason).await;
    assert!(matches!(refused, Err(OperationError::BadRequest(ref why)) if why.contains("reason")));
    let audits = scalar(&store, "SELECT count(*) FROM recovery_audit").await;
    assert_eq!(audits, 1, "only the one transform applied is on the record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shows_the_diff_on_a_dry_run_and_writes_after_yes() {
    let (store, settings) = fresh_store().await;
    let id = task(&store, br#"{"currency":"EUR"}"#, Status::PermanentFailure).await;
    let spec = r#"[{"op":"map","path":"/currency","from_value":"EUR","to":"eur"}]"#;
    let dry = run(
        &settings,
        &[
            "tasks",
            "transform",
            "--handler",
            "h",
            "--spec",
            spec,
            "--dry-run",
        ],
    );
    let out = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(out.contains("would change 1 of 1 task(s)"), "{out}");
    assert!(out.contains(r#"/currency: "EUR" → "eur""#), "{out}");
    assert_eq!(value(&store, id).await, br#"{"currency":"EUR"}"#.to_vec());

    let done = run(
        &settings,
        &[
            "tasks",
            "transform",
            "--handler",
            "h",
            "--spec",
            spec,
            "--reason",
            "lowercase",
            "--yes",
        ],
    );
    let out = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(out.contains("1 payload(s) changed"), "{out}");
    assert_eq!(value(&store, id).await, br#"{"currency":"eur"}"#.to_vec());
    let show = run(&settings, &["tasks", "show", &id.0.to_string()]);
    let out = String::from_utf8_lossy(&show.stdout);
    assert!(
        out.contains("value as it came (the value above is version 2"),
        "{out}"
    );

    let bad = run(
        &settings,
        &[
            "tasks",
            "transform",
            "--handler",
            "h",
            "--spec",
            "[{",
            "--dry-run",
        ],
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not JSON"));
}

/// Found by the attack: the faces parsed a transform into a JSON value first, which keeps
/// the last of two duplicate keys and turns 12345678901234567890123 into a double; the
/// parser's refusals of both never ran. The text as sent is parsed now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_is_read_from_the_text_as_sent() {
    let (store, settings) = fresh_store().await;
    task(&store, br#"{"x":1}"#, Status::Failed).await;
    let fleet = redrive::Fleet::builder(settings.clone()).build().unwrap();
    let operations = fleet.operations(store.clone());
    for (text, expected) in [
        (
            r#"[{"op":"set","path":"/big","value":12345678901234567890123}]"#,
            "exactly",
        ),
        (r#"[{"op":"set","op":"remove","path":"/x"}]"#, "op"),
        (r#"[{"op":"remove","path":"/x","path":"/y"}]"#, "path"),
    ] {
        let request = TransformRequest {
            transform: Some(serde_json::value::RawValue::from_string(text.into()).unwrap()),
            ..of_h(json!(null), true)
        };
        match operations.transform(&Actor::shell(), &request).await {
            Err(OperationError::BadRequest(why)) => {
                assert!(why.contains(expected), "{text}: {why}")
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let big = r#"[{"op":"set","path":"/big","value":12345678901234567890123}]"#;
    let cli = run(
        &settings,
        &[
            "tasks",
            "transform",
            "--handler",
            "h",
            "--spec",
            big,
            "--dry-run",
        ],
    );
    assert!(!cli.status.success());
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("exactly"),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
}
