//! The `redrive` command line, reusable by a developer's own binary with its own handlers.

use anyhow::bail;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[cfg(feature = "bench")]
use crate::bench::{self, BenchArgs};
use crate::config::Settings;
#[cfg(feature = "demo")]
use crate::demo::{self, DemoOptions};
use crate::fleet::{Fleet, FleetBuilder};
use crate::operations::Operations;
use crate::output::outln;
use crate::store::Store;
use crate::telemetry;

mod act;
mod alerts;
mod approvals;
mod audit;
mod brakes;
mod breakers;
mod enqueue;
mod groups;
mod members;
mod operator;
mod pace;
mod replays;
mod selection;
mod show;
mod table;
mod tasks;
mod transform;
mod watch;

#[cfg(test)]
mod documented_commands;

pub use act::{BulkArgs, DecideArgs, ResolveArgs, RetryArgs};
pub use alerts::AlertsArgs;
pub use audit::AuditArgs;
pub use brakes::BrakesCommand;
pub use breakers::BreakersCommand;
pub use enqueue::EnqueueArgs;
pub use replays::{ReplayArgs, ReplaysCommand};
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
    /// Look at tasks and act on them: list, show, retry, discard, resolve, replay,
    /// transform, groups, stats, check.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// Redrive jobs (replays and paced retries): list, pause, cancel, resume.
    #[command(subcommand)]
    Replays(ReplaysCommand),
    /// Four eyes for large actions (`operations.approval_over`): list, approve, reject.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// Circuit breakers: list them, force one open or closed, release it.
    #[command(subcommand)]
    Breakers(BreakersCommand),
    /// Brakes of routes: list them, engage one (pausing the route), release one.
    #[command(subcommand, alias = "brake")]
    Brakes(BrakesCommand),
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
            | Command::Approvals(_)
            | Command::Breakers(_)
            | Command::Brakes(_)
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
            enqueue::run(args, &fleet, &settings).await?;
        }
        Command::Tasks(command) => {
            let (fleet, operations) = operations(register, &settings).await?;
            tasks::run(command, &fleet, &operations).await?;
        }
        Command::Replays(command) => {
            let (fleet, operations) = operations(register, &settings).await?;
            replays::run(command, &fleet, &operations).await?;
        }
        Command::Approvals(command) => {
            let (_, operations) = operations(register, &settings).await?;
            approvals::run(command, &operations).await?;
        }
        Command::Breakers(command) => {
            let (_, operations) = operations(register, &settings).await?;
            breakers::run(command, &operations).await?;
        }
        Command::Brakes(command) => {
            let (_, operations) = operations(register, &settings).await?;
            brakes::run(command, &operations).await?;
        }
        Command::Audit(args) => {
            let (_, operations) = operations(register, &settings).await?;
            audit::run(args, &operations).await?;
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
