//! Redriving safely in a real browser: the jobs page shows a paced job's step, pace and
//! why it paused, with Resume at a new rate; the approvals page lists an action waiting
//! for a second operator, who approves it there (the action runs); a transformed task's
//! page shows its version and the value as it came. Screenshots under
//! `target/console-screenshots/`.

use redrive::config::Role;
use redrive::operations::TransformRequest;
use redrive::operations::{ActRequest, Actor, FilterParams, OperationError, Runner, Verb};
use redrive::pace::PaceRequest;
use redrive::{Fleet, Settings};
use serde_json::json;
use std::time::Duration;

use crate::support::api::OPERATE;
use crate::support::console::{enqueue, task, Console};
use crate::support::{eventually, fresh_store, raw, scalar, Browser};

fn actor(name: &str) -> Actor {
    Actor {
        name: name.into(),
        role: Role::Operate,
    }
}

fn of_log() -> Option<FilterParams> {
    Some(FilterParams {
        handler: Some("log".into()),
        ..FilterParams::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_operator_resumes_a_paused_job_approves_a_large_action_and_reads_a_transformed_task() {
    let (store, settings) = fresh_store().await;
    let ids = enqueue(
        &store,
        (1..=3)
            .map(|i| {
                let mut t = task("log", format!("k{i}").as_bytes(), br#"{"amount":150}"#);
                t.status = redrive::Status::PermanentFailure;
                t
            })
            .collect(),
    )
    .await;
    let mut approving: Settings = settings.clone();
    approving.operations.approval_over = Some(2);
    let operations = Fleet::builder(approving.clone())
        .build()
        .unwrap()
        .operations(store.clone());

    // A transform of one task (one task: under the threshold).
    let transform = TransformRequest {
        ids: vec![ids[0].0],
        transform: raw(json!([{"op": "rename", "from": "/amount", "path": "/amount_cents"}])),
        reason: Some("schema v3".into()),
        ..TransformRequest::default()
    };
    let done = operations
        .transform(&actor("alice"), &transform)
        .await
        .unwrap();
    assert_eq!(done.changed, 1);

    // A paced retry of two tasks, paused by hand with a hostile reason.
    let paced = ActRequest {
        ids: vec![ids[1].0, ids[2].0],
        reason: Some("billing is back".into()),
        pace: Some(PaceRequest {
            rate: Some(50.0),
            ramp: Some("10%,100%".into()),
            ..PaceRequest::default()
        }),
        ..ActRequest::default()
    };
    let job = operations
        .act_by(
            &actor("alice"),
            Verb::Retry,
            &paced,
            Runner::Here("a-cli"),
            |_| {},
        )
        .await
        .unwrap()
        .job
        .unwrap();
    let why = "7 of 9 outcomes failed <script>alert(1)</script>";
    assert!(store.pause_job(job.id, "a-cli", why).await.unwrap());

    // A retry of all three waits for a second operator.
    let all = ActRequest {
        filter: of_log(),
        reason: Some("<b>all</b> of them".into()),
        force: true,
        ..ActRequest::default()
    };
    let approval = match operations
        .act(&actor("alice"), Verb::Retry, &all, |_| {})
        .await
    {
        Err(OperationError::NeedsApproval { approval, .. }) => approval,
        other => panic!("held: {other:?}"),
    };

    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[operations]\napproval_over = 2\n").unwrap();
    let console = Console::start_configured(&settings, false, Some(config.path())).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/replays").await;

    let row = browser.text(&format!("#job-{}", job.id)).await;
    assert!(
        row.contains("retry") && row.contains("paused") && row.contains(why),
        "the paused job and why, as text: {row}"
    );
    assert!(row.contains("step 1 of 2"), "{row}");
    assert_eq!(browser.open_dialog().await, None, "no script ran");
    browser.screenshot("jobs-paused").await;

    browser.open(&console.url("/console/approvals")).await;
    let waiting = browser.text(&format!("#approval-{}", approval.id)).await;
    assert!(
        waiting.contains("alice") && waiting.contains("<b>all</b> of them"),
        "{waiting}"
    );
    browser.screenshot("approvals").await;
    browser
        .fill(
            &format!("#approval-{} form[action$='/approve'] input", approval.id),
            "checked",
        )
        .await;
    browser
        .follow(&format!("#approval-{} button.approve", approval.id))
        .await;
    eventually(
        Duration::from_secs(20),
        "the approved retry ran",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'failed'",
            )
            .await
                == 3
        },
    )
    .await;
    let decided = browser.text("#decided").await;
    assert!(decided.contains("Decided"), "{decided}");
    assert!(
        browser
            .text(&format!("#approval-{}", approval.id))
            .await
            .contains("by ops"),
        "decided by the console's operator"
    );
    browser.screenshot("approvals-decided").await;

    // A paced retry from the task list: its confirm page takes a rate and a ramp, and
    // the job it records is followed on the Replays page.
    browser
        .open(&console.url("/console/tasks?handler=log&key=k1"))
        .await;
    browser.click("#select-filter").await;
    browser.follow("#act button[value=retry]").await;
    browser.fill("#c-reason", "one first").await;
    browser.fill("#c-rate", "20").await;
    browser.fill("#c-ramp", "10%,100%").await;
    browser.screenshot("confirm-paced-retry").await;
    browser.follow("#confirm").await;
    assert_eq!(browser.path().await, "/console/replays");
    let jobs = scalar(
        &store,
        "SELECT count(*) FROM recovery_replay WHERE kind = 'retry'",
    )
    .await;
    assert_eq!(jobs, 2, "the console recorded a paced retry job");
    let newest = scalar(&store, "SELECT max(id) FROM recovery_replay").await;
    let row = browser.text(&format!("#job-{newest}")).await;
    assert!(row.contains("retry") && row.contains("of 2, 2/s"), "{row}");

    browser
        .open(&console.url(&format!("/console/tasks/{}", ids[0])))
        .await;
    let message = browser.text("section[aria-labelledby=message]").await;
    assert!(
        message.contains("version 2, transformed") && message.contains("Value as it came"),
        "{message}"
    );
    assert!(
        message.contains("amount_cents") && message.contains("\"amount\""),
        "{message}"
    );
    browser.screenshot("task-transformed").await;
}
