//! What PostgreSQL wrote for a measured stretch, per task: WAL bytes (`pg_stat_wal`,
//! the whole cluster: run on a quiet server) and transactions committed
//! (`pg_stat_database`, this database).

use std::time::Duration;

use crate::store::Store;

/// How long backends may keep their statistics before they report them once idle
/// (PostgreSQL 15 and later flush pending statistics about a second after going idle).
const STATS_SETTLE: Duration = Duration::from_millis(1500);

/// The server's counters at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerCounters {
    wal_bytes: f64,
    commits: i64,
}

/// WAL bytes and commits per task between two readings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerTask {
    /// WAL bytes written per task.
    pub wal_bytes: f64,
    /// Transactions committed per task.
    pub commits: f64,
}

impl ServerCounters {
    /// Reads the counters once what the server did so far has been reported.
    pub(crate) async fn read(store: &Store) -> anyhow::Result<ServerCounters> {
        tokio::time::sleep(STATS_SETTLE).await;
        let (wal_bytes, commits): (f64, i64) = sqlx::query_as(
            "SELECT (SELECT wal_bytes FROM pg_stat_wal)::float8, \
                    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())",
        )
        .fetch_one(store.pool())
        .await?;
        Ok(ServerCounters { wal_bytes, commits })
    }

    /// What the server did per task of `tasks` since `before`.
    pub(crate) fn per_task_since(&self, before: &ServerCounters, tasks: usize) -> PerTask {
        let tasks = tasks.max(1) as f64;
        PerTask {
            wal_bytes: (self.wal_bytes - before.wal_bytes) / tasks,
            commits: (self.commits - before.commits) as f64 / tasks,
        }
    }
}
