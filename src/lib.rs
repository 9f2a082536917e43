//! redrive: durable recovery of failed Kafka messages.
//!
//! Failures are stored as recovery tasks in PostgreSQL; a pool of workers claims due
//! tasks with `FOR UPDATE SKIP LOCKED` under a fenced lease and calls pluggable
//! [`Handler`]s with backoff and jitter until each task is resolved or fails for good.
//!
//! ```no_run
//! use redrive::{Fleet, LogHandler, Settings};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let settings = Settings::load(None, None)?;
//! Fleet::builder(settings).handler("log", LogHandler).build()?.run().await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Data flow
//!
//! Kafka → `ingest` (batches; process mode calls the handler first) → `store` (a task
//! row; only then is the offset committed) → `worker` (claims due tasks under a fenced
//! lease) → `handlers` (one invocation, guarded by the fleet's breakers) → `store` (the
//! attempt's outcome: resolved, due again later, or a permanent failure handed to the
//! `finals`, parking among them). Operators read and act through `operations`, whose
//! faces are `cli` and the `admin` listener's API and console.
//!
//! ## Strata
//!
//! Each module imports only modules of the strata below it (none above, none beside it,
//! no two files of a folder in a circle; `src/strata.rs` holds this against the code),
//! from the ground up:
//!
//! 1. vocabulary and tools with no redrive imports: [`backoff`] (and `Pause`),
//!    [`headers`], `parts`, [`readable`], `listener`, [`when`], [`rate`];
//! 2. [`task`]: the task model, attempt outcomes and verdicts, causes; [`pace`]: a
//!    redrive job's ramp, checkpoints and the rule that pauses it;
//! 3. [`config`] (settings, every check naming its key) and [`finals`];
//! 4. `kafka` (clients, byte-safe messages, the dead-letter dialects) and
//!    [`resilience`] (the pure machines: breaker states, the brake's window);
//! 5. [`store`]: every statement, each write fenced;
//! 6. [`telemetry`]: logs, metrics, events, health, alert rules;
//! 7. [`handlers`] (the API, its invocation, the member's view of the breakers),
//!    [`replay`], and `output` (what the verbs print);
//! 8. `ingest`, `worker` and [`operations`] (every operator verb, written once), and
//!    [`testing`];
//! 9. [`admin`]: the admin listener and its two faces over operations, the JSON API
//!    and the console;
//! 10. [`fleet`]: a member, its parts, its upkeep;
//! 11. `demo` and `bench`;
//! 12. [`cli`]: every verb, the two above among them.
//!
//! ## Where things go
//!
//! - **A handler**: implement [`Handler`] in your crate (or `src/handlers/` for a
//!   built-in) and register it with [`FleetBuilder::handler`].
//! - **An operator verb**: once in `src/operations/` (selection, bounds, dry run, role,
//!   audit), then a thin face in `src/cli/`, `src/admin/api/` and `src/admin/console/`.
//! - **A metric**: declared in `src/telemetry/metrics.rs`, emitted where it happens
//!   (with its log line, an event of `src/telemetry/events.rs`), listed in
//!   `docs/observability.md`.

#![warn(missing_docs)]

pub mod admin;
pub mod backoff;
#[cfg(feature = "bench")]
mod bench;
pub mod cli;
pub mod config;
#[cfg(feature = "demo")]
mod demo;
pub mod finals;
pub mod fleet;
pub mod handlers;
pub mod headers;
mod ingest;
mod kafka;
mod listener;
pub mod operations;
mod output;
pub mod pace;
mod parts;
#[cfg(any(feature = "demo", feature = "bench"))]
mod private_cluster;
pub mod rate;
pub mod readable;
pub mod replay;
pub mod resilience;
pub mod store;
#[cfg(test)]
mod strata;
pub mod task;
pub mod telemetry;
pub mod testing;
pub mod when;
mod worker;

pub use backoff::{Backoff, Jitter};
pub use config::{ConfigError, Settings};
pub use fleet::{Fleet, FleetBuilder, FleetError};
pub use handlers::{
    Handler, HandlerContext, HandlerError, HandlerRegistry, LogHandler, RepublishHandler,
};
pub use headers::Header;
pub use ingest::{FlushError, IngestError};
pub use store::{Enqueued, Store, StoreError};
pub use task::{
    Failure, InlineAttempt, Lease, NewTask, OriginalCoordinates, SourceCoordinates, Status, Task,
    TaskId,
};
pub use worker::{PartDied, Processed, WorkerPool};
