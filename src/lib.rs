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

#![warn(missing_docs)]

pub mod admin;
pub mod backoff;
#[cfg(feature = "bench")]
mod bench;
pub mod cli;
pub mod config;
mod console;
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
mod parking;
mod parts;
#[cfg(any(feature = "demo", feature = "bench"))]
mod private_cluster;
pub mod rate;
pub mod readable;
pub mod replay;
pub mod resilience;
pub mod store;
pub mod task;
pub mod telemetry;
pub mod testing;
mod upkeep;
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
