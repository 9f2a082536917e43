//! The console's action flows in a real browser against a real member process: a bulk
//! discard by filter with its count confirmed and its progress followed to the end,
//! two ticked tasks retried from the keyboard alone; and over plain HTTP, the refusal of
//! a read-only session's and a cross-site request's writes. Screenshots of each new page
//! are saved under `target/console-screenshots/`.

use fantoccini::key::Key;
use fantoccini::Locator;
use redrive::store::{Action, Operator, Selection};
use redrive::Store;
use reqwest::header::SET_COOKIE;
use reqwest::StatusCode;
use std::time::{Duration, Instant};

use crate::admin_api::{OPERATE, READ};
use crate::console::{assert_secured, enqueue, task, Console};
use crate::support::{fresh_store, scalar, Browser};

/// Presses Enter on the focused control and waits until the browser left the page.
async fn enter_and_leave(browser: &Browser) {
    let page = browser.client.find(Locator::Css("html")).await.unwrap();
    browser.press(Key::Enter).await;
    let start = Instant::now();
    while page.attr("lang").await.is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Enter left no page"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the progress page says its action ended.
async fn wait_for_the_end(browser: &Browser) -> String {
    let mut state = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let job = browser.client.find(Locator::Css("[data-job-state]")).await;
        // The live region may replace the element between finding and reading it.
        if let Ok(job) = job {
            if let Ok(Some(now)) = job.attr("data-job-state").await {
                state = now;
                if state != "running" {
                    return state;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let main = browser.text("main").await;
    panic!(
        "{}: the bulk action's page says {state:?}: {main}",
        browser.path().await
    );
}

async fn status_count(store: &Store, handler: &str, status: &str) -> i64 {
    scalar(
        store,
        &format!(
            "SELECT count(*) FROM recovery_task WHERE handler = '{handler}' AND status = '{status}'"
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_discards_by_filter_after_confirming_the_count_and_retries_two_ticked_tasks() {
    let (store, settings) = fresh_store().await;
    enqueue(
        &store,
        (1..=7)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    let billing = enqueue(
        &store,
        (1..=3)
            .map(|i| task("billing", format!("invoice-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console
        .sign_in(&browser, OPERATE, "/console/tasks?handler=orders")
        .await;

    // Every task the filter selects: the list says how many, the confirm page too.
    assert_eq!(browser.text("#act .matching").await, "7");
    browser.screenshot("tasks-with-actions").await;
    browser.click("#select-filter").await;
    browser.follow("#act button[value=discard]").await;
    assert_eq!(browser.path().await, "/console/actions/preview");
    assert_eq!(browser.text(".exact-count").await, "7");
    assert!(browser.text("table.sample").await.contains("order-1"));
    browser.screenshot("confirm-discard").await;
    // Without a reason the browser does not send the form.
    browser.click("#confirm").await;
    assert_eq!(browser.path().await, "/console/actions/preview");
    browser.fill("#c-reason", "orders replayed upstream").await;
    browser.follow("#confirm").await;
    assert!(browser.path().await.starts_with("/console/jobs/"));
    assert_eq!(wait_for_the_end(&browser).await, "done");
    assert_eq!(browser.text(".final-changed").await, "7");
    browser.screenshot("progress-done").await;
    assert_eq!(status_count(&store, "orders", "discarded").await, 7);
    assert_eq!(status_count(&store, "billing", "failed").await, 3);
    let audit_id = browser.text(".audit-id").await;
    assert_eq!(
        scalar(
            &store,
            &format!(
                "SELECT count(*) FROM recovery_audit WHERE id = {audit_id} AND action = 'discard' \
                 AND actor = 'ops' AND reason = 'orders replayed upstream'"
            ),
        )
        .await,
        1
    );

    // Two tasks ticked on the list, retried, the confirmation typed from the keyboard.
    let operator = Operator {
        actor: "test".into(),
        reason: Some("set up".into()),
    };
    let two = Selection::Ids(vec![billing[0], billing[1]]);
    store.act(&operator, &Action::Discard, &two).await.unwrap();
    browser
        .open(&console.url("/console/tasks?handler=billing"))
        .await;
    for id in [billing[0], billing[1]] {
        browser.click(&format!("#select-{id}")).await;
    }
    browser.follow("#act button[value=retry]").await;
    assert_eq!(browser.text(".exact-count").await, "2");
    browser.screenshot("confirm-retry").await;
    browser.tab_to("c-reason").await;
    browser.type_here("downstream fixed").await;
    browser.tab_to("confirm").await;
    enter_and_leave(&browser).await;
    assert_eq!(wait_for_the_end(&browser).await, "done");
    assert_eq!(status_count(&store, "billing", "failed").await, 3);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_audit WHERE action = 'retry' AND reason = 'downstream fixed'",
        )
        .await,
        1
    );
}

/// Signs in over HTTP with `token`: the session cookie.
async fn session(client: &reqwest::Client, console: &Console, token: &str) -> String {
    let signed_in = client
        .post(console.url("/console/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let cookie = signed_in.headers()[SET_COOKIE].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

/// The console's write endpoints, each with a form that would change something.
fn writes(task: i64) -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let discard = vec![
        ("verb", "discard".to_owned()),
        ("id", task.to_string()),
        ("reason", "forged".to_owned()),
    ];
    vec![
        ("/console/actions/preview", discard.clone()),
        ("/console/actions/run", discard),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_session_and_a_cross_site_request_change_nothing() {
    let (store, settings) = fresh_store().await;
    let task = enqueue(&store, vec![task("orders", b"k", b"v")]).await[0].0;
    let console = Console::start(&settings, false).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let reader = session(&client, &console, READ).await;
    let operator = session(&client, &console, OPERATE).await;
    for (path, form) in writes(task) {
        let forged = client
            .post(console.url(path))
            .header("cookie", &reader)
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN, "read-only {path}");
        for (name, value) in [
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://evil.example"),
        ] {
            let answer = client
                .post(console.url(path))
                .header("cookie", &operator)
                .header(name, value)
                .form(&form)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{path} {name}");
            assert_secured(path, answer.headers());
        }
    }
    assert_eq!(status_count(&store, "orders", "failed").await, 1);
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_audit").await,
        0,
        "nothing was audited"
    );
}
