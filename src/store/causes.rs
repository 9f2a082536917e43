//! What broke: the causes of failures ([`crate::task::cause`]), one row each, and the
//! ids that tasks carry.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use std::collections::BTreeMap;

use super::Result;
use crate::task::Cause;

/// Stores the causes not yet known (first seen now, with their example) and answers
/// the id of each of `causes`, in order (`None` stays `None`).
///
/// Two statements: the insert waits for a transaction inserting the same cause and
/// then does nothing, and the read that follows, with a snapshot of its own, sees the
/// row either way. Causes are inserted in their sort order, so that two transactions
/// never wait for each other's.
pub(super) async fn cause_ids(
    conn: &mut PgConnection,
    causes: &[Option<&Cause>],
) -> Result<Vec<Option<i64>>> {
    let seen = vec![None; causes.len()];
    ids_of(conn, causes, &seen, NEW_CAUSES).await
}

/// Causes first seen now; one a concurrent transaction inserted is left as it is. A
/// cause already stored is not offered to the insert: an insert that meets its conflict
/// still draws an id, and the ids operators type would run with gaps.
const NEW_CAUSES: &str = "\
    INSERT INTO recovery_cause (class, fingerprint, example, first_seen) \
    SELECT c, f, e, coalesce(s, now()) \
    FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) WITH ORDINALITY AS u(c, f, e, s, o) \
    WHERE NOT EXISTS (SELECT 1 FROM recovery_cause r WHERE r.class = u.c AND r.fingerprint = u.f) \
    ORDER BY o \
    ON CONFLICT (class, fingerprint) DO NOTHING";

/// Causes of earlier tasks: first seen when their earliest task was stored, which moves
/// an existing cause's first sighting back (one seen again since the upgrade would
/// otherwise look new, and page as a new cause that grows). Stored causes are moved by
/// an update, not offered to the insert (see [`NEW_CAUSES`]).
const EARLIER_CAUSES: &str = "\
    WITH u AS ( \
        SELECT c, f, e, coalesce(s, now()) AS s, o \
        FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) WITH ORDINALITY AS u(c, f, e, s, o)), \
    moved AS ( \
        UPDATE recovery_cause r SET first_seen = u.s FROM u \
        WHERE r.class = u.c AND r.fingerprint = u.f AND r.first_seen > u.s) \
    INSERT INTO recovery_cause AS r (class, fingerprint, example, first_seen) \
    SELECT c, f, e, s FROM u \
    WHERE NOT EXISTS (SELECT 1 FROM recovery_cause x WHERE x.class = u.c AND x.fingerprint = u.f) \
    ORDER BY o \
    ON CONFLICT (class, fingerprint) DO UPDATE SET first_seen = EXCLUDED.first_seen \
    WHERE r.first_seen > EXCLUDED.first_seen";

/// The ids of `causes` (stored by `insert` where new), each first seen at its `seen`
/// (the earliest of a cause's) or now.
async fn ids_of(
    conn: &mut PgConnection,
    causes: &[Option<&Cause>],
    seen: &[Option<DateTime<Utc>>],
    insert: &str,
) -> Result<Vec<Option<i64>>> {
    // (class, fingerprint) -> (example, first seen)
    type Distinct<'a> = BTreeMap<(&'a str, &'a str), (&'a str, Option<DateTime<Utc>>)>;
    let mut distinct: Distinct = BTreeMap::new();
    for (cause, seen) in causes.iter().zip(seen) {
        let Some(cause) = cause else { continue };
        let entry = distinct
            .entry((cause.class.as_str(), cause.fingerprint.as_str()))
            .or_insert((cause.example.as_str(), *seen));
        entry.1 = match (entry.1, *seen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    if distinct.is_empty() {
        return Ok(vec![None; causes.len()]);
    }
    let classes: Vec<&str> = distinct.keys().map(|(class, _)| *class).collect();
    let prints: Vec<&str> = distinct.keys().map(|(_, print)| *print).collect();
    let examples: Vec<&str> = distinct.values().map(|(example, _)| *example).collect();
    let firsts: Vec<Option<DateTime<Utc>>> = distinct.values().map(|(_, seen)| *seen).collect();
    sqlx::query(insert)
        .bind(&classes)
        .bind(&prints)
        .bind(&examples)
        .bind(&firsts)
        .execute(&mut *conn)
        .await?;
    let rows = sqlx::query(
        "SELECT c.id, c.class, c.fingerprint FROM recovery_cause c \
         JOIN unnest($1::text[], $2::text[]) AS u(class, fingerprint) \
           ON c.class = u.class AND c.fingerprint = u.fingerprint",
    )
    .bind(&classes)
    .bind(&prints)
    .fetch_all(&mut *conn)
    .await?;
    let mut ids: BTreeMap<(String, String), i64> = BTreeMap::new();
    for row in rows {
        ids.insert(
            (row.try_get("class")?, row.try_get("fingerprint")?),
            row.try_get("id")?,
        );
    }
    Ok(causes
        .iter()
        .map(|cause| {
            let cause = (*cause)?;
            ids.get(&(cause.class.clone(), cause.fingerprint.clone()))
                .copied()
        })
        .collect())
}

/// Tasks whose cause one backfill batch sets.
pub const BACKFILL_BATCH: i64 = 1000;

/// Where the backfill of causes stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backfill {
    /// A batch was done; more may remain.
    Progressed {
        /// Tasks given a cause by the batch.
        set: u64,
    },
    /// Another member holds the backfill's row right now.
    Busy,
    /// Every task up to the newest a member saw at its start has a cause.
    Done,
}

impl super::Store {
    /// Raises the backfill's end to the newest task: a member of an earlier release may
    /// have stored tasks without a cause (a rolling upgrade). Each member calls it once,
    /// at its start.
    pub async fn extend_cause_backfill(&self) -> Result<()> {
        sqlx::query(
            "UPDATE recovery_backfill \
             SET upto = greatest(upto, (SELECT coalesce(max(id), 0) FROM recovery_task)) \
             WHERE name = 'causes'",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Sets the cause of the next [`BACKFILL_BATCH`] tasks stored without one, in id
    /// order: from the error their last attempt left, or else the one they were
    /// reported with. A task whose cause was set meanwhile (an attempt finished) keeps it.
    pub async fn backfill_causes(&self) -> Result<Backfill> {
        let mut tx = self.pool.begin().await?;
        let Some(mark) = sqlx::query(
            "SELECT done_upto, upto FROM recovery_backfill WHERE name = 'causes' \
             FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(Backfill::Busy);
        };
        let (done_upto, upto): (i64, i64) = (mark.try_get("done_upto")?, mark.try_get("upto")?);
        if done_upto >= upto {
            return Ok(Backfill::Done);
        }
        let rows = sqlx::query(
            "SELECT id, status, left(error_class, 1000) AS error_class, disposition, \
                    left(error_message, 4096) AS error_message, left(last_error, 4096) AS last_error, \
                    attempts, cause_id IS NOT NULL AS has_cause, \
                    CASE WHEN created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59+00' \
                         THEN created_at END AS created_at \
             FROM recovery_task WHERE id > $1 AND id <= $2 ORDER BY id LIMIT $3",
        )
        .bind(done_upto)
        .bind(upto)
        .bind(BACKFILL_BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let mut ids = Vec::new();
        let mut causes = Vec::new();
        let mut seen = Vec::new();
        for row in &rows {
            if row.try_get("has_cause")? {
                continue;
            }
            let last_error: Option<String> = row.try_get("last_error")?;
            let attempts: i32 = row.try_get("attempts")?;
            let cause = match last_error {
                Some(error) if attempts > 0 => {
                    let status: String = row.try_get("status")?;
                    Cause::of_stored_attempt(&error, status == "permanent_failure")
                }
                _ => Cause::reported(
                    row.try_get::<Option<String>, _>("error_class")?.as_deref(),
                    row.try_get::<Option<String>, _>("disposition")?.as_deref(),
                    row.try_get::<Option<String>, _>("error_message")?
                        .as_deref(),
                ),
            };
            ids.push(row.try_get::<i64, _>("id")?);
            causes.push(cause);
            seen.push(row.try_get::<Option<DateTime<Utc>>, _>("created_at")?);
        }
        let refs: Vec<Option<&Cause>> = causes.iter().map(Some).collect();
        let cause_ids = ids_of(&mut tx, &refs, &seen, EARLIER_CAUSES).await?;
        let set = sqlx::query(
            "UPDATE recovery_task t SET cause_id = u.cause_id, cause_at = t.updated_at \
             FROM unnest($1::bigint[], $2::bigint[]) AS u(id, cause_id) \
             WHERE t.id = u.id AND t.cause_id IS NULL",
        )
        .bind(&ids)
        .bind(&cause_ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let reached = match rows.last() {
            Some(last) if (rows.len() as i64) == BACKFILL_BATCH => last.try_get("id")?,
            _ => upto,
        };
        sqlx::query("UPDATE recovery_backfill SET done_upto = $1 WHERE name = 'causes'")
            .bind(reached)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Backfill::Progressed { set })
    }
}

impl super::Store {
    /// Cause `id`, or `None` when no cause has it.
    pub async fn cause(&self, id: i64) -> Result<Option<super::CauseView>> {
        Ok(sqlx::query_as(&format!(
            "SELECT id, class, fingerprint, example, {} AS first_seen \
             FROM recovery_cause WHERE id = $1",
            super::groups::readable("first_seen")
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The cause task `id` carries (its last failure's), or `None` before one is set.
    pub async fn cause_of_task(&self, id: crate::task::TaskId) -> Result<Option<super::CauseView>> {
        Ok(sqlx::query_as(&format!(
            "SELECT c.id, c.class, c.fingerprint, c.example, {} AS first_seen \
             FROM recovery_task t JOIN recovery_cause c ON c.id = t.cause_id WHERE t.id = $1",
            super::groups::readable("c.first_seen")
        ))
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await?)
    }
}
