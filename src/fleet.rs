//! Building and running a fleet member: settings plus handlers, in a few lines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Tokens};
use crate::backoff::Pause;
use crate::config::{refuse_loops, validate_routes, ConfigError, RouteMode, Settings, Targets};
use crate::finals::{FinalSink, Finals};
use crate::handlers::{
    Handler, HandlerRegistry, LogHandler, Registered, RegistryError, RepublishHandler,
    WebhookHandler,
};
use crate::ingest::Ingest;
use crate::operations::Operations;
use crate::parking::Parking;
use crate::parts::Watch;
use crate::resilience::follower::BreakerFollower;
use crate::store::{Budgets, Member, Store, StoreError};
use crate::telemetry::{self, Metrics};
use crate::upkeep;
use crate::worker::WorkerPool;
use futures::FutureExt;

/// The pause before connecting again when the database is unavailable at start-up: from
/// half a second, doubling up to 15 s.
const STARTUP_RETRY: Pause = Pause::new(
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(15),
);

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

    /// Connects (and migrates, unless `database.migrate_on_start` is off), then runs
    /// ingest and the worker pool until SIGTERM or SIGINT.
    pub async fn run(self) -> Result<(), FleetError> {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        self.run_until(shutdown).await
    }

    /// Like [`Fleet::run`], stopping when `shutdown` fires.
    pub async fn run_until(self, shutdown: CancellationToken) -> Result<(), FleetError> {
        match self.open_store(&shutdown).await? {
            Some(store) => self.run_with_store(store, shutdown).await,
            None => Ok(()),
        }
    }

    /// Connects and migrates, waiting out a database that is down, restarting or cutting
    /// connections (a member started before PostgreSQL, or cut off mid-start) with a
    /// growing pause; errors waiting cannot cure (authentication, a missing database, a
    /// failed migration) stop start-up. `None` when `shutdown` fires first.
    async fn open_store(&self, shutdown: &CancellationToken) -> Result<Option<Store>, FleetError> {
        let mut pause = STARTUP_RETRY;
        loop {
            let opened = async {
                let store = Store::connect(&self.settings.database).await?;
                if self.settings.database.migrate_on_start {
                    migrate_unless_newer(&store).await?;
                }
                Ok::<_, StoreError>(store)
            }
            .await;
            match opened {
                Ok(store) => {
                    let migrated = self.settings.database.migrate_on_start
                        || wait_for_migrations(&store, shutdown).await?;
                    if !migrated {
                        return Ok(None);
                    }
                    warn_if_not_vacuumed(&store).await;
                    return Ok(Some(store));
                }
                Err(error) if error.is_unavailable() => {
                    let wait = pause.next_pause();
                    tracing::warn!(%error, retry_in = ?wait,
                        "database unavailable at start-up; waiting for it");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Runs ingest (when routes are configured), the worker pool and the metrics endpoint
    /// on an existing, migrated store until `shutdown` fires.
    pub async fn run_with_store(
        self,
        store: Store,
        shutdown: CancellationToken,
    ) -> Result<(), FleetError> {
        let breakers = self.breaker_follower(store.clone());
        let ingest = self.ingest(store.clone(), breakers.clone());
        if ingest.is_none() && !self.settings.worker.enabled && self.settings.admin.listen.is_none()
        {
            return Err(ConfigError::new(
                "worker.enabled",
                "nothing to do: the worker pool is off, no ingest route is configured and \
                 admin.listen is not set (add [[routes]] or set worker.enabled = true)",
            )
            .into());
        }
        if ingest.is_none() {
            let why = match self.settings.routes.is_empty() {
                true => "no [[routes]] are configured",
                false => "ingest.enabled is false",
            };
            tracing::info!(
                "{why}: this member consumes no Kafka topic and only works tasks already \
                 stored (by `redrive enqueue`, the library or another member); add \
                 [[routes]] to capture or process messages"
            );
        }
        // Listeners first: an address that is taken stops start-up before anything runs.
        let admin_listener = match self.settings.admin.listen {
            Some(listen) => Some(bind(listen, "admin.listen").await?),
            None => None,
        };
        let metrics_listener = match self.settings.metrics.listen {
            Some(listen) => Some(bind(listen, "metrics.listen").await?),
            None => None,
        };
        // The breaker follower runs outside the supervised parts, until they have all
        // ended; should it panic, the member stops and that is its error.
        let watch = Watch::default();
        let shutdown = watch.stop_on(&shutdown);
        let mut parts = tokio::task::JoinSet::new();
        if let Some(listener) = admin_listener {
            tracing::info!(listen = ?self.settings.admin.listen, "serving the admin API");
            let api_store = admin::api_store(&self.settings.database, &self.settings.admin)?;
            let app = admin::router(
                self.operations(api_store),
                Tokens::new(&self.settings.admin),
            );
            let drain = self.settings.worker.shutdown_timeout;
            parts.spawn(admin::serve(listener, app, shutdown.clone(), drain).map(Ok));
        }
        // The metrics and health endpoints outlive the other parts, so that `/readyz`
        // says "shutting down" while they drain.
        let serving = CancellationToken::new();
        let telemetry = metrics_listener.map(|listener| {
            tracing::info!(listen = ?self.settings.metrics.listen, "serving /metrics, /healthz, /readyz");
            tokio::spawn(telemetry::serve_metrics(
                listener,
                self.metrics.clone(),
                store.clone(),
                serving.clone(),
                self.settings.worker.shutdown_timeout,
            ))
        });
        let health = self.metrics.health.clone();
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            stopping.cancelled().await;
            health.shutting_down();
        });
        let stop_following = CancellationToken::new();
        let following = watch.spawn(
            "breaker follower",
            breakers.clone().run(stop_following.clone()),
        );
        let pool = self.worker_pool(store.clone()).with_breakers(breakers);
        let member = self.member(pool.worker_id(), ingest.is_some());
        parts.spawn(
            upkeep::keep_member_recorded(
                store.clone(),
                member,
                self.metrics.clone(),
                shutdown.clone(),
            )
            .map(Ok),
        );
        parts.spawn(
            upkeep::sample_fleet_figures(store.clone(), self.metrics.clone(), shutdown.clone())
                .map(Ok),
        );
        parts.spawn(
            upkeep::backfill_causes(store.clone(), self.metrics.clone(), shutdown.clone()).map(Ok),
        );
        if self.settings.retention.enabled {
            parts.spawn(
                upkeep::apply_retention(
                    store.clone(),
                    self.settings.retention.clone(),
                    self.metrics.clone(),
                    shutdown.clone(),
                )
                .map(Ok),
            );
        }
        parts.spawn(
            upkeep::run_detached_replays(
                store.clone(),
                self.settings.kafka.clone(),
                self.settings.ingest.max_message_bytes,
                pool.worker_id().to_owned(),
                self.settings.routes.clone(),
                self.metrics.clone(),
                shutdown.clone(),
            )
            .map(Ok),
        );
        if let Some(ingest) = ingest {
            let stop = shutdown.clone();
            parts.spawn(async move { ingest.run(stop).await.map_err(FleetError::from) });
        }
        if self.settings.worker.enabled {
            let stop = shutdown.clone();
            parts.spawn(async move {
                (pool.run(stop).await).map_err(|died| FleetError::Panicked(died.to_string()))
            });
        }
        let mut outcome = supervise(parts, &shutdown).await;
        // Followed until the pool has written its last results: their calls are reported.
        stop_following.cancel();
        let _ = following.await;
        if let (Ok(()), Some(died)) = (&outcome, watch.failure()) {
            outcome = Err(FleetError::Panicked(died));
        }
        self.finals
            .drain(self.settings.worker.shutdown_timeout)
            .await;
        serving.cancel();
        if let Some(telemetry) = telemetry {
            if let (Ok(()), Err(panic)) = (&outcome, telemetry.await) {
                outcome = Err(FleetError::Panicked(panic.to_string()));
            }
        }
        outcome
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

/// Binds `listen`; an address that is taken or not this host's names `key`.
async fn bind(
    listen: std::net::SocketAddr,
    key: &str,
) -> Result<tokio::net::TcpListener, FleetError> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| {
            ConfigError::new(key, format!("cannot listen on {listen}: {error}")).into()
        })
}

/// Waits for every part of a member. The first part that fails or panics stops the
/// others and decides the outcome: any abnormal end is an error (a non-zero exit).
async fn supervise(
    mut parts: tokio::task::JoinSet<Result<(), FleetError>>,
    shutdown: &CancellationToken,
) -> Result<(), FleetError> {
    let mut outcome = Ok(());
    while let Some(joined) = parts.join_next().await {
        let error = match joined {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error,
            Err(panic) => FleetError::Panicked(panic.to_string()),
        };
        tracing::error!(%error, "a part of this member failed; stopping the others");
        shutdown.cancel();
        if outcome.is_ok() {
            outcome = Err(error);
        }
    }
    outcome
}

/// Fires `shutdown` on the first SIGTERM or SIGINT. A second one ends the process at
/// once, without waiting for running work, with the exit status a shell gives a process
/// the signal killed (128 + its number): the leases it holds lapse after `worker.lease`
/// and other members take the tasks over.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    let (name, _) = next_signal(&mut term, &mut int).await;
    tracing::info!(
        signal = name,
        "shutdown requested; a second SIGTERM or SIGINT stops at once"
    );
    shutdown.cancel();
    let (name, number) = next_signal(&mut term, &mut int).await;
    tracing::warn!(
        signal = name,
        "second signal: stopping now, without waiting for running work (its leases lapse)"
    );
    telemetry::flush_logs();
    std::process::exit(128 + number);
}

/// The next of SIGTERM and SIGINT: its name and number.
async fn next_signal(
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> (&'static str, i32) {
    tokio::select! {
        _ = term.recv() => ("SIGTERM", libc::SIGTERM),
        _ = int.recv() => ("SIGINT", libc::SIGINT),
    }
}

/// Applies pending migrations; a schema a newer release migrated is worked on as it is,
/// with a warning: migrations add and never take away (docs: upgrades), so a member of
/// the previous release keeps working, or restarts, while its fleet is upgraded.
async fn migrate_unless_newer(store: &Store) -> Result<(), StoreError> {
    match store.migrate().await {
        Ok(applied) => {
            for migration in applied {
                tracing::info!(version = migration.version, description = %migration.description,
                    "applied a migration");
            }
            Ok(())
        }
        Err(newer @ StoreError::SchemaNewer { .. }) => {
            tracing::warn!("{newer}");
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// With `database.migrate_on_start` off (`run --no-migrate`), waits until the schema
/// has every migration of this release, saying once that it waits for `redrive
/// migrate`; true once it has, false when `shutdown` fires first.
async fn wait_for_migrations(
    store: &Store,
    shutdown: &CancellationToken,
) -> Result<bool, StoreError> {
    let mut told = false;
    loop {
        match store.schema_versions().await {
            Ok(versions) if versions.pending.is_empty() => {
                if told {
                    tracing::info!("the schema is migrated; starting");
                }
                return Ok(true);
            }
            Ok(versions) if !told => {
                told = true;
                tracing::warn!(
                    schema = store.schema(),
                    pending = versions.pending.len(),
                    "the schema lacks migrations of this release and migrations on start are \
                     off (--no-migrate): waiting for `redrive migrate`"
                );
            }
            Ok(_) => {}
            Err(error) if error.is_unavailable() => {
                tracing::debug!(%error, "database unavailable while waiting for migrations");
            }
            Err(error) => return Err(error),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            _ = tokio::time::sleep(MIGRATIONS_POLL) => {}
        }
    }
}

/// How often a member started with `--no-migrate` looks whether the schema is migrated.
const MIGRATIONS_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Warns when PostgreSQL would not vacuum redrive's tables (a store that bloats until
/// its drain stalls). A failed look is only logged: it must not stop start-up.
async fn warn_if_not_vacuumed(store: &Store) {
    match store.autovacuum_off().await {
        Ok(reasons) => {
            for reason in reasons {
                tracing::warn!("{reason}");
            }
        }
        Err(error) => tracing::debug!(%error, "could not read the autovacuum settings"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a part that panicked ended the member with success (exit code 0), so
    /// a supervisor would not restart it.
    #[tokio::test]
    async fn a_panicking_part_is_an_error_and_stops_the_others() {
        let shutdown = CancellationToken::new();
        let mut parts = tokio::task::JoinSet::new();
        let stop = shutdown.clone();
        parts.spawn(async move {
            stop.cancelled().await;
            Ok(())
        });
        parts.spawn(async { panic!("a bug in a part") });
        let outcome = supervise(parts, &shutdown).await;
        assert!(
            matches!(&outcome, Err(FleetError::Panicked(m)) if m.contains("panic")),
            "{outcome:?}"
        );
        assert!(shutdown.is_cancelled());
    }
}
