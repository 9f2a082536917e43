//! `redrive alerts`: prints the fleet's Prometheus alert rules with this deployment's
//! job selector, thresholds and runbook address (see [`AlertSettings`]).

use clap::Args;
use std::time::Duration;

use crate::config::parse_duration;
use crate::telemetry::AlertSettings;

/// Options of `redrive alerts`; each defaults to the shipped `deploy/prometheus/alerts.yml`.
#[derive(Debug, Args)]
pub struct AlertsArgs {
    /// Label matchers selecting the fleet's series (without braces).
    #[arg(long, default_value = r#"job="redrive""#)]
    pub selector: String,
    /// The runbook's address; each rule links to ADDRESS#alertname.
    #[arg(
        long,
        default_value = "https://github.com/redrive/redrive/blob/main/docs/runbook.md"
    )]
    pub runbook_base: String,
    /// The console's address: each alert's `console_url` links to the page to look at
    /// first (reach it through a Service that keeps unready members; see docs/deploying.md).
    #[arg(long, default_value = "http://localhost:9465/console")]
    pub console_url: String,
    /// Permanent failures of one handler in 15 minutes that raise an alert (above).
    #[arg(long, default_value_t = 10)]
    pub permanent_failures: u64,
    /// How long a due task may wait before an alert.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub oldest_due: Duration,
    /// A topic's consumer lag (messages) above which its growth raises an alert.
    #[arg(long, default_value_t = 1000)]
    pub consumer_lag: u64,
    /// How long a member (or the whole fleet) may be not ready.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub not_ready_for: Duration,
    /// How long consumer errors meaning "cannot consume" may go on; also the rule's
    /// window (an error in every window this long keeps it pending; a single burst ages
    /// out). At least two scrape intervals.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub cannot_consume_for: Duration,
    /// How long a topic with lag may go without its offsets moving.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub stall_for: Duration,
    /// How long a breaker may stay open while tasks wait behind it.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub breaker_open_for: Duration,
    /// A new cause that grows: first seen within this long ...
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub new_cause_within: Duration,
    /// ... with more tasks not done than this.
    #[arg(long, default_value_t = 100)]
    pub new_cause_tasks: u64,
}

impl From<AlertsArgs> for AlertSettings {
    fn from(args: AlertsArgs) -> AlertSettings {
        AlertSettings {
            selector: args.selector,
            runbook_base: args.runbook_base,
            console_base: args.console_url,
            permanent_failures: args.permanent_failures,
            oldest_due: args.oldest_due,
            consumer_lag: args.consumer_lag,
            not_ready_for: args.not_ready_for,
            cannot_consume_for: args.cannot_consume_for,
            stall_for: args.stall_for,
            breaker_open_for: args.breaker_open_for,
            new_cause_within: args.new_cause_within,
            new_cause_tasks: args.new_cause_tasks,
        }
    }
}
