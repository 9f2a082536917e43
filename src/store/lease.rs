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
// A claim takes the earliest claimable tasks across its handlers in turns, each of two
// statements (`Store::claim_in`). `EARLIEST` reads, without locking, the ids of the
// earliest claimable tasks of the lane, leaving out those an earlier turn took or found
// held (`$9` here). The claim then takes what it can of them:
//
// - In its first turns (`BY_IDS`), the earliest `$2` of those ids (`$8`) that no other
//   transaction holds (`SKIP LOCKED`), locking no row it does not take. A turn that comes
//   back short has looked at every id it was given: those it did not take are held, and
//   are left out of the next turn, which reads twice as many. So held rows, however many
//   head one handler's tasks, neither keep the claim short nor let that handler's later
//   tasks go ahead of another handler's earlier ones (the due order holds across
//   handlers for every task nobody holds).
// - Should the claim still be short after those turns (more rows held than it read), it
//   walks each handler's due tasks (`WALK`), taking that handler's share of the earliest
//   (`$8`), passing rows held since. A handler whose walk comes back short has nothing
//   left that is not held and is left out; the others share again. The claim is then
//   never short while an unheld task is due, but a handler may take its later tasks before
//   another handler's earlier ones for as long as rows it could not see as held stay so.
//
// `due` is capped at `$2` so that the planner, which cannot estimate the shares, still
// joins the few rows it updates by their primary key, not by reading the whole table.
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
{DUE}
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

/// The claim's `due` in its first turns: the earliest `$2` of the ids `$8` that are
/// still claimable and that no other transaction holds. (`$1` is not named: with a
/// condition on the handler, statistics taken while the table was empty made the planner
/// walk the handlers' whole due index and filter the ids, 300,000 entries to take one.)
const DUE_BY_IDS: &str = r#"
WITH due AS MATERIALIZED (
    SELECT id, handler, lease_owner, lease_version, leased_at, next_attempt_at, attempts
    FROM recovery_task
    WHERE id = ANY ($8::bigint[]) AND status = 'failed' {CLAIMABLE}
      AND id <> ALL ($9::bigint[])
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED),"#;

/// The claim's `due` after them: each handler `$1` walked for its share `$8`.
const DUE_BY_WALK: &str = r#"
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
    LIMIT $2),"#;

/// The claim statement with `due` as given.
fn claim_statement(due: &str) -> String {
    CLAIM_TEMPLATE
        .replace("{DUE}", due)
        .replace("{CLAIMABLE}", &claimable("$5", "$7"))
}

static BY_IDS: LazyLock<String> = LazyLock::new(|| claim_statement(DUE_BY_IDS));
static WALK: LazyLock<String> = LazyLock::new(|| claim_statement(DUE_BY_WALK));

/// Turns of a claim that take the earliest ids read (`BY_IDS`) before it walks each
/// handler for its share (`WALK`): they read as many ids as the claim's size, then 2, 4,
/// 8 and 16 times as many, so that up to 30 times a claim's size of held rows are passed
/// in due order.
const TURNS_BY_IDS: u32 = 5;

// The ids and handlers of the `$2` earliest claimable tasks of the handlers `$1`,
// leaving out the tasks `$5` (taken or found held by an earlier turn of the claim). `$3`
// and `$4` are the claim's `$5` and `$7`.
static EARLIEST: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT candidate.id, candidate.handler \
         FROM (SELECT DISTINCT name FROM unnest($1::text[]) AS l(name)) AS lane \
         CROSS JOIN LATERAL ( \
             SELECT id, handler, next_attempt_at FROM recovery_task \
             WHERE status = 'failed' AND handler = lane.name {} \
               AND id <> ALL ($5::bigint[]) \
             ORDER BY next_attempt_at LIMIT $2) AS candidate \
         ORDER BY candidate.next_attempt_at LIMIT $2",
        claimable("$3", "$4")
    )
});

/// The handlers of `shares` (one per task read, in due order) and how many tasks each has
/// there: each handler's share of the claim.
fn count_shares(shares: &[String]) -> (Vec<String>, Vec<i64>) {
    let mut counted: Vec<(String, i64)> = Vec::new();
    for handler in shares {
        match counted.iter_mut().find(|(name, _)| name == handler) {
            Some((_, n)) => *n += 1,
            None => counted.push((handler.clone(), 1)),
        }
    }
    counted.into_iter().unzip()
}

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

    /// Runs the claim's turns in `tx` (begun with [`DUE_ORDER`]; see the comment on
    /// `CLAIM_TEMPLATE`): tasks due by `due_by` (now when `None`), from `from` on (every
    /// one when `None`).
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
        // The ids an earlier turn took or found held: left out of the later turns.
        let mut passed: Vec<i64> = Vec::new();
        let mut turn = 0u32;
        // A turn by ids reads at least one id more than its last one; a turn by walks
        // leaves out a handler: at most `TURNS_BY_IDS` and one per handler of the lane.
        loop {
            let wanted = limit.saturating_sub(rows.len() as u32);
            if wanted == 0 || lane.is_empty() {
                break;
            }
            let by_ids = turn < TURNS_BY_IDS;
            // Counted from the claim's size, not from what it still wants: a claim that
            // took all but one at once must still pass 30 times its size of held rows.
            let read = match by_ids {
                true => i64::from(limit).saturating_mul(1 << turn),
                false => i64::from(wanted),
            };
            turn += 1;
            let earliest: Vec<(i64, String)> = sqlx::query_as(&EARLIEST)
                .bind(&lane)
                .bind(read)
                .bind(due_by)
                .bind(from)
                .bind(&passed)
                .fetch_all(&mut *tx)
                .await?;
            if earliest.is_empty() {
                break;
            }
            let (ids, shares): (Vec<i64>, Vec<String>) = earliest.into_iter().unzip();
            let (statement, names, eighth) = match by_ids {
                true => (&*BY_IDS, lane.clone(), ids.clone()),
                false => {
                    let (names, counts) = count_shares(&shares);
                    (&*WALK, names, counts)
                }
            };
            let claimed = sqlx::query(statement)
                .bind(&names)
                .bind(i64::from(wanted))
                .bind(owner)
                .bind(millis(lease))
                .bind(due_by)
                .bind(AttemptOutcome::LeaseExpired.as_str())
                .bind(from)
                .bind(&eighth)
                .bind(&passed)
                .fetch_all(&mut *tx)
                .await?;
            let took: Vec<i64> = claimed
                .iter()
                .filter_map(|r| r.try_get::<i64, _>("id").ok())
                .collect();
            let short = took.len() < wanted as usize;
            if by_ids {
                // Short, it looked at every id it read: those it did not take are held
                // (or no longer claimable).
                passed.extend(&ids);
                rows.extend(claimed);
                if short && (ids.len() as i64) < read {
                    // It read every claimable task there is: the rest is held.
                    break;
                }
                continue;
            }
            let (names, counts) = (names, eighth);
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
            passed.extend(&took);
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
