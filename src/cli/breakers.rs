//! `redrive breakers`: the fleet's circuit breakers, and forcing one open or closed.

use clap::Subcommand;

use super::table;
use crate::operations::{Actor, Operations, ReasonRequest};
use crate::output::outln;
use crate::store::BreakerCommand;

/// `redrive breakers ...`
#[derive(Debug, Subcommand)]
pub enum BreakersCommand {
    /// Every configured breaker: state, forced state, counts, hold and last reason.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Force a handler's breaker open: its tasks wait until `close` or `release`.
    Open {
        /// The handler.
        handler: String,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Force a handler's breaker closed: calls go through, whatever fails.
    Close {
        /// The handler.
        handler: String,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Release a forced state: the breaker is closed and counts afresh.
    Release {
        /// The handler.
        handler: String,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: String,
    },
}

/// Runs a breakers verb.
pub async fn run(command: BreakersCommand, operations: &Operations) -> anyhow::Result<()> {
    let (handler, reason, command) = match command {
        BreakersCommand::List { json } => return list(operations, json).await,
        BreakersCommand::Open { handler, reason } => (handler, reason, BreakerCommand::Open),
        BreakersCommand::Close { handler, reason } => (handler, reason, BreakerCommand::Close),
        BreakersCommand::Release { handler, reason } => (handler, reason, BreakerCommand::Release),
    };
    let request = ReasonRequest {
        reason: Some(reason),
    };
    let after = operations
        .command_breaker(&Actor::shell(), &handler, command, &request)
        .await?;
    outln!(
        "breaker of {handler}: {}{}",
        after.state,
        after
            .forced
            .map(|f| format!(" (forced {f})"))
            .unwrap_or_default()
    );
    Ok(())
}

async fn list(operations: &Operations, json: bool) -> anyhow::Result<()> {
    let page = operations.breakers().await?;
    let header = [
        "HANDLER",
        "STATE",
        "FORCED",
        "IN A ROW",
        "FAILED/CALLS",
        "HELD UNTIL",
        "CHANGED",
        "REASON",
    ];
    let nothing = "no breaker yet (a handler's breaker appears with its first call)";
    table::print_page(&page, json, &header, nothing, |b| {
        vec![
            b.handler.clone(),
            b.state.to_string(),
            b.forced.map(|f| f.to_string()).unwrap_or_default(),
            b.consecutive_failures.to_string(),
            format!("{}/{}", b.window_failures, b.window_calls),
            match b.hold_until {
                _ if b.forced_open() => "until released".to_owned(),
                Some(h) => h.format("%Y-%m-%d %H:%M:%S").to_string(),
                None => String::new(),
            },
            b.changed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            b.reason.clone().unwrap_or_default(),
        ]
    })
}
