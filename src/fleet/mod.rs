//! A fleet member: what it is (settings plus handlers, built in a few lines) and its
//! parts. How it runs is in [`run`] (start-up, parts, supervision); the signals that stop
//! it in [`signals`]; its background upkeep (its own record, retention, the fleet's
//! figures, detached replays) in [`upkeep`]; parking permanent failures on a topic in
//! [`parking`].

mod parking;
mod run;
mod signals;
pub(crate) mod upkeep;

pub use signals::cancel_on_signal;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::{refuse_loops, validate_routes, ConfigError, RouteMode, Settings, Targets};
use crate::finals::{FinalSink, Finals};
use crate::handlers::breakers::BreakerFollower;
use crate::handlers::{
    Handler, HandlerRegistry, LogHandler, Registered, RegistryError, RepublishHandler,
    WebhookHandler,
};
use crate::ingest::Ingest;
use crate::operations::Operations;
use crate::store::{Budgets, Member, Store, StoreError};
use crate::telemetry::Metrics;
use crate::worker::WorkerPool;
use parking::Parking;

/// Why a fleet member could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Invalid settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A handler registration problem.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The database could not be reached or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A Kafka client could not be created or failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Ingest stopped with an error.
    #[error("ingest: {0}")]
    Ingest(#[from] crate::ingest::IngestError),
    /// A part of the member panicked (a bug); the others were stopped.
    #[error("a part of this member panicked: {0}")]
    Panicked(String),
}

/// Collects settings and handlers; [`FleetBuilder::build`] validates them together.
pub struct FleetBuilder {
    settings: Settings,
    metrics: Metrics,
    registry: HandlerRegistry,
    sinks: Vec<Arc<dyn FinalSink>>,
    problems: Vec<FleetError>,
    /// Whether the configured parking topics get their producer (off for operator verbs).
    parks: bool,
}

impl FleetBuilder {
    /// Registers `handler` under the stable `name` that tasks refer to.
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        if let Err(problem) = self.registry.register(name, handler) {
            self.problems.push(problem.into());
        }
        self
    }

    /// Adds a sink told about every task that becomes a permanent failure, after its
    /// row says so (parking is one, when `parking.topic` or a route's `parking_topic`
    /// is set). Shutdown waits for
    /// running reports up to `worker.shutdown_timeout`.
    pub fn final_sink(mut self, sink: impl FinalSink) -> Self {
        self.sinks.push(Arc::new(sink));
        self
    }

    /// Leaves out the parking producer: for a fleet that only reads its configuration
    /// (an operator verb), which then creates no Kafka client of its own.
    pub fn without_parking(mut self) -> Self {
        self.parks = false;
        self
    }

    /// Registers the built-in handlers `log` and `republish` (whose producer is created
    /// when it first republishes). The `webhook` handler of each `[webhooks.NAME]` needs
    /// no call: [`FleetBuilder::build`] registers it whatever else is registered.
    pub fn with_builtin_handlers(self) -> Self {
        let republish = RepublishHandler::new(&self.settings).with_metrics(self.metrics.clone());
        self.handler("log", LogHandler)
            .handler("republish", republish)
    }

    /// Registers a `webhook` handler per `[webhooks.NAME]`: a configured webhook is
    /// always served, by any binary. A name that code registers too is refused, naming
    /// the key: which of the two should run cannot be guessed.
    fn register_webhooks(&mut self) -> Result<(), FleetError> {
        let in_code = self.registry.names();
        let fleet = self.settings.fleet_identity();
        for (name, settings) in &self.settings.webhooks {
            if in_code.contains(name) {
                return Err(ConfigError::new(
                    format!("webhooks.{name}"),
                    format!(
                        "a handler named {name:?} is registered in code too; \
                         rename the webhook or the handler"
                    ),
                )
                .into());
            }
            let webhook =
                WebhookHandler::new(name, settings, &fleet)?.with_metrics(self.metrics.clone());
            self.registry.register(name.clone(), webhook)?;
        }
        Ok(())
    }

    /// Checks that every handler was registered once and that the handlers the settings
    /// (worker and routes) ask for exist.
    pub fn build(mut self) -> Result<Fleet, FleetError> {
        if let Some(problem) = self.problems.drain(..).next() {
            return Err(problem);
        }
        self.register_webhooks()?;
        let settings = &mut self.settings;
        let handlers = self
            .registry
            .select(&settings.worker.handlers, &settings.retry)
            .map_err(|e| ConfigError::new("worker.handlers", e.to_string()))?;
        validate_routes(&mut settings.routes, Some(&self.registry.names()))?;
        refuse_loops(settings)?;
        let registered = self.registry.names();
        if let Some(name) = settings.handlers.keys().find(|n| !registered.contains(n)) {
            return Err(ConfigError::new(
                format!("handlers.{name}"),
                format!(
                    "no handler is registered under this name (registered: {})",
                    registered.join(", ")
                ),
            )
            .into());
        }
        let route_handlers: Vec<String> =
            settings.routes.iter().map(|r| r.handler.clone()).collect();
        let ingest_handlers = self.registry.select(&route_handlers, &settings.retry)?;
        let metrics = self.metrics;
        metrics.prepare(
            handlers
                .keys()
                .chain(ingest_handlers.keys())
                .map(String::as_str),
            settings.routes.iter().map(|r| r.name.as_str()),
        );
        let mut sinks = self.sinks;
        let targets = Targets::new(settings);
        if targets.parks() && self.parks {
            let parking = Parking::new(
                &settings.kafka,
                settings.ingest.max_message_bytes,
                targets,
                metrics.clone(),
            )?;
            sinks.push(Arc::new(parking));
        }
        Ok(Fleet {
            settings: self.settings,
            handlers,
            ingest_handlers: Arc::new(ingest_handlers),
            metrics,
            finals: Finals::new(sinks),
        })
    }
}

/// A validated fleet member, ready to run.
pub struct Fleet {
    settings: Settings,
    handlers: BTreeMap<String, Registered>,
    ingest_handlers: Arc<BTreeMap<String, Registered>>,
    metrics: Metrics,
    finals: Finals,
}

impl Fleet {
    /// Starts building a fleet member from validated settings.
    pub fn builder(settings: Settings) -> FleetBuilder {
        FleetBuilder {
            settings,
            metrics: Metrics::new(),
            registry: HandlerRegistry::default(),
            sinks: Vec::new(),
            problems: Vec::new(),
            parks: true,
        }
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Names of the handlers this member's workers serve.
    pub fn handler_names(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// The attempt budgets this member applies: each registered handler's, each route's
    /// override, and the default for handlers it does not know.
    pub fn budgets(&self) -> Budgets {
        let to_i32 = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let mut handlers: BTreeMap<&String, i32> = BTreeMap::new();
        for (name, registered) in self.handlers.iter().chain(self.ingest_handlers.iter()) {
            handlers.insert(name, to_i32(registered.policy.max_attempts));
        }
        Budgets {
            routes: self
                .settings
                .routes
                .iter()
                .filter_map(|r| r.max_attempts.map(|m| (r.name.clone(), to_i32(m))))
                .collect(),
            handlers: handlers.into_iter().map(|(n, m)| (n.clone(), m)).collect(),
            default: to_i32(self.settings.retry.max_attempts),
        }
    }

    /// The operator verbs over `store`, with this member's configuration and budgets:
    /// what its admin API serves and the CLI runs.
    pub fn operations(&self, store: Store) -> Operations {
        Operations::new(store, &self.settings, self.budgets())
    }

    /// Its metrics, to expose or inspect.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// This member as recorded in the members table.
    fn member(&self, id: &str, ingests: bool) -> Member {
        let roles = [
            (self.settings.worker.enabled, "worker"),
            (ingests, "ingest"),
            (self.settings.admin.listen.is_some(), "admin"),
            (true, "replay"),
        ];
        Member {
            id: id.to_owned(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            roles: roles
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, role)| (*role).to_owned())
                .collect(),
            handlers: match self.settings.worker.enabled {
                true => self.handler_names(),
                false => Vec::new(),
            },
            started_at: chrono::Utc::now(),
            last_seen: chrono::Utc::now(),
            budgets: Some(self.budgets()),
        }
    }

    /// Whether this member ingests: it has routes and ingest is enabled.
    fn ingests(&self) -> bool {
        self.settings.ingest.enabled && !self.settings.routes.is_empty()
    }

    /// The member's one follower of the fleet's breakers: it guards the breakers of the
    /// handlers its worker pool calls and of those its process-mode routes call inline
    /// (their failures count as the pool's do). It is started once, by
    /// [`Fleet::run_with_store`].
    pub(crate) fn breaker_follower(&self, store: Store) -> Arc<BreakerFollower> {
        let mut guarded: BTreeSet<String> = match self.settings.worker.enabled {
            true => self.handler_names().into_iter().collect(),
            false => BTreeSet::new(),
        };
        if self.ingests() {
            guarded.extend(
                (self.settings.routes.iter())
                    .filter(|r| r.mode == RouteMode::Process)
                    .map(|r| r.handler.clone()),
            );
        }
        let guarded: Vec<String> = guarded.into_iter().collect();
        Arc::new(BreakerFollower::new(
            store,
            self.metrics.clone(),
            &self.settings.handlers,
            &guarded,
        ))
    }

    /// The ingest of this member, if it has routes and ingest is enabled; process mode
    /// follows the breakers with `breakers`.
    pub(crate) fn ingest(&self, store: Store, breakers: Arc<BreakerFollower>) -> Option<Ingest> {
        if !self.ingests() {
            return None;
        }
        Some(
            Ingest::new(
                store,
                &self.settings,
                self.ingest_handlers.clone(),
                self.metrics.clone(),
                breakers,
            )
            .with_finals(self.finals.clone()),
        )
    }

    /// A worker pool on `store` without running it: for stepping with
    /// [`WorkerPool::process_next`].
    pub fn worker_pool(&self, store: Store) -> WorkerPool {
        WorkerPool::new(
            store,
            self.handlers.clone(),
            self.settings.worker.clone(),
            self.metrics.clone(),
        )
        .with_routes(&self.settings.routes)
        .with_finals(self.finals.clone())
        .with_limits(self.settings.handlers.clone())
    }
}
