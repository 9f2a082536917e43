//! Every operator verb, written once: which tasks it means, its bounds, its dry run, who
//! may do it and its audit row. The CLI (`src/cli/`), the admin HTTP API (`src/admin/`)
//! and the console are thin faces over [`Operations`]: each reads its input into a
//! plain request type, calls one method, and renders the plain answer (the API as JSON
//! as it is, the CLI as a table or the same JSON). None builds SQL or checks a rule of
//! its own, and none but the replay verbs that check topics creates a Kafka client.
//!
//! Its pieces:
//!
//! - [`actor`]: who asks ([`Actor`]), refused a write when it may only read.
//! - [`error`]: [`OperationError`], in kinds every face renders (bad request, not found,
//!   forbidden, conflict, Kafka, store).
//! - [`page`]: the one list envelope [`Page`] (`items` + `next_cursor`) and page bounds.
//! - [`selection`]: filters as written ([`FilterParams`]: statuses by name, times as
//!   RFC 3339 or a duration ago), ids, and the rules that join them.
//! - [`tasks`]: list (and search), show, stats, check, members (read-only).
//! - [`groups`]: what broke, grouped by cause (or class, handler, route, topic).
//! - [`heavy`]: the few counts of every task a process runs at once, each to its end.
//! - [`act`]: retry, discard, resolve, with a dry run that counts and samples, and
//!   progress after every committed batch.
//! - [`transform`]: fix stored payloads before redriving them (a dry run with a diff,
//!   then new versions, the value as it came kept).
//! - [`replays`]: start (or a dry run counting what would be produced and skipped, and
//!   why), list, cancel, resume.
//! - [`breakers`]: list, open, close, release.
//! - [`brakes`]: list, engage on purpose (any route), release.
//! - [`approvals`]: four eyes for large actions (`operations.approval_over`): pending,
//!   approved (by another operator, then run), rejected.
//! - [`audit`]: the audit log.

pub mod act;
pub mod actor;
pub mod approvals;
pub mod approved;
pub mod audit;
pub mod brakes;
pub mod breakers;
pub mod error;
pub mod groups;
pub mod heavy;
pub mod page;
pub mod replays;
pub mod selection;
pub mod tasks;
pub mod transform;

use std::collections::BTreeMap;

pub use act::{ActAnswer, ActRequest, HeldByBreaker, Verb};
pub use actor::Actor;
pub use audit::AuditRequest;
pub use brakes::EngageRequest;
pub use breakers::ReasonRequest;
pub use error::{OperationError, Result};
pub use groups::{GroupParams, GROUP_PARAMS};
pub use heavy::{HeavyReads, HEAVY_READS};
pub use page::{Page, PageRequest};
pub use replays::{ReplayPreview, ReplayRequest, Runner, Skipped};
pub use selection::{FilterParams, StatusNames, MAX_IDS};
pub use transform::{TransformAnswer, TransformRequest};

use crate::config::{BreakerSettings, KafkaSettings, RouteSettings, Settings, Targets};
use crate::store::{Budgets, Store};

/// What the verbs work with: the store, and what the configuration they run with says
/// (routes, targets, budgets, breakers). Built once per face: by a member for its admin
/// API, by the CLI per command ([`crate::Fleet::operations`]).
pub struct Operations {
    store: Store,
    /// The cluster a replay's topics are checked on.
    kafka: KafkaSettings,
    /// The routes: a replay may not produce to a topic one of them captures, and each has
    /// a brake an operator may engage.
    routes: Vec<RouteSettings>,
    /// Where a task is republished and parked, for `show`.
    targets: Targets,
    /// This configuration's attempt budgets, where the fleet's members recorded none
    /// ([`Operations::budgets`]).
    budgets: Budgets,
    /// The configured breakers, by handler.
    breakers: BTreeMap<String, BreakerSettings>,
    /// Four eyes: actions selecting more tasks wait for a second operator.
    approval_over: Option<u64>,
    /// Groupings shared by this process's callers for a few seconds.
    shared_groups: groups::SharedGroups,
    /// The slots of this process's heavy reads ([`HEAVY_READS`]).
    heavy_reads: HeavyReads,
}

impl Operations {
    /// The verbs over `store`, with validated `settings` (routes resolved) and the
    /// fleet's attempt `budgets`.
    pub fn new(store: Store, settings: &Settings, budgets: Budgets) -> Operations {
        Operations {
            store,
            kafka: settings.kafka.clone(),
            routes: settings.routes.clone(),
            targets: Targets::new(settings),
            budgets,
            breakers: (settings.handlers.iter())
                .filter_map(|(name, h)| Some((name.clone(), h.breaker.clone()?)))
                .collect(),
            approval_over: settings.operations.approval_over,
            shared_groups: groups::SharedGroups::default(),
            heavy_reads: HeavyReads::default(),
        }
    }

    /// The slots of this process's heavy reads: a grouping's count takes one itself;
    /// the admin API's stats and check take one per request.
    pub fn heavy_reads(&self) -> HeavyReads {
        self.heavy_reads.clone()
    }

    /// The store the verbs work on.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The attempt budgets the fleet applies, as its live members recorded them, over
    /// this configuration's: what `show`, `check` and `retry --more-attempts` count
    /// with, so that a reader configured otherwise (a laptop, a member serving other
    /// handlers) counts as the members that run the tasks do.
    async fn budgets(&self) -> Result<Budgets> {
        Ok(self.store.fleet_budgets(&self.budgets).await?)
    }
}
