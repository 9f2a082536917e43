//! Hostile numbers: every numeric configuration key, admin API field and CLI flag is
//! given zero, negatives, the tiny, the huge, NaN and infinities (as numbers and as
//! strings), the empty string and words. Nothing may panic: the configuration is
//! refused naming the key (or accepted when the value is fine), the API answers 4xx
//! with a message and keeps serving, the CLI answers an error and exits 1 or 2. Which
//! hostile values a configuration key may take is listed ([`acceptable`]).

use crate::support::{Bounded, CHILD_LIMIT};
use std::panic::AssertUnwindSafe;

/// The values every numeric input is given, as the text an operator would type.
const HOSTILE: &[&str] = &[
    "0",
    "-1",
    "1e-20",
    "1e309",
    "-1e309",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "NaN",
    "inf",
    "-inf",
    "",
    "many",
    "1.5",
    "99999999999999999999999years",
];

/// A configuration with one of each table that has numeric keys: a process route
/// with a brake, a handler with limits and a breaker, a webhook.
const BASE: &str = r#"
[[routes]]
name = "orders"
topics = ["orders"]
mode = "process"
handler = "log"
[routes.brake]

[handlers.log]
max_concurrency = 2
[handlers.log.breaker]

[webhooks.hook]
url = "http://127.0.0.1:1/hook"
"#;

/// Every numeric key of the configuration (durations among them), as `table.key` in
/// the TOML above; `routes.` keys go to the route.
const CONFIG_KEYS: &[&str] = &[
    "database.max_connections",
    "database.connect_timeout",
    "worker.concurrency",
    "worker.batch_size",
    "worker.lease",
    "worker.heartbeat",
    "worker.poll_interval",
    "worker.shutdown_timeout",
    "retry.max_attempts",
    "retry.timeout",
    "retry.backoff_base",
    "retry.backoff_factor",
    "retry.backoff_cap",
    "ingest.batch_size",
    "ingest.batch_bytes",
    "ingest.linger",
    "ingest.max_message_bytes",
    "ingest.stacktrace_max_bytes",
    "ingest.process_concurrency",
    "ingest.process_budget",
    "admin.statement_timeout",
    "retention.resolved",
    "retention.discarded",
    "retention.permanent_failure",
    "retention.interval",
    "routes.max_attempts",
    "routes.timeout",
    "routes.backoff_base",
    "routes.backoff_cap",
    "routes.backoff_factor",
    "routes.brake.failure_ratio",
    "routes.brake.window",
    "routes.brake.min_messages",
    "routes.brake.cool_down",
    "handlers.log.max_concurrency",
    "handlers.log.rate_limit",
    "handlers.log.breaker.consecutive_failures",
    "handlers.log.breaker.failure_ratio",
    "handlers.log.breaker.window",
    "handlers.log.breaker.min_calls",
    "handlers.log.breaker.cool_down",
    "handlers.log.breaker.probes",
    "webhooks.hook.connect_timeout",
    "webhooks.hook.timeout",
    "webhooks.hook.retry_after_max",
];

/// `value` as TOML: a string always; also a bare number where TOML has one.
fn toml_forms(value: &str) -> Vec<String> {
    let mut forms = vec![format!("{value:?}")];
    let bare = match value {
        "NaN" => Some("nan".to_owned()),
        "inf" | "-inf" => Some(value.to_owned()),
        "" | "many" | "99999999999999999999999years" => None,
        // Numbers TOML cannot hold are refused by the TOML parser, naming the line:
        // fine, but not what this sweep is about.
        "9223372036854775808" | "18446744073709551616" | "1e309" | "-1e309" => None,
        _ => Some(value.to_owned()),
    };
    forms.extend(bare);
    forms
}

/// `BASE` with `key` set to `value` (a TOML literal), in its table.
fn with_key(key: &str, value: &str) -> String {
    let (table, name) = key.rsplit_once('.').unwrap();
    let line = format!("{name} = {value}\n");
    match table {
        "routes" => BASE.replacen(
            "handler = \"log\"\n",
            &format!("handler = \"log\"\n{line}"),
            1,
        ),
        "routes.brake" => BASE.replacen("[routes.brake]\n", &format!("[routes.brake]\n{line}"), 1),
        "handlers.log" => BASE.replacen("max_concurrency = 2\n", &line, 1),
        "handlers.log.breaker" | "webhooks.hook" => {
            BASE.replacen(&format!("[{table}]\n"), &format!("[{table}]\n{line}"), 1)
        }
        _ => format!("[{table}]\n{line}{BASE}"),
    }
}

/// The name an error must mention: the key as written in the file (a route's keys
/// are named by the route, `routes[0].…`).
fn named(key: &str) -> String {
    match key.strip_prefix("routes.") {
        Some(rest) => format!("routes[0].{rest}"),
        None => key.to_owned(),
    }
}

/// The hostile values a key may legitimately take (`literal` as written in the file).
fn acceptable(key: &str, literal: &str) -> bool {
    let value = literal.trim_matches('"');
    let bare = !literal.starts_with('"');
    match value {
        // The TOML layer rounds a bare float given for a whole number (`1.5` reads as
        // 2, NaN and -inf as 0): what is left is checked like any whole number.
        "1.5" | "1e-20" | "nan" | "-inf" if bare && !FLOAT_KEYS.contains(&key) => {
            value == "1.5" || ZERO_OK.contains(&key)
        }
        "0" => ZERO_OK.contains(&key),
        // Ratios may be tiny; a factor, huge (the delay is capped); a rate, 1.5/s.
        "1e-20" => key.ends_with("failure_ratio"),
        "1.5" => FLOAT_KEYS.contains(&key),
        "9223372036854775807" | "9223372036854775808" | "18446744073709551616" => {
            key.ends_with("backoff_factor")
        }
        _ => false,
    }
}

/// Keys read as fractional numbers.
const FLOAT_KEYS: &[&str] = &[
    "retry.backoff_factor",
    "routes.backoff_factor",
    "routes.brake.failure_ratio",
    "handlers.log.rate_limit",
    "handlers.log.breaker.failure_ratio",
];

/// Keys for which zero means something: no wait, no stack trace kept.
const ZERO_OK: &[&str] = &[
    "retry.backoff_base",
    "routes.backoff_base",
    "routes.backoff_cap",
    "webhooks.hook.retry_after_max",
    "worker.shutdown_timeout",
    "ingest.stacktrace_max_bytes",
];

#[test]
fn hostile_numbers_in_the_configuration_are_refused_naming_the_key_or_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for key in CONFIG_KEYS {
        for value in HOSTILE {
            for literal in toml_forms(value) {
                let path = dir.path().join("redrive.toml");
                std::fs::write(&path, with_key(key, &literal)).unwrap();
                let loaded = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let settings = redrive::Settings::load(Some(&path), Some(Default::default()))?;
                    // Accepted values must also build a fleet.
                    redrive::Fleet::builder(settings)
                        .with_builtin_handlers()
                        .build()
                        .map(|_| ())
                        .map_err(|e| redrive::ConfigError::new("(fleet)", e.to_string()))
                }));
                match loaded {
                    Err(_) => failures.push(format!("{key} = {literal}: panicked")),
                    Ok(Err(error)) if !error.to_string().contains(&named(key)) => failures.push(
                        format!("{key} = {literal}: error does not name it: {error}"),
                    ),
                    Ok(Err(_)) => {}
                    Ok(Ok(())) if acceptable(key, &literal) => {}
                    Ok(Ok(())) => failures.push(format!("{key} = {literal}: accepted")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `value` as JSON: a string always; also a bare number where JSON has one (a number
/// JSON can write but no field can hold, like 1e309, included).
fn json_forms(value: &str) -> Vec<String> {
    let mut forms = vec![format!("{value:?}")];
    if !value.is_empty()
        && value
            .parse::<f64>()
            .is_ok_and(|_| !value.contains(['N', 'i']))
    {
        forms.push(value.to_owned());
    }
    forms
}

/// Every numeric field of the admin API's requests, as a path with `{}` where the value
/// goes (a query, a path segment) or a JSON body with `{}` for the value.
const API_GETS: &[&str] = &[
    "/api/v1/tasks?limit={}",
    "/api/v1/tasks?after={}",
    "/api/v1/tasks/{}",
    "/api/v1/replays?limit={}",
    "/api/v1/audit?limit={}",
    "/api/v1/audit?before={}",
    "/api/v1/tasks?created_after={}",
];
const API_POSTS: &[(&str, &str)] = &[
    ("/api/v1/tasks/retry", r#"{"ids": [{}]}"#),
    (
        "/api/v1/tasks/retry",
        r#"{"ids": [1], "more_attempts": {}}"#,
    ),
    ("/api/v1/tasks/retry", r#"{"ids": [1], "at": {}}"#),
    ("/api/v1/tasks/discard", r#"{"ids": [{}], "reason": "x"}"#),
    ("/api/v1/tasks/replay", r#"{"all": true, "rate": {}}"#),
    ("/api/v1/replays/{}/cancel", "{}"),
];

fn percent_encoded(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_numbers_in_api_requests_are_answered_4xx_and_the_member_keeps_serving() {
    use crate::support::api::{with_tokens, Api, OPERATE};
    let kafka = crate::support::broker::cluster(&[("orders", 1)]);
    let (store, mut settings) = crate::support::fresh_store().await;
    settings.kafka.bootstrap_servers = kafka.bootstrap_servers();
    let settings = with_tokens(settings);
    let mut task = redrive::NewTask::new("log", b"x".to_vec());
    task.status = redrive::Status::PermanentFailure;
    store.enqueue_many(&[task]).await.unwrap();
    let api = Api::start(&store, &settings).await;
    let mut failures = Vec::new();
    let mut check = |what: String, status: reqwest::StatusCode, text: &str| {
        if status.is_server_error() || (status.is_client_error() && text.trim().is_empty()) {
            failures.push(format!("{what}: {status} {text}"));
        }
    };
    for value in HOSTILE {
        for get in API_GETS {
            let path = get.replace("{}", &percent_encoded(value));
            let (status, body) = api.get(&path, Some(OPERATE)).await;
            check(format!("GET {path}"), status, &body.to_string());
        }
        for (path, body) in API_POSTS {
            let (path, forms) = match path.contains("{}") {
                true => (
                    path.replace("{}", &percent_encoded(value)),
                    vec![body.to_string()],
                ),
                false => (path.to_string(), json_forms(value)),
            };
            for form in forms {
                let body = body.replacen("{}", &form, 1);
                let (status, text) = api.post_raw(&path, OPERATE, body.clone()).await;
                check(format!("POST {path} {body}"), status, &text);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let (status, _) = api.get("/api/v1/members", Some(OPERATE)).await;
    assert_eq!(status, 200, "the member still serves");
}

/// Every numeric flag and argument of the CLI, with `{}` for the value (given as
/// `--flag=VALUE`, so that a negative number is not taken for a flag).
const CLI: &[&[&str]] = &[
    &["enqueue", "--handler", "log", "--max-attempts={}"],
    &["enqueue", "--handler", "log", "--delay={}"],
    &["tasks", "list", "--limit={}"],
    &["tasks", "list", "--after={}"],
    &["tasks", "list", "--watch={}"],
    &["tasks", "stats", "--watch={}"],
    &["tasks", "list", "--created-after={}"],
    &["tasks", "show", "--", "{}"],
    &["tasks", "retry", "--yes", "--", "{}"],
    &["tasks", "retry", "--yes", "--at={}", "1"],
    &["tasks", "retry", "--yes", "--more-attempts={}", "1"],
    &[
        "tasks",
        "replay",
        "--all",
        "--yes",
        "--dry-run",
        "--rate={}",
    ],
    &["replays", "list", "--limit={}"],
    &["replays", "cancel", "--", "{}"],
    &["replays", "resume", "--", "{}"],
    &["audit", "--limit={}"],
    &["audit", "--before={}"],
    &["audit", "--since={}"],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn hostile_numbers_on_the_command_line_are_refused_with_an_error() {
    let (store, settings) = crate::support::fresh_store().await;
    let mut task = redrive::NewTask::new("log", b"x".to_vec());
    task.status = redrive::Status::PermanentFailure;
    store.enqueue_many(&[task]).await.unwrap();
    let mut failures = Vec::new();
    for value in HOSTILE {
        for args in CLI {
            let args: Vec<String> = args.iter().map(|a| a.replace("{}", value)).collect();
            let mut command = crate::support::cli::redrive(&settings);
            let out = command
                .args(&args)
                .stdin(std::process::Stdio::null())
                .output_within(CHILD_LIMIT)
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let fine = match out.status.code() {
                Some(0) => true,
                Some(1 | 2) => !stderr.trim().is_empty() && !stderr.contains("panicked"),
                _ => false,
            };
            if !fine {
                failures.push(format!("{args:?}: {:?} {stderr}", out.status));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
