//! The alert rules of a redrive fleet, from one template (`alerts.in.yml`) whose job
//! selector, thresholds and runbook base are parameters, as monitoring mixins have them.
//! `redrive alerts` prints the rules; `deploy/prometheus/alerts.yml` is the output with
//! [`AlertSettings::default`], and the dashboards' thresholds are these defaults.

use std::time::Duration;

/// The template: `${name}` marks a parameter.
const TEMPLATE: &str = include_str!("alerts.in.yml");

/// librdkafka error codes (as `redrive_consumer_errors_total{code}` names them) that
/// mean the member cannot consume at all: no broker answers, or the brokers refuse its
/// login or its access.
pub const CANNOT_CONSUME_CODES: [&str; 6] = [
    "AllBrokersDown",
    "Authentication",
    "SaslAuthenticationFailed",
    "TopicAuthorizationFailed",
    "GroupAuthorizationFailed",
    "ClusterAuthorizationFailed",
];

/// The parameters of the alert rules.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertSettings {
    /// Label matchers selecting the fleet's series, e.g. `job="redrive"`.
    pub selector: String,
    /// The runbook's address; each rule links to `BASE#alertname`.
    pub runbook_base: String,
    /// The console's address (`http://ADMIN/console`); each rule's `console_url` links
    /// to the page to look at first (the cause's or the handler's tasks, the fleet).
    pub console_base: String,
    /// `RedrivePermanentFailuresRising`: more permanent failures of a handler in 15 minutes.
    pub permanent_failures: u64,
    /// `RedriveOldestDueTaskTooOld`: a due task waiting longer.
    pub oldest_due: Duration,
    /// `RedriveConsumerLagGrowing`: a topic's lag above this (and growing).
    pub consumer_lag: u64,
    /// `RedriveMemberNotReady`, `RedriveNoMemberReady`: not ready for this long.
    pub not_ready_for: Duration,
    /// `RedriveCannotConsume`: consumer errors that mean "cannot consume" for this long.
    /// It is the rule's range window too: an error in every window this long keeps the
    /// rule pending, and a single burst ages out before it fires.
    pub cannot_consume_for: Duration,
    /// `RedriveIngestStalled`: a topic with lag whose offsets did not move for this long.
    pub stall_for: Duration,
    /// `RedriveBreakerOpen`: a breaker not closed, with tasks waiting, for this long.
    pub breaker_open_for: Duration,
    /// `RedriveNewCauseGrowing`: a cause first seen within this long ...
    pub new_cause_within: Duration,
    /// ... with more tasks not done than this.
    pub new_cause_tasks: u64,
}

impl Default for AlertSettings {
    fn default() -> Self {
        AlertSettings {
            selector: r#"job="redrive""#.into(),
            runbook_base: "https://github.com/redrive/redrive/blob/main/docs/runbook.md".into(),
            console_base: "http://localhost:9465/console".into(),
            permanent_failures: 10,
            oldest_due: Duration::from_secs(900),
            consumer_lag: 1000,
            not_ready_for: Duration::from_secs(300),
            cannot_consume_for: Duration::from_secs(300),
            stall_for: Duration::from_secs(600),
            breaker_open_for: Duration::from_secs(900),
            new_cause_within: Duration::from_secs(1800),
            new_cause_tasks: 100,
        }
    }
}

/// A parameter that cannot go into the rules, named by its command-line option.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{option}: {reason}")]
pub struct AlertSettingsError {
    /// The option, e.g. `--selector`.
    pub option: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl AlertSettings {
    /// The rules, in Prometheus' rule file format.
    pub fn render(&self) -> Result<String, AlertSettingsError> {
        self.validate()?;
        let parameters = [
            ("selector", self.selector.clone()),
            ("runbook", self.runbook_base.clone()),
            (
                "console",
                self.console_base.trim_end_matches('/').to_owned(),
            ),
            ("permanent_failures", self.permanent_failures.to_string()),
            ("oldest_due_seconds", self.oldest_due.as_secs().to_string()),
            ("consumer_lag", self.consumer_lag.to_string()),
            ("not_ready_for", prometheus_duration(self.not_ready_for)),
            ("cannot_consume_codes", CANNOT_CONSUME_CODES.join("|")),
            (
                "cannot_consume_for",
                prometheus_duration(self.cannot_consume_for),
            ),
            ("stall_for", prometheus_duration(self.stall_for)),
            (
                "breaker_open_for",
                prometheus_duration(self.breaker_open_for),
            ),
            (
                "new_cause_within",
                prometheus_duration(self.new_cause_within),
            ),
            (
                "new_cause_within_seconds",
                self.new_cause_within.as_secs().to_string(),
            ),
            ("new_cause_tasks", self.new_cause_tasks.to_string()),
        ];
        let mut rules = TEMPLATE.to_owned();
        for (name, value) in parameters {
            rules = rules.replace(&format!("${{{name}}}"), &value);
        }
        Ok(rules)
    }

    fn validate(&self) -> Result<(), AlertSettingsError> {
        let error = |option, reason: &str| {
            Err(AlertSettingsError {
                option,
                reason: reason.to_owned(),
            })
        };
        if self.selector.trim().is_empty() {
            return error("--selector", "must not be empty (e.g. job=\"redrive\")");
        }
        if self.selector.contains(['{', '}', '\n', '\r']) {
            return error(
                "--selector",
                "label matchers without braces or line breaks (e.g. job=\"redrive\",env=\"prod\")",
            );
        }
        if let Some(problem) = selector_problem(&self.selector) {
            return error("--selector", &problem);
        }
        if self.runbook_base.is_empty() || self.runbook_base.contains(char::is_whitespace) {
            return error("--runbook-base", "must be an address without spaces");
        }
        let console = &self.console_base;
        if console.is_empty()
            || console.contains(|c: char| c.is_whitespace() || c == '"' || c == '{')
        {
            return error(
                "--console-url",
                "must be an address without spaces, quotes or braces (http://ADMIN:9465/console)",
            );
        }
        for (option, duration) in [
            ("--not-ready-for", self.not_ready_for),
            ("--cannot-consume-for", self.cannot_consume_for),
            ("--stall-for", self.stall_for),
            ("--breaker-open-for", self.breaker_open_for),
            ("--oldest-due", self.oldest_due),
            ("--new-cause-within", self.new_cause_within),
        ] {
            if duration.as_secs() == 0 || duration.subsec_nanos() != 0 {
                return error(option, "must be a whole number of seconds, at least 1s");
            }
            if duration > LONGEST_HOLD {
                return error(
                    option,
                    "must be at most 365d (an alert held longer never fires)",
                );
            }
        }
        Ok(())
    }
}

/// The longest hold or window a rule may have.
const LONGEST_HOLD: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why `selector` is not a list of PromQL label matchers (`name="value"`, `!=`, `=~`,
/// `!~`, separated by commas, regular expressions that compile), if it is not: a rule
/// file Prometheus cannot parse loads none of its rules.
fn selector_problem(selector: &str) -> Option<String> {
    let matcher = regex::Regex::new(
        r#"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)"#,
    )
    .expect("a valid pattern");
    let mut rest = selector;
    while !rest.trim().is_empty() {
        let Some(found) = matcher.captures(rest) else {
            return Some(format!(
                "{rest:?} is not a label matcher: write name=\"value\" (or !=, =~, !~), \
                 separated by commas"
            ));
        };
        let whole = found.get(0).expect("the whole match");
        if matches!(&found[2], "=~" | "!~") {
            if let Err(error) = regex::Regex::new(&found[3]) {
                return Some(format!(
                    "the regular expression of {:?}: {error}",
                    &found[1]
                ));
            }
        }
        rest = &rest[whole.end()..];
        if whole.as_str().trim_end().ends_with(',') && rest.trim().is_empty() {
            return Some("ends with a comma".into());
        }
    }
    None
}

/// `duration` as Prometheus writes one (`90s`, `15m`, `2h`), in whole seconds.
fn prometheus_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_is_filled_in() {
        let rules = AlertSettings::default().render().unwrap();
        assert!(!rules.contains("${"), "a parameter left: {rules}");
        assert!(rules.contains(r#"redrive_ready{job="redrive"}"#));
        let custom = AlertSettings {
            selector: r#"job="rd",env="prod""#.into(),
            runbook_base: "https://wiki.example/redrive".into(),
            stall_for: Duration::from_secs(90),
            ..AlertSettings::default()
        }
        .render()
        .unwrap();
        assert!(custom.contains(r#"redrive_tasks{job="rd",env="prod",status="failed"}"#));
        assert!(custom.contains("runbook_url: https://wiki.example/redrive#redrivecannotconsume"));
        assert!(custom.contains("for: 90s"));
    }

    #[test]
    fn a_bad_parameter_names_its_option() {
        let braces = AlertSettings {
            selector: "{job=\"x\"}".into(),
            ..AlertSettings::default()
        };
        assert_eq!(braces.render().unwrap_err().option, "--selector");
        let fraction = AlertSettings {
            stall_for: Duration::from_millis(1500),
            ..AlertSettings::default()
        };
        assert_eq!(fraction.render().unwrap_err().option, "--stall-for");
    }

    #[test]
    fn a_selector_prometheus_cannot_parse_is_refused() {
        for good in [
            r#"job="redrive""#,
            r#"job="rd", env!="dev",pod=~"redrive-.*""#,
            r#"job="a\"b""#,
        ] {
            assert_eq!(selector_problem(good), None, "{good}");
        }
        for bad in [
            "job",
            r#"job="x" or vector(1)"#,
            r#"job=~"((""#,
            r#"job="x","#,
            r##"job="x"# comment"##,
            r#"job="x" env="y""#,
            r#"9job="x""#,
        ] {
            assert!(selector_problem(bad).is_some(), "{bad}");
        }
        let endless = AlertSettings {
            not_ready_for: Duration::from_secs(100_000_000_000 * 86_400),
            ..AlertSettings::default()
        };
        assert_eq!(endless.render().unwrap_err().option, "--not-ready-for");
    }

    #[test]
    fn durations_are_written_as_prometheus_reads_them() {
        assert_eq!(prometheus_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(prometheus_duration(Duration::from_secs(900)), "15m");
        assert_eq!(prometheus_duration(Duration::from_secs(90)), "90s");
    }
}
