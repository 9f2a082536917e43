//! What an SRE sees, proven against real parts: a real Prometheus scrapes a working
//! fleet, and every dashboard panel and alert rule is evaluated through its HTTP API;
//! `/readyz` follows PostgreSQL through an outage; JSON log lines carry the attempt's
//! task id and never a secret.

use async_trait::async_trait;
use redrive::config::{BrakeSettings, BreakerSettings, HandlerSettings, RouteMode};
use redrive::{Fleet, Handler, HandlerContext, HandlerError, Settings, Store, Task};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::broker::{produce, producer, route, use_cluster, KafkaCase, Sample};
use crate::support::{eventually, fresh_store, Member, PgProxy};
use crate::support::{Bounded, CHILD_LIMIT};

/// Resolves even values, fails odd ones (transiently, then for good).
struct Flaky;

#[async_trait]
impl Handler for Flaky {
    async fn handle(&self, _: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let value = task.failure.value.as_deref().unwrap_or_default();
        if value.last().is_some_and(|b| b % 2 == 1) {
            return Err(HandlerError::transient("odd value"));
        }
        Ok(())
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(2)
    }

    fn backoff(&self) -> Option<redrive::Backoff> {
        Some(redrive::Backoff {
            base: Duration::from_millis(100),
            factor: 1.0,
            cap: Duration::from_millis(100),
            jitter: redrive::Jitter::None,
        })
    }

    /// Its permanent failures are compensated (the compensation series).
    fn compensates(&self) -> bool {
        true
    }
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn repository(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A Prometheus server on loopback scraping `target` every second, with the alert rules.
struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let rules = repository("deploy/prometheus/alerts.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: redrive\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let address = free_address();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the prometheus binary (Debian package `prometheus`) is installed");
        Prometheus {
            child,
            base: format!("http://{address}"),
            _dir: dir,
        }
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let response = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .query(query)
            .send()
            .await;
        match response {
            Ok(response) => response.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    async fn query(&self, expr: &str) -> Value {
        self.api("/api/v1/query", &[("query", expr)]).await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `expr` in a Grafana dashboard, with its panel's title.
fn dashboard_exprs(path: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repository(path)).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut found = Vec::new();
    fn walk(value: &Value, title: &str, found: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
                if let Some(expr) = map.get("expr").and_then(Value::as_str) {
                    found.push((title.to_owned(), expr.to_owned()));
                }
                for (key, child) in map {
                    if key != "templating" {
                        walk(child, title, found);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, title, found)),
            _ => {}
        }
    }
    walk(&dashboard, "", &mut found);
    found
}

/// The metric names (`redrive_*`, `process_*`) an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = prefixed_names(expr, "redrive_");
    names.extend(prefixed_names(expr, "process_"));
    names
}

/// The names starting with `prefix` in `expr`.
fn prefixed_names(expr: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(start) = expr[i..].find(prefix).map(|s| s + i) {
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |e| e + start);
        if boundary {
            names.insert(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn every_dashboard_panel_and_alert_evaluates_against_a_real_prometheus() {
    // A process-mode route with a brake, and a breaker on the handler: their series.
    let mut payments = route(&["payments"], RouteMode::Process, "flaky");
    payments.brake = Some(BrakeSettings::default());
    let KafkaCase {
        broker: _kafka,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders.dlt", 2), ("payments", 1)],
        vec![
            route(&["orders.dlt"], RouteMode::Capture, "flaky"),
            payments,
        ],
    )
    .await;
    settings.handlers.insert(
        "flaky".into(),
        HandlerSettings {
            breaker: Some(BreakerSettings::default()),
            ..HandlerSettings::default()
        },
    );
    // A webhook handler: its call series.
    settings.webhooks.insert(
        "hook".into(),
        redrive::config::WebhookSettings {
            url: Some("http://127.0.0.1:1/hook".into()),
            ..Default::default()
        },
    );
    let metrics_at = free_address();
    settings.metrics.listen = Some(metrics_at);
    let fleet = Fleet::builder(settings)
        .with_builtin_handlers()
        .handler("flaky", Flaky)
        .build()
        .unwrap();
    // A failure no member serves, stored before the member's first sample: the cause
    // series (`redrive_cause_*`) are there from the first scrape.
    let unserved = redrive::NewTask {
        handler: "unserved".into(),
        failure: redrive::Failure {
            error_class: Some("java.net.ConnectException".into()),
            error_message: Some("Connection refused".into()),
            ..redrive::Failure::default()
        },
        ..redrive::NewTask::default()
    };
    store.enqueue(&unserved).await.unwrap();
    let member = Member::start(fleet, &store);
    let prometheus = Prometheus::start(metrics_at);

    // Traffic while Prometheus scrapes.
    let producer = producer(&bootstrap);
    let started = Instant::now();
    let mut sent = 0u8;
    while started.elapsed() < Duration::from_secs(12) {
        for _ in 0..10 {
            sent = sent.wrapping_add(1);
            let sample = Sample {
                key: Some(vec![sent]),
                value: Some(vec![b'v', sent]),
                ..Sample::default()
            };
            produce(&producer, "orders.dlt", &sample).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eventually(
        Duration::from_secs(30),
        "Prometheus scraping the member",
        || async {
            let answer = prometheus
                .query("count_over_time(up{job=\"redrive\"}[1m])")
                .await;
            answer["data"]["result"][0]["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|n| n >= 5.0)
        },
    )
    .await;

    let names: BTreeSet<String> = prometheus.api("/api/v1/label/__name__/values", &[]).await
        ["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    let mut exprs = Vec::new();
    for dashboard in [
        "dashboards/redrive-fleet.json",
        "dashboards/redrive-handler.json",
    ] {
        let found = dashboard_exprs(dashboard);
        assert!(
            found.len() >= 8,
            "{dashboard}: only {} expressions",
            found.len()
        );
        for (title, expr) in found {
            exprs.push((format!("{dashboard}: {title}"), expr));
        }
    }
    let rules = prometheus.api("/api/v1/rules", &[]).await;
    let groups = rules["data"]["groups"]
        .as_array()
        .expect("the alert rules loaded");
    let mut alerts = 0;
    for group in groups {
        for rule in group["rules"].as_array().unwrap() {
            alerts += 1;
            assert_eq!(rule["health"], "ok", "{rule}");
            exprs.push((
                format!("alert {}", rule["name"].as_str().unwrap()),
                rule["query"].as_str().unwrap().to_owned(),
            ));
        }
    }
    assert!(alerts >= 8, "only {alerts} alert rules loaded");

    let mut failures = Vec::new();
    for (what, expr) in &exprs {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$handler", "flaky")
            .replace("$job", "redrive")
            .replace("$instance", ".*");
        let answer = prometheus.query(&expr).await;
        if answer["status"] != "success" {
            failures.push(format!("{what}: {expr}: {}", answer["error"]));
            continue;
        }
        for name in metric_names(&expr) {
            if !names.contains(&name) {
                failures.push(format!("{what}: {expr}: no series named {name}"));
            }
        }
        let values: Vec<String> = answer["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .take(3)
                    .map(|s| format!("{}={}", s["metric"], s["value"][1].as_str().unwrap_or("?")))
                    .collect()
            })
            .unwrap_or_default();
        println!("{what}\n    {expr}\n    -> {}", values.join("; "));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Figures that traffic must have moved.
    let resolved = prometheus
        .query("sum(redrive_attempts_total{handler=\"flaky\",outcome=\"resolved\"})")
        .await;
    let resolved: f64 = resolved["data"]["result"][0]["value"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(resolved > 0.0, "no attempt resolved");
    // The breaker panels and RedriveBreakerOpen read the handler's own series: its state,
    // and a transitions counter for every state it can change to.
    for (expr, expected) in [
        ("count(redrive_breaker_state{handler=\"flaky\"})", "1"),
        (
            "count(redrive_breaker_transitions_total{handler=\"flaky\"})",
            "3",
        ),
    ] {
        let answer = prometheus.query(expr).await;
        assert_eq!(
            answer["data"]["result"][0]["value"][1], expected,
            "{expr}: {answer}"
        );
    }
    // Lag is a number from the first statistics, also where nothing was committed yet
    // (payments: nothing produced, nothing committed).
    for topic in ["orders.dlt", "payments"] {
        let expr = format!("count(redrive_consumer_lag{{topic=\"{topic}\"}})");
        let answer = prometheus.query(&expr).await;
        assert!(
            answer["data"]["result"][0]["value"][1].as_str().is_some(),
            "{expr}: no lag exported: {answer}"
        );
    }
    let ready = prometheus.query("sum(redrive_ready)").await;
    let readyz = get(&format!("http://{metrics_at}/readyz")).await;
    assert_eq!(
        ready["data"]["result"][0]["value"][1], "1",
        "{ready} {readyz:?}"
    );
    member.stop().await;
}

async fn get(url: &str) -> (u16, Value) {
    match reqwest::get(url).await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_postgres_through_an_outage_while_healthz_stays_up() {
    let (store, settings) = fresh_store().await;
    let proxy = PgProxy::start().await;
    let mut settings: Settings = proxy.route(&settings);
    let address = free_address();
    settings.metrics.listen = Some(address);
    let proxied = Store::connect(&settings.database).await.unwrap();
    let fleet = Fleet::builder(settings)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &proxied);
    let readyz = format!("http://{address}/readyz");
    let healthz = format!("http://{address}/healthz");
    eventually(Duration::from_secs(10), "ready", || async {
        get(&readyz).await.0 == 200
    })
    .await;
    let (_, body) = get(&readyz).await;
    assert_eq!(body["checks"]["database"], "ok", "{body}");
    assert_eq!(body["checks"]["migrations"], "ok", "{body}");

    proxy.cut();
    eventually(Duration::from_secs(10), "not ready", || async {
        get(&readyz).await.0 == 503
    })
    .await;
    let (_, body) = get(&readyz).await;
    assert_eq!(body["ready"], false);
    assert_ne!(body["checks"]["database"], "ok", "{body}");
    assert_eq!(
        get(&healthz).await.0,
        200,
        "alive while the database is away"
    );

    proxy.restore();
    eventually(Duration::from_secs(20), "ready again", || async {
        get(&readyz).await.0 == 200
    })
    .await;
    member.stop().await;
    drop(store);
}

/// Runs the binary as a worker with JSON logs and a planted secret in every place a
/// secret lives; an attempt's lines carry its task id; no line holds a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_carry_the_task_id_and_no_secret() {
    use secrecy::ExposeSecret;
    let (store, settings) = fresh_store().await;
    let ids = store
        .enqueue_many(&[
            redrive::NewTask::new("republish", b"x".to_vec()),
            redrive::NewTask::new("hook", b"y".to_vec()),
        ])
        .await
        .unwrap();
    let task_id = ids[0].id().0;
    let hook_id = ids[1].id().0;
    let secrets = [
        "sasl-secret-7d1f",
        "admin-token-secret-93ab0c",
        "url-pass-secret-5e2a",
        "url-key-secret-c41b",
    ];
    // A webhook whose URL carries credentials, on a port nothing listens on.
    let hook_url = format!(
        "http://user:{}@127.0.0.1:1/hook?api_key={}",
        secrets[2], secrets[3]
    );
    let child = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("run")
        .env(
            "REDRIVE__DATABASE__URL",
            settings.database.url.expose_secret(),
        )
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .env("REDRIVE__LOG__FORMAT", "json")
        .env("REDRIVE__LOG__LEVEL", "debug,sqlx=warn,librdkafka=warn")
        .env("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
        .env("REDRIVE__KAFKA__PROPERTIES__SASL_PASSWORD", secrets[0])
        .env("REDRIVE__KAFKA__PROPERTIES__SASL_USERNAME", "u")
        .env(
            "REDRIVE__KAFKA__PROPERTIES__SECURITY_PROTOCOL",
            "sasl_plaintext",
        )
        .env("REDRIVE__KAFKA__PROPERTIES__SASL_MECHANISM", "PLAIN")
        .env("REDRIVE__ADMIN__LISTEN", "127.0.0.1:0")
        .env("REDRIVE__ADMIN__TOKENS__OPS__ROLE", "operate")
        .env("REDRIVE__ADMIN__TOKENS__OPS__TOKEN", secrets[1])
        .env("REDRIVE__WEBHOOKS__HOOK__URL", &hook_url)
        .env("REDRIVE__WORKER__POLL_INTERVAL", "100ms")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The republish attempt fails (no topic known): a permanent failure, logged; the
    // webhook's cannot connect: a transient failure, logged.
    for id in [task_id, hook_id] {
        eventually(Duration::from_secs(20), "the attempts", || async {
            store
                .get(redrive::TaskId(id))
                .await
                .unwrap()
                .unwrap()
                .attempts
                > 0
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = crate::support::wait_with_output_within(child, CHILD_LIMIT, "the member");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stderr).unwrap();
    let mut attempt_lines = 0;
    for line in text.lines() {
        let parsed: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for secret in secrets {
            assert!(!line.contains(secret), "a secret in: {line}");
        }
        let span_task = parsed["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["task_id"] == task_id));
        if parsed["task_id"] == task_id || span_task {
            attempt_lines += 1;
        }
    }
    assert!(attempt_lines >= 1, "no line names task {task_id}:\n{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("connection failed") && l.contains("127.0.0.1:1/hook")),
        "no line tells the webhook's failure:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("\"outcome\":\"permanent_failure\"")
                && l.contains("\"level\":\"WARN\"")),
        "no permanent-failure line at warn:\n{text}"
    );
}

/// Every panel of both dashboards reads the fleet through the job and instance variables
/// and links to the runbook or the other dashboard; the fleet dashboard's top row of
/// figures turns red at the thresholds of the alert rules; a panel showing counts and
/// seconds puts the seconds on an axis of their own.
#[test]
fn dashboards_share_the_alerts_thresholds_variables_and_links() {
    let defaults = redrive::telemetry::AlertSettings::default();
    let runbook = std::fs::read_to_string(repository("docs/runbook.md")).unwrap();
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    for (path, other) in [
        ("dashboards/redrive-fleet.json", "/d/redrive-handler/"),
        ("dashboards/redrive-handler.json", "/d/redrive-fleet/"),
    ] {
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(repository(path)).unwrap()).unwrap();
        let variables: Vec<&str> = dashboard["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert!(
            variables.contains(&"job") && variables.contains(&"instance"),
            "{path}: {variables:?}"
        );
        let links = dashboard["links"].as_array().expect("dashboard links");
        assert!(
            links
                .iter()
                .any(|l| l["url"].as_str().is_some_and(|u| u.starts_with(other))),
            "{path}: no link to {other}"
        );
        for (title, expr) in dashboard_exprs(path) {
            for name in metric_names(&expr) {
                let selected = format!("{name}{{job=~\"$job\",instance=~\"$instance\"");
                assert!(expr.contains(&selected), "{path}: {title}: {expr}");
            }
        }
        for panel in dashboard["panels"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap();
            for link in panel["links"].as_array().into_iter().flatten() {
                let url = link["url"].as_str().unwrap();
                if let Some((_, anchor)) = url.split_once("docs/runbook.md#") {
                    assert!(anchors.contains(anchor), "{path}: {title}: {url}");
                }
            }
            let targets = panel["targets"].as_array().unwrap();
            let seconds = |t: &Value| {
                let expr = t["expr"].as_str().unwrap();
                expr.contains("_age_seconds") || expr.starts_with("histogram_quantile")
            };
            let units = panel["fieldConfig"]["defaults"]["unit"].as_str();
            if targets.iter().any(seconds) && units != Some("s") {
                for target in targets.iter().filter(|t| seconds(t)) {
                    let on_right = panel["fieldConfig"]["overrides"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|o| {
                            o["matcher"]["options"] == target["refId"]
                                && o["properties"].to_string().contains("\"right\"")
                                && o["properties"].to_string().contains("\"s\"")
                        });
                    assert!(on_right, "{path}: {title}: seconds share the counts' axis");
                }
            }
        }
    }
    let fleet: Value = serde_json::from_str(
        &std::fs::read_to_string(repository("dashboards/redrive-fleet.json")).unwrap(),
    )
    .unwrap();
    let top: Vec<&Value> = fleet["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["gridPos"]["y"] == 0)
        .collect();
    let red_at = |title: &str| -> Option<f64> {
        let panel = top.iter().find(|p| p["title"] == title)?;
        assert_eq!(panel["type"], "stat", "{title}");
        let steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"].as_array()?;
        steps
            .iter()
            .find(|s| s["color"] == "red")
            .and_then(|s| s["value"].as_f64())
    };
    assert_eq!(
        red_at("Oldest due task"),
        Some(defaults.oldest_due.as_secs() as f64)
    );
    assert_eq!(
        red_at("Permanent failures (15 min)"),
        Some(defaults.permanent_failures as f64)
    );
    assert_eq!(red_at("Breakers open"), Some(1.0));
    assert_eq!(red_at("Brakes engaged"), Some(1.0));
    // Red below one ready member (the base step), green from one.
    assert_eq!(red_at("Members ready"), None);
    assert!(top.iter().any(|p| p["title"] == "Backlog"));
    assert!(top.iter().any(|p| p["title"] == "Members ready"));
    // Breakers and brakes right below the figures.
    let second_row: Vec<&str> = fleet["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["gridPos"]["y"] == 4)
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert!(
        second_row.iter().any(|t| t.contains("breakers"))
            && second_row.iter().any(|t| t.contains("brakes")),
        "{second_row:?}"
    );
}

/// The shipped rule file is `redrive alerts` with its defaults, and a bad option is
/// refused by name.
#[test]
fn the_shipped_alert_rules_are_the_generators_default_output() {
    let printed = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("alerts")
        .env_remove("REDRIVE_CONFIG")
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let shipped = std::fs::read_to_string(repository("deploy/prometheus/alerts.yml")).unwrap();
    assert_eq!(
        String::from_utf8(printed.stdout).unwrap(),
        shipped,
        "regenerate: cargo run -- alerts > deploy/prometheus/alerts.yml"
    );
    let custom = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args([
            "alerts",
            "--selector",
            r#"job="rd-prod""#,
            "--stall-for",
            "3m",
        ])
        .output_within(CHILD_LIMIT)
        .unwrap();
    let custom = String::from_utf8(custom.stdout).unwrap();
    assert!(
        custom.contains(r#"redrive_ready{job="rd-prod"}"#),
        "{custom}"
    );
    assert!(!custom.contains(r#"job="redrive""#), "{custom}");
    let refused = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args(["alerts", "--selector", "{job=\"x\"}"])
        .env("RUST_BACKTRACE", "0")
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--selector"), "{stderr}");
}

/// A member whose broker is gone (nothing listens at its bootstrap address) is not
/// ready and counts AllBrokersDown; a real Prometheus scraping it with the shipped rules
/// turns that into alerts, pending at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_cut_off_from_kafka_raises_alerts_in_a_real_prometheus() {
    let (store, mut settings) = fresh_store().await;
    let nowhere = free_address();
    use_cluster(
        &mut settings,
        &nowhere.to_string(),
        vec![route(&["orders.dlt"], RouteMode::Capture, "log")],
    );
    let metrics_at = free_address();
    settings.metrics.listen = Some(metrics_at);
    let fleet = Fleet::builder(settings)
        .with_builtin_handlers()
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    let prometheus = Prometheus::start(metrics_at);
    let wanted = [
        "RedriveCannotConsume",
        "RedriveMemberNotReady",
        "RedriveNoMemberReady",
    ];
    eventually(
        Duration::from_secs(60),
        "the cut-off alerts pending or firing",
        || async {
            let alerts = prometheus.api("/api/v1/alerts", &[]).await;
            let active: BTreeSet<&str> = (alerts["data"]["alerts"].as_array().into_iter())
                .flatten()
                .filter(|a| ["pending", "firing"].contains(&a["state"].as_str().unwrap_or("")))
                .filter_map(|a| a["labels"]["alertname"].as_str())
                .collect();
            wanted.iter().all(|w| active.contains(w))
        },
    )
    .await;
    let readyz = get(&format!("http://{metrics_at}/readyz")).await;
    assert_eq!(readyz.0, 503, "{readyz:?}");
    member.stop().await;
}

/// The partitions `text` (a `/metrics` page) exports a lag or committed offset for, by
/// metric name and partition.
fn partition_series(text: &str) -> BTreeSet<(String, i32)> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        for metric in ["redrive_consumer_lag", "redrive_consumer_committed_offset"] {
            let Some(labels) = line.strip_prefix(&format!("{metric}{{")) else {
                continue;
            };
            let partition = labels
                .split(',')
                .find_map(|l| l.strip_prefix("partition=\""))
                .and_then(|p| p.split('"').next())
                .and_then(|p| p.parse().ok());
            if let Some(partition) = partition {
                found.insert((metric.to_owned(), partition));
            }
        }
    }
    found
}

/// The value of `metric{...partition="N"...}` on a `/metrics` page.
fn partition_value(text: &str, metric: &str, partition: i32) -> Option<i64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| l.contains(&format!("partition=\"{partition}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn metrics_page(at: SocketAddr) -> String {
    match reqwest::get(format!("http://{at}/metrics")).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Issue 17 follow-up: a member that gives partitions up in a rebalance stops exporting
/// their lag and committed offset (stale series would make per-topic stall alerts and
/// lag panels lie), also after its later statistics reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_stops_exporting_the_partitions_a_rebalance_took_away() {
    let KafkaCase {
        broker: _kafka,
        bootstrap,
        store,
        mut settings,
    } = KafkaCase::new(
        &[("orders.dlt", 2)],
        vec![route(&["orders.dlt"], RouteMode::Capture, "log")],
    )
    .await;
    (settings.kafka.properties).insert("statistics.interval.ms".into(), "200".into());
    let start = |settings: &Settings| {
        let mut settings = settings.clone();
        let at = free_address();
        settings.metrics.listen = Some(at);
        let fleet = Fleet::builder(settings)
            .with_builtin_handlers()
            .build()
            .unwrap();
        (Member::start(fleet, &store), at)
    };
    let (first, first_at) = start(&settings);
    let producer = producer(&bootstrap);
    let to = |partition: i32| Sample {
        value: Some(b"v".to_vec()),
        partition: Some(partition),
        ..Sample::default()
    };
    for partition in 0..2 {
        produce(&producer, "orders.dlt", &to(partition)).await;
    }
    let both: BTreeSet<(String, i32)> = (0..2)
        .flat_map(|p| {
            ["redrive_consumer_lag", "redrive_consumer_committed_offset"].map(|m| (m.to_owned(), p))
        })
        .collect();
    eventually(
        Duration::from_secs(30),
        "the first member exporting both partitions",
        || async { partition_series(&metrics_page(first_at).await) == both },
    )
    .await;

    let (second, second_at) = start(&settings);
    let owned = |page: &str| -> Vec<i32> {
        let mut partitions: Vec<i32> = partition_series(page).into_iter().map(|(_, p)| p).collect();
        partitions.dedup();
        partitions
    };
    eventually(
        Duration::from_secs(60),
        "the second member exporting one partition",
        || async { owned(&metrics_page(second_at).await).len() == 1 },
    )
    .await;
    let given_up = owned(&metrics_page(second_at).await)[0];
    let kept = 1 - given_up;
    // A message on the partition the first member kept: once its committed offset shows
    // it, the first member's statistics have been reported since the rebalance.
    produce(&producer, "orders.dlt", &to(kept)).await;
    eventually(
        Duration::from_secs(30),
        "the first member reporting its kept partition's new offset",
        || async {
            let page = metrics_page(first_at).await;
            partition_value(&page, "redrive_consumer_committed_offset", kept) == Some(2)
        },
    )
    .await;
    let exported = partition_series(&metrics_page(first_at).await);
    let stale: Vec<_> = exported.iter().filter(|(_, p)| *p == given_up).collect();
    assert!(
        stale.is_empty(),
        "the first member still exports partition {given_up}, which it gave up: {stale:?}"
    );
    second.stop().await;
    first.stop().await;
}

/// The database library's own lines stay below INFO: every statement slower than a
/// second was logged at WARN with its whole SQL (kilobytes a line, many a minute, on
/// operators' terminals too), and PostgreSQL's notices ("schema ... already exists,
/// skipping") at INFO on every start and every CLI verb.
#[test]
fn slow_statements_and_schema_notices_are_not_logged_at_info_or_above() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let (store, settings) = fresh_store().await;
            let again = Store::connect(&settings.database).await.unwrap();
            again.migrate().await.unwrap();
            sqlx::query("SELECT pg_sleep(1.2)")
                .execute(store.pool())
                .await
                .unwrap();
            // Found by an attack: a pool whose every connection is taken warned at
            // each acquire that waited past two seconds.
            let mut one = settings.clone();
            one.database.max_connections = 1;
            let small = Store::connect(&one.database).await.unwrap();
            let held = small.pool().acquire().await.unwrap();
            let release = tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
                drop(held);
            });
            drop(small.pool().acquire().await.unwrap());
            release.await.unwrap();
        })
    });
    let seen = String::from_utf8_lossy(&lines.0.lock().unwrap()).into_owned();
    assert!(
        !seen.contains("sqlx"),
        "the database library logged: {seen}"
    );
    assert!(!seen.contains("already exists"), "{seen}");
}
