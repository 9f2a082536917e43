//! The operator console in a real browser (headless Chromium over WebDriver) against a
//! real member process (`redrive run`): signing in with each role, the overview, the
//! task list's filters and pages, binary and hostile payloads, the keyboard; and over
//! plain HTTP, the security headers of every answer and the refusal of cross-site
//! requests. Each page's screenshot is saved under `target/console-screenshots/`.

use redrive::headers::Header;
use redrive::store::{Action, NewReplay, Operator, Selection, TaskFilter};
use redrive::{NewTask, Store, TaskId};
use reqwest::header::{ORIGIN, SET_COOKIE};
use reqwest::StatusCode;
use std::time::Duration;

use crate::support::api::{OPERATE, READ};
use crate::support::console::{assert_secured, enqueue, task, Console};
use crate::support::{eventually, fresh_store, scalar, Browser};

const HOSTILE: &str = "<script>alert(1)</script>";

/// The hostile task: its key, value and one header's name and value are a script.
fn hostile() -> NewTask {
    let mut task = task("orders", HOSTILE.as_bytes(), HOSTILE.as_bytes());
    task.failure.headers = vec![Header {
        name: HOSTILE.as_bytes().to_vec(),
        value: Some(HOSTILE.as_bytes().to_vec()),
    }];
    task
}

/// The texts of each row of the table `css` selects.
pub(crate) async fn rows(browser: &Browser, css: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let found = browser
        .client
        .find_all(fantoccini::Locator::Css(&format!("{css} tbody tr")))
        .await
        .unwrap();
    for row in found {
        let mut cells = Vec::new();
        for cell in row
            .find_all(fantoccini::Locator::Css("th, td"))
            .await
            .unwrap()
        {
            cells.push(cell.text().await.unwrap());
        }
        rows.push(cells);
    }
    rows
}

/// The task ids of the task list shown.
async fn listed_ids(browser: &Browser) -> Vec<i64> {
    rows(browser, "table.tasks")
        .await
        .iter()
        .map(|row| row[0].parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn an_operator_reads_the_fleet_its_tasks_and_their_payloads_in_a_browser() {
    let (store, settings) = fresh_store().await;
    let orders = enqueue(
        &store,
        (1..=7)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    let mut billing: Vec<NewTask> = (1..=3)
        .map(|i| task("billing", format!("invoice-{i}").as_bytes(), b"{}"))
        .collect();
    for t in &mut billing {
        t.failure.error_message = Some("downstream Timeout after 30 s".into());
    }
    enqueue(&store, billing).await;
    let binary = enqueue(&store, vec![task("orders", b"bin", &[0xff, 0x00, b'v'])]).await[0];
    let hostile = enqueue(&store, vec![hostile()]).await[0];
    enqueue(
        &store,
        vec![task("log", b"l1", b"1"), task("log", b"l2", b"2")],
    )
    .await;
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("bad data".into()),
    };
    let selection = Selection::Ids(vec![orders[0]]);
    store
        .act(&operator, &Action::Discard, &selection)
        .await
        .unwrap();
    let replay = NewReplay {
        retry: None,
        pace: None,
        force: false,
        bounded: false,
        filter: TaskFilter {
            handler: Some("billing".into()),
            ..TaskFilter::default()
        },
        target_topic: Some("billing-again".into()),
        mark_resolved: false,
        rate: None,
        detached: false,
        approval: None,
        most: None,
    };
    store
        .create_replay(&operator, &replay, "a-test")
        .await
        .unwrap();
    let console = Console::start(&settings, true).await;
    eventually(
        Duration::from_secs(30),
        "the worker resolved the log tasks",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
            )
            .await
                == 2
        },
    )
    .await;
    let browser = Browser::start().await;

    // Signing in comes back to the page that asked.
    browser.open(&console.url("/console/tasks")).await;
    browser.screenshot("login").await;
    console.sign_in(&browser, OPERATE, "/console/tasks").await;
    assert_eq!(browser.path().await, "/console/tasks");
    let who = browser.text(".who").await;
    assert!(who.contains("ops") && who.contains("operate"), "{who}");

    // The overview counts by handler and status (the fleet's sample: reloaded until a
    // turn after the log tasks resolved counts them, within 30 s), charts the outcomes,
    // updates itself.
    let mut backlog = Vec::new();
    let resolved_log = ["log", "0", "0", "2", "0"].map(String::from).to_vec();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !backlog.contains(&resolved_log) {
        assert!(
            std::time::Instant::now() < deadline,
            "the overview never counted the resolved log tasks: {backlog:?}"
        );
        browser.open(&console.url("/console/")).await;
        backlog = rows(&browser, "table.backlog").await;
        if !backlog.contains(&resolved_log) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    browser.click("[data-live-toggle]").await;
    assert!(
        backlog.contains(&["orders", "8", "0", "0", "1"].map(String::from).to_vec()),
        "{backlog:?}"
    );
    assert!(
        backlog.contains(&["billing", "3", "0", "0", "0"].map(String::from).to_vec()),
        "{backlog:?}"
    );
    assert!(
        backlog.contains(&["log", "0", "0", "2", "0"].map(String::from).to_vec()),
        "{backlog:?}"
    );
    assert!(browser.count("svg.chart rect.bar.ok").await >= 1);
    assert!(browser.text("table.members").await.contains("admin"));
    assert_eq!(
        browser.text("[data-live-status]").await,
        "Live updates paused."
    );
    browser.click("[data-live-toggle]").await;
    eventually(Duration::from_secs(30), "a live update", || async {
        browser
            .text("[data-live-status]")
            .await
            .starts_with("Updated at")
    })
    .await;
    browser.screenshot("overview").await;

    // Every task, then a filter typed into the form narrows them.
    browser.open(&console.url("/console/tasks")).await;
    assert_eq!(listed_ids(&browser).await.len(), 14);
    browser.click("#f-handler option[value=billing]").await;
    browser.follow("form.filter button[type=submit]").await;
    assert!(browser.path().await.contains("handler=billing"));
    let billing_rows = rows(&browser, "table.tasks").await;
    assert_eq!(billing_rows.len(), 3, "{billing_rows:?}");
    assert!(billing_rows.iter().all(|row| row[2] == "billing"));
    browser.screenshot("tasks-filtered").await;
    browser.click("#f-handler option[value='']").await;
    browser.click("details.more summary").await;
    browser.fill("#f-error", "TIMEOUT").await;
    browser.follow("form.filter button[type=submit]").await;
    assert_eq!(listed_ids(&browser).await.len(), 3, "error text, any case");

    // Keyset paging: the second page holds the older tasks, and is the last.
    browser
        .open(&console.url("/console/tasks?handler=orders&limit=5"))
        .await;
    let first = listed_ids(&browser).await;
    assert_eq!(first.len(), 5);
    browser.follow("a[rel=next]").await;
    let second = listed_ids(&browser).await;
    assert_eq!(second.len(), 4, "9 orders tasks in all");
    assert!(second.iter().all(|id| id < first.iter().min().unwrap()));
    assert_eq!(browser.count("a[rel=next]").await, 0);
    browser.screenshot("tasks-page-2").await;

    // A binary value is hex, with its size.
    browser
        .open(&console.url(&format!("/console/tasks/{binary}")))
        .await;
    let main = browser.text("main").await;
    assert!(main.contains("3 bytes, not UTF-8: shown as hex"), "{main}");
    assert!(main.contains("ff 00 76"), "{main}");
    // Why it waits, in the store's words, in the headline; no far-future time anywhere.
    let waiting = browser.text("dd.waiting").await;
    assert!(waiting.starts_with("due"), "{waiting}");
    assert!(!main.contains("9999"), "{main}");
    browser.screenshot("task-binary").await;

    // A script in the key, the value and a header is text: shown as typed, never run.
    browser
        .open(&console.url(&format!("/console/tasks/{hostile}")))
        .await;
    assert_eq!(browser.open_dialog().await, None);
    let main = browser.text("main").await;
    assert_eq!(
        main.matches(HOSTILE).count(),
        4,
        "key, value, header name and value: {main}"
    );
    browser.screenshot("task-hostile").await;
    browser
        .open(&console.url("/console/tasks?key_prefix=%3Cscript%3E"))
        .await;
    assert_eq!(browser.open_dialog().await, None);
    assert_eq!(rows(&browser, "table.tasks").await[0][5], HOSTILE);

    // The keyboard reaches the filter form's controls, in order.
    browser.open(&console.url("/console/tasks")).await;
    let mut focused = Vec::new();
    for _ in 0..40 {
        browser.tab().await;
        focused.push(browser.focused_id().await);
    }
    let at = |id: &str| focused.iter().position(|f| f == id);
    let (status, search, handler, route) = (
        at("tab-failed"),
        at("f-search"),
        at("f-handler"),
        at("f-route"),
    );
    assert!(
        status.is_some() && status < search && search < handler && handler < route,
        "{focused:?}"
    );

    // Replays with their progress, the audit log, members, breakers and brakes.
    browser.open(&console.url("/console/replays")).await;
    let jobs = rows(&browser, "table.replays").await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0][2].contains("0 of 3"), "{jobs:?}");
    assert!(jobs[0][4].contains("billing-again"), "{jobs:?}");
    browser.screenshot("replays").await;
    browser.open(&console.url("/console/audit")).await;
    let audit = rows(&browser, "table.audit").await;
    assert_eq!(audit.len(), 2, "the discard and the replay: {audit:?}");
    assert!(
        audit
            .iter()
            .any(|e| e[3] == "discard" && e[4] == "bad data"),
        "{audit:?}"
    );
    browser.screenshot("audit").await;
    // The audit filter is the operations layer's: durations ago, action names.
    browser
        .open(&console.url("/console/audit?since=1h&action=discard"))
        .await;
    let discards = rows(&browser, "table.audit").await;
    assert_eq!(discards.len(), 1, "{discards:?}");
    browser.open(&console.url("/console/fleet")).await;
    assert_eq!(rows(&browser, "table.members").await.len(), 1);
    browser.screenshot("fleet").await;

    // Signing out ends the session in this browser.
    browser.follow(".who button").await;
    assert_eq!(browser.path().await, "/console/login");
    browser.open(&console.url("/console/")).await;
    assert!(browser.path().await.starts_with("/console/login"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_read_only_token_reads_every_page_and_sees_no_action_control() {
    let (store, settings) = fresh_store().await;
    let ids = enqueue(&store, vec![task("orders", b"k", b"v")]).await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, READ, "/console/").await;
    assert_eq!(browser.path().await, "/console/");
    assert_eq!(browser.text(".role").await, "read only");
    for (path, shot) in [
        ("/console/".to_owned(), "read-only-overview"),
        ("/console/tasks".to_owned(), "read-only-tasks"),
        (format!("/console/tasks/{}", ids[0]), "read-only-task"),
        ("/console/replays".to_owned(), "read-only-replays"),
        ("/console/audit".to_owned(), "read-only-audit"),
        ("/console/fleet".to_owned(), "read-only-fleet"),
        ("/console/causes".to_owned(), "read-only-causes"),
    ] {
        browser.open(&console.url(&path)).await;
        let forms = browser
            .client
            .find_all(fantoccini::Locator::Css("form[method=post]"))
            .await
            .unwrap();
        for form in forms {
            let action = form.attr("action").await.unwrap();
            assert_eq!(action.as_deref(), Some("/console/logout"), "{path}");
        }
        assert_eq!(
            browser
                .count("input[type=checkbox]:not([name=status])")
                .await,
            0,
            "{path}: no selection controls"
        );
        browser.screenshot(shot).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_wrong_token_is_refused_and_the_sixth_rapid_attempt_waits() {
    let (_store, settings) = fresh_store().await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    let wrong = "operate-token-012345678";
    let try_in_browser = || async {
        browser.open(&console.url("/console/login")).await;
        browser.fill("#token", wrong).await;
        browser.follow("form.login button[type=submit]").await;
        browser.text("main").await
    };
    let refusal = try_in_browser().await;
    assert!(
        refusal.contains("not one of this fleet's admin tokens"),
        "{refusal}"
    );
    browser.screenshot("login-refused").await;
    // Attempts 2 to 5 from the same address, quickly (one more is allowed every 12 s).
    let client = reqwest::Client::new();
    for attempt in 2..=5 {
        let answer = client
            .post(console.url("/console/login"))
            .form(&[("token", wrong)])
            .send()
            .await
            .unwrap();
        assert_eq!(
            answer.status(),
            StatusCode::UNAUTHORIZED,
            "attempt {attempt}"
        );
    }
    let limited = try_in_browser().await;
    assert!(limited.contains("too many sign-in attempts"), "{limited}");
    browser.screenshot("login-limited").await;

    // The limit is per client: another loopback address signs in.
    let elsewhere = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = elsewhere
        .post(console.url("/console/login"))
        .form(&[("token", OPERATE)])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
}

/// A failed task of `handler` whose error is `class` and `message`.
fn failing(handler: &str, key: &str, class: &str, message: &str) -> NewTask {
    let mut task = task(handler, key.as_bytes(), b"{}");
    task.failure.error_class = Some(class.into());
    task.failure.error_message = Some(message.into());
    task
}

/// The `href` of the first element `css` selects.
async fn href(browser: &Browser, css: &str) -> String {
    let link = browser
        .client
        .find(fantoccini::Locator::Css(css))
        .await
        .expect(css);
    link.attr("href").await.unwrap().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_overview_opens_with_what_broke_and_links_each_cause_to_its_tasks() {
    let (store, settings) = fresh_store().await;
    let timeouts = enqueue(
        &store,
        (1..=3)
            .map(|i| {
                failing(
                    "orders",
                    &format!("order-{i}"),
                    "java.net.SocketTimeoutException",
                    &format!(
                        "connect timed out after {} ms to 10.0.0.{i}:9092",
                        30_000 + i
                    ),
                )
            })
            .collect(),
    )
    .await;
    let parsing = enqueue(
        &store,
        (1..=2)
            .map(|i| {
                failing(
                    "billing",
                    &format!("invoice-{i}"),
                    "com.fasterxml.jackson.core.JsonParseException",
                    &format!("Unexpected character at line {i} column 7"),
                )
            })
            .collect(),
    )
    .await;
    let hostile = enqueue(
        &store,
        vec![failing(
            "billing",
            "hostile",
            "IllegalStateException",
            HOSTILE,
        )],
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/").await;
    assert_eq!(browser.path().await, "/console/");
    browser.click("[data-live-toggle]").await;
    browser.screenshot("what-broke-overview").await;

    // The section comes first, biggest cause first, one row a cause.
    let first_section = browser.text("main section h2").await;
    assert_eq!(first_section, "What broke");
    let broke = rows(&browser, "table.broke").await;
    assert_eq!(broke.len(), 3, "{broke:?}");
    assert_eq!(broke[0][1], "java.net.SocketTimeoutException", "{broke:?}");
    assert!(
        broke[0][2].starts_with("connect timed out after"),
        "{broke:?}"
    );
    assert_eq!(broke[0][3], "3", "{broke:?}");
    assert!(broke[0][6].ends_with("s ago"), "last seen: {broke:?}");
    assert_eq!(broke[0][7], "orders", "{broke:?}");
    assert_eq!(broke[0][8], "tasks →", "{broke:?}");
    assert_eq!(broke[1][1], "com.fasterxml.jackson.core.JsonParseException");
    assert_eq!(broke[1][3], "2", "{broke:?}");
    assert_eq!(broke[2][3], "1", "{broke:?}");
    assert_eq!(browser.count("table.broke svg.spark rect.bar").await, 3);
    let meta = browser.text("section.broke .meta").await;
    assert!(
        meta.starts_with("6 tasks failed or given up, 3 causes"),
        "{meta}"
    );

    // A script in an error message is text in the row and in its title, never run.
    assert_eq!(browser.open_dialog().await, None);
    assert!(broke[2][2].contains("<script>"), "{broke:?}");
    let source = browser.client.source().await.unwrap();
    assert!(!source.contains("<script>alert"), "the message is escaped");
    let title = browser
        .client
        .find(fantoccini::Locator::Css(
            "table.broke tbody tr:nth-child(3) td.fingerprint",
        ))
        .await
        .unwrap()
        .attr("title")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(title.starts_with("<script>"), "{title}");

    // The link lists that cause's tasks not done, and only them.
    let link = href(&browser, "table.broke tbody tr:first-child td.go a").await;
    assert!(
        link.starts_with("/console/tasks?status=failed&status=permanent_failure&cause="),
        "{link}"
    );
    browser
        .follow("table.broke tbody tr:first-child td.go a")
        .await;
    browser.screenshot("what-broke-cause-tasks").await;
    assert_eq!(browser.path().await, link);
    let mut expected: Vec<i64> = timeouts.iter().map(|id| id.0).collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(listed_ids(&browser).await, expected);
    let cause = link.rsplit('=').next().unwrap().to_owned();
    let field = browser
        .client
        .find(fantoccini::Locator::Css("#f-cause"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap();
    assert_eq!(
        field.as_deref(),
        Some(cause.as_str()),
        "the form shows the cause"
    );

    // The second cause's link lists its two tasks.
    browser.open(&console.url("/console/")).await;
    browser
        .follow("table.broke tbody tr:nth-child(2) td.go a")
        .await;
    let mut expected: Vec<i64> = parsing.iter().map(|id| id.0).collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(listed_ids(&browser).await, expected);
    browser.open(&console.url("/console/")).await;
    browser
        .follow("table.broke tbody tr:nth-child(3) td.go a")
        .await;
    assert_eq!(listed_ids(&browser).await, vec![hostile[0].0]);
    assert_eq!(browser.open_dialog().await, None);

    // Resolved tasks leave What broke.
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("fixed".into()),
    };
    let all: Vec<TaskId> = timeouts
        .iter()
        .chain(&parsing)
        .chain(&hostile)
        .copied()
        .collect();
    store
        .act(
            &operator,
            &Action::Resolve { force: false },
            &Selection::Ids(all),
        )
        .await
        .unwrap();
    // (the overview's figures are read at most once per 5 s)
    eventually(Duration::from_secs(30), "What broke is empty", || async {
        browser.open(&console.url("/console/")).await;
        browser.count("section.broke p.empty").await == 1
    })
    .await;
    browser.screenshot("what-broke-nothing").await;
    assert_eq!(
        browser.text("section.broke p.empty").await,
        "Nothing is broken: no task is failed or given up."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_search_finds_text_in_keys_values_and_headers_and_says_what_it_read() {
    let (store, settings) = fresh_store().await;
    let mut traced = task("orders", b"order-3", b"{}");
    traced.failure.headers = vec![Header {
        name: b"trace".to_vec(),
        value: Some(b"trace-7f3a".to_vec()),
    }];
    let ids = enqueue(
        &store,
        vec![
            task("orders", b"order-1", br#"{"sku":"blue-widget"}"#),
            task("orders", b"order-2", br#"{"sku":"red-gadget"}"#),
            traced,
        ],
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/tasks").await;
    assert_eq!(listed_ids(&browser).await.len(), 3);

    browser.fill("#f-search", "blue-widget").await;
    browser.follow("form.filter button[type=submit]").await;
    browser.screenshot("search").await;
    assert!(browser.path().await.contains("search=blue-widget"));
    assert_eq!(listed_ids(&browser).await, vec![ids[0].0]);
    assert_eq!(
        browser.text("p.searched").await,
        "Searched all 3 tasks of the filter for “blue-widget” (keys, values, headers)."
    );
    // No "all that match" (the layer refuses an action by a search), nor a replay (it
    // needs a filter); the ticked rows can be acted on.
    assert_eq!(browser.count("#select-filter").await, 0);
    assert_eq!(browser.count("button[value=replay]").await, 0);
    browser.click(&format!("#select-{}", ids[0].0)).await;
    browser.follow("button[value=retry]").await;
    assert_eq!(browser.path().await, "/console/actions/preview");
    let confirm = browser.text("main").await;
    assert!(confirm.contains(&format!("task {}", ids[0].0)), "{confirm}");

    // A header's value is searched too, and the rest of the filter applies.
    browser
        .open(&console.url("/console/tasks?search=trace-7f3a&handler=orders"))
        .await;
    assert_eq!(listed_ids(&browser).await, vec![ids[2].0]);
    browser
        .open(&console.url("/console/tasks?search=trace-7f3a&handler=billing"))
        .await;
    assert_eq!(browser.count("table.tasks").await, 0);
    assert_eq!(
        browser.text("p.searched").await,
        "The filter selects no task to search for “trace-7f3a”."
    );
    // Without a search the list offers every task that matches again.
    browser.open(&console.url("/console/tasks")).await;
    assert_eq!(browser.count("#select-filter").await, 1);
    assert_eq!(browser.count("p.searched").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_answer_carries_the_policy_and_cross_site_posts_are_refused() {
    let (store, settings) = fresh_store().await;
    let hostile = enqueue(&store, vec![hostile()]).await[0];
    let console = Console::start(&settings, false).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed_in = client
        .post(console.url("/console/login"))
        .form(&[("token", OPERATE), ("next", "/console/tasks")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    assert_secured("sign-in", signed_in.headers());
    let cookie = signed_in.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    for part in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=28800",
    ] {
        assert!(cookie.contains(part), "{cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();

    let task = format!("/console/tasks/{hostile}");
    for (path, with_session, status) in [
        ("/", false, StatusCode::SEE_OTHER),
        ("/console", false, StatusCode::SEE_OTHER),
        ("/console/", false, StatusCode::SEE_OTHER),
        ("/console/live/overview", false, StatusCode::UNAUTHORIZED),
        ("/console/login", false, StatusCode::OK),
        ("/console/static/console.css", false, StatusCode::OK),
        ("/console/static/console.js", false, StatusCode::OK),
        ("/console/static/other.js", false, StatusCode::NOT_FOUND),
        ("/console/no-such-page", false, StatusCode::NOT_FOUND),
        ("/api/v1/tasks", false, StatusCode::UNAUTHORIZED),
        ("/console/", true, StatusCode::OK),
        ("/console/live/overview", true, StatusCode::OK),
        ("/console/tasks", true, StatusCode::OK),
        ("/console/tasks?status=done", true, StatusCode::BAD_REQUEST),
        ("/console/tasks?colour=red", true, StatusCode::BAD_REQUEST),
        (task.as_str(), true, StatusCode::OK),
        ("/console/tasks/0", true, StatusCode::BAD_REQUEST),
        ("/console/tasks/999999", true, StatusCode::NOT_FOUND),
        ("/console/replays", true, StatusCode::OK),
        ("/console/live/replays", true, StatusCode::OK),
        ("/console/audit", true, StatusCode::OK),
        (
            "/console/audit?since=yesterday",
            true,
            StatusCode::BAD_REQUEST,
        ),
        ("/console/audit?before=0", true, StatusCode::BAD_REQUEST),
        ("/console/fleet", true, StatusCode::OK),
        ("/console/causes", false, StatusCode::SEE_OTHER),
        ("/console/causes?by=handler&since=1d", true, StatusCode::OK),
        ("/console/causes?since=2h", true, StatusCode::BAD_REQUEST),
        ("/console/causes?colour=red", true, StatusCode::BAD_REQUEST),
    ] {
        let mut request = client.get(console.url(path));
        if with_session {
            request = request.header("cookie", &session);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), status, "{path}");
        assert_secured(path, answer.headers());
        let html = answer
            .headers()
            .get("content-type")
            .is_some_and(|t| t.to_str().unwrap().starts_with("text/html"));
        let body = answer.text().await.unwrap();
        if html {
            let scripts = body.matches("<script").count();
            let own = body
                .matches("<script src=\"/console/static/console.js\" defer></script>")
                .count();
            assert_eq!(scripts, own, "{path}: only the console's own script");
            assert!(!body.contains(" style="), "{path}: no inline style");
            assert!(
                !body.contains(" onclick=") && !body.contains(" onload="),
                "{path}"
            );
            assert!(!body.contains(HOSTILE), "{path}: the payload is escaped");
        }
    }

    // A cross-site post is refused whatever it carries; the console's own passes.
    let origin = console.base.clone();
    for (name, value) in [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
        ("origin", "http://evil.example"),
    ] {
        for path in ["/console/login", "/console/logout"] {
            let answer = client
                .post(console.url(path))
                .header("cookie", &session)
                .header(name, value)
                .form(&[("token", OPERATE)])
                .send()
                .await
                .unwrap();
            assert_eq!(
                answer.status(),
                StatusCode::FORBIDDEN,
                "{path} {name}: {value}"
            );
            assert_secured(path, answer.headers());
        }
    }
    // A person following a link from another site (a chat, a ticket) to a console page
    // reaches it (found by the third issue 16 attack: a JSON 403). Without the session
    // cookie, which SameSite=Strict keeps back, that is the sign-in page, which leads
    // back to the link's page; a script's request from that site is still refused.
    let link = "/console/tasks?handler=billing";
    let followed = client
        .get(console.url(link))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .header("sec-fetch-dest", "document")
        .send()
        .await
        .unwrap();
    assert_eq!(followed.status(), StatusCode::SEE_OTHER, "{link}");
    let sign_in = followed.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        sign_in.starts_with("/console/login?next=") && sign_in.contains("billing"),
        "the sign-in page leads back to the link's page: {sign_in}"
    );
    let fetched = client
        .get(console.url(link))
        .header("cookie", &session)
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "cors")
        .header("sec-fetch-dest", "empty")
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), StatusCode::FORBIDDEN, "a script's fetch");
    let own = client
        .post(console.url("/console/logout"))
        .header("cookie", &session)
        .header("sec-fetch-site", "same-origin")
        .header(ORIGIN, &origin)
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::SEE_OTHER);
    assert!(own.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
}

/// An open API (no tokens, loopback only) needs no sign-in: its caller is `anonymous`
/// with role operate. It answers loopback host names only, the console included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_api_needs_no_sign_in_and_answers_loopback_names_only() {
    let (store, settings) = fresh_store().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let fleet = redrive::Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap();
    let app = redrive::admin::router(
        fleet.operations(store.clone()),
        redrive::admin::Tokens::new(&settings.admin),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(redrive::admin::serve(
        listener,
        app,
        stop.clone(),
        Duration::from_secs(1),
    ));
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let overview = client
        .get(format!("http://{address}/console/"))
        .send()
        .await
        .unwrap();
    assert_eq!(overview.status(), StatusCode::OK);
    let page = overview.text().await.unwrap();
    assert!(page.contains("<b>anonymous</b>"), "{page}");
    assert!(!page.contains("Sign out"), "nothing to sign out of");
    assert!(
        page.contains("Nothing is broken: no task is failed or given up."),
        "{page}"
    );
    let login = client
        .get(format!("http://{address}/console/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER, "no sign-in needed");
    let rebound = client
        .get(format!("http://{address}/console/"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);
    assert_secured("a foreign host", rebound.headers());
    stop.cancel();
}

/// Runs `script` (a function body; its arguments in `args`) in the page shown.
async fn run(browser: &Browser, script: &str, args: Vec<serde_json::Value>) -> serde_json::Value {
    browser.client.execute(script, args).await.expect(script)
}

/// The computed CSS `property` of the first element `css` selects.
async fn style(browser: &Browser, css: &str, property: &str) -> String {
    let value = run(
        browser,
        "var e = document.querySelector(arguments[0]); \
         return e ? getComputedStyle(e).getPropertyValue(arguments[1]) : null;",
        vec![css.into(), property.into()],
    )
    .await;
    value
        .as_str()
        .unwrap_or_else(|| panic!("no element {css}"))
        .to_owned()
}

/// The red, green and blue of a computed colour (`rgb(…)` or `rgba(…)`).
fn rgb(colour: &str) -> [f64; 3] {
    let digits: Vec<f64> = colour
        .trim_start_matches("rgba(")
        .trim_start_matches("rgb(")
        .trim_end_matches(')')
        .split(',')
        .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{colour}")))
        .collect();
    [digits[0], digits[1], digits[2]]
}

/// WCAG's relative luminance of a colour.
fn luminance(colour: [f64; 3]) -> f64 {
    let channel = |c: f64| {
        let c = c / 255.0;
        if c <= 0.039_28 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * channel(colour[0]) + 0.7152 * channel(colour[1]) + 0.0722 * channel(colour[2])
}

/// WCAG's contrast ratio of two colours (1 to 21).
fn contrast(a: [f64; 3], b: [f64; 3]) -> f64 {
    let (la, lb) = (luminance(a), luminance(b));
    (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
}

/// Whether a colour reads as red: red well above green and blue.
fn reddish(colour: [f64; 3]) -> bool {
    colour[0] > 150.0 && colour[0] > colour[1] + 70.0 && colour[0] > colour[2] + 70.0
}

/// Presses the key of `c` (a letter, `/`, `?`) once.
async fn press_char(browser: &Browser, c: char) {
    use fantoccini::actions::{InputSource, KeyAction, KeyActions};
    let press = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: c })
        .then(KeyAction::Up { value: c });
    browser.client.perform_actions(press).await.unwrap();
}

/// 45 tasks: 30 of `orders` with a long error, 12 of `billing`, 3 of them discarded.
async fn many_tasks(store: &Store) -> Vec<TaskId> {
    // (the list has an error's first 120 bytes; the task's page has it whole)
    let long = "upstream shipping-api answered 503 Service Unavailable after 3 retries: \
                the warehouse is closed for inventory END";
    assert!(long.len() <= 120);
    let orders: Vec<NewTask> = (1..=30)
        .map(|i| failing("orders", &format!("order-{i}"), "HttpError", long))
        .collect();
    let mut ids = enqueue(store, orders).await;
    let billing: Vec<NewTask> = (1..=15)
        .map(|i| failing("billing", &format!("invoice-{i}"), "Timeout", "timed out"))
        .collect();
    ids.extend(enqueue(store, billing).await);
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("test data".into()),
    };
    store
        .act(
            &operator,
            &Action::Discard,
            &Selection::Ids(ids[42..].to_vec()),
        )
        .await
        .unwrap();
    ids
}

/// The window of the density test: what an operator's laptop shows.
async fn laptop(browser: &Browser) {
    browser.client.set_window_size(1400, 1000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_task_list_is_dense_with_status_tabs_choices_and_folded_filters() {
    let (store, settings) = fresh_store().await;
    let ids = many_tasks(&store).await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/tasks").await;
    browser.screenshot("dense-tasks").await;
    laptop(&browser).await;

    // 25 tasks and more are on the screen at once, each on one line.
    let seen = run(
        &browser,
        "var h = window.innerHeight, n = 0, tallest = 0; \
         document.querySelectorAll('table.tasks tbody tr').forEach(function (r) { \
           var b = r.getBoundingClientRect(); \
           tallest = Math.max(tallest, b.height); \
           if (b.top >= 0 && b.bottom <= h) { n += 1; } }); \
         return [n, h, tallest, document.querySelectorAll('table.tasks tbody tr').length];",
        Vec::new(),
    )
    .await;
    let visible = seen[0].as_u64().unwrap();
    assert!(
        visible >= 25,
        "{visible} task rows on the screen (innerHeight, tallest row, rows): {seen}"
    );
    assert!(seen[2].as_f64().unwrap() < 30.0, "one line a task: {seen}");

    // A long error is cut with an ellipsis on its line, whole in its title and on a
    // click.
    let cut = "table.tasks tbody tr:last-child td.error .cut";
    assert_eq!(style(&browser, cut, "text-overflow").await, "ellipsis");
    let widths = run(
        &browser,
        "var e = document.querySelector(arguments[0]); \
         return [e.scrollWidth, e.clientWidth, e.offsetHeight, e.getAttribute('title')];",
        vec![cut.into()],
    )
    .await;
    assert!(
        widths[0].as_f64() > widths[1].as_f64(),
        "the error is cut: {widths}"
    );
    let title = widths[3].as_str().unwrap();
    assert!(
        title.starts_with("upstream shipping-api") && title.ends_with("END"),
        "{title}"
    );
    browser.click(cut).await;
    let opened = run(
        &browser,
        "return document.querySelector(arguments[0]).offsetHeight;",
        vec![cut.into()],
    )
    .await;
    assert!(
        opened.as_f64().unwrap() > 1.5 * widths[2].as_f64().unwrap(),
        "a click shows it whole: {opened} high, was {widths}"
    );
    browser.screenshot("dense-tasks-error-whole").await;

    // Tabs by status, with the fleet's counts; each keeps the rest of the filter.
    assert_eq!(browser.text("#tab-all").await, "All 45");
    assert_eq!(browser.text("#tab-failed").await, "failed 42");
    assert_eq!(browser.text("#tab-discarded").await, "discarded 3");
    assert_eq!(browser.text("#tab-resolved").await, "resolved 0");
    browser
        .open(&console.url("/console/tasks?handler=billing&limit=20"))
        .await;
    assert_eq!(
        href(&browser, "#tab-discarded").await,
        "/console/tasks?status=discarded&handler=billing&limit=20"
    );
    assert_eq!(browser.text("#tab-failed").await, "failed 12", "billing's");
    browser.follow("#tab-discarded").await;
    assert_eq!(listed_ids(&browser).await.len(), 3);
    assert_eq!(
        browser.text("nav.status-tabs a[aria-current=page]").await,
        "discarded 3"
    );
    assert_eq!(
        href(&browser, "#tab-all").await,
        "/console/tasks?handler=billing&limit=20"
    );

    // Handler and route are the fleet's names to choose from.
    browser.open(&console.url("/console/tasks")).await;
    let handlers = run(
        &browser,
        "return Array.prototype.map.call(document.querySelectorAll('#f-handler option'), \
           function (o) { return o.value; });",
        Vec::new(),
    )
    .await;
    assert_eq!(handlers, serde_json::json!(["", "billing", "orders"]));
    assert_eq!(browser.count("select#f-route").await, 1);
    browser.click("#f-handler option[value=orders]").await;
    browser.follow("form.filter button[type=submit]").await;
    assert!(browser.path().await.contains("&handler=orders&"));
    assert_eq!(listed_ids(&browser).await.len(), 30);
    assert_eq!(ids.len(), 45);

    // The other fields are folded, and unfolded when one of them is set.
    let open = "return document.querySelector('details.more').open;";
    assert_eq!(
        run(&browser, open, Vec::new()).await,
        serde_json::json!(false)
    );
    assert_eq!(browser.text("details.more summary").await, "More filters");
    browser
        .open(&console.url("/console/tasks?key_prefix=invoice-1"))
        .await;
    assert_eq!(
        run(&browser, open, Vec::new()).await,
        serde_json::json!(true)
    );
    assert_eq!(
        browser.text("details.more summary").await,
        "More filters (1 set)"
    );
    assert_eq!(
        listed_ids(&browser).await.len(),
        7,
        "invoice-1 and 10 to 15"
    );
    browser.screenshot("dense-tasks-more-filters").await;

    // A cause is named by the banner above the list: it leaves the fold closed.
    browser.open(&console.url("/console/tasks?cause=1")).await;
    assert_eq!(
        run(&browser, open, Vec::new()).await,
        serde_json::json!(false)
    );
    assert_eq!(
        browser.text("details.more summary").await,
        "More filters (1 set)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn destructive_actions_are_red_and_the_others_are_not() {
    let (store, settings) = fresh_store().await;
    let ids = enqueue(
        &store,
        vec![task("orders", b"k1", b"v"), task("orders", b"k2", b"v")],
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/tasks").await;
    browser.screenshot("danger-list").await;
    let colour = |css: &'static str| {
        let browser = &browser;
        async move { rgb(&style(browser, css, "background-color").await) }
    };
    let discard = colour("button[value=discard]").await;
    assert!(reddish(discard), "discard: {discard:?}");
    for verb in ["retry", "resolve", "replay"] {
        let other = rgb(&style(
            &browser,
            &format!("button[value={verb}]"),
            "background-color",
        )
        .await);
        assert!(!reddish(other), "{verb}: {other:?}");
        assert_ne!(other, discard, "{verb}");
    }
    assert!(
        contrast(
            discard,
            rgb(&style(&browser, "button[value=discard]", "color").await)
        ) >= 4.5,
        "its label reads"
    );

    // The task's page, and the confirm page of a discard; not of a retry.
    browser
        .open(&console.url(&format!("/console/tasks/{}", ids[0])))
        .await;
    assert!(reddish(
        colour("form.task-actions button[value=discard]").await
    ));
    assert!(!reddish(
        colour("form.task-actions button[value=retry]").await
    ));
    browser
        .follow("form.task-actions button[value=discard]")
        .await;
    browser.screenshot("danger-confirm-discard").await;
    assert!(reddish(colour("#confirm").await), "confirming a discard");
    browser
        .open(&console.url(&format!("/console/tasks/{}", ids[0])))
        .await;
    browser
        .follow("form.task-actions button[value=resolve]")
        .await;
    assert!(!reddish(colour("#confirm").await), "confirming a resolve");
}

/// A Chrome DevTools command, sent through chromedriver's `goog/cdp/execute`.
#[derive(Debug)]
struct DevTools(serde_json::Value);

impl fantoccini::wd::WebDriverCompatibleCommand for DevTools {
    fn endpoint(
        &self,
        base_url: &reqwest::Url,
        session_id: Option<&str>,
    ) -> Result<reqwest::Url, <reqwest::Url as std::str::FromStr>::Err> {
        base_url.join(&format!(
            "session/{}/goog/cdp/execute",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &reqwest::Url) -> (reqwest::Method, Option<String>) {
        (reqwest::Method::POST, Some(self.0.to_string()))
    }
}

/// Makes the pages of `browser` see a system in dark mode.
async fn dark_system(browser: &Browser) {
    browser
        .client
        .issue_cmd(DevTools(serde_json::json!({
            "cmd": "Emulation.setEmulatedMedia",
            "params": { "features": [{ "name": "prefers-color-scheme", "value": "dark" }] },
        })))
        .await
        .expect("chromedriver passes a DevTools command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_console_follows_a_dark_system_scheme_and_every_part_reads() {
    let (store, settings) = fresh_store().await;
    many_tasks(&store).await;
    enqueue(
        &store,
        vec![task("log", b"l1", b"1"), task("log", b"l2", b"2")],
    )
    .await;
    let console = Console::start(&settings, true).await;
    eventually(Duration::from_secs(30), "the worker resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 2
    })
    .await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/").await;
    let light = rgb(&style(&browser, "body", "background-color").await);
    assert!(luminance(light) > 0.5, "light by default: {light:?}");

    dark_system(&browser).await;
    browser.open(&console.url("/console/")).await;
    browser.click("[data-live-toggle]").await;
    browser.screenshot("dark-overview").await;
    let matches = run(
        &browser,
        "return matchMedia('(prefers-color-scheme: dark)').matches;",
        Vec::new(),
    )
    .await;
    assert_eq!(matches, serde_json::json!(true), "the system is dark");
    let body = rgb(&style(&browser, "body", "background-color").await);
    assert!(luminance(body) < 0.05, "a dark page: {body:?}");

    // Text against what it is drawn on, in every part: 4.5 to 1 at least.
    let parts = [
        ("main h1", "body"),
        ("table.broke td.fingerprint", "section.broke"),
        ("table.backlog th a", "section"),
        ("table.backlog thead th", "table.backlog thead th"),
        ("ul.cards li .figure", "ul.cards li"),
        ("ul.legend li", "section"),
        ("header.top .brand", "header.top"),
        ("p.as-of", "body"),
    ];
    for (text, under) in parts {
        let ink = rgb(&style(&browser, text, "color").await);
        let paper = rgb(&style(&browser, under, "background-color").await);
        let ratio = contrast(ink, paper);
        assert!(
            ratio >= 4.5,
            "{text} on {under}: {ratio:.1} ({ink:?} on {paper:?})"
        );
    }
    let chart = rgb(&style(&browser, "svg.chart", "background-color").await);
    assert!(luminance(chart) < 0.05, "the chart's ground: {chart:?}");
    let axis = rgb(&style(&browser, "svg.chart .axis", "fill").await);
    assert!(contrast(axis, chart) >= 4.5, "the chart's words: {axis:?}");

    browser.open(&console.url("/console/tasks")).await;
    browser.screenshot("dark-tasks").await;
    for (text, under) in [
        ("table.tasks td a", "section"),
        ("table.tasks td.error .cut", "section"),
        ("table.tasks thead th", "table.tasks thead th"),
        (
            "table.tasks .badge.status-failed",
            "table.tasks .badge.status-failed",
        ),
        (
            "table.tasks .badge.status-discarded",
            "table.tasks .badge.status-discarded",
        ),
        ("#f-search", "#f-search"),
        ("#f-handler", "#f-handler"),
        (
            "nav.status-tabs a[aria-current=page]",
            "nav.status-tabs a[aria-current=page]",
        ),
        ("button[value=retry]", "button[value=retry]"),
        ("button[value=discard]", "button[value=discard]"),
        ("fieldset.actions label", "section"),
    ] {
        let ink = rgb(&style(&browser, text, "color").await);
        let mut paper = rgb(&style(&browser, under, "background-color").await);
        if style(&browser, under, "background-color").await == "rgba(0, 0, 0, 0)" {
            paper = rgb(&style(&browser, "section", "background-color").await);
        }
        let ratio = contrast(ink, paper);
        assert!(
            ratio >= 4.5,
            "{text} on {under}: {ratio:.1} ({ink:?} on {paper:?})"
        );
    }
    browser
        .click("table.tasks tbody tr:last-child td.error .cut")
        .await;
    browser.screenshot("dark-tasks-error-whole").await;
    let first = browser.text("table.tasks tbody tr:last-child td a").await;
    browser
        .open(&console.url(&format!("/console/tasks/{first}")))
        .await;
    browser.screenshot("dark-task").await;
    let ink = rgb(&style(&browser, "div.payload pre", "color").await);
    let paper = rgb(&style(&browser, "div.payload pre", "background-color").await);
    assert!(contrast(ink, paper) >= 4.5, "the payload reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_keyboard_searches_moves_through_tasks_opens_one_and_shows_its_help() {
    use fantoccini::key::Key;
    let (store, settings) = fresh_store().await;
    let ids = enqueue(
        &store,
        (1..=5)
            .map(|i| task("orders", format!("order-{i}").as_bytes(), b"{}"))
            .collect(),
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/tasks").await;
    let marked = || async {
        run(
            &browser,
            "return Array.prototype.map.call(document.querySelectorAll('table.tasks tbody tr.current'), \
               function (r) { return r.querySelector('a').textContent; });",
            Vec::new(),
        )
        .await
    };

    // `/` goes to the search box; keys typed there are text, not commands.
    press_char(&browser, '/').await;
    assert_eq!(browser.focused_id().await, "f-search");
    for c in "jk?".chars() {
        press_char(&browser, c).await;
    }
    let typed = run(
        &browser,
        "return document.getElementById('f-search').value;",
        Vec::new(),
    )
    .await;
    assert_eq!(typed, serde_json::json!("jk?"));
    assert_eq!(marked().await, serde_json::json!([]));
    assert_eq!(browser.count("#keys:not([hidden])").await, 0);
    // Esc leaves the field.
    browser.press(Key::Escape).await;
    assert_ne!(browser.focused_id().await, "f-search");

    // j and k move a visible mark through the rows (newest first).
    let newest: Vec<String> = ids.iter().rev().map(|id| id.0.to_string()).collect();
    press_char(&browser, 'j').await;
    assert_eq!(marked().await, serde_json::json!([newest[0]]));
    press_char(&browser, 'j').await;
    press_char(&browser, 'j').await;
    press_char(&browser, 'k').await;
    assert_eq!(marked().await, serde_json::json!([newest[1]]));
    let ground = rgb(&style(&browser, "table.tasks tbody tr.current", "background-color").await);
    let others = style(
        &browser,
        "table.tasks tbody tr:last-child",
        "background-color",
    )
    .await;
    assert_ne!(
        format!("{ground:?}"),
        format!(
            "{:?}",
            rgb(&others.replace("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"))
        ),
        "the mark shows"
    );
    // x ticks the marked task.
    press_char(&browser, 'x').await;
    let ticked = run(
        &browser,
        "return document.querySelector('table.tasks tbody tr.current input[name=id]').checked;",
        Vec::new(),
    )
    .await;
    assert_eq!(ticked, serde_json::json!(true));
    browser.screenshot("keyboard-marked").await;

    // ? shows the keys; Esc closes them.
    press_char(&browser, '?').await;
    assert_eq!(browser.count("#keys:not([hidden])").await, 1);
    let help = browser.text("#keys").await;
    for key in ["/", "j / k", "Enter", "?", "Esc"] {
        assert!(help.contains(key), "{help}");
    }
    browser.screenshot("keyboard-help").await;
    browser.press(Key::Escape).await;
    assert_eq!(browser.count("#keys:not([hidden])").await, 0);

    // Enter opens the marked task.
    let page = browser
        .client
        .find(fantoccini::Locator::Css("html"))
        .await
        .unwrap();
    browser.press(Key::Enter).await;
    eventually(Duration::from_secs(10), "the task's page", || async {
        page.attr("lang").await.is_err()
    })
    .await;
    assert_eq!(
        browser.path().await,
        format!("/console/tasks/{}", newest[1])
    );
}

/// Found by an attack: j, k and Enter moved through the task list only, and `/` did
/// nothing on a page without the search box, while `?` listed them on every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_keyboard_moves_through_causes_and_searches_from_every_page() {
    use fantoccini::key::Key;
    let (store, settings) = fresh_store().await;
    for (key, class, message) in [
        ("a", "java.net.ConnectException", "Connection refused"),
        ("b", "java.net.ConnectException", "Connection refused"),
        ("c", "com.acme.Missing", "order 7 not found"),
    ] {
        store
            .enqueue(&failing("billing", key, class, message))
            .await
            .unwrap();
    }
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/causes").await;
    press_char(&browser, 'j').await;
    press_char(&browser, 'j').await;
    press_char(&browser, 'k').await;
    let marked = run(
        &browser,
        "return Array.prototype.map.call(document.querySelectorAll('table.broke tbody tr.current'), \
           function (r) { return r.querySelector('td.go a').getAttribute('aria-label'); });",
        Vec::new(),
    )
    .await;
    let biggest = marked[0].as_str().unwrap_or_default().to_owned();
    assert!(biggest.starts_with("Tasks of cause "), "{marked}");
    let outline = style(&browser, "table.broke tbody tr.current", "outline-style").await;
    assert_eq!(outline, "solid", "the mark shows");
    browser.screenshot("keyboard-causes").await;
    let page = browser
        .client
        .find(fantoccini::Locator::Css("html"))
        .await
        .unwrap();
    browser.press(Key::Enter).await;
    eventually(Duration::from_secs(10), "the cause's tasks", || async {
        page.attr("lang").await.is_err()
    })
    .await;
    assert!(
        browser.path().await.contains("cause="),
        "{}",
        browser.path().await
    );
    assert_eq!(
        listed_ids(&browser).await.len(),
        2,
        "the biggest cause's tasks"
    );

    // Found by a second attack: the overview's refresh replaced the rows and the mark,
    // and Enter then opened a row nobody had marked.
    browser.open(&console.url("/console/")).await;
    // (paused, so that no refresh of its own comes between the steps)
    browser.click("[data-live-toggle]").await;
    press_char(&browser, 'j').await;
    press_char(&browser, 'j').await;
    assert_eq!(browser.count("table.broke tbody tr.current").await, 1);
    run(
        &browser,
        "var t = document.querySelector('table.broke'), c = t.cloneNode(true); \
         Array.prototype.forEach.call(c.querySelectorAll('tr.current'), \
           function (r) { r.classList.remove('current'); }); \
         t.parentNode.replaceChild(c, t); return null;",
        Vec::new(),
    )
    .await;
    browser.press(Key::Enter).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        browser.path().await,
        "/console/",
        "Enter opened an unmarked row"
    );
    press_char(&browser, 'j').await;
    let first = run(
        &browser,
        "return document.querySelector('table.broke tbody tr').classList.contains('current');",
        Vec::new(),
    )
    .await;
    assert_eq!(first, serde_json::json!(true), "j starts again at the top");

    // `/` on a page without the search box opens the task list's, focused.
    browser.open(&console.url("/console/")).await;
    press_char(&browser, '/').await;
    eventually(
        Duration::from_secs(10),
        "the task list's search",
        || async { browser.focused_id().await == "f-search" },
    )
    .await;
    assert!(browser.path().await.starts_with("/console/tasks"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_outcome_chart_says_which_colour_is_which_outcome() {
    let (store, settings) = fresh_store().await;
    enqueue(&store, vec![task("log", b"l1", b"1")]).await;
    let console = Console::start(&settings, true).await;
    eventually(Duration::from_secs(30), "the worker resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 1
    })
    .await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/").await;
    browser.click("[data-live-toggle]").await;
    browser.screenshot("chart-legend").await;
    let legend = rows_of(&browser, "ul.legend li").await;
    assert_eq!(
        legend,
        [
            "resolved",
            "retry, lease expired, released",
            "permanent failure",
            "other"
        ]
    );
    // Each swatch is its bars' colour.
    let swatch = style(&browser, "ul.legend .swatch.ok", "background-color").await;
    let bar = style(&browser, "svg.chart rect.bar.ok", "fill").await;
    assert_eq!(rgb(&swatch), rgb(&bar));
    for class in ["retry", "failed", "other"] {
        let other = style(
            &browser,
            &format!("ul.legend .swatch.{class}"),
            "background-color",
        )
        .await;
        assert_ne!(rgb(&other), rgb(&swatch), "{class}");
    }
}

/// The texts of every element `css` selects.
async fn rows_of(browser: &Browser, css: &str) -> Vec<String> {
    let mut texts = Vec::new();
    for element in browser
        .client
        .find_all(fantoccini::Locator::Css(css))
        .await
        .unwrap()
    {
        texts.push(element.text().await.unwrap());
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_task_held_by_a_forced_open_breaker_releases_it_from_its_page() {
    use std::io::Write;
    let (store, settings) = fresh_store().await;
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(config, "[handlers.log.breaker]").unwrap();
    let id = enqueue(&store, vec![task("log", b"l1", b"1")]).await[0];
    sqlx::query("INSERT INTO recovery_breaker (handler) VALUES ('log')")
        .execute(store.pool())
        .await
        .unwrap();
    let console = Console::start_configured(&settings, false, Some(config.path())).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/fleet").await;
    browser.fill("#breaker-open-0", "shipping is down").await;
    browser.follow("#breaker-open-0 + button").await;

    browser
        .open(&console.url(&format!("/console/tasks/{id}")))
        .await;
    browser.screenshot("breaker-release-from-task").await;
    let waiting = browser.text("dd.waiting").await;
    assert!(
        waiting.contains("redrive breakers release log"),
        "the words still say it: {waiting}"
    );
    assert_eq!(
        browser.text("dd.waiting code:nth-of-type(2)").await,
        "redrive breakers release log"
    );
    assert_eq!(
        browser.text("#release-breaker-button").await,
        "Release the breaker"
    );
    browser.fill("#release-breaker", "shipping is back").await;
    browser.follow("#release-breaker-button").await;
    let released = "SELECT count(*) FROM recovery_breaker WHERE handler = 'log' AND forced IS NULL";
    assert_eq!(scalar(&store, released).await, 1);
    let audit = "SELECT count(*) FROM recovery_audit WHERE actor = 'ops' \
        AND action = 'breaker_release' AND reason = 'shipping is back'";
    assert_eq!(scalar(&store, audit).await, 1);

    // A read-only caller is shown where the breakers are, and no button.
    let other = Browser::start().await;
    store_force_open(&browser, &console).await;
    console
        .sign_in(&other, READ, &format!("/console/tasks/{id}"))
        .await;
    assert_eq!(other.count("#release-breaker-button").await, 0);
    assert_eq!(
        href(&other, "dd.waiting a").await,
        "/console/fleet#breakers"
    );
}

/// Forces the `log` breaker open again from the fleet page.
async fn store_force_open(browser: &Browser, console: &Console) {
    browser.open(&console.url("/console/fleet")).await;
    browser.fill("#breaker-open-0", "down again").await;
    browser.follow("#breaker-open-0 + button").await;
}

/// Sixteen causes, the n-th of them n tasks: `orders`' are the odd ones, `billing`'s
/// the even ones, of four classes.
async fn sixteen_causes(store: &Store) -> Vec<Vec<TaskId>> {
    const WORDS: [&str; 16] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    ];
    let mut causes = Vec::new();
    for (n, word) in WORDS.iter().enumerate() {
        let handler = if n % 2 == 0 { "orders" } else { "billing" };
        let tasks = (0..=n)
            .map(|i| {
                failing(
                    handler,
                    &format!("{word}-{i}"),
                    &format!("Class{}", n % 4),
                    &format!("the {word} service broke on request {i}"),
                )
            })
            .collect();
        causes.push(enqueue(store, tasks).await);
    }
    causes
}

/// The causes of the tasks `ids`, as the store keeps them.
async fn cause_of(store: &Store, id: TaskId) -> i64 {
    scalar(
        store,
        &format!("SELECT cause_id FROM recovery_task WHERE id = {}", id.0),
    )
    .await
}

/// Found by a review: What broke said "16 causes; the 10 biggest:" and nothing showed
/// the other six. It links a page of every cause, grouped as asked, over a span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn every_cause_is_one_link_away_grouped_and_spanned_as_asked() {
    let (store, settings) = fresh_store().await;
    let causes = sixteen_causes(&store).await;
    // The smallest cause failed two days ago.
    sqlx::query(&format!(
        "UPDATE recovery_task SET cause_at = now() - interval '2 days' WHERE id = {}",
        causes[0][0].0
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/").await;
    browser.click("[data-live-toggle]").await;
    browser.screenshot("causes-overview-link").await;
    assert_eq!(rows(&browser, "table.broke").await.len(), 10);
    assert_eq!(
        browser.text("section.broke p.meta a").await,
        "all 16 causes →"
    );
    browser.follow("section.broke p.meta a").await;
    browser.screenshot("causes-every").await;
    assert_eq!(browser.path().await, "/console/causes");
    let every = rows(&browser, "table.broke").await;
    assert_eq!(every.len(), 16, "{every:?}");
    assert_eq!(every[0][1], "Class3", "{every:?}");
    assert!(
        every[0][2].starts_with("the papa service broke on request <n>"),
        "{every:?}"
    );
    assert_eq!(every[0][3], "16", "{every:?}");
    assert_eq!(every[15][3], "1", "{every:?}");
    let meta = browser.text("section.broke p.meta").await;
    assert!(
        meta.starts_with("136 tasks failed or given up, 16 causes. Counted ")
            && meta.ends_with(" s ago."),
        "{meta}"
    );
    assert_eq!(
        browser.text("nav.group-choices a[aria-current=page]").await,
        "cause"
    );
    // Each row leads to its cause's tasks.
    let last = causes[15][0];
    assert_eq!(
        href(&browser, "table.broke tbody tr:first-child td.go a").await,
        format!(
            "/console/tasks?status=failed&status=permanent_failure&cause={}",
            cause_of(&store, last).await
        )
    );

    // By class: four, each leading to its causes.
    browser.follow("#by-class").await;
    browser.screenshot("causes-by-class").await;
    assert_eq!(browser.path().await, "/console/causes?by=class");
    let classes = rows(&browser, "table.broke").await;
    assert_eq!(classes.len(), 4, "{classes:?}");
    assert_eq!(classes[0][0].lines().next(), Some("Class3"), "{classes:?}");
    assert_eq!(classes[0][1], "40", "4 + 8 + 12 + 16: {classes:?}");
    browser
        .follow("table.broke tbody tr:first-child td.go a")
        .await;
    assert_eq!(browser.path().await, "/console/causes?class=Class3");
    let of_class = rows(&browser, "table.broke").await;
    assert_eq!(of_class.len(), 4, "{of_class:?}");
    assert!(
        of_class.iter().all(|row| row[1] == "Class3"),
        "{of_class:?}"
    );

    // By handler: two, each leading to its tasks not done.
    browser.open(&console.url("/console/causes")).await;
    browser.follow("#by-handler").await;
    browser.screenshot("causes-by-handler").await;
    let handlers = rows(&browser, "table.broke").await;
    assert_eq!(handlers.len(), 2, "{handlers:?}");
    assert_eq!(
        (handlers[0][0].lines().next(), handlers[0][1].as_str()),
        (Some("billing"), "72"),
        "{handlers:?}"
    );
    assert_eq!(
        href(&browser, "table.broke tbody tr:first-child td.go a").await,
        "/console/tasks?status=failed&status=permanent_failure&handler=billing"
    );

    // Over the last day: the cause of two days ago is left out; any time, it is in.
    browser.follow("#since-last-day").await;
    browser.screenshot("causes-by-handler-last-day").await;
    assert_eq!(browser.path().await, "/console/causes?by=handler&since=1d");
    let day = rows(&browser, "table.broke").await;
    assert_eq!(day[1][0].lines().next(), Some("orders"), "{day:?}");
    assert_eq!(day[1][1], "63", "64 but the one of two days ago: {day:?}");
    assert!(
        browser
            .text("section.broke p.meta")
            .await
            .starts_with("135 tasks failed or given up within the last day"),
        "{}",
        browser.text("section.broke p.meta").await
    );
    browser.follow("#by-cause").await;
    assert_eq!(browser.path().await, "/console/causes?since=1d");
    assert_eq!(rows(&browser, "table.broke").await.len(), 15);
    browser.follow("#since-any-time").await;
    assert_eq!(rows(&browser, "table.broke").await.len(), 16);

    // A wrong choice is refused by name.
    browser
        .open(&console.url("/console/causes?by=colour"))
        .await;
    let refused = browser.text("main").await;
    assert!(refused.contains("unknown grouping \"colour\""), "{refused}");
}

/// Found by a review: What broke's rows drew each sparkline to its own scale (a 1-task
/// cause as tall as a 605-task one), a blank message was an empty cell, a cause's
/// example message was nowhere, and the overview wrote "1,303" in What broke but "1339"
/// in its tiles and tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn what_broke_rows_compare_and_the_overview_writes_numbers_one_way() {
    let (store, settings) = fresh_store().await;
    let big: Vec<NewTask> = (1..=1303)
        .map(|i| {
            failing(
                "orders",
                &format!("order-{i}"),
                "java.net.SocketTimeoutException",
                &format!("connect timed out after {} ms", 30_000 + i),
            )
        })
        .collect();
    enqueue(&store, big).await;
    enqueue(
        &store,
        vec![
            failing(
                "billing",
                "one",
                "IllegalStateException",
                "the one odd failure",
            ),
            failing("billing", "blank", "EmptyException", "   "),
        ],
    )
    .await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/").await;
    browser.click("[data-live-toggle]").await;
    browser.screenshot("what-broke-compared").await;

    let broke = rows(&browser, "table.broke").await;
    assert_eq!(broke.len(), 3, "{broke:?}");
    assert_eq!(broke[0][3], "1,303", "{broke:?}");
    // The example message, muted under the fingerprint, whole in its title.
    let example = browser
        .text("table.broke tbody tr:first-child td.fingerprint .example")
        .await;
    assert!(
        example.contains("connect timed out after 3") && !example.contains("<n>"),
        "{example}"
    );
    // A blank message says so.
    let blank = broke
        .iter()
        .find(|row| row[1] == "EmptyException")
        .expect("the blank cause");
    assert_eq!(blank[2], "(empty message)", "{broke:?}");
    // One scale for every row: the 1-task cause's bar is a sliver of the big one's.
    let heights = run(
        &browser,
        "return Array.prototype.map.call(document.querySelectorAll('table.broke tbody tr'), \
           function (r) { var b = r.querySelector('svg.spark rect.bar'); \
             return b ? b.getBoundingClientRect().height : 0; });",
        Vec::new(),
    )
    .await;
    let heights: Vec<f64> = heights
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_f64().unwrap())
        .collect();
    assert!(
        heights[1] * 4.0 < heights[0] && heights[1] > 0.0,
        "bar heights: {heights:?}"
    );

    // Every number of the overview is written with the same separators.
    assert_eq!(
        browser.text("ul.cards li:first-child .figure").await,
        "1,305"
    );
    let backlog = rows(&browser, "table.backlog").await;
    let orders = backlog.iter().find(|r| r[0] == "orders").unwrap();
    assert_eq!(orders[1], "1,303", "{backlog:?}");
    assert_eq!(
        browser
            .text("table.backlog tfoot td.number:first-of-type")
            .await,
        "1,305"
    );
    let meta = browser.text("section.broke p.meta").await;
    assert!(meta.starts_with("1,305 tasks failed"), "{meta}");
}

/// Found by a review: a task's page said nothing of its cause, and a dead letter not
/// yet attempted showed "Last error —" though it came with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_task_page_shows_its_cause_and_the_error_it_was_reported_with() {
    let (store, settings) = fresh_store().await;
    let message = "connect timed out after 30001 ms to 10.0.0.1:9092";
    let ids = enqueue(
        &store,
        vec![
            failing(
                "orders",
                "order-1",
                "java.net.SocketTimeoutException",
                message,
            ),
            failing(
                "orders",
                "order-2",
                "java.net.SocketTimeoutException",
                message,
            ),
        ],
    )
    .await;
    let cause = cause_of(&store, ids[0]).await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console
        .sign_in(&browser, READ, &format!("/console/tasks/{}", ids[0]))
        .await;
    browser.screenshot("task-cause-and-reported-error").await;
    let said = browser.text("dd.cause").await;
    assert!(
        said.starts_with("java.net.SocketTimeoutException: connect timed out after <n> ms to"),
        "{said}"
    );
    assert_eq!(
        href(&browser, "dd.cause a").await,
        format!("/console/tasks?status=failed&status=permanent_failure&cause={cause}")
    );
    assert_eq!(
        browser.text("section.headline pre.error").await,
        message,
        "the reported error, for want of a last one"
    );
    let label = browser.text("section.headline p.reported").await;
    assert!(
        label.contains("reported with") && label.contains("java.net.SocketTimeoutException"),
        "{label}"
    );
    browser.follow("dd.cause a").await;
    let mut expected: Vec<i64> = ids.iter().map(|id| id.0).collect();
    expected.reverse();
    assert_eq!(listed_ids(&browser).await, expected);
}

/// Found by a review: a cause's task list was titled "Tasks", its cause a number among
/// the folded filters, its tabs counted every task while it listed a few, and with
/// failed and permanent_failure chosen no tab looked chosen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_causes_task_list_names_the_cause_and_its_tabs_count_its_tasks() {
    let (store, settings) = fresh_store().await;
    let first = "connect timed out after 30001 ms to 10.0.0.1:9092";
    let timeouts = enqueue(
        &store,
        (1..=3)
            .map(|i| {
                failing(
                    "orders",
                    &format!("order-{i}"),
                    "java.net.SocketTimeoutException",
                    &format!("connect timed out after 3000{i} ms to 10.0.0.{i}:9092"),
                )
            })
            .collect(),
    )
    .await;
    enqueue(
        &store,
        (1..=5)
            .map(|i| failing("orders", &format!("other-{i}"), "Other", "something else"))
            .collect(),
    )
    .await;
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("fixed".into()),
    };
    store
        .act(
            &operator,
            &Action::Resolve { force: false },
            &Selection::Ids(vec![timeouts[0]]),
        )
        .await
        .unwrap();
    let cause = cause_of(&store, timeouts[1]).await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, OPERATE, "/console/").await;
    browser
        .follow(&format!(
            "table.broke td.go a[aria-label='Tasks of cause {cause}']"
        ))
        .await;
    browser.screenshot("cause-tasks-banner").await;
    assert_eq!(
        browser.path().await,
        format!("/console/tasks?status=failed&status=permanent_failure&cause={cause}")
    );
    assert_eq!(
        browser.text("main h1").await,
        format!("Tasks of cause {cause}")
    );
    let banner = browser.text("section.cause-banner p").await;
    assert!(
        banner.starts_with(&format!(
            "Cause {cause} · java.net.SocketTimeoutException · connect timed out after <n> ms to "
        )) && banner.ends_with(" · 2 tasks failed or given up · every cause →"),
        "{banner}"
    );
    browser.click("section.cause-banner details summary").await;
    let example = browser.text("section.cause-banner pre.example").await;
    assert!(example.starts_with(&first[..26]), "{example}");
    browser.screenshot("cause-tasks-banner-example").await;

    // The tabs count this cause's tasks, and say so.
    assert_eq!(listed_ids(&browser).await.len(), 2);
    assert_eq!(browser.text("#tab-resolved").await, "resolved 1");
    assert_eq!(browser.text("#tab-discarded").await, "discarded 0");
    assert!(
        browser.text("#tab-failed").await.starts_with("failed 2"),
        "{}",
        browser.text("#tab-failed").await
    );
    assert!(
        browser
            .text("nav.status-tabs .counted")
            .await
            .starts_with("Counts: the tasks of this filter"),
        "{}",
        browser.text("nav.status-tabs .counted").await
    );
    // Both statuses chosen look chosen; the others do not.
    let marked = |css: &'static str| {
        let browser = &browser;
        async move {
            (
                style(browser, css, "box-shadow").await,
                style(browser, css, "font-weight").await,
            )
        }
    };
    for chosen in ["#tab-failed", "#tab-permanent_failure"] {
        let (shadow, weight) = marked(chosen).await;
        assert!(
            shadow != "none" && weight == "600",
            "{chosen}: {shadow} {weight}"
        );
    }
    let (shadow, weight) = marked("#tab-resolved").await;
    assert!(
        shadow == "none" && weight != "600",
        "resolved: {shadow} {weight}"
    );
    assert_eq!(
        browser.text("nav.status-tabs a[aria-current=page]").await,
        "All not done 2",
        "the cause's tasks not done are what its link selects"
    );
    browser.follow("#tab-resolved").await;
    assert_eq!(listed_ids(&browser).await, vec![timeouts[0].0]);
    assert!(browser
        .text("section.cause-banner p")
        .await
        .starts_with(&format!("Cause {cause} · java.net.SocketTimeoutException")));

    // Found by an attack: the confirm page of an action on a cause said "cause 4" only.
    browser
        .open(&console.url(&format!(
            "/console/tasks?status=failed&status=permanent_failure&cause={cause}"
        )))
        .await;
    browser.click("#select-filter").await;
    browser.follow("#act button[value=retry]").await;
    browser.screenshot("confirm-retry-cause-named").await;
    let named = browser.text("p.cause-named").await;
    assert!(
        named.starts_with(&format!(
            "Cause {cause}: java.net.SocketTimeoutException connect timed out after <n> ms"
        )),
        "{named}"
    );

    // Found by an attack: an unknown cause read as a cause with nothing broken.
    browser
        .open(&console.url("/console/tasks?cause=999999"))
        .await;
    assert!(
        browser
            .text("section.cause-banner p")
            .await
            .starts_with("No cause has id 999999."),
        "{}",
        browser.text("section.cause-banner p").await
    );
    // Under a window, the banner counts what the list holds, and says since when.
    browser
        .open(&console.url(&format!(
            "/console/tasks?status=failed&status=permanent_failure&cause={cause}&failed_after=2999-01-01T00:00:00Z"
        )))
        .await;
    let banner = browser.text("section.cause-banner p").await;
    assert!(
        banner.contains("0 tasks failed or given up that last failed since 2999-01-01"),
        "{banner}"
    );
    assert_eq!(listed_ids(&browser).await.len(), 0);
}

/// Forces the breaker of `handler` open, as an operator would.
async fn force_open(store: &Store, handler: &str) {
    sqlx::query("INSERT INTO recovery_breaker (handler) VALUES ($1)")
        .bind(handler)
        .execute(store.pool())
        .await
        .unwrap();
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("shipping is down".into()),
    };
    store
        .command_breaker(
            handler,
            redrive::store::BreakerCommand::Open,
            &redrive::config::BreakerSettings::default(),
            &operator,
        )
        .await
        .unwrap();
}

/// Found by a review: the replay confirm page put its checkbox alone on a line, its
/// label under it; a task's page ran the forced-open words into the release form's
/// label; a retry's confirm page showed the breaker warning's backticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_checkbox_sits_by_its_label_and_commands_read_apart_and_as_code() {
    use std::io::Write;
    let (store, settings) = fresh_store().await;
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(config, "[handlers.log.breaker]").unwrap();
    let id = enqueue(&store, vec![task("log", b"l1", b"1")]).await[0];
    force_open(&store, "log").await;
    let console = Console::start_configured(&settings, false, Some(config.path())).await;
    let browser = Browser::start().await;
    console
        .sign_in(&browser, OPERATE, "/console/tasks?handler=log")
        .await;

    // The replay's confirm page: the checkbox on its label's line, before it.
    browser.click("#select-filter").await;
    browser.follow("#act button[value=replay]").await;
    browser.screenshot("confirm-replay-checkbox").await;
    let boxes = run(
        &browser,
        "var c = document.querySelector('#c-resolved').getBoundingClientRect(), \
             l = document.querySelector('label[for=c-resolved]').getBoundingClientRect(); \
         return [c.top + c.height / 2, l.top + l.height / 2, c.right, l.left];",
        Vec::new(),
    )
    .await;
    let at = |i: usize| boxes[i].as_f64().unwrap();
    assert!((at(0) - at(1)).abs() < 4.0, "one line: {boxes}");
    assert!(at(2) <= at(3), "the box, then its label: {boxes}");

    // The task's page: the words, then the release form, apart.
    browser
        .open(&console.url(&format!("/console/tasks/{id}")))
        .await;
    browser.screenshot("forced-open-task-words-apart").await;
    let shown = run(
        &browser,
        "return document.querySelector('dd.waiting').innerText;",
        Vec::new(),
    )
    .await;
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("(redrive breakers release log)\nReason to release"),
        "{shown:?}"
    );

    // A retry's confirm page: the warning's handler and command as code.
    browser
        .follow("form.task-actions button[value=retry]")
        .await;
    browser.screenshot("confirm-retry-breaker-warning").await;
    let warning = browser.text("ul.held-by-breakers li").await;
    assert!(!warning.contains('`'), "{warning}");
    assert!(
        warning.contains("none of the retried tasks of log will run until it is released"),
        "{warning}"
    );
    assert_eq!(
        rows_of(&browser, "ul.held-by-breakers li code").await,
        vec!["log", "log", "redrive breakers release log"]
    );
}

/// Found by a review: a task held behind a breaker forced open until released showed
/// "Next attempt: in 1 s" in the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_task_behind_a_forced_open_breaker_says_so_in_the_list() {
    let (store, settings) = fresh_store().await;
    let held = enqueue(&store, vec![task("log", b"l1", b"1")]).await[0];
    let free = enqueue(&store, vec![task("orders", b"o1", b"1")]).await[0];
    sqlx::query("UPDATE recovery_task SET next_attempt_at = now() + interval '8 seconds'")
        .execute(store.pool())
        .await
        .unwrap();
    force_open(&store, "log").await;
    let console = Console::start(&settings, false).await;
    let browser = Browser::start().await;
    console.sign_in(&browser, READ, "/console/tasks").await;
    browser.screenshot("tasks-behind-forced-breaker").await;
    let listed = rows(&browser, "table.tasks").await;
    let next = |id: TaskId| {
        listed
            .iter()
            .find(|row| row[0] == id.0.to_string())
            .map(|row| row[7].clone())
            .unwrap()
    };
    assert_eq!(
        next(held),
        "held: breaker forced open (until released)",
        "{listed:?}"
    );
    assert!(next(free).starts_with("in "), "{listed:?}");
}
