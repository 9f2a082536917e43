//! The console's action flows in a real browser against a real member process: a bulk
//! discard by filter with its count confirmed and its progress followed to the end,
//! two ticked tasks retried from the keyboard alone; and over plain HTTP, the refusal of
//! a read-only session's and a cross-site request's writes. Screenshots of each new page
//! are saved under `target/console-screenshots/`.

use fantoccini::key::Key;
use fantoccini::Locator;
use redrive::store::{Action, NewReplay, Operator, Selection, TaskFilter};
use redrive::Store;
use reqwest::StatusCode;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::support::api::{OPERATE, READ};
use crate::support::broker::cluster;
use crate::support::console::{assert_secured, enqueue, session, task, Console};
use crate::support::{eventually, fresh_store, scalar, Browser};

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
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
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
    // Found by an attack: tasks stored while the operator read the count were acted on
    // too (confirmed 3, discarded 8). What is confirmed is what existed at the count.
    enqueue(
        &store,
        (8..=10)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    browser.follow("#confirm").await;
    assert!(browser.path().await.starts_with("/console/jobs/"));
    assert_eq!(wait_for_the_end(&browser).await, "done");
    assert_eq!(browser.text(".final-changed").await, "7");
    browser.screenshot("progress-done").await;
    assert_eq!(status_count(&store, "orders", "discarded").await, 7);
    assert_eq!(
        status_count(&store, "orders", "failed").await,
        3,
        "stored after the count"
    );
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

    // One task resolved from its own page.
    browser
        .open(&console.url(&format!("/console/tasks/{}", billing[2])))
        .await;
    browser
        .follow("form.task-actions button[value=resolve]")
        .await;
    assert_eq!(browser.text(".exact-count").await, "1");
    browser.fill("#c-reason", "handled by hand").await;
    browser.follow("#confirm").await;
    assert_eq!(wait_for_the_end(&browser).await, "done");
    assert_eq!(status_count(&store, "billing", "resolved").await, 1);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_audit WHERE action = 'retry' AND reason = 'downstream fixed'",
        )
        .await,
        1
    );
}

/// The console's write endpoints, each with a form that would change something.
fn writes(task: i64) -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let discard = vec![
        ("verb", "discard".to_owned()),
        ("id", task.to_string()),
        ("reason", "forged".to_owned()),
    ];
    let reason = vec![("reason", "forged".to_owned())];
    vec![
        ("/console/actions/preview", discard.clone()),
        ("/console/actions/run", discard),
        ("/console/replays/1/cancel", Vec::new()),
        ("/console/replays/1/resume", Vec::new()),
        ("/console/breakers/log/open", reason.clone()),
        ("/console/brakes/incoming/release", reason.clone()),
        (
            "/console/brakes/engage",
            vec![
                ("route", "incoming".to_owned()),
                ("reason", "forged".into()),
            ],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_session_and_a_cross_site_request_change_nothing() {
    let (store, settings) = fresh_store().await;
    let task = enqueue(&store, vec![task("orders", b"k", b"v")]).await[0].0;
    let replay = NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: TaskFilter::default(),
        target_topic: Some("elsewhere".into()),
        mark_resolved: false,
        rate: None,
        detached: false,
        approval: None,
        most: None,
    };
    let operator = Operator {
        actor: "test".into(),
        reason: None,
    };
    let job = store
        .create_replay(&operator, &replay, "gone")
        .await
        .unwrap();
    assert_eq!(job.id, 1);
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
    assert_eq!(replay_status(&store, 1).await, "running");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_audit").await,
        1,
        "nothing but the replay's start was audited"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_brake").await,
        0
    );
}

async fn replay_status(store: &Store, id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM recovery_replay WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_operator_starts_cancels_and_resumes_replays_and_engages_and_releases_a_brake() {
    let kafka = cluster(&[("incoming.dlt", 1), ("replayed", 1)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    write!(
        config,
        // A route name that is not a path segment as it stands: its release address
        // must carry it percent-encoded.
        "[[routes]]\nname = \"in coming/eu?1\"\ntopics = [\"incoming.dlt\"]\n\
         mode = \"capture\"\nhandler = \"log\"\n[handlers.log.breaker]\n"
    )
    .unwrap();
    enqueue(
        &store,
        (1..=30)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    enqueue(
        &store,
        (1..=3)
            .map(|i| task("billing", format!("invoice-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    // A job whose runner died an hour ago: the console offers to resume it.
    let operator = Operator {
        actor: "test".into(),
        reason: None,
    };
    let stalled = NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: TaskFilter {
            handler: Some("billing".into()),
            ..TaskFilter::default()
        },
        target_topic: Some("replayed".into()),
        mark_resolved: false,
        rate: None,
        detached: false,
        approval: None,
        most: None,
    };
    let stalled = store
        .create_replay(&operator, &stalled, "a-runner-that-died")
        .await
        .unwrap()
        .id;
    sqlx::query("UPDATE recovery_replay SET heartbeat_at = now() - interval '1 hour'")
        .execute(store.pool())
        .await
        .unwrap();
    let console = Console::start_configured(&settings, false, Some(config.path())).await;
    let browser = Browser::start().await;
    console
        .sign_in(&browser, OPERATE, "/console/tasks?handler=orders")
        .await;

    // A slow replay of every orders task, started from the list, then cancelled.
    browser.click("#select-filter").await;
    browser.follow("#act button[value=replay]").await;
    assert_eq!(browser.text(".exact-count").await, "30");
    browser.fill("#c-reason", "consumer fixed").await;
    browser.fill("#c-to", "replayed").await;
    browser.fill("#c-rate", "1").await;
    browser.screenshot("confirm-replay").await;
    browser.follow("#confirm").await;
    let main = browser.text("main").await;
    assert!(
        browser.path().await.starts_with("/console/replays"),
        "{main}"
    );
    let started: i64 = sqlx::query_scalar("SELECT id FROM recovery_replay WHERE actor = 'ops'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "a member runs the replay",
        || async { replay_status(&store, started).await == "running" },
    )
    .await;
    browser.open(&console.url("/console/replays")).await;
    browser.screenshot("replays-with-actions").await;
    browser
        .follow(&format!("#job-{started} button.cancel"))
        .await;
    assert_eq!(replay_status(&store, started).await, "cancelled");
    assert_eq!(browser.count(&format!("#job-{started} button")).await, 0);

    // The stalled job resumed: the fleet takes it and ends it.
    browser
        .follow(&format!("#job-{stalled} button.resume"))
        .await;
    eventually(
        Duration::from_secs(30),
        "the resumed replay ends",
        || async { replay_status(&store, stalled).await == "done" },
    )
    .await;
    browser.open(&console.url("/console/replays")).await;
    browser.screenshot("replays-after-actions").await;
    let produced: i64 = sqlx::query_scalar("SELECT produced FROM recovery_replay WHERE id = $1")
        .bind(started)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(produced < 30, "cancelled before the end: {produced}");

    // A brake engaged on the route, shown, then released.
    browser.open(&console.url("/console/fleet")).await;
    let route_name = browser
        .client
        .find(Locator::Css("#engage-route option"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    browser.fill("#engage-reason", "downstream incident").await;
    browser.fill("#engage-for", "30m").await;
    browser.follow("#engage").await;
    let engaged = format!(
        "SELECT count(*) FROM recovery_brake WHERE route = '{route_name}' \
         AND engaged_until > now() + interval '25 minutes' AND reason = 'downstream incident'"
    );
    assert_eq!(scalar(&store, &engaged).await, 1);
    assert!(browser.text("table.brakes").await.contains("engaged"));
    browser.screenshot("brakes-engaged").await;
    assert_eq!(route_name, "in coming/eu?1");
    browser.fill("#brake-release-0", "incident over").await;
    browser.follow("#brake-release-0 + button").await;
    let released = format!(
        "SELECT count(*) FROM recovery_brake WHERE route = '{route_name}' \
         AND released_at IS NOT NULL AND released_by = 'ops'"
    );
    assert_eq!(scalar(&store, &released).await, 1);
    assert!(!browser.text("table.brakes").await.contains("engaged\n"));

    // The log handler's breaker (its row as a member leaves it after a first call)
    // forced open, then released, each with a reason.
    sqlx::query("INSERT INTO recovery_breaker (handler) VALUES ('log')")
        .execute(store.pool())
        .await
        .unwrap();
    browser.open(&console.url("/console/fleet")).await;
    browser.fill("#breaker-open-0", "billing is down").await;
    browser.follow("#breaker-open-0 + button").await;
    let forced = "SELECT count(*) FROM recovery_breaker WHERE handler = 'log' \
        AND forced = 'open' AND reason = 'forced open by ops: billing is down'";
    assert_eq!(scalar(&store, forced).await, 1);
    assert!(browser.text("table.breakers").await.contains("open"));
    browser.screenshot("breaker-forced-open").await;
    browser.fill("#breaker-release-0", "billing is back").await;
    browser.follow("#breaker-release-0 + button").await;
    let released = "SELECT count(*) FROM recovery_breaker WHERE handler = 'log' \
        AND forced IS NULL";
    assert_eq!(scalar(&store, released).await, 1);
    let audit = "SELECT count(*) FROM recovery_audit WHERE actor = 'ops' \
        AND action IN ('breaker_open', 'breaker_release') \
        AND reason IN ('billing is down', 'billing is back')";
    assert_eq!(scalar(&store, audit).await, 2);
}

/// Found by an operator: two tasks ticked on the list and replayed answered a bare "Bad
/// Request" (a replay took a filter only). A replay of ticked tasks produces those
/// tasks' messages, and nothing else, to the target topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn two_ticked_tasks_replayed_from_the_list_reach_the_target_topic_and_nothing_else() {
    let kafka = cluster(&[("replayed", 1)]);
    let bootstrap = kafka.bootstrap_servers();
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    let ids = enqueue(
        &store,
        (1..=4)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console
        .sign_in(&browser, OPERATE, "/console/tasks?handler=orders")
        .await;
    for id in [ids[1], ids[3]] {
        browser.click(&format!("#select-{id}")).await;
    }
    browser.follow("#act button[value=replay]").await;
    let main = browser.text("main").await;
    assert_eq!(browser.path().await, "/console/actions/preview", "{main}");
    assert_eq!(browser.text(".exact-count").await, "2", "{main}");
    browser.fill("#c-reason", "consumer fixed").await;
    browser.fill("#c-to", "replayed").await;
    browser.screenshot("confirm-replay-ticked").await;
    browser.follow("#confirm").await;
    let main = browser.text("main").await;
    assert!(
        browser.path().await.starts_with("/console/replays"),
        "{main}"
    );
    assert!(
        main.contains(&format!("tasks {}, {}", ids[1], ids[3])),
        "{main}"
    );
    eventually(Duration::from_secs(30), "the replay ends", || async {
        replay_status(&store, 1).await == "done"
    })
    .await;
    let messages =
        crate::support::broker::consume(&bootstrap, "replayed", 1, 3, Duration::from_secs(5));
    let mut keys: Vec<Vec<u8>> = messages
        .iter()
        .map(|m| crate::support::broker::bytes(m).0.unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, [b"order-2".to_vec(), b"order-4".to_vec()]);
}

/// Found by an operator during a Kafka outage: a replay confirmed against a cluster
/// that could not be reached answered, after 30 s, a bare "Bad Gateway" page. Within
/// seconds the confirm page is shown again, with what the operator typed and why the
/// replay was not started (the bootstrap servers, what failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_replay_against_an_unreachable_cluster_shows_the_form_again_with_the_reason() {
    let kafka = cluster(&[("replayed", 1)]);
    let bootstrap = kafka.bootstrap_servers();
    drop(kafka);
    let (store, mut settings) = fresh_store().await;
    settings.kafka.bootstrap_servers = bootstrap.clone();
    enqueue(
        &store,
        (1..=3)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console
        .sign_in(&browser, OPERATE, "/console/tasks?handler=orders")
        .await;
    browser.click("#select-filter").await;
    browser.follow("#act button[value=replay]").await;
    browser.fill("#c-reason", "consumer fixed").await;
    browser.fill("#c-to", "replayed").await;
    browser.fill("#c-rate", "5").await;
    let started = Instant::now();
    browser.follow("#confirm").await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    let refused = browser.text(".replay-refused").await;
    assert!(
        refused.contains(&format!("bootstrap servers {bootstrap}"))
            && refused.contains("\"replayed\""),
        "{refused}"
    );
    browser.screenshot("replay-refused").await;
    assert_eq!(value(&browser, "#c-reason").await, "consumer fixed");
    assert_eq!(value(&browser, "#c-to").await, "replayed");
    assert_eq!(value(&browser, "#c-rate").await, "5");
    assert_eq!(browser.text(".exact-count").await, "3");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_replay").await,
        0
    );
}

/// The value of the field `css` selects.
async fn value(browser: &Browser, css: &str) -> String {
    let field = browser.client.find(Locator::Css(css)).await.unwrap();
    field.prop("value").await.unwrap().unwrap_or_default()
}
