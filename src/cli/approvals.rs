//! `redrive approvals ...`: four eyes for large actions (`operations.approval_over`).

use clap::Subcommand;

use super::table;
use crate::operations::{Actor, Operations, PageRequest};
use crate::output::outln;

/// The approval verbs.
#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List approvals, newest first: those waiting, or with --all every one.
    List {
        /// Every approval, decided ones too.
        #[arg(long)]
        all: bool,
        /// Approvals per page (1 to 1000; default 50).
        #[arg(long)]
        limit: Option<i64>,
        /// Continue after this approval id.
        #[arg(long)]
        after: Option<i64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting action (another operator than who asked) and run it.
    Approve {
        /// Approval id.
        id: i64,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a waiting action (who asked withdraws it so).
    Reject {
        /// Approval id.
        id: i64,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Runs an `approvals` verb.
pub async fn run(command: ApprovalsCommand, operations: &Operations) -> anyhow::Result<()> {
    let actor = Actor::shell();
    match command {
        ApprovalsCommand::List {
            all,
            limit,
            after,
            json,
        } => {
            let page = operations
                .approvals(!all, &PageRequest { limit, after })
                .await?;
            let header = [
                "ID",
                "STATUS",
                "VERB",
                "TASKS",
                "ASKED BY",
                "ASKED",
                "REASON",
                "DECIDED BY",
            ];
            table::print_page(&page, json, &header, "no approval", |a| {
                vec![
                    a.id.to_string(),
                    a.status.clone(),
                    a.verb.clone(),
                    a.selected.to_string(),
                    a.requested_by.clone(),
                    a.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    a.reason.clone().unwrap_or_default(),
                    a.decided_by.clone().unwrap_or_default(),
                ]
            })
        }
        ApprovalsCommand::Approve { id, reason } => {
            let approval = operations.approve(&actor, id, reason.as_deref()).await?;
            let outcome = approval.outcome.map(|o| o.to_string()).unwrap_or_default();
            outln!(
                "approval {id} approved: the {} of {} asked by {} ran: {}",
                approval.verb,
                approval.selected,
                approval.requested_by,
                crate::readable::visible(&outcome)
            );
            Ok(())
        }
        ApprovalsCommand::Reject { id, reason } => {
            let approval = operations.reject(&actor, id, reason.as_deref()).await?;
            outln!(
                "approval {id} rejected: the {} asked by {} will not run",
                approval.verb,
                approval.requested_by
            );
            Ok(())
        }
    }
}
