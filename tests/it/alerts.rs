//! `redrive alerts` with a non-default hold: the rules it prints are valid (`promtool
//! check rules`) and behave as their flags say (`promtool test rules`).

use crate::support::{Bounded, CHILD_LIMIT};
use std::path::Path;
use std::process::Command;

/// The rules `redrive alerts ARGS` prints.
fn alerts(args: &[&str]) -> String {
    let printed = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("alerts")
        .args(args)
        .env_remove("REDRIVE_CONFIG")
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    String::from_utf8(printed.stdout).unwrap()
}

/// Runs `promtool ARGS` in `dir`; panics with its output unless it succeeds.
fn promtool(dir: &Path, args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output_within(CHILD_LIMIT)
        .expect("promtool (Debian package `prometheus`) is installed");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The text of rule `alert` in `rules`, up to the next rule.
fn rule<'a>(rules: &'a str, alert: &str) -> &'a str {
    let start = rules
        .find(&format!("- alert: {alert}\n"))
        .unwrap_or_else(|| panic!("no rule {alert}"));
    let body = &rules[start + 1..];
    &body[..body.find("- alert: ").unwrap_or(body.len())]
}

/// Expected firing alerts of RedriveCannotConsume for member `a`, `count` errors seen.
fn cannot_consume_firing(count: u32, window: &str) -> String {
    format!(
        r#"
          - exp_labels: {{severity: critical, instance: a, code: AllBrokersDown}}
            exp_annotations:
              summary: "Member a cannot consume from Kafka: AllBrokersDown"
              description: "The Kafka consumer of a keeps reporting AllBrokersDown ({count} in the last {window}): no broker answers, or the brokers refuse its login or its access to the topics or group. Dead letters wait on Kafka."
              runbook_url: https://github.com/redrive/redrive/blob/main/docs/runbook.md#redrivecannotconsume
              console_url: http://localhost:9465/console/fleet"#
    )
}

/// Issue 17 follow-up: `--cannot-consume-for` sets the range window of the rule as well
/// as its hold (the window is the hold): with 30s one burst of errors does not page 30 s
/// later, and with 2h errors every ten minutes page (a 5-minute window saw none).
#[test]
fn the_cannot_consume_window_follows_its_hold() {
    let dir = tempfile::tempdir().unwrap();
    for hold in ["30s", "2h"] {
        let rules = alerts(&["--cannot-consume-for", hold]);
        let cannot = rule(&rules, "RedriveCannotConsume");
        assert!(cannot.contains(&format!("}}[{hold}]))")), "{cannot}");
        assert!(cannot.contains(&format!("for: {hold}")), "{cannot}");
        std::fs::write(dir.path().join(format!("rules-{hold}.yml")), rules).unwrap();
        promtool(
            dir.path(),
            &["check", "rules", &format!("rules-{hold}.yml")],
        );
    }
    let series = |code: &str, values: &str| {
        format!(
            "      - series: 'redrive_consumer_errors_total{{job=\"redrive\",code=\"{code}\",instance=\"a\"}}'\n        values: '{values}'\n"
        )
    };
    let tests = [
        (
            "30s",
            format!(
                "  - name: one burst of errors, then none, with a 30s hold\n    interval: 10s\n    input_series:\n{}    alert_rule_test:\n      - eval_time: 2m\n        alertname: RedriveCannotConsume\n        exp_alerts: []\n",
                series("AllBrokersDown", "0 1x30")
            ),
        ),
        (
            "30s",
            format!(
                "  - name: errors every 10s, with a 30s hold\n    interval: 10s\n    input_series:\n{}    alert_rule_test:\n      - eval_time: 2m\n        alertname: RedriveCannotConsume\n        exp_alerts:{}\n",
                series("AllBrokersDown", "0+1x30"),
                cannot_consume_firing(3, "30s")
            ),
        ),
        (
            "2h",
            format!(
                "  - name: errors every 10m, with a 2h hold\n    interval: 10m\n    input_series:\n{}    alert_rule_test:\n      - eval_time: 1h\n        alertname: RedriveCannotConsume\n        exp_alerts: []\n      - eval_time: 2h30m\n        alertname: RedriveCannotConsume\n        exp_alerts:{}\n",
                series("AllBrokersDown", "0+1x30"),
                cannot_consume_firing(12, "2h")
            ),
        ),
    ];
    for (i, (hold, test)) in tests.iter().enumerate() {
        let file = format!("test-{i}.yml");
        std::fs::write(
            dir.path().join(&file),
            format!("rule_files:\n  - rules-{hold}.yml\nevaluation_interval: 1m\ntests:\n{test}"),
        )
        .unwrap();
        promtool(dir.path(), &["test", "rules", &file]);
    }
}
