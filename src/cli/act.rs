//! `redrive tasks retry|discard|resolve`: a dry run first (the count, and a sample),
//! confirmation, then the action with a progress bar on a terminal.

use anyhow::bail;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

use super::operator::confirm;
use super::pace::PaceArgs;
use super::replays::{foreground, print_job_started, replayer};
use super::selection::SelectionArgs;
use crate::fleet::Fleet;
use crate::operations::{ActAnswer, ActRequest, Actor, Operations, Runner, Verb};
use crate::output::{errln, outln};

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
    pub at: Option<String>,
    /// Give N attempts more than the tasks have left (a task that used its budget up gets
    /// exactly N calls) instead of a whole budget again (1 to 1000000).
    #[arg(long)]
    pub more_attempts: Option<i32>,
    /// Why (written to the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    /// Also retry tasks whose compensation has started: they start over from the first
    /// step (their checkpoint cleared), and a compensation still running is cancelled;
    /// and tasks an earlier redrive job already redrove.
    #[arg(long)]
    pub force: bool,
    /// Pace the retry: make at most this many tasks due a second (a job, run here or
    /// with --detach by the fleet, that pauses itself when the retried tasks fail again).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The ramp and the pause of a paced retry.
    #[command(flatten)]
    pub pace: PaceArgs,
    /// A paced retry: leave the job to the fleet's members instead of running it here.
    #[arg(long)]
    pub detach: bool,
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

/// The request of `selection`, `reason` and `force` (a retry sets its own options).
pub fn request(selection: &SelectionArgs, reason: Option<String>, force: bool) -> ActRequest {
    ActRequest {
        ids: selection.ids.clone(),
        filter: selection.filter.given(),
        all: selection.all,
        reason,
        force,
        ..ActRequest::default()
    }
}

/// Runs `verb` on `request`: counts first, then asks, then acts (a paced retry: records
/// its job, then runs it here or leaves it to the fleet with `detach`).
pub async fn bulk(
    fleet: &Fleet,
    operations: &Operations,
    verb: Verb,
    request: ActRequest,
    options: &BulkArgs,
    detach: bool,
) -> anyhow::Result<()> {
    let actor = Actor::shell();
    if detach && request.pace.is_none() {
        bail!("--detach belongs to a paced retry: give it a --rate");
    }
    // What is counted and confirmed is what exists now: tasks stored while the operator
    // reads the count (a cause that keeps growing) are left alone, unless the filter
    // gives an end of its own.
    let mut request = request;
    if let Some(filter) = request.filter.as_mut() {
        if filter.created_before.is_none() {
            filter.created_before =
                Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true));
        }
    }
    let dry_run = ActRequest {
        dry_run: true,
        ..request.clone()
    };
    let preview = operations.act(&actor, verb, &dry_run, |_| {}).await?;
    let name = preview.action;
    let count = preview.matched;
    if options.dry_run {
        return print_dry_run(&preview, verb, options.json);
    }
    if count == 0 {
        let what = match request.ids.is_empty() {
            true => "no task matching the filter",
            false => "none of these tasks",
        };
        // Confirmed up front (`--yes`): on the record like every confirmed action, with
        // count 0, as the API does; asked at a prompt, there was nothing to confirm.
        let audited = match options.yes {
            true => {
                operations
                    .act(&actor, verb, &request, |_| {})
                    .await?
                    .audit_id
            }
            false => None,
        };
        if options.json {
            let nothing = ActAnswer {
                dry_run: false,
                sample: None,
                audit_id: audited,
                ..preview.clone()
            };
            outln!("{}", serde_json::to_string(&nothing)?);
        }
        let what = match audited {
            Some(audit) => format!("{what} (audit entry {audit})"),
            None => what.to_owned(),
        };
        if preview.refused > 0 {
            bail!("{}; nothing changed", left_alone(verb, preview.refused));
        }
        errln!(
            "{what} is in a status {name} applies to ({}); nothing changed",
            applies(verb)
        );
        return Ok(());
    }
    errln!("{name}: {count} task(s) selected");
    warn_held(&preview);
    if let Some(refusal) = preview.redriven.as_ref().and_then(|r| r.refusal()) {
        if !request.force {
            bail!("{refusal}; nothing changed");
        }
    }
    if request.pace.is_some() {
        let what = format!("{name} {count} task(s) at a pace (a job)?");
        if !confirm(&what, options.yes)? {
            bail!("not confirmed; nothing changed");
        }
        return paced(fleet, operations, &actor, &request, options.json, detach).await;
    }
    if !confirm(&format!("{name} {count} task(s)?"), options.yes)? {
        bail!("not confirmed; nothing changed");
    }
    let bar = progress_bar(count);
    let done = operations
        .act(&actor, verb, &request, |report| {
            bar.set_position((report.changed + report.refused).max(0) as u64)
        })
        .await;
    bar.finish_and_clear();
    let answer = done?;
    if options.json {
        outln!("{}", serde_json::to_string(&answer)?);
    } else {
        outln!(
            "{name}: {} task(s) changed (audit entry {})",
            answer.changed,
            answer.audit_id.unwrap_or_default()
        );
    }
    if answer.refused > 0 {
        bail!("{}", left_alone(verb, answer.refused));
    }
    Ok(())
}

/// Records a paced retry's job and runs it here, or leaves it to the fleet.
async fn paced(
    fleet: &Fleet,
    operations: &Operations,
    actor: &Actor,
    request: &ActRequest,
    json: bool,
    detach: bool,
) -> anyhow::Result<()> {
    let replayer = replayer(fleet, operations.store());
    let runner = match detach {
        true => Runner::Fleet,
        false => Runner::Here(replayer.runner()),
    };
    let answer = (operations.act_by(actor, Verb::Retry, request, runner, |_| {})).await?;
    let Some(job) = answer.job else {
        bail!("the paced retry recorded no job");
    };
    if detach {
        return print_job_started(&job, json);
    }
    foreground(&replayer, job, json).await
}

/// Warns of the breakers forced open that hold retried tasks back.
fn warn_held(answer: &ActAnswer) {
    for held in &answer.held_by_breakers {
        errln!("warning: {}", crate::readable::visible(&held.warning));
    }
}

fn print_dry_run(preview: &ActAnswer, verb: Verb, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(preview)?);
        return Ok(());
    }
    outln!(
        "{} would change {} task(s); nothing changed (dry run)",
        preview.action,
        preview.matched
    );
    for task in preview.sample.iter().flatten() {
        let error = task.last_error.as_deref().unwrap_or_default();
        let line = format!(
            "  {} {} {} key={} {}",
            task.id,
            task.status,
            task.handler,
            task.key.as_deref().unwrap_or("(none)"),
            error.replace('\n', " ")
        );
        outln!("{}", crate::readable::visible(&line));
    }
    for unreadable in &preview.unreadable {
        outln!(
            "  {} (counted, and changed like the others)",
            crate::readable::visible(unreadable)
        );
    }
    if preview.refused > 0 {
        outln!("{}", left_alone(verb, preview.refused));
    }
    // Part of the report: on standard output with the rest of it.
    for held in &preview.held_by_breakers {
        outln!("warning: {}", crate::readable::visible(&held.warning));
    }
    if let Some(refusal) = preview.redriven.as_ref().and_then(|r| r.refusal()) {
        outln!("{refusal}");
    }
    Ok(())
}

/// A bar of `total` tasks on a terminal's standard error; hidden elsewhere.
fn progress_bar(total: i64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar =
        ProgressBar::with_draw_target(Some(total.max(0) as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// The statuses `verb` applies to, in words.
fn applies(verb: Verb) -> String {
    let names: Vec<&str> = verb.applies_to().iter().map(|s| s.as_str()).collect();
    names.join(", ")
}

/// Why `verb` left `count` tasks alone, and how to act on them anyway.
fn left_alone(verb: Verb, count: i64) -> String {
    let forced = match verb {
        Verb::Retry => "--force retries them from the first step (their checkpoint cleared)",
        Verb::Discard | Verb::Resolve => "--force resolves them",
    };
    format!(
        "{count} task(s) left alone: their compensation has started (running, waiting to \
         retry, compensated or failed: see `tasks show ID`), so it may have undone work; \
         {forced} and cancels a compensation still running"
    )
}
