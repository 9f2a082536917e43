//! `redrive tasks VERB`: look at tasks and act on them, through the operations layer.

use clap::{Args, Subcommand};

use super::act::{bulk, request, DecideArgs, ResolveArgs, RetryArgs};
use super::groups;
use super::replays::{run_in_foreground, ReplayArgs};
use super::selection::FilterArgs;
use super::show::{self, ShowArgs};
use super::table;
use super::watch::{self, StatsArgs, WatchArgs};
use crate::fleet::Fleet;
use crate::operations::{ActRequest, Operations, PageRequest, Verb};
use crate::output::{errln, outln};

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
    /// Fix stored JSON payloads before redriving them: set, remove, rename or map fields
    /// by JSON Pointer. A dry run shows what it would change (with a diff), fail on and
    /// leave alone; each changed payload becomes a new version, the value as it came kept
    /// (`tasks show`).
    Transform(super::transform::TransformArgs),
    /// What broke: tasks grouped by cause (or class, handler, route, topic), biggest
    /// first, with first and last seen, a trend, what each spans and an example.
    ///
    /// With no --status, the tasks not done (failed and permanent_failure). List a
    /// group's tasks with `tasks list --cause ID`, and act on all of them with
    /// `tasks retry|discard|resolve|replay --cause ID`.
    Groups(groups::GroupsArgs),
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
    /// Tasks per page (1 to 1000; default 50).
    #[arg(long)]
    pub limit: Option<i64>,
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

/// Runs a task verb.
pub async fn run(
    command: TasksCommand,
    fleet: &Fleet,
    operations: &Operations,
) -> anyhow::Result<()> {
    match command {
        TasksCommand::List(args) => watch::every(&args.watch, || list(operations, &args)).await,
        TasksCommand::Show(args) => show::run(operations, args).await,
        TasksCommand::Retry(args) => {
            let request = ActRequest {
                at: args.at,
                more_attempts: args.more_attempts,
                pace: args.pace.request(args.rate, true),
                ..request(&args.selection, args.reason, args.force)
            };
            let (bulk_args, detach) = (&args.bulk, args.detach);
            bulk(fleet, operations, Verb::Retry, request, bulk_args, detach).await
        }
        TasksCommand::Discard(args) => {
            let request = request(&args.selection, Some(args.reason), false);
            bulk(fleet, operations, Verb::Discard, request, &args.bulk, false).await
        }
        TasksCommand::Resolve(args) => {
            let decide = args.decide;
            let request = request(&decide.selection, Some(decide.reason), args.force);
            bulk(
                fleet,
                operations,
                Verb::Resolve,
                request,
                &decide.bulk,
                false,
            )
            .await
        }
        TasksCommand::Replay(args) => run_in_foreground(args, fleet, operations).await,
        TasksCommand::Transform(args) => super::transform::run(operations, args).await,
        TasksCommand::Groups(args) => {
            watch::every(&args.watch, || groups::print(operations, &args)).await
        }
        TasksCommand::Stats(args) => {
            watch::every(&args.watch, || stats(operations, args.json)).await
        }
        TasksCommand::Check(args) => check(operations, args.json).await,
    }
}

async fn list(operations: &Operations, args: &ListArgs) -> anyhow::Result<()> {
    let page = PageRequest {
        limit: args.limit,
        after: args.after,
    };
    let page = operations.list(&args.filter.params(), &page).await?;
    let header = [
        "ID", "STATUS", "HANDLER", "ROUTE", "SOURCE", "KEY", "ATTEMPTS", "NEXT", "ERROR",
    ];
    if let (Some(searched), false) = (&page.searched, args.json) {
        errln!("{}", groups::searched_line(searched));
    }
    table::print_page(&page, args.json, &header, "no task matches", |t| {
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
}

async fn stats(operations: &Operations, json: bool) -> anyhow::Result<()> {
    let stats = operations.stats().await?;
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

async fn check(operations: &Operations, json: bool) -> anyhow::Result<()> {
    let report = operations.check().await?;
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
