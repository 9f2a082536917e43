//! Whether PostgreSQL vacuums redrive's tables. Every claim and finish leaves dead row
//! versions behind; without autovacuum they pile up, claims walk past more of them each
//! time, and the drain slows until it stalls. `redrive run` warns at start-up and
//! `redrive tasks check` reports it.

use super::{Result, Store};

/// What keeps autovacuum off: the server's settings, then each of the schema's tables
/// created or altered with `autovacuum_enabled = false`.
const AUTOVACUUM_OFF: &str = r#"
SELECT 'autovacuum is off on this PostgreSQL server (autovacuum = off): the dead rows every claim and finish leaves pile up and the drain slows until it stalls; set autovacuum = on'
WHERE current_setting('autovacuum') = 'off'
UNION ALL
SELECT 'track_counts is off on this PostgreSQL server: autovacuum cannot tell which tables need it; set track_counts = on'
WHERE current_setting('track_counts') = 'off'
UNION ALL
SELECT format('autovacuum is disabled on table %I.%I: ALTER TABLE %I.%I RESET (autovacuum_enabled)',
              n.nspname, c.relname, n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
  AND EXISTS (SELECT 1 FROM unnest(c.reloptions) o
              -- PostgreSQL checked the value when it was set: any of its boolean
              -- spellings. (CASE: other options' values are no booleans.)
              WHERE CASE WHEN lower(split_part(o, '=', 1)) = 'autovacuum_enabled'
                         THEN NOT split_part(o, '=', 2)::boolean ELSE false END)
"#;

impl Store {
    /// Why PostgreSQL would not vacuum redrive's tables, in words; empty when it would.
    pub async fn autovacuum_off(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(AUTOVACUUM_OFF)
            .fetch_all(&self.pool)
            .await?)
    }
}
