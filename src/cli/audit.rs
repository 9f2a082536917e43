//! `redrive audit`: the audit log of operator actions, newest first.

use clap::Args;

use super::table;
use crate::operations::{AuditRequest, Operations};
use crate::output::{errln, outln};

/// Options of `redrive audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this actor.
    #[arg(long)]
    pub actor: Option<String>,
    /// Only this action (retry, discard, resolve, replay, replay_cancel, replay_resume,
    /// breaker_open, breaker_close, breaker_release, brake_engage, brake_release).
    #[arg(long)]
    pub action: Option<String>,
    /// Only entries at or after: RFC 3339 time or a duration ago.
    #[arg(long)]
    pub since: Option<String>,
    /// Entries older than this entry id (the previous page's last, as printed).
    #[arg(long, alias = "before")]
    pub after: Option<i64>,
    /// Entries per page (1 to 1000; default 50).
    #[arg(long)]
    pub limit: Option<i64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `redrive audit`.
pub async fn run(args: AuditArgs, operations: &Operations) -> anyhow::Result<()> {
    let request = AuditRequest {
        actor: args.actor,
        action: args.action,
        since: args.since,
        limit: args.limit,
        after: args.after,
    };
    let page = operations.audit(&request).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .items
        .iter()
        .map(|e| {
            let what = match (&e.ids, &e.filter) {
                (Some(ids), _) => format!(
                    "ids {}",
                    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
                ),
                (_, Some(filter)) => format!("filter {filter}"),
                _ => e
                    .details
                    .as_ref()
                    .map(|d| d.to_string())
                    .unwrap_or_default(),
            };
            vec![
                e.id.to_string(),
                e.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                e.actor.clone(),
                e.action.clone(),
                e.count.to_string(),
                what,
                e.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::print(
        &["ID", "AT", "ACTOR", "ACTION", "COUNT", "ON", "REASON"],
        &rows,
    );
    if let Some(cursor) = page.next_cursor {
        errln!("more: --after {cursor}");
    }
    Ok(())
}
