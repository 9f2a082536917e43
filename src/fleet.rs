//! Building and running a fleet member: settings plus handlers, in a few lines.

use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, Settings};
use crate::handlers::{Handler, HandlerRegistry, Registered, RegistryError};
use crate::store::{Store, StoreError};
use crate::telemetry::Metrics;
use crate::worker::WorkerPool;

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
}

/// Collects settings and handlers; [`FleetBuilder::build`] validates them together.
pub struct FleetBuilder {
    settings: Settings,
    registry: HandlerRegistry,
    problems: Vec<RegistryError>,
}

impl FleetBuilder {
    /// Registers `handler` under the stable `name` that tasks refer to.
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        if let Err(problem) = self.registry.register(name, handler) {
            self.problems.push(problem);
        }
        self
    }

    /// Checks that every handler was registered once and that the handlers the settings
    /// ask for exist.
    pub fn build(self) -> Result<Fleet, FleetError> {
        if let Some(problem) = self.problems.into_iter().next() {
            return Err(problem.into());
        }
        let handlers = self
            .registry
            .select(&self.settings.worker.handlers, &self.settings.retry)
            .map_err(|e| ConfigError::new("worker.handlers", e.to_string()))?;
        Ok(Fleet {
            settings: self.settings,
            handlers,
            metrics: Metrics::new(),
        })
    }
}

/// A validated fleet member, ready to run.
pub struct Fleet {
    settings: Settings,
    handlers: BTreeMap<String, Registered>,
    metrics: Metrics,
}

impl Fleet {
    /// Starts building a fleet member from validated settings.
    pub fn builder(settings: Settings) -> FleetBuilder {
        FleetBuilder {
            settings,
            registry: HandlerRegistry::default(),
            problems: Vec::new(),
        }
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Names of the handlers this member serves.
    pub fn handler_names(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// Its metrics, to expose or inspect.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Connects (and migrates, unless `database.migrate_on_start` is off), then runs the
    /// worker pool until SIGTERM or SIGINT.
    pub async fn run(self) -> Result<(), FleetError> {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        self.run_until(shutdown).await
    }

    /// Like [`Fleet::run`], stopping when `shutdown` fires.
    pub async fn run_until(self, shutdown: CancellationToken) -> Result<(), FleetError> {
        let store = Store::connect(&self.settings.database).await?;
        if self.settings.database.migrate_on_start {
            store.migrate().await?;
        }
        self.run_with_store(store, shutdown).await;
        Ok(())
    }

    /// Runs on an existing store (already migrated) until `shutdown` fires.
    pub async fn run_with_store(self, store: Store, shutdown: CancellationToken) {
        if !self.settings.worker.enabled {
            tracing::info!("worker.enabled is false: nothing to run");
            shutdown.cancelled().await;
            return;
        }
        let pool = WorkerPool::new(store, self.handlers, self.settings.worker, self.metrics);
        pool.run(shutdown).await;
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
    }
}

/// Fires `shutdown` on the first SIGTERM or SIGINT.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutdown requested");
    shutdown.cancel();
}
