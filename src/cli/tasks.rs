//! `redrive tasks VERB`: look at tasks and act on them, over the store's fenced operations.

use anyhow::bail;
use clap::{Args, Subcommand};

use super::operator::{cli_operator, confirm};
use super::output::{errln, outln};
use super::replays::{run_in_foreground, ReplayArgs};
use super::selection::{FilterArgs, SelectionArgs};
use super::show::{self, ShowArgs};
use super::table;
use super::watch::{self, StatsArgs, WatchArgs};
use crate::config::Targets;
use crate::fleet::Fleet;
use crate::store::{Action, Applicable, Budget, Due, Selection, Store, TaskFilter, MAX_PAGE};
use crate::task::{Status, TaskId};

/// The task verbs.
#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// List tasks, newest first, a page at a time.
    List(ListArgs),
    /// Show every field of a task, its payload and its attempt history.
    Show(ShowArgs),
    /// Make tasks due again (failed, permanent_failure or discarded ones) with a new budget.
    ///
    /// A task whose compensation has started (running, waiting to retry, compensated or
    /// failed) is left alone unless --force: the compensation may have undone what its
    /// checkpoint says is done. Exits 1 when it left any task alone for that reason.
    Retry(RetryArgs),
    /// Give up on tasks (failed or permanent_failure ones): they become discarded.
    Discard(DecideArgs),
    /// Declare tasks handled (failed or permanent_failure ones): they become resolved.
    ///
    /// A task whose compensation has started is left alone unless --force. Exits 1 when
    /// it left any task alone for that reason.
    Resolve(ResolveArgs),
    /// Produce the stored messages of the tasks a filter selects to a topic.
    Replay(ReplayArgs),
    /// Counts by status and handler, due work, the last hour's attempts, live members.
    Stats(StatsArgs),
    /// Check the store's invariants; exit status 1 when any is broken.
    Check(JsonArgs),
}

/// Just `--json`.
#[derive(Debug, Args)]
pub struct JsonArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tasks list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Which tasks.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Tasks per page (at most 1000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=MAX_PAGE))]
    pub limit: i64,
    /// Continue after this task id (the previous page's last, as printed).
    #[arg(long)]
    pub after: Option<i64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print again every interval.
    #[command(flatten)]
    pub watch: WatchArgs,
}

/// Confirmation and output options of the bulk verbs.
#[derive(Debug, Args)]
pub struct BulkArgs {
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print how many tasks it would change and a sample; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tasks retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Which tasks.
    #[command(flatten)]
    pub selection: SelectionArgs,
    /// When the next attempt is due: a duration from now ("1h": in an hour) or an RFC 3339
    /// time, at most a year ahead (default: now; never before the handler's breaker hold).
    #[arg(long)]
    pub at: Option<Due>,
    /// Give N attempts more than the tasks have left (a task that used its budget up gets
    /// exactly N calls) instead of a whole budget again.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=1_000_000))]
    pub more_attempts: Option<i32>,
    /// Why (written to the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    /// Also retry tasks whose compensation has started: they start over from the first
    /// step (their checkpoint cleared), and a compensation still running is cancelled.
    #[arg(long)]
    pub force: bool,
    /// Confirmation and output.
    #[command(flatten)]
    pub bulk: BulkArgs,
}

/// Options of `tasks resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// Which tasks, why, confirmation and output.
    #[command(flatten)]
    pub decide: DecideArgs,
    /// Also resolve tasks whose compensation has started (a compensation still running
    /// is cancelled).
    #[arg(long)]
    pub force: bool,
}

/// Options of `tasks discard` and `tasks resolve`.
#[derive(Debug, Args)]
pub struct DecideArgs {
    /// Which tasks.
    #[command(flatten)]
    pub selection: SelectionArgs,
    /// Why (written to the audit log).
    #[arg(long)]
    pub reason: String,
    /// Confirmation and output.
    #[command(flatten)]
    pub bulk: BulkArgs,
}

/// Runs a task verb; `targets` are the reader's configured republish and parking topics.
pub async fn run(
    command: TasksCommand,
    fleet: &Fleet,
    store: &Store,
    targets: &Targets,
) -> anyhow::Result<()> {
    match command {
        TasksCommand::List(args) => watch::every(&args.watch, || list(store, &args)).await,
        TasksCommand::Show(args) => show::run(store, args, targets, &fleet.budgets()).await,
        TasksCommand::Retry(args) => {
            let budget = match args.more_attempts {
                None => Budget::Fresh,
                Some(attempts) => Budget::More {
                    attempts,
                    budgets: fleet.budgets(),
                },
            };
            let action = Action::Retry {
                at: args.at,
                budget,
                force: args.force,
            };
            bulk(store, &action, &args.selection, args.reason, &args.bulk).await
        }
        TasksCommand::Discard(args) => {
            bulk(
                store,
                &Action::Discard,
                &args.selection,
                Some(args.reason),
                &args.bulk,
            )
            .await
        }
        TasksCommand::Resolve(args) => {
            bulk(
                store,
                &Action::Resolve { force: args.force },
                &args.decide.selection,
                Some(args.decide.reason),
                &args.decide.bulk,
            )
            .await
        }
        TasksCommand::Replay(args) => run_in_foreground(args, fleet, store).await,
        TasksCommand::Stats(args) => watch::every(&args.watch, || stats(store, args.json)).await,
        TasksCommand::Check(args) => check(fleet, store, args.json).await,
    }
}

async fn list(store: &Store, args: &ListArgs) -> anyhow::Result<()> {
    let filter = args.filter.filter()?;
    let page = store
        .list(&filter, args.after.map(TaskId), args.limit)
        .await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    if page.tasks.is_empty() {
        errln!("no task matches");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.status.to_string(),
                t.handler.clone(),
                t.route.clone().unwrap_or_default(),
                match (&t.topic, t.partition, t.offset) {
                    (Some(topic), Some(p), Some(o)) => format!("{topic}/{p}/{o}"),
                    _ => String::new(),
                },
                t.key.clone().unwrap_or_default(),
                t.attempts.to_string(),
                show::next_attempt(t),
                t.last_error.clone().unwrap_or_default().replace('\n', " "),
            ]
        })
        .collect();
    table::print(
        &[
            "ID", "STATUS", "HANDLER", "ROUTE", "SOURCE", "KEY", "ATTEMPTS", "NEXT", "ERROR",
        ],
        &rows,
    );
    if let Some(cursor) = page.next_cursor {
        errln!("more: --after {cursor}");
    }
    Ok(())
}

/// The selection's filter narrowed to the statuses `action` applies to: what a sample
/// of the tasks it would change reads.
fn applicable_filter(action: &Action, selection: &Selection) -> Option<TaskFilter> {
    let Selection::Filter(filter) = selection else {
        return None;
    };
    let mut filter = filter.clone();
    let applies = action.applies_to();
    filter.status = if filter.status.is_empty() {
        applies.to_vec()
    } else {
        filter
            .status
            .iter()
            .copied()
            .filter(|s| applies.contains(s))
            .collect()
    };
    Some(filter)
}

fn names(statuses: &[Status]) -> String {
    statuses
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn bulk(
    store: &Store,
    action: &Action,
    selection: &SelectionArgs,
    reason: Option<String>,
    options: &BulkArgs,
) -> anyhow::Result<()> {
    let selection = selection.selection()?;
    if let Selection::Ids(ids) = &selection {
        store.ensure_exist(ids).await?;
    }
    let Applicable {
        changes: count,
        refused,
    } = store.count_applicable(action, &selection).await?;
    let verb = action.name();
    if count == 0 {
        let what = match &selection {
            Selection::Ids(_) => "none of these tasks",
            Selection::Filter(_) => "no task matching the filter",
        };
        if options.json {
            outln!(
                "{}",
                serde_json::json!({ "action": verb, "matched": 0, "changed": 0, "refused": refused })
            );
        }
        if refused > 0 {
            bail!("{}; nothing changed", left_alone(action, refused));
        }
        errln!(
            "{what} is in a status {verb} applies to ({}); nothing changed",
            names(action.applies_to())
        );
        return Ok(());
    }
    if options.dry_run {
        let sample = match applicable_filter(action, &selection) {
            Some(filter) => store.list(&filter, None, 5).await?.tasks,
            None => Vec::new(),
        };
        if options.json {
            let report = serde_json::json!({
                "action": verb, "dry_run": true, "matched": count, "refused": refused,
                "sample": sample,
            });
            outln!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            outln!("{verb} would change {count} task(s); nothing changed (dry run)");
            for task in sample {
                outln!("  {} {} {}", task.id, task.status, task.handler);
            }
            if refused > 0 {
                outln!("{}", left_alone(action, refused));
            }
        }
        return Ok(());
    }
    errln!("{verb}: {count} task(s) selected");
    if !confirm(&format!("{verb} {count} task(s)?"), options.yes)? {
        bail!("not confirmed; nothing changed");
    }
    let report = store.act(&cli_operator(reason), action, &selection).await?;
    if options.json {
        let json = serde_json::json!({
            "action": verb, "matched": count, "changed": report.changed,
            "refused": report.refused, "audit_id": report.audit_id,
        });
        outln!("{json}");
    } else {
        outln!(
            "{verb}: {} task(s) changed (audit entry {})",
            report.changed,
            report.audit_id
        );
    }
    if report.refused > 0 {
        bail!("{}", left_alone(action, report.refused));
    }
    Ok(())
}

/// Why `action` left `count` tasks alone, and how to act on them anyway.
fn left_alone(action: &Action, count: i64) -> String {
    let forced = match action {
        Action::Retry { .. } => {
            "--force retries them from the first step (their checkpoint cleared)"
        }
        _ => "--force resolves them",
    };
    format!(
        "{count} task(s) left alone: their compensation has started (running, waiting to \
         retry, compensated or failed: see `tasks show ID`), so it may have undone work; \
         {forced} and cancels a compensation still running"
    )
}

async fn stats(store: &Store, json: bool) -> anyhow::Result<()> {
    let stats = store.stats().await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = stats
        .tasks
        .iter()
        .map(|c| vec![c.status.to_string(), c.handler.clone(), c.count.to_string()])
        .collect();
    table::print(&["STATUS", "HANDLER", "TASKS"], &rows);
    outln!();
    let rows: Vec<Vec<String>> = stats
        .due
        .iter()
        .map(|d| {
            vec![
                d.handler.clone(),
                d.due.to_string(),
                humantime::format_duration(std::time::Duration::from_secs(
                    d.oldest_due_seconds.max(0.0) as u64,
                ))
                .to_string(),
            ]
        })
        .collect();
    table::print(&["HANDLER", "DUE", "OLDEST DUE FOR"], &rows);
    outln!();
    let rows: Vec<Vec<String>> = stats
        .last_hour
        .iter()
        .map(|o| vec![o.outcome.clone(), o.count.to_string()])
        .collect();
    table::print(&["OUTCOME (LAST HOUR)", "COUNT"], &rows);
    outln!();
    let rows: Vec<Vec<String>> = stats
        .members
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                m.host.clone(),
                m.version.clone(),
                m.roles.join(","),
                m.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                m.last_seen.format("%H:%M:%S").to_string(),
            ]
        })
        .collect();
    table::print(
        &["MEMBER", "HOST", "VERSION", "ROLES", "STARTED", "SEEN"],
        &rows,
    );
    Ok(())
}

async fn check(fleet: &Fleet, store: &Store, json: bool) -> anyhow::Result<()> {
    let report = store.check(&fleet.budgets()).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for v in &report.violations {
            outln!("task {}: {}: {}", v.task_id, v.kind, v.detail);
        }
        for (kind, count) in &report.counts {
            errln!("{kind}: {count} violation(s)");
        }
        for warning in &report.warnings {
            errln!("warning: {warning}");
        }
        if report.violations.is_empty() {
            outln!("every invariant holds");
        }
    }
    if !report.violations.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
