//! `redrive enqueue`: stores recovery tasks from a file or standard input.

use anyhow::{bail, Context};
use clap::Args;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{parse_duration, Settings};
use crate::fleet::Fleet;
use crate::headers::Header;
use crate::output::outln;
use crate::store::{Enqueued, Store};
use crate::task::{Failure, NewTask, TaskId};

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

/// Runs `redrive enqueue` for the handlers of `fleet`.
pub async fn run(args: EnqueueArgs, fleet: &Fleet, settings: &Settings) -> anyhow::Result<()> {
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
    enqueue(&store, args, values).await
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
