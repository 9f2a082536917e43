//! `redrive tasks groups`: what broke, grouped by cause, as a table or JSON.

use super::selection::FilterArgs;
use super::table;
use super::watch::WatchArgs;
use crate::operations::{GroupParams, Operations};
use crate::output::{errln, outln};
use crate::store::{GroupBy, Groups, Searched, TaskFilter};
use crate::task::Status;
use clap::Args;

/// Options of `tasks groups`.
#[derive(Debug, Args)]
pub struct GroupsArgs {
    /// Which tasks (with no --status: failed and permanent_failure).
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Group by cause (the default), class, handler, route or topic.
    #[arg(long)]
    pub by: Option<String>,
    /// Only tasks that failed within this long ("1h").
    #[arg(long)]
    pub since: Option<String>,
    /// The trend's span ("1h", the default; "1d"), cut into --buckets.
    #[arg(long)]
    pub trend: Option<String>,
    /// Buckets of the trend (default 12).
    #[arg(long)]
    pub buckets: Option<u32>,
    /// Most groups listed (default 50).
    #[arg(long)]
    pub limit: Option<i64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print again every interval.
    #[command(flatten)]
    pub watch: WatchArgs,
}

/// Prints the groups `args` asks for.
pub async fn print(operations: &Operations, args: &GroupsArgs) -> anyhow::Result<()> {
    let params = GroupParams {
        by: args.by.clone(),
        since: args.since.clone(),
        trend: args.trend.clone(),
        buckets: args.buckets,
        limit: args.limit,
    };
    let groups = operations
        .groups(&args.filter.params(), &params, true)
        .await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&groups)?);
        return Ok(());
    }
    if groups.groups.is_empty() {
        errln!("no task matches");
        return Ok(());
    }
    table::print(&header(groups.by), &rows(&groups));
    let listed = groups.groups.len() as i64;
    errln!(
        "{} task(s) in {} group(s){}; trend: {} bucket(s) of {}, oldest first",
        groups.total_tasks,
        groups.total_groups,
        match groups.total_groups > listed {
            true => format!(", the {listed} biggest listed (--limit)"),
            false => String::new(),
        },
        groups.groups.first().map_or(0, |g| g.trend.len()),
        humantime::format_duration(std::time::Duration::from_secs(groups.bucket_seconds)),
    );
    if groups.by == GroupBy::Cause {
        let filter = options(&groups.filter);
        errln!(
            "a cause's tasks: tasks list --cause ID{filter}; act on them: tasks retry|discard|resolve|replay --cause ID{filter}"
        );
    }
    Ok(())
}

/// The options that select what the groups counted, as the hint after the table
/// prints them: the statuses unless they are the tasks not done (what `--cause` takes
/// without any), and every other part of the filter, the window (`--failed-after`)
/// included, each value quoted for a shell where it needs to be.
fn options(filter: &TaskFilter) -> String {
    let mut out = String::new();
    let not_done = [Status::Failed, Status::PermanentFailure];
    if !filter.status.is_empty() && filter.status != not_done {
        let statuses: Vec<&str> = filter.status.iter().map(|s| s.as_str()).collect();
        out.push_str(&format!(" --status {}", statuses.join(",")));
    }
    for (name, value) in filter.named_values() {
        if name == "status" {
            continue;
        }
        let value =
            shlex::try_quote(&value).map_or_else(|_| format!("{value:?}"), |v| v.into_owned());
        out.push_str(&format!(" --{} {value}", name.replace('_', "-")));
    }
    out
}

fn header(by: GroupBy) -> Vec<&'static str> {
    let mut header = match by {
        GroupBy::Cause => vec!["CAUSE", "CLASS", "MESSAGE"],
        GroupBy::Class => vec!["CLASS"],
        GroupBy::Handler => vec!["HANDLER"],
        GroupBy::Route => vec!["ROUTE"],
        GroupBy::Topic => vec!["TOPIC"],
    };
    header.extend([
        "TASKS",
        "FIRST SEEN",
        "LAST SEEN",
        "TREND",
        "HANDLERS",
        "ROUTES",
        "EXAMPLE",
    ]);
    header
}

fn rows(groups: &Groups) -> Vec<Vec<String>> {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or_else(String::new, |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
    };
    groups
        .groups
        .iter()
        .map(|g| {
            let mut row = match (&g.cause, groups.by) {
                (Some(cause), _) => vec![
                    cause.id.to_string(),
                    cause.class.clone(),
                    cause.fingerprint.clone(),
                ],
                (None, GroupBy::Cause) => {
                    vec!["-".into(), "(not yet classified)".into(), String::new()]
                }
                (None, _) => vec![g.key.clone().unwrap_or_else(|| "(none)".into())],
            };
            row.extend([
                g.tasks.to_string(),
                time(g.first_seen),
                time(g.last_seen),
                sparkline(&g.trend),
                g.handlers.join(","),
                g.routes.join(","),
                g.example_task
                    .map_or_else(String::new, |id| format!("task {id}")),
            ]);
            row
        })
        .collect()
}

/// A trend as a line of bars, each as high as its count against the highest.
pub fn sparkline(counts: &[i64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let highest = counts.iter().copied().max().unwrap_or(0);
    counts
        .iter()
        .map(|&n| match n {
            0 => ' ',
            n => BARS[((n * 7) / highest.max(1)).clamp(0, 7) as usize],
        })
        .collect()
}

/// What a search read, in one line.
pub fn searched_line(searched: &Searched) -> String {
    match (searched.bounded, searched.down_to) {
        (true, Some(oldest)) => format!(
            "searched the newest {} task(s) of the filter, down to task {oldest}; older ones \
             were not searched yet: page on (--after) to go on",
            searched.scanned
        ),
        _ => format!(
            "searched {} task(s): every one of the filter (below the cursor, if given)",
            searched.scanned
        ),
    }
}
