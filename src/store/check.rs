//! The invariants a correct store keeps, checked by `redrive tasks check`.

use serde::Serialize;
use sqlx::Row;

use super::budgets::Budgets;
use super::members::MEMBER_LIVE_WITHIN;
use super::{Result, Store};
use crate::task::{AttemptOutcome, TaskId};

/// Violations reported per kind at most (the count says how many there are).
const SHOWN_PER_KIND: i64 = 100;

/// How long past its deadline a lease may stay before a live owner is suspect: its
/// heartbeats should have extended it long before.
const EXPIRED_LEASE_GRACE_SECONDS: f64 = 60.0;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Violation {
    /// Which invariant.
    pub kind: String,
    /// The task that breaks it.
    pub task_id: TaskId,
    /// What is wrong, in words.
    pub detail: String,
}

/// What `check` found.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct CheckReport {
    /// Up to 100 violations of each kind.
    pub violations: Vec<Violation>,
    /// How many violations there are in all, by kind (only kinds with any).
    pub counts: std::collections::BTreeMap<String, i64>,
    /// What threatens the store without breaking an invariant yet (autovacuum off).
    pub warnings: Vec<String>,
}

/// The parameters a check's query takes.
#[derive(Clone, Copy, PartialEq)]
enum Params {
    None,
    /// `$1`..`$6`: the budgets ([`Budgets::bind`]), and the outcomes of a call the
    /// handler answered ([`AttemptOutcome::answered`]).
    Budgets,
    /// `$1`: the outcomes of counted attempts ([`AttemptOutcome::counted`]).
    Counted,
    /// `$1`: seconds a lease may be past its deadline; `$2`: how recent "live" is.
    Liveness,
}

/// The invariants: a name, a query answering `(id, detail)` per violation, its parameters.
const CHECKS: [(&str, &str, Params); 13] = [
    (
        "held_with_nothing_ahead",
        "SELECT h.id, 'held, but no unheld open task of its key is ahead of it' \
         FROM recovery_task h WHERE h.held AND h.status = 'failed' AND NOT EXISTS ( \
             SELECT 1 FROM recovery_task o WHERE o.order_key = h.order_key \
                 AND o.status = 'failed' AND NOT o.held)",
        Params::None
    ),
    (
        "compensation_owed_by_unfinished_task",
        "SELECT c.task_id, 'compensation pending while the task is ' || t.status \
         FROM recovery_compensation c JOIN recovery_task t ON t.id = c.task_id \
         WHERE c.state = 'pending' AND t.status NOT IN ('permanent_failure', 'discarded')",
        Params::None
    ),
    (
        "failed_without_next_attempt",
        "SELECT id, 'failed, but its next attempt time is ' || next_attempt_at::text \
         FROM recovery_task WHERE status = 'failed' AND NOT isfinite(next_attempt_at)",
        Params::None
    ),
    (
        "final_with_lease",
        "SELECT id, status || ' but leased by ' || lease_owner FROM recovery_task \
         WHERE status <> 'failed' AND lease_owner IS NOT NULL",
        Params::None
    ),
    (
        "final_without_finish_time",
        "SELECT id, status || ' with no finish time' FROM recovery_task \
         WHERE status <> 'failed' AND finished_at IS NULL",
        Params::None
    ),
    (
        "failed_with_finish_time",
        "SELECT id, 'failed, yet finished at ' || finished_at::text FROM recovery_task \
         WHERE status = 'failed' AND finished_at IS NOT NULL",
        Params::None
    ),
    (
        "attempts_over_budget",
        "WITH budgeted AS ( \
             SELECT t.id, t.attempts, recovery_attempts_allowed(t, $1, $2, $3, $4, $5) AS allowed \
             FROM recovery_task t) \
         SELECT b.id, 'handler called on attempt ' || a.attempt || ' of ' || b.allowed || ' allowed' \
         FROM budgeted b JOIN recovery_attempt a ON a.task_id = b.id \
         WHERE a.outcome = ANY($6) AND a.attempt > b.allowed \
         UNION ALL \
         SELECT id, attempts || ' attempts counted, ' || allowed || ' allowed (one more may end it unrun)' \
         FROM budgeted WHERE attempts > allowed + 1",
        Params::Budgets
    ),
    (
        "history_mismatch",
        "SELECT t.id, t.attempts || ' attempts counted' || \
                CASE WHEN t.lease_owner IS NULL THEN '' ELSE ' (one running)' END || \
                ', ' || count(a.task_id) || ' finished in the history' \
         FROM recovery_task t LEFT JOIN recovery_attempt a ON a.task_id = t.id \
              AND a.outcome = ANY($1) \
         GROUP BY t.id \
         HAVING count(a.task_id) <> t.attempts - CASE WHEN t.lease_owner IS NULL THEN 0 ELSE 1 END",
        Params::Counted
    ),
    (
        "duplicate_dedup_key",
        "SELECT unnest(ids[2:]), 'dedup key ' || quote_literal(dedup_key) || ' also held by task ' || ids[1] \
         FROM (SELECT dedup_key, array_agg(id ORDER BY id) AS ids FROM recovery_task \
               WHERE dedup_key IS NOT NULL GROUP BY dedup_key HAVING count(*) > 1) d",
        Params::None
    ),
    (
        // A keyed task's key is claimed for it in `recovery_task_dedup`: otherwise a
        // redelivered message would be stored again as a second task.
        "dedup_key_unclaimed",
        "SELECT t.id, 'dedup key ' || quote_literal(t.dedup_key) || \
                coalesce(' is claimed by task ' || d.task_id, ' is not claimed') \
         FROM recovery_task t LEFT JOIN recovery_task_dedup d ON d.dedup_key = t.dedup_key \
         WHERE t.dedup_key IS NOT NULL AND d.task_id IS DISTINCT FROM t.id",
        Params::None
    ),
    (
        // A claimed key whose task is gone or holds another key: harmless (the next
        // message that wants the key takes it back), but a sign of hand-made changes.
        "dedup_claim_orphaned",
        "SELECT d.task_id, 'dedup key ' || quote_literal(d.dedup_key) || ' is claimed for task ' || \
                d.task_id || CASE WHEN t.id IS NULL THEN ', which does not exist' \
                ELSE ', which holds ' || coalesce('key ' || quote_literal(t.dedup_key), 'no key') END \
         FROM recovery_task_dedup d LEFT JOIN recovery_task t ON t.id = d.task_id \
         WHERE t.id IS NULL OR t.dedup_key IS DISTINCT FROM d.dedup_key",
        Params::None
    ),
    (
        // A keyed task's key head is recorded (`recovery_task_key_head`): otherwise a
        // list by a narrow key (console, API, CLI) does not find it.
        "key_head_unrecorded",
        "SELECT t.id, 'key head of ' || octet_length(t.msg_key) || '-byte key not recorded' \
         FROM recovery_task t \
         WHERE t.msg_key IS NOT NULL AND NOT EXISTS ( \
             SELECT 1 FROM recovery_task_key_head k \
             WHERE k.key_head = substring(t.msg_key FROM 1 FOR 64) AND k.task_id = t.id)",
        Params::None
    ),
    (
        "expired_lease_of_live_member",
        "SELECT t.id, 'lease of live member ' || t.lease_owner || ' expired at ' || t.next_attempt_at::text \
         FROM recovery_task t JOIN recovery_member m ON m.id = t.lease_owner \
         WHERE t.status = 'failed' AND t.next_attempt_at < now() - $1 * interval '1 second' \
           AND m.last_seen > now() - $2 * interval '1 second'",
        Params::Liveness
    ),
];

impl Store {
    /// Runs every invariant check. Each reads the whole store: an operator's tool.
    pub async fn check(&self, budgets: &Budgets) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        for (kind, query, params) in CHECKS {
            let statement = format!(
                "WITH v(id, detail) AS ({query}) \
                 SELECT id, detail, count(*) OVER () AS total FROM v ORDER BY id LIMIT {SHOWN_PER_KIND}"
            );
            let q = sqlx::query(&statement);
            let q = match params {
                Params::None => q,
                Params::Budgets => budgets
                    .bind(q)
                    .bind(AttemptOutcome::values_where(AttemptOutcome::answered)),
                Params::Counted => q.bind(AttemptOutcome::values_where(AttemptOutcome::counted)),
                Params::Liveness => q
                    .bind(EXPIRED_LEASE_GRACE_SECONDS)
                    .bind(MEMBER_LIVE_WITHIN.as_secs_f64()),
            };
            let rows = q.fetch_all(&self.pool).await?;
            if let Some(first) = rows.first() {
                report
                    .counts
                    .insert(kind.to_owned(), first.try_get::<i64, _>("total")?);
            }
            for row in rows {
                report.violations.push(Violation {
                    kind: kind.to_owned(),
                    task_id: TaskId(row.try_get("id")?),
                    detail: row
                        .try_get::<Option<String>, _>("detail")?
                        .unwrap_or_default(),
                });
            }
        }
        report.warnings = self.autovacuum_off().await?;
        Ok(report)
    }
}
