//! What each statement cost during a measured stretch, from `pg_stat_statements` when the
//! server loads it (`shared_preload_libraries`): calls, execution time, buffers touched
//! and WAL written, per task. Without it the figures are skipped, and the report says so.

use crate::output::outln;
use crate::store::Store;

/// One statement's figures over a stretch.
#[derive(Debug, Clone)]
pub(crate) struct StatementFigures {
    calls: i64,
    exec_ms: f64,
    blocks: i64,
    wal_bytes: f64,
    /// The statement's text, normalized, on one line, its leading comments removed.
    text: String,
}

/// `pg_stat_statements` in the benchmark's database, where it can be read.
#[derive(Debug, Clone)]
pub(crate) struct Profile {
    /// The schema the extension lives in (not on the store's search path).
    schema: String,
}

impl Profile {
    /// Clears the counters of `pg_stat_statements`; `None` when the server does not load
    /// it. The extension is created in `public` when the database has none yet.
    pub(crate) async fn reset(store: &Store) -> Option<Profile> {
        let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public")
            .execute(store.pool())
            .await;
        let schema: String = sqlx::query_scalar(
            "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension \
             WHERE extname = 'pg_stat_statements'",
        )
        .fetch_optional(store.pool())
        .await
        .ok()??;
        sqlx::query(&format!("SELECT {schema}.pg_stat_statements_reset()"))
            .execute(store.pool())
            .await
            .ok()?;
        Some(Profile { schema })
    }

    /// The statements of this database since [`Profile::reset`], costliest first (at
    /// most `limit`).
    pub(crate) async fn read(
        &self,
        store: &Store,
        limit: i64,
    ) -> anyhow::Result<Vec<StatementFigures>> {
        let rows: Vec<(i64, f64, i64, f64, String)> = sqlx::query_as(&format!(
        "SELECT calls, total_exec_time, shared_blks_hit + shared_blks_read + shared_blks_dirtied, \
                wal_bytes::float8, query \
         FROM {}.pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         ORDER BY total_exec_time DESC LIMIT $1",
        self.schema
    ))
        .bind(limit)
        .fetch_all(store.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(calls, exec_ms, blocks, wal_bytes, query)| StatementFigures {
                    calls,
                    exec_ms,
                    blocks,
                    wal_bytes,
                    text: one_line(&query),
                },
            )
            .collect())
    }
}

/// Prints `statements` per task of `tasks`.
pub(crate) fn print(statements: &[StatementFigures], tasks: u64) {
    let tasks = tasks.max(1) as f64;
    outln!(
        "  {:>7} {:>12} {:>12} {:>11}  statement",
        "calls",
        "µs/task",
        "blocks/task",
        "WAL B/task"
    );
    for s in statements {
        outln!(
            "  {:>7} {:>12.1} {:>12.1} {:>11.0}  {}",
            s.calls,
            s.exec_ms * 1000.0 / tasks,
            s.blocks as f64 / tasks,
            s.wal_bytes / tasks,
            s.text
        );
    }
}

/// A statement on one line of at most 90 characters, without its leading comments.
fn one_line(query: &str) -> String {
    let code: Vec<&str> = query
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("--"))
        .collect();
    let joined = code.join(" ");
    match joined.char_indices().nth(90) {
        Some((at, _)) => format!("{}…", &joined[..at]),
        None => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_statement_is_shown_on_one_line_without_its_comments() {
        assert_eq!(
            one_line("-- why\nWITH due AS (\n    SELECT 1) -- inline stays\nSELECT 2"),
            "WITH due AS ( SELECT 1) -- inline stays SELECT 2"
        );
        let long = format!("SELECT {}", "é".repeat(200));
        assert_eq!(one_line(&long).chars().count(), 91);
    }
}
