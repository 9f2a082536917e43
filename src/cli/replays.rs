//! `redrive tasks replay` and `redrive replays ...`.

use anyhow::bail;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use tokio_util::sync::CancellationToken;

use super::operator::confirm;
use super::pace::PaceArgs;
use super::selection::FilterArgs;
use super::{table, watch};
use crate::fleet::{cancel_on_signal, Fleet};
use crate::operations::{Actor, Operations, PageRequest, ReplayPreview, ReplayRequest, Runner};
use crate::output::{errln, outln};
use crate::replay::Replayer;
use crate::store::{ReplayJob, Store};

/// Options of `tasks replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Which tasks.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Replay every task (required when no filter option is given).
    #[arg(long)]
    pub all: bool,
    /// Target topic (default: each task's original topic; tasks without one are skipped).
    #[arg(long)]
    pub to: Option<String>,
    /// Mark each replayed task resolved.
    #[arg(long)]
    pub mark_resolved: bool,
    /// Messages per second at most (with a ramp: at full pace).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The ramp and the pause of a paced replay (needs --rate).
    #[command(flatten)]
    pub pace: PaceArgs,
    /// Also replay tasks an earlier redrive job already redrove.
    #[arg(long)]
    pub force: bool,
    /// Leave the job to the fleet's members instead of running it here.
    #[arg(long)]
    pub detach: bool,
    /// Why (written to the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print how many tasks it would replay and skip (and why), with a sample; produce
    /// nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the job as JSON when it ends (or is detached).
    #[arg(long)]
    pub json: bool,
}

/// The redrive job verbs (replays and paced retries).
#[derive(Debug, Subcommand)]
pub enum ReplaysCommand {
    /// List redrive jobs (replays and paced retries) with their progress and pace,
    /// newest first.
    List {
        /// Jobs per page (1 to 1000; default 50).
        #[arg(long)]
        limit: Option<i64>,
        /// Continue after this job id (the previous page's last, as printed).
        #[arg(long)]
        after: Option<i64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print again every interval until interrupted.
        #[command(flatten)]
        watch: watch::WatchArgs,
    },
    /// Pause a job; its runner stops after its current batch, and no member takes it
    /// until it is resumed.
    Pause {
        /// Job id.
        id: i64,
    },
    /// Cancel a job; its runner stops after its current batch.
    Cancel {
        /// Job id.
        id: i64,
    },
    /// Continue a paused or interrupted job here (or hand it to the fleet with
    /// --detach); a paused job judges its step afresh.
    Resume {
        /// Job id.
        id: i64,
        /// Hand it to the fleet's members.
        #[arg(long)]
        detach: bool,
        /// Slow it down (or speed it up): a paced job's full pace, an unpaced replay's
        /// rate, per second.
        #[arg(long)]
        rate: Option<f64>,
    },
}

/// This CLI's name as a replay runner: `cli-<host>-<pid>`.
fn runner_name() -> String {
    format!("{}{}", runner_prefix(), std::process::id())
}

fn runner_prefix() -> String {
    format!("cli-{}-", gethostname::gethostname().to_string_lossy())
}

/// `runner` if it names a CLI process of this host that no longer runs (killed, or
/// its terminal closed): its job can be resumed at once, without waiting for its hold
/// to go stale.
fn dead_local_runner(runner: Option<&str>) -> Option<&str> {
    let runner = runner?;
    let pid: u32 = runner.strip_prefix(&runner_prefix())?.parse().ok()?;
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    (!alive).then_some(runner)
}

/// The runner of this CLI's jobs.
pub(super) fn replayer(fleet: &Fleet, store: &Store) -> Replayer {
    let settings = fleet.settings();
    Replayer::new(
        store.clone(),
        settings.kafka.clone(),
        settings.ingest.max_message_bytes,
        runner_name(),
        settings.routes.clone(),
    )
}

/// `tasks replay`: counts, asks, records the job, then runs it here with a progress bar
/// (or leaves it to the fleet with `--detach`).
pub async fn run_in_foreground(
    args: ReplayArgs,
    fleet: &Fleet,
    operations: &Operations,
) -> anyhow::Result<()> {
    let actor = Actor::shell();
    let pace = args.pace.request(args.rate, false);
    let request = ReplayRequest {
        ids: Vec::new(),
        filter: args.filter.given(),
        all: args.all,
        to: args.to.clone(),
        mark_resolved: args.mark_resolved,
        rate: if pace.is_some() { None } else { args.rate },
        pace,
        force: args.force,
        reason: args.reason.clone(),
        dry_run: args.dry_run,
    };
    let preview = operations.preview_replay(&actor, &request).await?;
    let target = args.to.as_deref().unwrap_or("each task's original topic");
    if args.dry_run {
        return print_preview(&preview, target, args.json);
    }
    let count = preview.produced;
    if count == 0 {
        errln!(
            "no task of the filter would be produced ({} selected); nothing to replay",
            preview.matched
        );
        return Ok(());
    }
    if let (Some(refusal), false) = (preview.redriven.refusal(), args.force) {
        bail!("{refusal}; nothing produced");
    }
    errln!("replay: {count} message(s) to produce, to {target}");
    if !confirm(&format!("replay {count} task(s) to {target}?"), args.yes)? {
        bail!("not confirmed; nothing produced");
    }
    let replayer = replayer(fleet, operations.store());
    let runner = match args.detach {
        true => Runner::Fleet,
        false => Runner::Here(replayer.runner()),
    };
    let job = operations.start_replay(&actor, &request, runner).await?;
    if args.detach {
        print_job_started(&job, args.json)?;
        return Ok(());
    }
    foreground(&replayer, job, args.json).await
}

fn print_preview(preview: &ReplayPreview, target: &str, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(preview)?);
        return Ok(());
    }
    outln!(
        "replay would produce {} message(s) of {} task(s) to {target}; nothing produced (dry run)",
        preview.produced,
        preview.matched
    );
    for skipped in preview.skipped.iter().filter(|s| s.count > 0) {
        outln!(
            "  {} skipped ({}): {}",
            skipped.count,
            skipped.reason,
            skipped.why
        );
    }
    if let Some(pace) = &preview.pace {
        outln!(
            "  paced: ramp {} of {}/s, {} task(s) per step, pausing above {:.0}% failed",
            pace.ramp_text(),
            pace.rate,
            pace.step_tasks,
            pace.pause_ratio * 100.0
        );
    }
    if let Some(refusal) = preview.redriven.refusal() {
        outln!("  {refusal}");
    }
    for task in &preview.sample {
        outln!(
            "  {} {} {} key={}",
            task.id,
            task.status,
            task.handler,
            task.key.as_deref().unwrap_or("(none)")
        );
    }
    Ok(())
}

/// Says that `job` was left to the fleet.
pub(super) fn print_job_started(job: &ReplayJob, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(job)?);
    } else {
        outln!(
            "{} job {} recorded; a fleet member will run it (follow it with `redrive replays list --watch`)",
            job.kind,
            job.id
        );
    }
    Ok(())
}

/// Runs `job` here until it ends, pauses or SIGINT/SIGTERM, with a progress bar on a
/// terminal.
pub(super) async fn foreground(
    replayer: &Replayer,
    job: ReplayJob,
    json: bool,
) -> anyhow::Result<()> {
    let id = job.id;
    let progress = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_message(format!("{} job {id}", job.kind));
        bar
    } else {
        ProgressBar::hidden()
    };
    let stop = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(stop.clone()));
    let bar = |done: u64, total: u64| {
        progress.set_length(total);
        progress.set_position(done);
    };
    let outcome = replayer.run(job, &bar, &stop).await;
    signals.abort();
    progress.abandon();
    let job = outcome?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&job)?);
    }
    match job.status.as_str() {
        "done" if job.kind == "retry" => {
            if !json {
                outln!(
                    "retry job {id} done: {} task(s) made due again, {} left alone (no longer \
                     in a status a retry applies to)",
                    job.produced,
                    job.skipped
                );
            }
            Ok(())
        }
        "done" => {
            if !json {
                outln!(
                    "replay job {id} done: {} produced, {} skipped (no topic or no stored payload)",
                    job.produced,
                    job.skipped
                );
            }
            Ok(())
        }
        "paused" => bail!(
            "{} job {id} paused after {} task(s): {}; resume it with `redrive replays resume \
             {id}` (add --rate to slow it down), or cancel it with `redrive replays cancel {id}`",
            job.kind,
            job.produced,
            job.paused_reason.as_deref().unwrap_or("paused")
        ),
        "cancelled" => bail!(
            "{} job {id} was cancelled after {} {}{}",
            job.kind,
            job.produced,
            match job.kind.as_str() {
                "retry" => "task(s)",
                _ => "message(s)",
            },
            job.uncounted()
                .map(|words| format!("; {words}"))
                .unwrap_or_default()
        ),
        _ => bail!(
            "{} job {id} stopped after {} {}; continue it with `redrive replays resume {id}`",
            job.kind,
            job.produced,
            match job.kind.as_str() {
                "retry" => "task(s)",
                _ => "message(s)",
            }
        ),
    }
}

/// Runs a `replays` verb.
pub async fn run(
    command: ReplaysCommand,
    fleet: &Fleet,
    operations: &Operations,
) -> anyhow::Result<()> {
    match command {
        ReplaysCommand::List {
            limit,
            after,
            json,
            watch,
        } => {
            let list = || list(operations, limit, after, json);
            watch::every(&watch, list).await
        }
        ReplaysCommand::Pause { id } => {
            let job = operations.pause_replay(&Actor::shell(), id).await?;
            outln!(
                "{} job {id} paused after {} task(s); resume it with `redrive replays resume {id}`",
                job.kind,
                job.produced
            );
            Ok(())
        }
        ReplaysCommand::Cancel { id } => {
            let job = operations.cancel_replay(&Actor::shell(), id).await?;
            let uncounted = job.uncounted().map(|words| format!("; {words}"));
            let unit = match job.kind.as_str() {
                "retry" => "task(s)",
                _ => "message(s)",
            };
            outln!(
                "{} job {id} cancelled after {} {unit}{}",
                job.kind,
                job.produced,
                uncounted.unwrap_or_default()
            );
            Ok(())
        }
        ReplaysCommand::Resume { id, detach, rate } => {
            let replayer = replayer(fleet, operations.store());
            let before = operations.store().replay(id).await?;
            let dead = before
                .as_ref()
                .and_then(|j| dead_local_runner(j.runner.as_deref()));
            let runner = match detach {
                true => Runner::Fleet,
                false => Runner::Here(replayer.runner()),
            };
            let job = operations
                .resume_replay(&Actor::shell(), id, runner, dead, rate)
                .await?;
            if detach {
                return print_job_started(&job, false);
            }
            foreground(&replayer, job, false).await
        }
    }
}

/// `replays list`: one page of jobs.
async fn list(
    operations: &Operations,
    limit: Option<i64>,
    after: Option<i64>,
    json: bool,
) -> anyhow::Result<()> {
    let page = operations.replays(&PageRequest { limit, after }).await?;
    let header = [
        "ID", "KIND", "STATUS", "DONE", "PRODUCED", "PACE", "TO", "RUNNER", "BY", "STARTED",
        "ERROR",
    ];
    table::print_page(&page, json, &header, "no redrive job", |j| {
        vec![
            j.id.to_string(),
            j.kind.clone(),
            match &j.paused_reason {
                Some(reason) if j.status == "paused" => format!("paused: {reason}"),
                _ => j.status.clone(),
            },
            format!("{}/{}", j.produced + j.skipped, j.total.unwrap_or(0)),
            // A batch in flight of a job that has ended may be uncounted.
            match j.pending_upto.is_some() && matches!(j.status.as_str(), "cancelled" | "failed") {
                true => format!("{}+?", j.produced),
                false => j.produced.to_string(),
            },
            pace_words(j),
            match (j.kind.as_str(), &j.target_topic) {
                ("retry", _) => "(workers)".into(),
                (_, Some(topic)) => topic.clone(),
                (_, None) => "(original)".into(),
            },
            j.runner.clone().unwrap_or_default(),
            j.actor.clone(),
            j.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            j.error.clone().unwrap_or_default(),
        ]
    })
}

/// A job's pace in a few words: the step under way and its rate.
fn pace_words(job: &ReplayJob) -> String {
    match (&job.pace, job.rate) {
        (Some(pace), _) => format!(
            "step {}/{} at {}/s{}",
            job.step.max(0) + 1,
            pace.steps(),
            pace.rate_of(job.step),
            match job.next_checkpoint {
                Some(at) => format!(", checkpoint at {at}"),
                None => String::new(),
            }
        ),
        (None, Some(rate)) => format!("{rate}/s"),
        (None, None) => String::new(),
    }
}
