//! The schema's versions: applying the binary's migrations (saying which), counting
//! those not applied, and telling a schema a newer release migrated apart from one
//! that is behind.

use sqlx::Connection;
use std::collections::BTreeSet;

use super::{Result, Store, StoreError};

/// Migrations embedded in the binary.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A migration, by its version (the file's timestamp) and its description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Its version: the timestamp its file name starts with.
    pub version: i64,
    /// What it does, from its file name.
    pub description: String,
}

/// Where a schema stands against this binary's migrations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaVersions {
    /// This binary's migrations the schema has not applied, oldest first.
    pub pending: Vec<Migration>,
    /// Versions the schema has applied that this binary does not know: a newer release
    /// migrated it.
    pub newer: Vec<i64>,
    /// How many migrations the schema has applied (0: a new schema).
    pub applied: usize,
}

impl SchemaVersions {
    /// The newest migration this binary knows.
    pub fn binary_latest() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }
}

impl Store {
    /// Creates the schema if needed and applies pending migrations; the ones it applied,
    /// oldest first (none: the schema was current). Safe to run from several processes
    /// at once: they serialise on an advisory lock. A schema that a newer release
    /// migrated is refused ([`StoreError::SchemaNewer`]), naming both versions.
    pub async fn migrate(&self) -> Result<Vec<Migration>> {
        let mut conn = self.pool.acquire().await?;
        let lock_key = format!("redrive.migrate.{}", self.schema);
        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
            .bind(&lock_key)
            .execute(&mut *conn)
            .await?;
        let outcome = async {
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema))
                .execute(&mut *conn)
                .await?;
            let versions = versions(&mut conn).await?;
            self.refuse_newer(&versions)?;
            MIGRATOR.run(&mut *conn).await?;
            // An upgrade (not a new schema): members may be working on it.
            if !versions.pending.is_empty() && versions.applied > 0 {
                end_other_sessions(&mut conn).await;
            }
            Ok(versions.pending)
        }
        .await;
        let unlock = sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(&lock_key)
            .execute(&mut *conn)
            .await;
        if unlock.is_err() {
            // The lock dies with the session; do not hand a locked connection back.
            conn.detach().close().await.ok();
        }
        outcome
    }

    /// Where the schema stands against this binary's migrations (a schema without
    /// redrive's tables has every migration pending).
    pub async fn schema_versions(&self) -> Result<SchemaVersions> {
        versions(&mut *self.pool.acquire().await?).await
    }

    /// How many of the binary's migrations the database has not applied (0: current).
    pub async fn pending_migrations(&self) -> Result<usize> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.pool)
                .await?;
        Ok(MIGRATOR
            .iter()
            .filter(|m| !applied.contains(&m.version))
            .count())
    }

    /// Whether the database answers a trivial statement.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// [`StoreError::SchemaNewer`] when a newer release migrated the schema.
    fn refuse_newer(&self, versions: &SchemaVersions) -> Result<()> {
        match versions.newer.iter().max() {
            Some(&database) => Err(StoreError::SchemaNewer {
                schema: self.schema.clone(),
                database,
                binary: SchemaVersions::binary_latest(),
            }),
            None => Ok(()),
        }
    }
}

/// Ends the sessions of other redrive processes on this database once migrations are
/// applied to a schema in use (an upgrade): a member of an earlier release whose statements return a table's every
/// column (`t.*`, up to 78cebd5) keeps them prepared for the table as it was, and
/// PostgreSQL refuses them once a column is added ("cached plan must not change result
/// type"): every claim failed until its connections were replaced. Members resume on
/// new connections by themselves, as after any backend termination (a statement in
/// flight is retried). Only logged when refused (a role without the right).
async fn end_other_sessions(conn: &mut sqlx::PgConnection) {
    let ended = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'redrive' \
           AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut *conn)
    .await;
    match ended {
        Ok(0) => {}
        Ok(ended) => tracing::info!(
            ended,
            "ended the database sessions of other redrive processes, so that none keeps \
             statements prepared for the tables as they were; they reconnect by themselves"
        ),
        Err(error) => tracing::warn!(%error,
            "could not end the database sessions of other redrive processes: members of \
             an earlier release may fail their statements until they reconnect"),
    }
}

/// The schema's applied versions against the binary's, on `conn` (whose `search_path`
/// is the schema).
async fn versions(conn: &mut sqlx::PgConnection) -> Result<SchemaVersions> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    let applied: BTreeSet<i64> = match exists {
        true => sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect(),
        false => BTreeSet::new(),
    };
    let known: BTreeSet<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    Ok(SchemaVersions {
        pending: (MIGRATOR.iter())
            .filter(|m| !applied.contains(&m.version))
            .map(|m| Migration {
                version: m.version,
                description: m.description.to_string(),
            })
            .collect(),
        newer: applied.difference(&known).copied().collect(),
        applied: applied.len(),
    })
}
