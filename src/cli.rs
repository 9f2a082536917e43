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
use crate::store::{Enqueued, Store};
use crate::task::{Failure, NewTask};
use crate::telemetry;

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
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker pool until SIGTERM or SIGINT.
    Run(RunArgs),
    /// Create the schema and apply pending migrations, then exit.
    Migrate,
    /// Store a recovery task from a file or standard input.
    Enqueue(EnqueueArgs),
    /// Measure throughput: the queue (enqueue, drain), or `ingest` (Kafka to PostgreSQL).
    #[cfg(feature = "bench")]
    Bench(BenchArgs),
    /// Run the whole loop with an in-process Kafka broker and the local PostgreSQL.
    #[cfg(feature = "demo")]
    Demo(DemoOptions),
}

impl Command {
    /// The demo and the benchmark print their own figures; their logs stay at warnings.
    fn prints_its_own_figures(&self) -> bool {
        match self {
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
    /// Delay before the first attempt, e.g. "30s".
    #[arg(long, value_parser = parse_duration)]
    pub delay: Option<Duration>,
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
    // The demo and the benchmark print their own figures; keep their logs to warnings.
    let quiet = cli.command.prints_its_own_figures();
    telemetry::init_logging(if quiet { "warn" } else { "info" });
    let settings = Settings::load(cli.config.as_deref(), None)?;
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
            store.migrate().await?;
            println!("schema {:?} is up to date", store.schema());
        }
        Command::Enqueue(args) => {
            let fleet = register(Fleet::builder(settings.clone())).build()?;
            if !fleet.handler_names().contains(&args.handler) {
                bail!(
                    "unknown handler {:?} (registered: {})",
                    args.handler,
                    fleet.handler_names().join(", ")
                );
            }
            let store = Store::connect(&settings.database).await?;
            store.migrate().await?;
            enqueue(&store, args).await?;
        }
        #[cfg(feature = "bench")]
        Command::Bench(options) => bench::run(&settings, &options).await?,
        #[cfg(feature = "demo")]
        Command::Demo(options) => demo::run(&settings, &options).await?,
    }
    Ok(())
}

async fn enqueue(store: &Store, args: EnqueueArgs) -> anyhow::Result<()> {
    let mut input = Vec::new();
    match &args.file {
        Some(path) => {
            input = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut input)
                .context("reading standard input")?;
        }
    }
    let values: Vec<Vec<u8>> = if args.lines {
        input
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    } else {
        vec![input]
    };
    let next_attempt_at = args.delay.map(|d| {
        chrono::Utc::now() + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
    });
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
                Enqueued::Created(id) => println!("created task {id}"),
                Enqueued::Existing(id) => println!("task {id} already exists with this content"),
                Enqueued::Conflict(id) => {
                    bail!("dedup key already belongs to task {id} with different content")
                }
            }
        }
    }
    Ok(())
}
