//! The `redrive` command line, reusable by a developer's own binary with its own handlers.

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "bench")]
use crate::bench::{self, BenchArgs};
use crate::config::{parse_duration, Settings};
#[cfg(feature = "demo")]
use crate::demo::{self, DemoOptions};
use crate::fleet::{Fleet, FleetBuilder};
use crate::headers::Header;
use crate::operations::Operations;
use crate::store::{Enqueued, Store};
use crate::task::{Failure, NewTask, TaskId};
use crate::telemetry;
use output::outln;

mod act;
mod alerts;
mod brake;
mod breakers;
mod groups;
mod members;
mod operator;
pub(crate) mod output;
mod replays;
mod selection;
mod show;
mod table;
mod tasks;
mod watch;

#[cfg(test)]
mod documented_commands;

pub use act::{BulkArgs, DecideArgs, ResolveArgs, RetryArgs};
pub use alerts::AlertsArgs;
pub use brake::BrakeCommand;
pub use breakers::BreakersCommand;
pub use replays::{AuditArgs, ReplayArgs, ReplaysCommand};
pub use selection::{FilterArgs, SelectionArgs};
pub use tasks::{JsonArgs, TasksCommand};

/// redrive: durable recovery of failed Kafka messages.
#[derive(Debug, Parser)]
#[command(name = "redrive", version, about, long_about = None)]
pub struct Cli {
    /// TOML configuration file (environment variables REDRIVE__SECTION__KEY override it).
    #[arg(long, global = true, env = "REDRIVE_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
// Parsed once per process: boxing the largest (the task verbs' filters) would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker pool until SIGTERM or SIGINT.
    Run(RunArgs),
    /// Create the schema and apply pending migrations, then exit.
    Migrate,
    /// Store a recovery task from a file or standard input.
    Enqueue(EnqueueArgs),
    /// Look at tasks and act on them: list, show, retry, discard, resolve, replay, stats, check.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// Replay jobs: list, cancel, resume.
    #[command(subcommand)]
    Replays(ReplaysCommand),
    /// Circuit breakers: list them, force one open or closed, release it.
    #[command(subcommand)]
    Breakers(BreakersCommand),
    /// Brakes of routes: list them, engage one (pausing the route), release one.
    #[command(subcommand)]
    Brake(BrakeCommand),
    /// The audit log of operator actions, newest first.
    Audit(AuditArgs),
    /// The fleet's members seen recently.
    Members(JsonArgs),
    /// Print the Prometheus alert rules for this deployment (selector, thresholds, runbook).
    Alerts(AlertsArgs),
    /// Measure throughput: the queue (enqueue, drain), or `ingest` (Kafka to PostgreSQL).
    #[cfg(feature = "bench")]
    Bench(BenchArgs),
    /// Run the whole loop with an in-process Kafka broker and the local PostgreSQL.
    #[cfg(feature = "demo")]
    Demo(DemoOptions),
}

impl Command {
    /// The demo, the benchmark and the operator verbs print their own output; their
    /// logs stay at warnings.
    fn prints_its_own_output(&self) -> bool {
        match self {
            Command::Tasks(_)
            | Command::Replays(_)
            | Command::Breakers(_)
            | Command::Brake(_)
            | Command::Audit(_)
            | Command::Members(_) => true,
            #[cfg(feature = "bench")]
            Command::Bench(_) => true,
            #[cfg(feature = "demo")]
            Command::Demo(_) => true,
            _ => false,
        }
    }
}

/// Options of `redrive run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Do not apply migrations at start-up.
    #[arg(long)]
    pub no_migrate: bool,
}

/// Options of `redrive enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Handler that will retry the task.
    #[arg(long)]
    pub handler: String,
    /// Read the value from this file instead of standard input.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// One task per line of input instead of one task for the whole input.
    #[arg(long)]
    pub lines: bool,
    /// Message key.
    #[arg(long)]
    pub key: Option<String>,
    /// Header as NAME=VALUE; repeat for more.
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<Header>,
    /// Event type.
    #[arg(long)]
    pub event_type: Option<String>,
    /// Idempotency key: enqueueing the same key again returns the existing task.
    #[arg(long, conflicts_with = "lines")]
    pub dedup_key: Option<String>,
    /// Correlation id.
    #[arg(long)]
    pub correlation_id: Option<String>,
    /// Attempts before a permanent failure (overrides the handler's policy).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: Option<i32>,
    /// Delay before the first attempt, e.g. "30s" (at most 10 years).
    #[arg(long, value_parser = parse_delay)]
    pub delay: Option<Duration>,
    /// Store a task even when the input is empty (refused otherwise, as a likely mistake).
    #[arg(long, conflicts_with = "lines")]
    pub allow_empty: bool,
}

/// Longest `--delay`: later is surely a typo, and far enough on it overflows time.
const MAX_DELAY: Duration = Duration::from_secs(10 * 31_557_600);

fn parse_delay(text: &str) -> Result<Duration, String> {
    let delay = parse_duration(text)?;
    if delay > MAX_DELAY {
        return Err(format!(
            "must be at most 10years (got {})",
            humantime::format_duration(delay)
        ));
    }
    Ok(delay)
}

fn parse_header(text: &str) -> Result<Header, String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    Ok(Header::new(name, value.as_bytes().to_vec()))
}

/// Parses the command line and runs it, with the handlers `register` adds. A
/// developer's own binary calls this with its handlers to get the same CLI.
pub async fn main_with(register: impl FnOnce(FleetBuilder) -> FleetBuilder) -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Needs no configuration: it prints what it is given.
    if let Command::Alerts(args) = cli.command {
        outln!(
            "{}",
            telemetry::AlertSettings::from(args).render()?.trim_end()
        );
        return Ok(());
    }
    let quiet = cli.command.prints_its_own_output();
    let settings = Settings::load(cli.config.as_deref(), None)?;
    // Their own output says what happened: attempt lines would only interleave with it.
    let level = if quiet {
        "warn,redrive::telemetry::attempt_log=error"
    } else {
        settings.log.level.as_str()
    };
    let _logs = telemetry::init_logging(settings.log.format, level);
    match cli.command {
        Command::Run(args) => {
            let mut settings = settings;
            if args.no_migrate {
                settings.database.migrate_on_start = false;
            }
            register(Fleet::builder(settings)).build()?.run().await?;
        }
        Command::Migrate => {
            let store = Store::connect(&settings.database).await?;
            let applied = store.migrate().await?;
            let latest = crate::store::SchemaVersions::binary_latest();
            if applied.is_empty() {
                outln!(
                    "schema {:?} is up to date (migration {latest}); none was pending",
                    store.schema()
                );
            } else {
                outln!(
                    "schema {:?}: applied {} migration(s), now at {latest}:",
                    store.schema(),
                    applied.len()
                );
                for migration in applied {
                    outln!("  {} {}", migration.version, migration.description);
                }
            }
        }
        Command::Enqueue(args) => {
            let fleet = verb_fleet(register, &settings)?;
            if !fleet.handler_names().contains(&args.handler) {
                bail!(
                    "unknown handler {:?} (registered: {})",
                    args.handler,
                    fleet.handler_names().join(", ")
                );
            }
            let values = read_values(&args, settings.ingest.max_message_bytes)?;
            let store = Store::connect(&settings.database).await?;
            store.migrate().await?;
            enqueue(&store, args, values).await?;
        }
        Command::Tasks(command) => {
            let (fleet, operations) = operations(register, &settings).await?;
            tasks::run(command, &fleet, &operations).await?;
        }
        Command::Replays(command) => {
            let (fleet, operations) = operations(register, &settings).await?;
            replays::run(command, &fleet, &operations).await?;
        }
        Command::Breakers(command) => {
            let (_, operations) = operations(register, &settings).await?;
            breakers::run(command, &operations).await?;
        }
        Command::Brake(command) => {
            let (_, operations) = operations(register, &settings).await?;
            brake::run(command, &operations).await?;
        }
        Command::Audit(args) => {
            let (_, operations) = operations(register, &settings).await?;
            replays::audit(args, &operations).await?;
        }
        Command::Members(args) => {
            let (_, operations) = operations(register, &settings).await?;
            members::print(&operations, args.json).await?;
        }
        // Printed before the configuration is read.
        Command::Alerts(_) => {}
        #[cfg(feature = "bench")]
        Command::Bench(options) => bench::run(&settings, &options).await?,
        #[cfg(feature = "demo")]
        Command::Demo(options) => demo::run(&settings, &options).await?,
    }
    Ok(())
}

/// The fleet a verb reads its configuration, handlers and attempt budgets from, built
/// without the parking producer: a verb never parks, and a verb that only reads creates
/// no Kafka client (the replay verbs create their own clients when they produce).
fn verb_fleet(
    register: impl FnOnce(FleetBuilder) -> FleetBuilder,
    settings: &Settings,
) -> anyhow::Result<Fleet> {
    let builder = Fleet::builder(settings.clone()).without_parking();
    Ok(register(builder).build()?)
}

/// The fleet an operator verb reads its configuration from ([`verb_fleet`]) and the
/// operations it runs, over [`operator_store`].
async fn operations(
    register: impl FnOnce(FleetBuilder) -> FleetBuilder,
    settings: &Settings,
) -> anyhow::Result<(Fleet, Operations)> {
    let fleet = verb_fleet(register, settings)?;
    let store = operator_store(settings).await?;
    let operations = fleet.operations(store);
    Ok((fleet, operations))
}

/// The store an operator verb works on, refused with what to do when its schema is
/// missing or behind this binary (the verbs never migrate a fleet's database).
async fn operator_store(settings: &Settings) -> anyhow::Result<Store> {
    let store = Store::connect(&settings.database).await?;
    let schema = store.schema().to_owned();
    match store.pending_migrations().await {
        Ok(0) => Ok(store),
        Ok(pending) => bail!(
            "schema {schema:?} is {pending} migration(s) behind this redrive; \
             run `redrive migrate` (or start `redrive run`) first"
        ),
        Err(crate::store::StoreError::Database(error))
            if error.as_database_error().and_then(|e| e.code()).as_deref() == Some("42P01") =>
        {
            bail!(
                "schema {schema:?} holds no redrive tables; check database.url and \
                 database.schema, or run `redrive migrate`"
            )
        }
        Err(error) => Err(error.into()),
    }
}

/// The values to enqueue from the file or standard input: each at most `max_bytes` with
/// the key and headers (as ingest counts), none empty unless `--allow-empty`; checked
/// all before any is stored.
fn read_values(args: &EnqueueArgs, max_bytes: u32) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut source: Box<dyn Read> = match &args.file {
        Some(path) => Box::new(
            std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?,
        ),
        None => Box::new(std::io::stdin()),
    };
    let limit = u64::from(max_bytes);
    let mut input = Vec::new();
    let read = if args.lines {
        source.read_to_end(&mut input)
    } else {
        // One byte past the limit is enough to know the input is too large.
        source.take(limit + 1).read_to_end(&mut input)
    };
    read.context("reading the input")?;
    let extra = args.key.as_ref().map_or(0, String::len)
        + args
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    let too_large = |value: &[u8]| (value.len() + extra) as u64 > limit;
    if !args.lines {
        if too_large(&input) {
            bail!(
                "the input is larger than ingest.max_message_bytes ({max_bytes} bytes, key \
                 and headers included); nothing was stored"
            );
        }
        if input.is_empty() && !args.allow_empty {
            bail!("the input is empty; pass --allow-empty to store a task without a value");
        }
        return Ok(vec![input]);
    }
    let mut values = Vec::new();
    for (number, line) in input.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        if too_large(line) {
            bail!(
                "line {} is {} bytes with key and headers, over ingest.max_message_bytes \
                 ({max_bytes}); nothing was stored",
                number + 1,
                line.len() + extra
            );
        }
        values.push(line.to_vec());
    }
    if values.is_empty() {
        bail!("the input has no line to enqueue (empty lines are skipped); nothing was stored");
    }
    Ok(values)
}

/// A repeat with `--delay` must ask for the due time the existing task got: if that
/// task is still unattempted and due at another time than `created_at + delay`, the
/// repeat is a conflict, not a silent no-op.
async fn check_same_delay(store: &Store, id: TaskId, delay: Duration) -> anyhow::Result<()> {
    let task = store.get(id).await?.context("the existing task vanished")?;
    let asked = chrono::TimeDelta::from_std(delay)
        .ok()
        .and_then(|delay| task.created_at.checked_add_signed(delay));
    let differs = asked.map_or(true, |asked| {
        (asked - task.next_attempt_at).abs() > chrono::TimeDelta::seconds(2)
    });
    if task.attempts == 0 && differs {
        bail!(
            "task {id} already exists with this content but is due at {}; \
             --delay {} asks for another time (nothing was changed)",
            task.next_attempt_at,
            humantime::format_duration(delay)
        );
    }
    Ok(())
}

/// Stores one task per value.
async fn enqueue(store: &Store, args: EnqueueArgs, values: Vec<Vec<u8>>) -> anyhow::Result<()> {
    let next_attempt_at = match args.delay {
        Some(delay) => Some(
            chrono::TimeDelta::from_std(delay)
                .ok()
                .and_then(|delay| chrono::Utc::now().checked_add_signed(delay))
                .context("--delay is too far in the future")?,
        ),
        None => None,
    };
    let tasks: Vec<NewTask> = values
        .into_iter()
        .map(|value| NewTask {
            handler: args.handler.clone(),
            dedup_key: args.dedup_key.clone(),
            failure: Failure {
                event_type: args.event_type.clone(),
                correlation_id: args.correlation_id.clone(),
                key: args.key.as_ref().map(|k| k.as_bytes().to_vec()),
                value: Some(value),
                headers: args.headers.clone(),
                ..Failure::default()
            },
            max_attempts: args.max_attempts,
            next_attempt_at,
            ..NewTask::default()
        })
        .collect();
    for chunk in tasks.chunks(1000) {
        for outcome in store.enqueue_many(chunk).await? {
            match outcome {
                Enqueued::Created(id) => outln!("created task {id}"),
                Enqueued::Existing(id) => {
                    if let Some(delay) = args.delay {
                        check_same_delay(store, id, delay).await?;
                    }
                    outln!("task {id} already exists with this content");
                }
                Enqueued::Conflict(id) => {
                    bail!("dedup key already belongs to task {id} with different content")
                }
            }
        }
    }
    Ok(())
}
