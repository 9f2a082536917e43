//! Circuit breakers in PostgreSQL: one row per handler, changed under its row lock by
//! whichever member sees the reason first, so every member follows one breaker.
//!
//! While a breaker is not closed its handler's waiting tasks are held: their
//! `next_attempt_at` is pushed to the breaker's `hold_until` in the transaction that
//! opens it (or renews the hold), and tasks stored meanwhile start there. No member
//! claims them, whatever its cached view of the breaker, and claims for other handlers
//! do not walk past them. Closing makes the held tasks due at once.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::time::Duration;

use super::filter::{bind_selection, Selection, CONDITION};
use super::lease::DUE_ORDER;
use super::operate::Operator;
use super::{Result, Store, StoreError};
use crate::config::BreakerSettings;
use crate::resilience::breaker::{Breaker, BreakerState, Tally, Transition};
use crate::task::{Status, Task};

const PUSH: &str = "UPDATE recovery_task SET next_attempt_at = $2, updated_at = now() \
    WHERE status = 'failed' AND handler = $1 AND lease_owner IS NULL AND next_attempt_at < $2";

const RELEASE_HELD: &str = "UPDATE recovery_task SET next_attempt_at = now(), updated_at = now() \
    WHERE status = 'failed' AND handler = $1 AND lease_owner IS NULL \
      AND next_attempt_at > now() AND next_attempt_at <= $2";

/// What an operator may ask of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerCommand {
    /// Force it open: no calls until released.
    Open,
    /// Force it closed: calls go through whatever fails.
    Close,
    /// Release a forced state: closed, counting afresh.
    Release,
}

impl BreakerCommand {
    fn forced(self) -> Option<BreakerState> {
        match self {
            BreakerCommand::Open => Some(BreakerState::Open),
            BreakerCommand::Close => Some(BreakerState::Closed),
            BreakerCommand::Release => None,
        }
    }

    /// What it did, as the breaker's reason starts: "forced open", "forced closed",
    /// "released".
    pub fn done(self) -> &'static str {
        match self {
            BreakerCommand::Open => "forced open",
            BreakerCommand::Close => "forced closed",
            BreakerCommand::Release => "released",
        }
    }

    /// The audit log's action name.
    pub fn action(self) -> &'static str {
        match self {
            BreakerCommand::Open => "breaker_open",
            BreakerCommand::Close => "breaker_close",
            BreakerCommand::Release => "breaker_release",
        }
    }
}

impl Store {
    /// The stored breakers of `handlers`, and PostgreSQL's clock as they were read: the
    /// one clock their hold times are compared with.
    pub(crate) async fn breakers_as_of_now(
        &self,
        handlers: &[String],
    ) -> Result<(Vec<Breaker>, DateTime<Utc>)> {
        let now = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.pool)
            .await?;
        let breakers = sqlx::query("SELECT * FROM recovery_breaker WHERE handler = ANY($1)")
            .bind(handlers)
            .fetch_all(&self.pool)
            .await?;
        Ok((
            breakers
                .iter()
                .map(breaker_from_row)
                .collect::<Result<_>>()?,
            now,
        ))
    }

    /// The stored breakers of `handlers` (all of them when `None`), by handler name.
    pub async fn breakers(&self, handlers: Option<&[String]>) -> Result<Vec<Breaker>> {
        let rows = sqlx::query(
            "SELECT * FROM recovery_breaker WHERE $1::text[] IS NULL OR handler = ANY($1) \
             ORDER BY handler",
        )
        .bind(handlers)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(breaker_from_row).collect()
    }

    /// The breakers forced open of the handlers of `selection`'s tasks in one of
    /// `statuses`: none of those tasks runs until its breaker is released.
    pub async fn forced_open_over(
        &self,
        selection: &Selection,
        statuses: &[Status],
    ) -> Result<Vec<Breaker>> {
        let statuses: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        let statement = format!(
            "SELECT * FROM recovery_breaker b WHERE b.forced = 'open' AND EXISTS ( \
                 SELECT 1 FROM recovery_task WHERE {CONDITION} AND status = ANY($20) \
                   AND handler = b.handler) \
             ORDER BY b.handler"
        );
        let rows = bind_selection(sqlx::query(&statement), selection)
            .bind(statuses)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(breaker_from_row).collect()
    }

    /// Applies a member's tally of `handler`'s calls; returns the breaker after it and
    /// the state change it caused, if any.
    pub async fn record_calls(
        &self,
        handler: &str,
        tally: Tally,
        settings: &BreakerSettings,
    ) -> Result<(Breaker, Option<Transition>)> {
        let mut tx = self.pool.begin().await?;
        let (mut breaker, now) = lock(&mut tx, handler).await?;
        let before = breaker.clone();
        let transition = breaker.record(tally, settings, now);
        save(&mut tx, &before, &breaker).await?;
        tx.commit().await?;
        Ok((breaker, transition))
    }

    /// Moves `handler`'s breaker on if its hold has passed (open → half-open, or a
    /// renewed hold); returns it and the state change, if any.
    pub async fn advance_breaker(
        &self,
        handler: &str,
        settings: &BreakerSettings,
    ) -> Result<(Breaker, Option<Transition>)> {
        let mut tx = self.pool.begin().await?;
        let (mut breaker, now) = lock(&mut tx, handler).await?;
        let before = breaker.clone();
        let (_, transition) = breaker.advance(settings, now);
        save(&mut tx, &before, &breaker).await?;
        tx.commit().await?;
        Ok((breaker, transition))
    }

    /// Claims up to `wanted` of `handler`'s held tasks as probes of its half-open
    /// breaker, within the probes it still allows.
    pub async fn claim_probes(
        &self,
        handler: &str,
        settings: &BreakerSettings,
        wanted: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let mut tx = self.pool.begin_with(DUE_ORDER).await?;
        // The claim round's earlier tasks wait to start while this waits for the row.
        sqlx::query(PROBE_LOCK_WAIT).execute(&mut *tx).await?;
        let (mut breaker, _) = lock(&mut tx, handler).await?;
        let available = breaker.probes_available(settings, wanted);
        if available == 0 {
            return Ok(Vec::new());
        }
        let before = breaker.clone();
        let handlers = [handler.to_owned()];
        let rows = self
            .claim_in(
                &mut tx,
                &handlers,
                available,
                owner,
                lease,
                breaker.hold_until,
                None,
            )
            .await?;
        breaker.probes_granted += i32::try_from(rows.len()).unwrap_or(i32::MAX);
        save(&mut tx, &before, &breaker).await?;
        tx.commit().await?;
        Ok(self.decode_claimed(owner, &rows).await?.0)
    }

    /// An operator's command on `handler`'s breaker, audited.
    pub async fn command_breaker(
        &self,
        handler: &str,
        command: BreakerCommand,
        settings: &BreakerSettings,
        operator: &Operator,
    ) -> Result<(Breaker, Option<Transition>)> {
        let mut tx = self.pool.begin().await?;
        let (mut breaker, now) = lock(&mut tx, handler).await?;
        let before = breaker.clone();
        let reason = format!(
            "{} by {}{}",
            command.done(),
            operator.actor,
            operator
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        let transition = breaker.force(command.forced(), settings, now, reason);
        save(&mut tx, &before, &breaker).await?;
        let details = serde_json::json!({ "handler": handler, "state": breaker.state });
        self.insert_audit(&mut tx, operator, command.action(), None, Some(details))
            .await?;
        tx.commit().await?;
        Ok((breaker, transition))
    }
}

/// The breaker row of `handler`, created closed if absent, locked until the end of `tx`.
/// How long a probe claim waits for the breaker row that another member is updating
/// before giving up the round (SQLSTATE 55P03).
const PROBE_LOCK_WAIT: &str = "SET LOCAL lock_timeout = '500ms'";

/// Locks `handler`'s breaker row (creating it closed): the breaker, and PostgreSQL's
/// clock, which every member compares the breaker's times with.
async fn lock(tx: &mut PgConnection, handler: &str) -> Result<(Breaker, DateTime<Utc>)> {
    sqlx::query("INSERT INTO recovery_breaker (handler) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(handler)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(
        "SELECT *, clock_timestamp() AS database_now FROM recovery_breaker \
         WHERE handler = $1 FOR UPDATE",
    )
    .bind(handler)
    .fetch_one(&mut *tx)
    .await?;
    Ok((breaker_from_row(&row)?, row.try_get("database_now")?))
}

/// Writes `after` and moves the handler's waiting tasks: pushed to a new hold, or made
/// due when the breaker closed.
async fn save(tx: &mut PgConnection, before: &Breaker, after: &Breaker) -> Result<()> {
    if before == after {
        return Ok(());
    }
    sqlx::query(
        "UPDATE recovery_breaker SET state = $2, forced = $3, consecutive_failures = $4, \
           window_started_at = $5, window_calls = $6, window_failures = $7, hold_until = $8, \
           probes_granted = $9, changed_at = $10, reason = $11 \
         WHERE handler = $1",
    )
    .bind(&after.handler)
    .bind(after.state.as_str())
    .bind(after.forced.map(BreakerState::as_str))
    .bind(after.consecutive_failures)
    .bind(after.window_started_at)
    .bind(after.window_calls)
    .bind(after.window_failures)
    .bind(after.hold_until)
    .bind(after.probes_granted)
    .bind(after.changed_at)
    .bind(&after.reason)
    .execute(&mut *tx)
    .await?;
    match (before.hold_until, after.hold_until) {
        (_, Some(hold)) if before.hold_until != Some(hold) => {
            sqlx::query(PUSH)
                .bind(&after.handler)
                .bind(hold)
                .execute(&mut *tx)
                .await?;
        }
        (Some(held_until), None) => {
            sqlx::query(RELEASE_HELD)
                .bind(&after.handler)
                .bind(held_until)
                .execute(&mut *tx)
                .await?;
        }
        _ => {}
    }
    Ok(())
}

fn breaker_from_row(row: &PgRow) -> Result<Breaker> {
    let handler: String = row.try_get("handler")?;
    let state = |column: &str| -> Result<Option<BreakerState>> {
        let text: Option<String> = row.try_get(column)?;
        text.map(|t| {
            t.parse()
                .map_err(|e| StoreError::MalformedRow(format!("breaker {handler}: {column}: {e}")))
        })
        .transpose()
    };
    Ok(Breaker {
        state: state("state")?.unwrap_or(BreakerState::Closed),
        forced: state("forced")?,
        consecutive_failures: row.try_get("consecutive_failures")?,
        window_started_at: super::time::required(row, "window_started_at")?,
        window_calls: row.try_get("window_calls")?,
        window_failures: row.try_get("window_failures")?,
        hold_until: super::time::optional(row, "hold_until")?,
        probes_granted: row.try_get("probes_granted")?,
        changed_at: super::time::required(row, "changed_at")?,
        reason: row.try_get("reason")?,
        handler,
    })
}
