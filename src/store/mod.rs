//! PostgreSQL storage of recovery tasks: enqueue, claim, finish, heartbeat, release.
//!
//! Every write made on behalf of a worker matches `(id, lease_version)`: a write whose
//! fencing token is stale changes nothing, and the caller learns which ids it did change.
//!
//! ## What the database does by itself
//!
//! Beside the statements of this module, the schema acts on its own; each piece is
//! written once in `migrations/` and named here with what fires it.
//!
//! **Triggers on `recovery_task`** (eleven):
//! - `recovery_task_inserted` (after an insert statement): notifies `<schema>_due`, which
//!   wakes the idle claim loops of every member.
//! - Per-key ordering (rows with an `order_key`):
//!   - `recovery_task_ordered_insert` (before insert) and `recovery_task_ordered_reopen`
//!     (before a status change) hold a task that opens while its key has another open
//!     task (`held`, due at the end of time);
//!   - `recovery_task_ordered_release` (after an open task ends) makes the key's oldest
//!     held task due once no unheld open task is left;
//!   - `recovery_task_ordered_reopened` (after a statement reopens several tasks of a
//!     key) gives the turn to the key's oldest open task, whatever order the statement
//!     visited them in.
//! - Dedup keys (`recovery_task_dedup`): `recovery_task_deleted` and
//!   `recovery_task_truncated` free the keys of deleted tasks (retention, an operator).
//! - Key heads (`recovery_task_key_head`, the first 64 bytes of each key, for a list by key):
//!   `recovery_task_key_head_stored` (insert), `recovery_task_key_head_changed` (a key or
//!   id changed), `recovery_task_key_head_deleted` and `recovery_task_key_head_truncated`.
//!
//! **Functions** the statements call: `recovery_due_at(handler, wanted)`, the one rule of
//! when a task may run (no earlier than its handler's open breaker's `hold_until`), used
//! by every path that sets a task due (enqueue, finish, operator actions, the ordering
//! triggers); `recovery_attempts_allowed` (an attempt budget); `recovery_lock_order_key`
//! (a key's advisory lock, taken by the ordering triggers); `recovery_headers_hold` (a
//! search in the stored headers); `recovery_clamp_time` and `recovery_elapsed_ms`
//! (a stored time held to the range every program here can read and subtract, before
//! any arithmetic).
//!
//! **Notifications**: `<schema>_due` (tasks inserted, see above; a fenced call that
//! stopped, from [`Store::calls_stopped`]'s statement) and `<schema>_fenced` (an operator
//! fenced leases or compensation claims: the members holding them cancel their calls).
//!
//! **Stopping-call rows** (`recovery_stopping_call`): written by an operator's action on a
//! task whose call is running (discard, resolve, retry with a new time), one per fenced
//! lease until its call could have stopped (`ends_by`); the claim passes over the task and
//! its key while one is there, and the member whose call stopped deletes it.

mod approvals;
mod audit;
mod brakes;
mod breakers;
mod budgets;
mod causes;
mod check;
mod compensation;
mod due;
mod enqueue;
mod filter;
mod finish;
mod groups;
mod inspect;
mod lease;
mod lineage;
mod members;
mod migrations;
mod operate;
mod pacing;
mod preview;
mod query;
mod replays;
mod retention;
mod row;
mod sample;
mod search;
mod time;
mod timeline;
mod transform;
mod vacuum;
mod view;
mod waiting;

pub use approvals::{Approval, ApprovalRowError};
pub use audit::{AuditEntry, AuditQuery};
pub use brakes::Brake;
pub use breakers::BreakerCommand;
pub use budgets::Budgets;
pub use causes::{Backfill, BACKFILL_BATCH};
pub use check::{CheckReport, Violation};
pub use compensation::{Compensating, CompensationOutcome, CompensationResult, CompensationView};
pub use due::Due;
pub use enqueue::{enqueue_many_in, Enqueued, KeyPartition, NewestOrdered, Recorded};
pub use filter::{Selection, TaskFilter, SEARCH_MAX_BYTES, SEARCH_SCAN};
pub use finish::Finish;
pub use groups::{CauseView, Group, GroupBy, GroupQuery, Groups, MAX_GROUPS, SPAN_SAMPLE};
pub use inspect::{OldestDue, OutcomeCount, Stats, StatusCount, TaskSummary, MAX_PAGE};
pub use lease::Claimed;
pub use lineage::Ancestor;
pub use members::{Member, MEMBER_BEAT, MEMBER_LIVE_WITHIN};
pub use migrations::{Migration, SchemaVersions};
pub(crate) use operate::{apply_batch, Walk};
pub use operate::{Action, ActionReport, Applicable, Budget, Operator, ACTION_BATCH};
pub use pacing::{Redriven, StepOutcomes};
pub use preview::{ActionSample, ReplayCounts};
pub use query::{Attempt, StatusCounts};
pub use replays::{
    Marks, NewReplay, ReplayJob, ReplayPage, ReplayRowError, Resumed, REPLAY_STALE_AFTER,
};
pub use retention::RETENTION_BATCH;
pub use sample::{
    next_turn_after, resolved_recount_after, FleetFigures, Sampled, RESOLVED_RECOUNT,
    SAMPLED_CAUSES, SAMPLE_ABANDONED, SAMPLE_EVERY,
};
pub use search::{SearchPage, Searched, SEARCH_TIMEOUT_MS};
pub use timeline::OutcomeMinute;
pub use transform::{NewPayload, StoredPayload, TRANSFORMABLE};
pub use view::{HeaderView, TaskDetail};
pub use waiting::{CompensationNow, Ending, Waiting, WaitingState};

use secrecy::ExposeSecret;
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::config::{ConfigError, DatabaseSettings};
use crate::task::TaskId;

/// Begins a transaction in which the planner may not sort: the statements that read
/// tasks in an index's order with a LIMIT (claims, operator batches, pages, replays,
/// retention) then walk that index and stop after the rows wanted, whatever the
/// statistics say. With stale statistics (a burst not analyzed yet, or a status believed
/// rare) the planner would otherwise read and sort every matching row, once per batch:
/// measured, 0.7 s per 500-task operator batch on a million tasks.
pub(crate) const ORDERED_WALK: &str = "BEGIN; SET LOCAL enable_sort = off";

/// Begins a transaction in which the planner can only probe an index for each input row
/// (a nested loop over index scans): for the fenced writes of the drain (finish,
/// heartbeat, release), which match a batch of `(id, lease_version)` against the
/// primary key. Their prepared statements run a cached generic plan, built while the
/// table was small; on a store never analysed nothing replaces it, and the plan a
/// small table gets (a hash join over a sequential scan) read the whole table for
/// every batch as it grew: measured with tasks arriving at 3,800/s on a fresh store,
/// the drain fell from 13.6k to 0.6k tasks/s within 80 s (finish 82 ms, rising),
/// where with these settings it kept up (finish 0.7 ms) with no ANALYZE at all.
pub(crate) const KEYED_PROBES: &str = "BEGIN; SET LOCAL enable_hashjoin = off; \
    SET LOCAL enable_mergejoin = off; SET LOCAL enable_seqscan = off; \
    SET LOCAL enable_material = off";

/// Keeps an operator's heavy read (a grouping, a search) in its own backend: no
/// parallel workers. They would take the cores the fleet's drain runs on for each
/// reading (a grouping of 10M tasks planned a leader and two workers); one backend
/// bounds what a console in use can cost the fleet to one core at a time.
pub(crate) const ONE_BACKEND: &str = "SET LOCAL max_parallel_workers_per_gather = 0";

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A newer release migrated the schema: this binary does not know its newest
    /// migrations.
    #[error(
        "schema {schema:?} is at migration {database}, newer than this redrive's latest \
         ({binary}): a newer release migrated it. Run `redrive migrate` with that release's \
         binary; members of this release keep working on the newer schema while a fleet is \
         upgraded, and should be replaced by the newer release"
    )]
    SchemaNewer {
        /// The schema.
        schema: String,
        /// The newest migration the schema has applied.
        database: i64,
        /// The newest migration this binary knows.
        binary: i64,
    },
    /// The dedup key is taken by a task with different content.
    #[error("dedup key {dedup_key:?} already belongs to task {existing} with different content")]
    Conflict {
        /// The contested key.
        dedup_key: String,
        /// The task that holds it.
        existing: TaskId,
    },
    /// Task ids that do not exist (nothing was changed).
    #[error("no such task: {}", .0.iter().map(|id| id.to_string()).collect::<Vec<_>>().join(", "))]
    UnknownTasks(Vec<TaskId>),
    /// A replay job is unknown or not in a state for what was asked.
    #[error(transparent)]
    Replay(#[from] ReplayRowError),
    /// An approval that cannot be decided (unknown, decided, or the requester's own).
    #[error(transparent)]
    Approval(#[from] ApprovalRowError),
    /// A brake that is not engaged cannot be released.
    #[error("the brake of route {0:?} is not engaged")]
    NotEngaged(String),
    /// A search did not finish reading within its time.
    #[error(
        "the search did not finish reading the newest {scan} task(s) of the filter within \
         {seconds} s (their payloads are large, or the filter is rare among the newest \
         tasks): narrow the filter (a status, a handler, created_after) so that it reads fewer"
    )]
    SearchTimedOut {
        /// Most tasks it was to read.
        scan: i64,
        /// Its time, in seconds.
        seconds: u64,
    },
    /// A stored row could not be read back; the text names the row.
    #[error("a stored row is malformed: {0}")]
    MalformedRow(String),
    /// A stored time (not a task's) is beyond what a time can hold here: a row written
    /// by hand.
    #[error("a stored time cannot be read: {0}")]
    UnreadableTime(String),
    /// The connection settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database the URL names does not exist (SQLSTATE 3D000).
    #[error("{message} (named by the URL from {origin}); create it, or {fix}")]
    MissingDatabase {
        /// PostgreSQL's message, which names the database.
        message: String,
        /// Where the URL came from ([`DatabaseSettings::url_origin`]).
        origin: String,
        /// What to change instead.
        fix: String,
    },
}

impl StoreError {
    /// Whether waiting may cure it: the database cannot be reached, is starting or
    /// shutting down, or cut the connection (SQLSTATE classes 08 and 57). Authentication,
    /// a missing database, bad data or a failed migration are not.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(error)
            | StoreError::Migrate(sqlx::migrate::MigrateError::Execute(error)) => match error {
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(db) => db
                    .code()
                    .is_some_and(|code| code.starts_with("08") || code.starts_with("57")),
                _ => false,
            },
            _ => false,
        }
    }
}

/// `error`, or, when the database does not exist, an error that says where the URL
/// naming it came from (the variable actually used, the file, or the default).
fn missing_database(error: sqlx::Error, settings: &DatabaseSettings) -> StoreError {
    let sqlx::Error::Database(db) = &error else {
        return error.into();
    };
    if db.code().as_deref() != Some("3D000") {
        return error.into();
    }
    let url = settings.url.expose_secret();
    let names_a_database = (url.split_once("://"))
        .and_then(|(_, rest)| rest.split(['?', '#']).next()?.split_once('/'))
        .is_some_and(|(_, database)| !database.is_empty());
    let mut origin = settings.url_origin.clone();
    if !names_a_database {
        origin.push_str(", which names no database: PostgreSQL took PGDATABASE or the user name");
    }
    let fix = match settings.url_origin.starts_with("the default") {
        true => "set DATABASE_URL (or database.url)".to_owned(),
        false => format!("change {}", settings.url_origin),
    };
    StoreError::MissingDatabase {
        message: db.message().to_owned(),
        origin,
        fix,
    }
}

/// A pool's options: a slow acquire (every connection taken, the server out of slots)
/// is logged at DEBUG, not at WARN on every statement: an outage is told once, by the
/// member's health, and counted.
fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new().acquire_slow_level(::log::LevelFilter::Debug)
}

/// Result alias of the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Handle on redrive's tables in one PostgreSQL schema. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    schema: String,
}

impl Store {
    /// Opens a connection pool whose `search_path` is the configured schema.
    pub async fn connect(settings: &DatabaseSettings) -> Result<Store> {
        let pool = pool_options()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.connect_timeout)
            .connect_with(settings.connect_options()?)
            .await
            .map_err(|error| missing_database(error, settings))?;
        Ok(Store {
            pool,
            schema: settings.schema.clone(),
        })
    }

    /// A pool of at most `max_connections`, connected on first use, in which PostgreSQL
    /// cancels any statement that runs longer than `statement_timeout` (SQLSTATE 57014):
    /// for work on behalf of requests (the admin API), so that none holds the database
    /// for long.
    pub fn connect_bounded(
        settings: &DatabaseSettings,
        max_connections: u32,
        statement_timeout: std::time::Duration,
    ) -> Result<Store> {
        let timeout = format!("{}ms", statement_timeout.as_millis().max(1));
        let options = settings
            .connect_options()?
            .options([("statement_timeout", timeout.as_str())]);
        Ok(Store {
            pool: pool_options()
                .max_connections(max_connections)
                .acquire_timeout(settings.connect_timeout)
                .connect_lazy_with(options),
            schema: settings.schema.clone(),
        })
    }

    /// The underlying pool, for callers that want to enqueue inside their own transaction.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// A store that never connects: for unit tests of code that must fail before it
    /// touches the database.
    #[cfg(test)]
    pub(crate) fn unreachable_for_test() -> Store {
        Store {
            pool: PgPoolOptions::new()
                .connect_lazy("postgres://nobody@127.0.0.1:1/none")
                .expect("a lazy pool"),
            schema: "none".into(),
        }
    }

    /// The LISTEN channel notified when tasks are inserted.
    pub fn due_channel(&self) -> String {
        format!("{}_due", self.schema)
    }

    /// The LISTEN channel notified when an operator fenced leases or compensation
    /// claims: members check theirs at once (the schema is the `search_path`'s first,
    /// `current_schema()` in the statements that notify).
    pub fn fenced_channel(&self) -> String {
        format!("{}_fenced", self.schema)
    }
}
