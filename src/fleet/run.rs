//! How a member runs: it opens the store (waiting out a database that is down, applying
//! or waiting for migrations), starts its parts (ingest, the worker pool, upkeep, the
//! listeners) and supervises them until shutdown or the first that fails.

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use super::signals::cancel_on_signal;
use super::{upkeep, Fleet, FleetError};
use crate::admin::{self, Tokens};
use crate::backoff::Pause;
use crate::config::ConfigError;
use crate::parts::Watch;
use crate::store::{Store, StoreError};
use crate::telemetry;

/// The pause before connecting again when the database is unavailable at start-up: from
/// half a second, doubling up to 15 s.
const STARTUP_RETRY: Pause = Pause::new(
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(15),
);

impl Fleet {
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
