//! A member's health: whether the database and Kafka answer, and whether it is shutting
//! down. Read by `/readyz`; a change of state is logged once, not once per try.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use crate::store::{Store, StoreError};

/// Kafka's state as the ingest consumer last saw it.
const KAFKA_UNKNOWN: u8 = 0;
const KAFKA_UP: u8 = 1;
const KAFKA_DOWN: u8 = 2;

/// How long `/readyz` waits for the database.
const DATABASE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Shared state of one member's health.
#[derive(Debug, Default)]
pub struct Health {
    database_down: AtomicBool,
    kafka: AtomicU8,
    ingest: AtomicBool,
    shutting_down: AtomicBool,
}

/// The answer of `/readyz`.
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// Whether every check passed.
    pub ready: bool,
    /// Each check: `ok`, or what is wrong.
    pub checks: BTreeMap<&'static str, String>,
    /// What threatens the store without making the member unready (autovacuum off on
    /// the server or on a table of redrive's: the store bloats until its drain stalls).
    /// Every member would report the same, so it does not take one out of service.
    pub warnings: Vec<String>,
}

impl Health {
    /// A database operation failed. An error waiting may cure (the server cannot be
    /// reached, is restarting or cut the connection) logs "unreachable" the first time;
    /// any other (a data error, a lock timeout, a bug) is logged as what it is, each time.
    pub fn database_failed(&self, operation: &str, error: &StoreError) {
        if !error.is_unavailable() {
            tracing::error!(operation, %error, "the database refused a statement");
            return;
        }
        if !self.database_down.swap(true, Ordering::Relaxed) {
            tracing::warn!(operation, %error, "database unreachable; retrying until it answers");
        } else {
            tracing::debug!(operation, %error, "database still unreachable");
        }
    }

    /// A database operation worked: logs "reachable again" after a failure.
    pub fn database_ok(&self) {
        if self.database_down.swap(false, Ordering::Relaxed) {
            tracing::info!("database reachable again");
        }
    }

    /// This member consumes Kafka: readiness includes the brokers.
    pub fn ingest_started(&self) {
        self.ingest.store(true, Ordering::Relaxed);
    }

    /// What the consumer's statistics say of the brokers: logs each change.
    pub fn kafka_seen(&self, up: bool) {
        let new = if up { KAFKA_UP } else { KAFKA_DOWN };
        let old = self.kafka.swap(new, Ordering::Relaxed);
        match (old, new) {
            (KAFKA_DOWN, KAFKA_UP) => tracing::info!("Kafka reachable again"),
            (KAFKA_UP | KAFKA_UNKNOWN, KAFKA_DOWN) => {
                tracing::warn!("Kafka unreachable: no broker is up; consuming resumes when one is")
            }
            _ => {}
        }
    }

    /// The member is stopping: no longer ready.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Checks the database (reachable, migrations current), Kafka (when ingest runs)
    /// and shutdown; warns when PostgreSQL would not vacuum redrive's tables.
    pub async fn readiness(&self, store: &Store) -> Readiness {
        let mut checks = BTreeMap::new();
        let database =
            tokio::time::timeout(DATABASE_CHECK_TIMEOUT, store.pending_migrations()).await;
        let (database, migrations) = match database {
            Err(_) => ("no answer within 2s".to_owned(), "unknown".to_owned()),
            Ok(Err(error)) => (format!("unreachable: {error}"), "unknown".to_owned()),
            Ok(Ok(0)) => ("ok".to_owned(), "ok".to_owned()),
            Ok(Ok(pending)) => (
                "ok".to_owned(),
                format!("{pending} migration(s) not applied (run `redrive migrate`)"),
            ),
        };
        let warnings = if database == "ok" {
            match tokio::time::timeout(DATABASE_CHECK_TIMEOUT, store.autovacuum_off()).await {
                Ok(Ok(reasons)) => reasons,
                _ => vec!["could not read the autovacuum settings".to_owned()],
            }
        } else {
            Vec::new()
        };
        checks.insert("database", database);
        checks.insert("migrations", migrations);
        if self.ingest.load(Ordering::Relaxed) {
            let kafka = match self.kafka.load(Ordering::Relaxed) {
                KAFKA_UP => "ok",
                KAFKA_DOWN => "no broker is up",
                _ => "not seen yet (waiting for the first consumer statistics)",
            };
            checks.insert("kafka", kafka.to_owned());
        }
        let shutdown = if self.shutting_down.load(Ordering::Relaxed) {
            "shutting down"
        } else {
            "ok"
        };
        checks.insert("shutdown", shutdown.to_owned());
        Readiness {
            ready: checks.values().all(|v| v == "ok"),
            checks,
            warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a data error (`22003 integer out of range` in a claim) was logged as
    /// "database unreachable".
    #[test]
    fn only_errors_waiting_may_cure_mark_the_database_unreachable() {
        let health = Health::default();
        let refused = StoreError::Database(sqlx::Error::Protocol("out of range".into()));
        health.database_failed("claim", &refused);
        assert!(!health.database_down.load(Ordering::Relaxed));
        let cut = StoreError::Database(sqlx::Error::PoolTimedOut);
        health.database_failed("claim", &cut);
        assert!(health.database_down.load(Ordering::Relaxed));
    }
}
