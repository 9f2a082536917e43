//! Leases: claim due tasks, keep them alive, give them back.
//!
//! While a task is leased its `next_attempt_at` is the lease deadline, so a task whose
//! worker died is claimed again by the ordinary claim once the deadline passes.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::sync::LazyLock;
use std::time::Duration;

use super::finish::Finish;
use super::row::{decode_each, task_columns, Unreadable};
use super::{Result, Store};
use crate::task::{AttemptOutcome, Cause, FinishOutcome, Lease, Task, TaskId};

// The claim and `next_due` read due tasks in due order, walking the partial index
// `recovery_task_due_by_handler` (handler, due time) once for each handler of the lane:
// the due tasks of handlers the lane does not serve are never read. Without fresh
// statistics (a burst of tasks not analyzed yet, or statistics taken while few tasks were
// unfinished) the planner believes few rows are due and reads all of them to sort them (a
// bitmap scan) or aggregate them: seconds per statement at a million rows. Their
// transaction switches sorting off, so the ordered index walk, which stops after the rows
// wanted, is the one plan left (the few rows the claim merges across handlers are sorted
// all the same: that plan has no other way).
use super::KEYED_PROBES;
pub(crate) use super::ORDERED_WALK as DUE_ORDER;

// `$5`, when set, claims tasks due by then rather than now (a breaker's probes, whose
// tasks are held until the breaker's `hold_until`); a leased task is only ever taken
// over once its lease has lapsed. `$7`, when set, is where the walk of the due index
// starts (see `worker::due_floor`): tasks due before it are left to a later claim.
// Each claimed row answers the due time it was claimed at (`was_due`).
//
// A claim takes the earliest due tasks across its handlers in two statements. The first
// (`SHARES`) reads, without locking, how many of the wanted earliest each handler holds.
// The second (this one) walks each handler's due tasks taking that many (`$8`), passing
// those another transaction holds (`SKIP LOCKED`): it locks no row it does not take. A
// handler whose walk comes back short has no claimable task left that is not held (an
// operator's action, other members' claims in flight): it is left out and the rest is
// shared again among the others (`Store::claim_in`), so held rows never keep the claim
// from other handlers' tasks. Under such holds a handler's later tasks may come before
// another handler's earlier ones: due order holds within each handler, and across
// handlers for the tasks no one holds. `due` is capped at `$2` so that the planner,
// which cannot estimate the shares, still joins the few rows it updates by their primary
// key, not by reading the whole table. `$9` are the tasks an earlier turn of the same
// claim took.
//
// A task an operator fenced mid-call waits until that call has stopped (see
// [`NOT_STOPPING`]).
//
// A due task still leased lost its attempt when its lease lapsed (the worker died or
// stalled): the claim that takes it over writes that attempt's history row (outcome `$6`,
// `lease_expired`), so the history holds one row per counted attempt.
//
// Times read from a row are clamped to what a time can hold here before any arithmetic
// (`recovery_clamp_time`, `recovery_elapsed_ms`: migration `20261211100000`): PostgreSQL
// 15 cannot subtract an infinite time, and a task given one by hand failed every claim of
// its handlers (see `store::time`).
const CLAIM_TEMPLATE: &str = concat!(
    r#"
WITH share AS (
    SELECT * FROM unnest($1::text[], $8::bigint[]) AS s(handler, n)),
due AS MATERIALIZED (
    SELECT walk.*
    FROM share CROSS JOIN LATERAL (
        SELECT id, handler, lease_owner, lease_version, leased_at, next_attempt_at, attempts
        FROM recovery_task
        WHERE status = 'failed' AND handler = share.handler {CLAIMABLE}
          AND id <> ALL ($9::bigint[])
        ORDER BY next_attempt_at
        LIMIT share.n
        FOR UPDATE SKIP LOCKED) AS walk
    LIMIT $2),
lost AS (
    INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, lease_version, attempts, lease_owner,
           recovery_clamp_time(coalesce(leased_at, next_attempt_at)),
           recovery_elapsed_ms(leased_at, next_attempt_at),
           $6::text, 'the lease expired before the attempt was finished; the task was claimed again'
    FROM due
    WHERE lease_owner IS NOT NULL
    ON CONFLICT DO NOTHING)
UPDATE recovery_task t
SET lease_version = t.lease_version + 1,
    lease_owner = $3,
    leased_at = now(),
    next_attempt_at = now() + $4 * interval '1 millisecond',
    attempts = least(t.attempts, 2147483646) + 1,
    updated_at = now()
FROM due
WHERE t.id = due.id
RETURNING "#,
    task_columns!("t."),
    r#", due.lease_owner IS NOT NULL AS recovered, due.next_attempt_at AS was_due
"#
);

static CLAIM: LazyLock<String> =
    LazyLock::new(|| CLAIM_TEMPLATE.replace("{CLAIMABLE}", &claimable("$5", "$7")));

// How many of the `$2` earliest claimable tasks of the handlers `$1` each handler holds,
// leaving out the tasks `$5` an earlier turn of the claim took. `$3` and `$4` are the
// claim's `$5` and `$7`.
static SHARES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT handler, count(*) AS n \
         FROM (SELECT candidate.handler, candidate.next_attempt_at \
               FROM (SELECT DISTINCT name FROM unnest($1::text[]) AS l(name)) AS lane \
               CROSS JOIN LATERAL ( \
                   SELECT handler, next_attempt_at FROM recovery_task \
                   WHERE status = 'failed' AND handler = lane.name {} \
                     AND id <> ALL ($5::bigint[]) \
                   ORDER BY next_attempt_at LIMIT $2) AS candidate \
               ORDER BY candidate.next_attempt_at LIMIT $2) AS earliest \
         GROUP BY handler",
        claimable("$3", "$4")
    )
});

/// What makes a task claimable now: due by `due_by` (now when null), at or after `from`
/// (every one when null), not leased or its lease lapsed, and no call of it or its key
/// still stopping.
fn claimable(due_by: &str, from: &str) -> String {
    format!(
        "AND next_attempt_at <= coalesce({due_by}::timestamptz, now()) \
         AND next_attempt_at >= coalesce({from}::timestamptz, '-infinity') \
         AND (lease_owner IS NULL OR next_attempt_at <= now()) {NOT_STOPPING}"
    )
}

/// The claim's condition that no call fenced out by an operator may still be running for
/// the task or its ordering key (`recovery_stopping_call`). The table is empty but for
/// the seconds after such an action: the statement then looks at it once (an init plan),
/// not once per row.
const NOT_STOPPING: &str =
    "AND (NOT EXISTS (SELECT 1 FROM recovery_stopping_call WHERE ends_by > now())
           OR (NOT EXISTS (SELECT 1 FROM recovery_stopping_call s
                           WHERE s.task_id = recovery_task.id AND s.ends_by > now())
               AND (order_key IS NULL OR NOT EXISTS (SELECT 1 FROM recovery_stopping_call s
                           WHERE s.order_key = recovery_task.order_key AND s.ends_by > now()))))";

// When the next task the claim would take is due, looking from `$2` on when set: the
// earliest of each handler's first. Tasks waiting for a stopping call are passed over:
// the member that stops the call tells the idle claimers (`<schema>_due`).
static NEXT_DUE: LazyLock<String> = LazyLock::new(|| {
    "SELECT greatest(extract(epoch FROM recovery_clamp_time(min(first.due)) - clock_timestamp()) * 1000, 0)::float8 \
     FROM unnest($1::text[]) AS lane(name) CROSS JOIN LATERAL ( \
         SELECT next_attempt_at AS due FROM recovery_task \
         WHERE status = 'failed' AND handler = lane.name \
           AND next_attempt_at >= coalesce($2::timestamptz, '-infinity') {NOT_STOPPING} \
         ORDER BY next_attempt_at LIMIT 1) AS first \
     HAVING count(*) > 0"
        .replace("{NOT_STOPPING}", NOT_STOPPING)
});

// A member whose fenced call has stopped says so: the task (and its key) may run again.
const CALLS_STOPPED: &str = r#"
WITH stopped AS (
    DELETE FROM recovery_stopping_call s
    USING unnest($1::bigint[], $2::bigint[]) AS l(id, version)
    WHERE s.task_id = l.id AND s.lease_version = l.version
    RETURNING s.ends_by)
SELECT pg_notify(current_schema() || '_due', '')
WHERE EXISTS (SELECT 1 FROM stopped WHERE ends_by > now())
"#;

// The fenced writes below match (id, lease_version) with a lease present, which implies
// an unfinished task (a table constraint). Do not add `status = 'failed'`: with stale
// statistics the planner would scan the whole due index instead of probing the primary key.
const HEARTBEAT: &str = r#"
UPDATE recovery_task t
SET next_attempt_at = now() + $3 * interval '1 millisecond', updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS l(id, version)
WHERE t.id = l.id AND t.lease_version = l.version AND t.lease_owner IS NOT NULL
RETURNING t.id, t.lease_version AS version
"#;

// The interrupted attempt's history row has outcome `$4` (`released`).
const RELEASE: &str = r#"
WITH released AS (
    UPDATE recovery_task t
    SET lease_version = t.lease_version + 1,
        lease_owner = NULL,
        leased_at = NULL,
        -- Due again now, or at the handler's breaker hold.
        next_attempt_at = (SELECT due_at FROM recovery_due_at(t.handler, now())),
        attempts = greatest(t.attempts - 1, 0),
        updated_at = now()
    FROM (SELECT l.id, l.version, o.leased_at
          FROM unnest($1::bigint[], $2::bigint[]) AS l(id, version)
          JOIN recovery_task o ON o.id = l.id) AS l
    WHERE t.id = l.id AND t.lease_version = l.version AND t.lease_owner IS NOT NULL
    RETURNING t.id, t.attempts + 1 AS attempt, l.version,
              recovery_clamp_time(coalesce(l.leased_at, now())) AS leased_at),
history AS (
    INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, version, attempt, $3, leased_at,
           recovery_elapsed_ms(leased_at, now()),
           $4::text, 'lease given back on shutdown before the handler finished'
    FROM released)
SELECT id FROM released
"#;

impl Store {
    /// Claims up to `limit` due tasks of `handlers` for `owner`, bumping each fencing
    /// token and leasing the task for `lease`. One statement, committed before returning.
    /// A task whose lease had lapsed gets a `lease_expired` history row for the attempt
    /// it lost.
    ///
    /// A claimed row that cannot be read (say, malformed stored headers) is not returned:
    /// it ends PERMANENT_FAILURE under its new lease, with the reason as its error, so it
    /// neither holds up the rest of its batch nor comes back.
    pub async fn claim(
        &self,
        handlers: &[String],
        limit: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        Ok(self
            .claim_from(handlers, limit, owner, lease, None)
            .await?
            .tasks)
    }

    /// [`Store::claim`] walking the due index from `from` on (from its start when
    /// `None`): tasks due before `from` are left to a later claim. Also answers how many
    /// tasks were taken over from lapsed leases and the earliest due time claimed.
    pub async fn claim_from(
        &self,
        handlers: &[String],
        limit: u32,
        owner: &str,
        lease: Duration,
        from: Option<DateTime<Utc>>,
    ) -> Result<Claimed> {
        let mut tx = self.pool.begin_with(DUE_ORDER).await?;
        let rows = self
            .claim_in(&mut tx, handlers, limit, owner, lease, None, from)
            .await?;
        tx.commit().await?;
        let first_due = rows
            .iter()
            .filter_map(|r| super::time::decode(r, "was_due").ok()?.ok()?)
            .min();
        let (tasks, recovered) = self.decode_claimed(owner, &rows).await?;
        Ok(Claimed {
            tasks,
            recovered,
            first_due,
        })
    }

    /// Runs the claim statement in `tx` (begun with [`DUE_ORDER`]): tasks due by
    /// `due_by` (now when `None`), from `from` on (every one when `None`).
    // One statement's parameters, each its own meaning: a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim_in(
        &self,
        tx: &mut PgConnection,
        handlers: &[String],
        limit: u32,
        owner: &str,
        lease: Duration,
        due_by: Option<DateTime<Utc>>,
        from: Option<DateTime<Utc>>,
    ) -> Result<Vec<PgRow>> {
        let mut lane = handlers.to_vec();
        let mut rows: Vec<PgRow> = Vec::new();
        let mut taken: Vec<i64> = Vec::new();
        // Each turn but the last leaves out a handler with nothing left to take: at most
        // one turn per handler of the lane (a cap of four let four handlers whose first
        // tasks were held keep a fifth's from every claim).
        loop {
            let wanted = limit.saturating_sub(rows.len() as u32);
            if wanted == 0 || lane.is_empty() {
                break;
            }
            let shares: Vec<(String, i64)> = sqlx::query_as(&SHARES)
                .bind(&lane)
                .bind(i64::from(wanted))
                .bind(due_by)
                .bind(from)
                .bind(&taken)
                .fetch_all(&mut *tx)
                .await?;
            if shares.is_empty() {
                break;
            }
            let (names, counts): (Vec<String>, Vec<i64>) = shares.into_iter().unzip();
            let claimed = sqlx::query(&CLAIM)
                .bind(&names)
                .bind(i64::from(wanted))
                .bind(owner)
                .bind(millis(lease))
                .bind(due_by)
                .bind(AttemptOutcome::LeaseExpired.as_str())
                .bind(from)
                .bind(&counts)
                .bind(&taken)
                .fetch_all(&mut *tx)
                .await?;
            let exhausted: Vec<&String> = names
                .iter()
                .zip(&counts)
                .filter(|&(name, &count)| {
                    let got = claimed
                        .iter()
                        .filter(|r| r.try_get::<&str, _>("handler").ok() == Some(name.as_str()))
                        .count();
                    (got as i64) < count
                })
                .map(|(name, _)| name)
                .collect();
            taken.extend(
                claimed
                    .iter()
                    .filter_map(|r| r.try_get::<i64, _>("id").ok()),
            );
            rows.extend(claimed);
            if exhausted.is_empty() {
                break;
            }
            lane.retain(|name| !exhausted.contains(&name));
        }
        Ok(rows)
    }

    /// Tasks from claimed rows, with how many were taken over from a lapsed lease.
    /// Rows that cannot be read end as permanent failures.
    pub(crate) async fn decode_claimed(
        &self,
        owner: &str,
        rows: &[PgRow],
    ) -> Result<(Vec<Task>, usize)> {
        let recovered = rows
            .iter()
            .filter(|r| r.try_get::<bool, _>("recovered").unwrap_or(false))
            .count();
        let (tasks, unreadable) = decode_each(rows)?;
        if !unreadable.is_empty() {
            self.end_unreadable(owner, &unreadable).await;
        }
        Ok((tasks, recovered))
    }

    /// Ends claimed rows that cannot be read as PERMANENT_FAILURE, in one fenced write
    /// with their history rows. Should that write fail, the rows come back when their
    /// leases lapse and are ended then.
    async fn end_unreadable(&self, owner: &str, unreadable: &[Unreadable]) {
        let now = Utc::now();
        let results: Vec<Finish> = unreadable
            .iter()
            .map(|row| Finish {
                lease: row.lease,
                outcome: FinishOutcome::PermanentFailure,
                started_at: now,
                duration: Duration::ZERO,
                error: Some(row.reason.clone()),
                cause: Some(Cause::reported(
                    Some("redrive.UnreadableTask"),
                    None,
                    Some(&row.reason),
                )),
                // Nothing ran: there is nothing to undo.
                compensate: false,
            })
            .collect();
        for row in unreadable {
            tracing::error!(task = %row.lease.id, reason = %row.reason,
                "claimed task cannot be read; ending it as permanent failure");
        }
        if let Err(error) = self.finish(owner, &results).await {
            tracing::warn!(%error, "could not end unreadable tasks; they come back after their lease");
        }
    }

    /// Extends the leases still held; returns the leases that were extended. A lease
    /// missing from the answer was taken over (or its task finished by someone else).
    pub async fn heartbeat(&self, leases: &[Lease], lease: Duration) -> Result<Vec<Lease>> {
        self.extend_leases(HEARTBEAT, leases, lease).await
    }

    /// Runs `extension`, a statement extending `leases` (ids `$1`, versions `$2`) by
    /// `lease` (`$3`, in milliseconds) that answers the extended ones as `(id, version)`.
    pub(super) async fn extend_leases(
        &self,
        extension: &str,
        leases: &[Lease],
        lease: Duration,
    ) -> Result<Vec<Lease>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, versions) = split(leases);
        let mut tx = self.pool.begin_with(KEYED_PROBES).await?;
        let rows = sqlx::query(extension)
            .bind(ids)
            .bind(versions)
            .bind(millis(lease))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(Lease {
                    id: TaskId(r.try_get("id")?),
                    version: r.try_get("version")?,
                })
            })
            .collect()
    }

    /// Gives leases back so another worker can take the tasks at once. The interrupted
    /// attempt does not count against the task's max attempts but is kept in the history.
    pub async fn release(&self, worker: &str, leases: &[Lease]) -> Result<Vec<TaskId>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, versions) = split(leases);
        let mut tx = self.pool.begin_with(KEYED_PROBES).await?;
        let rows = sqlx::query(RELEASE)
            .bind(ids)
            .bind(versions)
            .bind(worker)
            .bind(AttemptOutcome::Released.as_str())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(|r| Ok(TaskId(r.try_get("id")?))).collect()
    }

    /// How long until the earliest unfinished task of `handlers` due at or after `from`
    /// (every one when `None`) is due (leased tasks count with their lease deadline; zero
    /// when one is due now), by PostgreSQL's clock, or `None` when there is none.
    pub async fn next_due(
        &self,
        handlers: &[String],
        from: Option<DateTime<Utc>>,
    ) -> Result<Option<Duration>> {
        let mut tx = self.pool.begin_with(DUE_ORDER).await?;
        let millis: Option<f64> = sqlx::query_scalar(&NEXT_DUE)
            .bind(handlers)
            .bind(from)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(millis.map(|ms| Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX)))
    }

    /// Says that the calls of these lost leases have stopped: a task (or ordering key)
    /// an operator acted on mid-call may run again at once, instead of at the old
    /// lease's deadline. Leases lost for other reasons are no-ops.
    pub async fn calls_stopped(&self, leases: &[Lease]) -> Result<()> {
        let (ids, versions) = split(leases);
        sqlx::query(CALLS_STOPPED)
            .bind(ids)
            .bind(versions)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// What one claim took.
#[derive(Debug)]
pub struct Claimed {
    /// The claimed tasks that could be read (the others ended PERMANENT_FAILURE).
    pub tasks: Vec<Task>,
    /// How many were taken over from a lapsed lease (a dead or stalled worker's).
    pub recovered: usize,
    /// The earliest due time among the claimed tasks (before the claim moved it to the
    /// lease deadline), read or not; `None` when nothing was claimed.
    pub first_due: Option<DateTime<Utc>>,
}

/// Ids and versions in id order: every multi-row write locks rows in that order, so a
/// heartbeat and a finish on overlapping tasks cannot deadlock.
pub(super) fn split(leases: &[Lease]) -> (Vec<i64>, Vec<i64>) {
    let mut pairs: Vec<(i64, i64)> = leases.iter().map(|l| (l.id.0, l.version)).collect();
    pairs.sort_unstable();
    pairs.into_iter().unzip()
}

/// A duration in whole milliseconds for SQL interval arithmetic.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
