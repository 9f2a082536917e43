//! `redrive breakers`: the fleet's circuit breakers, and forcing one open or closed.

use anyhow::{bail, Context};
use clap::Subcommand;

use super::operator::cli_operator;
use super::output::outln;
use super::table;
use crate::config::Settings;
use crate::resilience::breaker::Breaker;
use crate::store::{BreakerCommand, Store};

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
pub async fn run(
    command: BreakersCommand,
    settings: &Settings,
    store: &Store,
) -> anyhow::Result<()> {
    let (handler, reason, command) = match command {
        BreakersCommand::List { json } => return list(settings, store, json).await,
        BreakersCommand::Open { handler, reason } => (handler, reason, BreakerCommand::Open),
        BreakersCommand::Close { handler, reason } => (handler, reason, BreakerCommand::Close),
        BreakersCommand::Release { handler, reason } => (handler, reason, BreakerCommand::Release),
    };
    let Some(breaker) = settings
        .handlers
        .get(&handler)
        .and_then(|h| h.breaker.as_ref())
    else {
        bail!("handler {handler:?} has no breaker: configure [handlers.{handler}.breaker]");
    };
    let (after, _) = store
        .command_breaker(&handler, command, breaker, &cli_operator(Some(reason)))
        .await
        .context("changing the breaker")?;
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

async fn list(settings: &Settings, store: &Store, json: bool) -> anyhow::Result<()> {
    let stored = store.breakers(None).await?;
    let now = chrono::Utc::now();
    // Configured breakers without a row yet have counted nothing: closed.
    let mut breakers: Vec<Breaker> = settings
        .handlers
        .iter()
        .filter(|(_, h)| h.breaker.is_some())
        .map(|(name, _)| {
            stored
                .iter()
                .find(|b| &b.handler == name)
                .cloned()
                .unwrap_or_else(|| Breaker::new(name.clone(), now))
        })
        .collect();
    // Rows of handlers this configuration does not know (another member's) are shown too.
    breakers.extend(
        stored
            .into_iter()
            .filter(|b| !settings.handlers.contains_key(&b.handler)),
    );
    if json {
        outln!("{}", serde_json::to_string_pretty(&breakers)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = breakers
        .iter()
        .map(|b| {
            vec![
                b.handler.clone(),
                b.state.to_string(),
                b.forced.map(|f| f.to_string()).unwrap_or_default(),
                b.consecutive_failures.to_string(),
                format!("{}/{}", b.window_failures, b.window_calls),
                b.hold_until
                    .map(|h| h.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_default(),
                b.changed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                b.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::print(
        &[
            "HANDLER",
            "STATE",
            "FORCED",
            "IN A ROW",
            "FAILED/CALLS",
            "HELD UNTIL",
            "CHANGED",
            "REASON",
        ],
        &rows,
    );
    Ok(())
}
