//! A randomized model test of the store's leases. Simulated workers claim, heartbeat,
//! finish (resolved, retry at a time, permanent), release, crash and lose their leases
//! in random interleavings, while an operator retries, discards and resolves tasks
//! (some of them leased), and a claim round's later statement (a limited handler's
//! claim) fails at random. Some tasks share an order key (a route's `ordering = "key"`):
//! whatever is enqueued, claimed, finished, retried or discarded, every key with open
//! tasks has exactly one that may run, the others held (their due times are then the
//! database's, not predicted). In half the cases the handler compensates: a permanent
//! failure owes a compensation, which a compensator claims and finishes (or leaves
//! running), and an operator's retry or resolve of a task whose compensation has
//! started is refused unless forced (forcing cancels a pending one); a discard never
//! needs force. Now and then a task's stored headers are made unreadable: its claim,
//! or its compensation's, ends it instead of returning it. After every step the rows
//! in PostgreSQL must agree with a small in-memory model: which writes landed,
//! attempts, lease columns, due times and the attempt history (one row per counted
//! attempt). Each case ends by driving every task to a final state, then `check` must
//! find the whole store sound.
//!
//! `REDRIVE_MODEL_CASES` (default 200) sets the number of cases and `REDRIVE_MODEL_SEED`
//! the first case's seed (default: random); a failure names the seed that replays it.
//! Cases share one schema, each with a handler of its own, and run a few at a time.

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use redrive::store::{
    Action, Budget, Budgets, CompensationOutcome, CompensationResult, Finish, Operator, Selection,
};
use redrive::task::FinishOutcome;
use redrive::{Lease, NewTask, Store, TaskId};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::fresh_store;

/// Long enough never to lapse by itself: lapses are simulated by moving deadlines.
const LEASE: Duration = Duration::from_secs(3600);
/// Cases run at once.
const PARALLEL: usize = 4;

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

type Checked<T = ()> = Result<T, String>;

fn db<T>(result: Result<T, impl std::fmt::Display>) -> Checked<T> {
    result.map_err(|e| format!("database error: {e}"))
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: not a whole number")),
    )
}

#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn the_store_agrees_with_a_model_of_leases_under_random_interleavings() {
    let cases = env_number("REDRIVE_MODEL_CASES").unwrap_or(200);
    let first_seed = env_number("REDRIVE_MODEL_SEED").unwrap_or_else(rand::random);
    eprintln!("model: {cases} cases from seed {first_seed} (REDRIVE_MODEL_SEED replays them)");
    let (store, _) = fresh_store().await;
    plant_claim_fault(&store).await;
    let mut running = tokio::task::JoinSet::new();
    let mut failures = BTreeMap::new();
    for seed in (0..cases).map(|i| first_seed.wrapping_add(i)) {
        if running.len() >= PARALLEL {
            failures.extend(running.join_next().await.unwrap().unwrap());
        }
        let store = store.clone();
        running.spawn(async move { Case::new(store, seed).run().await.err().map(|e| (seed, e)) });
    }
    while let Some(done) = running.join_next().await {
        failures.extend(done.unwrap());
    }
    if let Some((_, first)) = failures.first_key_value() {
        panic!(
            "{} of {cases} model cases failed (seeds from {first_seed}); the first:\n{first}",
            failures.len()
        );
    }
}

/// Ends the handler names of faulty claims: a claim of such a task fails (as
/// `hardening::a_claim_round_that_fails_half_way_starts_what_it_claimed` plants it).
const FAULTY: &str = "!faulty";

/// Makes every claim of a task whose handler ends in [`FAULTY`] fail with a data
/// error, the statement rolled back.
async fn plant_claim_fault(store: &Store) {
    for statement in [
        "CREATE FUNCTION model_refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'planted claim fault' USING ERRCODE = '22003'; END $$",
        "CREATE TRIGGER model_refuse_claim BEFORE UPDATE OF lease_owner ON recovery_task \
         FOR EACH ROW WHEN (NEW.handler LIKE '%!faulty' AND NEW.lease_owner IS NOT NULL) \
         EXECUTE FUNCTION model_refuse_claim()",
    ] {
        sqlx::query(statement).execute(store.pool()).await.unwrap();
    }
}

/// A time the model knows exactly, or only within the window of the call that set it
/// (the database's `now()`); the next comparison with the database pins it down.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Time {
    At(DateTime<Utc>),
    Between(DateTime<Utc>, DateTime<Utc>),
}

impl Time {
    fn within(start: DateTime<Utc>, end: DateTime<Utc>, offset: Duration) -> Time {
        let offset = chrono::Duration::from_std(offset).unwrap();
        Time::Between(start + offset, end + offset)
    }

    fn exact(self) -> DateTime<Utc> {
        match self {
            Time::At(at) => at,
            Time::Between(..) => panic!("time not pinned down yet"),
        }
    }

    /// Checks the database's value and pins this time to it.
    fn pin(&mut self, actual: DateTime<Utc>) -> bool {
        let slack = chrono::Duration::milliseconds(5);
        let ok = match *self {
            Time::At(at) => at == actual,
            Time::Between(start, end) => start - slack <= actual && actual <= end + slack,
        };
        *self = Time::At(actual);
        ok
    }
}

/// The columns of one task the model predicts.
#[derive(Debug, Clone)]
struct Row {
    status: &'static str,
    attempts: i32,
    owner: Option<String>,
    version: i64,
    leased_at: Option<Time>,
    next_at: Time,
}

/// One predicted row of `recovery_attempt`.
#[derive(Debug, Clone)]
struct HistoryRow {
    version: i64,
    attempt: i32,
    worker: String,
    outcome: &'static str,
    started_at: Time,
    /// `None`: the store words the error itself.
    error: Option<Option<String>>,
}

#[derive(Debug)]
struct ModelTask {
    row: Row,
    history: Vec<HistoryRow>,
    /// Its stored headers were overwritten with bytes that cannot be decoded.
    corrupt: bool,
    /// Enqueued with an order key: held behind its key's open task while there is one.
    ordered: bool,
    /// Its order key's number, if ordered.
    key: Option<u8>,
    /// Its row of `recovery_compensation`, once it owes one.
    compensation: Option<Compensation>,
}

/// The predicted row of a task's compensation.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Compensation {
    state: &'static str,
    attempts: i32,
    version: i64,
    /// Claimed and not finished: due a lease ahead, never again within a case.
    running: bool,
}

impl Compensation {
    /// Whether it has started for its task's current failure (see `store/operate.rs`).
    fn started(&self, task_status: &str) -> bool {
        matches!(task_status, "permanent_failure" | "discarded")
            && self.attempts > 0
            && self.state != "cancelled"
    }
}

/// Order keys per case: few, so that keys have several tasks.
const ORDER_KEYS: u8 = 2;

/// One randomized run against its own handler.
struct Case {
    store: Store,
    seed: u64,
    handler: String,
    rng: StdRng,
    tasks: BTreeMap<i64, ModelTask>,
    /// Leases each worker believes it holds (some of them stale).
    workers: Vec<Vec<Lease>>,
    log: Vec<String>,
    /// Whether this case's handler compensates its permanent failures.
    compensates: bool,
    /// Compensation claims a compensator holds (task id, claim version), some stale.
    compensation_claims: Vec<(i64, i64)>,
    /// Calls an operator fenced whose workers have not said they stopped (task id, the
    /// fenced lease's version): the task and its key are not claimed meanwhile.
    stopping: Vec<(i64, i64)>,
}

fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap()
}

fn worker_name(w: usize) -> String {
    format!("w{w}")
}

impl Case {
    fn new(store: Store, seed: u64) -> Case {
        let mut rng = StdRng::seed_from_u64(seed);
        let workers = vec![Vec::new(); rng.random_range(2..=4)];
        let compensates = rng.random_bool(0.5);
        Case {
            store,
            seed,
            handler: format!("m{seed:016x}"),
            rng,
            tasks: BTreeMap::new(),
            workers,
            log: Vec::new(),
            compensates,
            compensation_claims: Vec::new(),
            stopping: Vec::new(),
        }
    }

    async fn run(mut self) -> Checked {
        let outcome = self.steps().await;
        outcome.map_err(|error| {
            let tail = self.log.len().saturating_sub(12);
            format!(
                "seed {seed} (replay: REDRIVE_MODEL_SEED={seed} REDRIVE_MODEL_CASES=1 \
                 cargo test --test it model::): {error}\nlast steps:\n  {}",
                self.log[tail..].join("\n  "),
                seed = self.seed
            )
        })
    }

    async fn steps(&mut self) -> Checked {
        let initial = self.rng.random_range(2..=6);
        self.enqueue(initial).await?;
        self.enqueue_faulty().await?;
        self.compare().await?;
        for _ in 0..self.rng.random_range(15..=45) {
            let w = self.rng.random_range(0..self.workers.len());
            match self.rng.random_range(0..100) {
                0..=7 if self.tasks.len() < 12 => {
                    let n = self.rng.random_range(1..=2);
                    self.enqueue(n).await?;
                }
                0..=20 => {
                    let limit = self.rng.random_range(1..=4);
                    self.claim(w, limit).await?;
                }
                21..=27 => {
                    let limit = self.rng.random_range(1..=4);
                    self.claim_round_failing_half_way(w, limit).await?;
                }
                28..=38 => self.heartbeat(w).await?,
                39..=63 => self.finish(w, false).await?,
                64..=71 => self.release(w).await?,
                72..=80 => self.lapse().await?,
                81..=86 => self.time_passes().await?,
                87..=89 => {
                    self.log.push(format!("{} crashes", worker_name(w)));
                    self.workers[w].clear();
                }
                90..=94 => self.operate().await?,
                95..=97 => self.compensate().await?,
                _ => self.corrupt(false).await?,
            }
            self.compare().await?;
        }
        self.drive_to_completion().await
    }

    /// Time passes until everything is due, a last worker claims every task and
    /// finishes each for good.
    async fn drive_to_completion(&mut self) -> Checked {
        let last = self.workers.len();
        self.workers.push(Vec::new());
        // Each round ends the tasks that may run; a key's next one is released then.
        for _ in 0..=self.tasks.len() {
            if self.unfinished().is_empty() {
                break;
            }
            self.time_passes().await?;
            self.compare().await?;
            let unfinished = self.unfinished().len() as u32;
            self.claim(last, unfinished + 1).await?;
            self.compare().await?;
            self.finish(last, true).await?;
            self.compare().await?;
        }
        ensure!(
            self.unfinished().is_empty(),
            "tasks {:?} not final at the end",
            self.unfinished()
        );
        let open: i64 = db(sqlx::query_scalar(
            "SELECT count(*) FROM recovery_task WHERE handler = $1 AND status = 'failed'",
        )
        .bind(&self.handler)
        .fetch_one(self.store.pool())
        .await)?;
        ensure!(open == 0, "{open} tasks still open in the database");
        // The whole store (other cases are mid-flight) keeps every invariant.
        let budgets = Budgets {
            default: i32::MAX / 2,
            ..Budgets::default()
        };
        let report = db(self.store.check(&budgets).await)?;
        ensure!(
            report.violations.is_empty(),
            "check: {:?}",
            report.violations
        );
        Ok(())
    }

    /// An operator retries, discards or resolves one task, maybe one a worker holds,
    /// often one whose compensation has started.
    async fn operate(&mut self) -> Checked {
        if self.compensates && self.rng.random_bool(0.5) {
            // Often, compensations have just run when an operator looks.
            self.compensate().await?;
        }
        let started: Vec<i64> = (self.tasks.iter())
            .filter(|(_, t)| t.compensation.is_some_and(|c| c.started(t.row.status)))
            .map(|(id, _)| *id)
            .collect();
        let candidates = if !started.is_empty() && self.rng.random_bool(0.5) {
            started
        } else {
            self.tasks.keys().copied().collect()
        };
        let Some(&id) = candidates.choose(&mut self.rng) else {
            return Ok(());
        };
        let force = self.rng.random_bool(0.3);
        let (action, new_status) = match self.rng.random_range(0..3) {
            0 => (
                Action::Retry {
                    at: None,
                    budget: Budget::Fresh,
                    force,
                },
                "failed",
            ),
            1 => (Action::Discard, "discarded"),
            _ => (Action::Resolve { force }, "resolved"),
        };
        let operator = Operator {
            actor: "op".into(),
            reason: Some("model".into()),
        };
        let start = now();
        let report = db(self
            .store
            .act(&operator, &action, &Selection::Ids(vec![TaskId(id)]))
            .await)?;
        let end = now();
        let task = self.tasks.get_mut(&id).unwrap();
        let in_status = match action {
            Action::Retry { .. } => task.row.status != "resolved",
            _ => matches!(task.row.status, "failed" | "permanent_failure"),
        };
        let refused = in_status
            && action.spares_compensations()
            && task
                .compensation
                .is_some_and(|c| c.started(task.row.status));
        let applies = in_status && !refused;
        self.log.push(format!(
            "operator {}{} task {id} ({}, compensation {:?}): changed {}, refused {}",
            action.name(),
            if force { " --force" } else { "" },
            task.row.status,
            task.compensation,
            report.changed,
            report.refused
        ));
        ensure!(
            (report.changed, report.refused) == (i64::from(applies), i64::from(refused)),
            "operator {}: changed {}, refused {} of task {id} in {} (compensation {:?})",
            action.name(),
            report.changed,
            report.refused,
            task.row.status,
            task.compensation
        );
        if !applies {
            return Ok(());
        }
        // A retried or resolved task no longer owes a compensation not yet done.
        if let Some(c) = &mut task.compensation {
            if c.state == "pending" && new_status != "discarded" {
                c.state = "cancelled";
                c.version += 1;
                c.running = false;
            }
        }
        let row = &mut task.row;
        if row.owner.is_some() && !matches!(row.next_at, Time::At(at) if at <= end) {
            // Its call runs on until its worker hears of the action.
            self.stopping.push((id, row.version));
        }
        if let Some(owner) = row.owner.take() {
            task.history.push(HistoryRow {
                version: row.version,
                attempt: row.attempts,
                worker: owner,
                outcome: "fenced",
                started_at: row.leased_at.take().expect("a lease has a start"),
                error: None,
            });
        }
        row.version += 1;
        row.leased_at = None;
        row.status = new_status;
        if new_status == "failed" {
            row.next_at = Time::Between(start, end);
        }
        task.history.push(HistoryRow {
            version: row.version,
            attempt: row.attempts,
            worker: "op".into(),
            outcome: match action {
                Action::Retry { .. } => "operator_retry",
                Action::Discard => "operator_discard",
                Action::Resolve { .. } => "operator_resolve",
            },
            started_at: Time::Between(start, end),
            error: Some(Some("model".into())),
        });
        let fenced = self
            .stopping
            .last()
            .copied()
            .filter(|(task, _)| *task == id);
        if let Some((_, version)) = fenced {
            if self.rng.random_bool(0.5) {
                self.stopped(id, version).await?;
            }
        }
        Ok(())
    }

    /// The worker whose call of task `id` under lease `version` an operator fenced says
    /// the call stopped.
    async fn stopped(&mut self, id: i64, version: i64) -> Checked {
        let lease = Lease {
            id: TaskId(id),
            version,
        };
        db(self.store.calls_stopped(&[lease]).await)?;
        self.stopping.retain(|fenced| *fenced != (id, version));
        self.log.push(format!(
            "the fenced call of task {id} (lease {version}) stopped"
        ));
        Ok(())
    }

    /// Whether a fenced call not yet stopped holds task `id` back (its own, or one of
    /// its key's).
    fn held_back(&self, id: i64) -> bool {
        let key = self.tasks[&id].key;
        self.stopping
            .iter()
            .any(|(fenced, _)| *fenced == id || (key.is_some() && self.tasks[fenced].key == key))
    }

    fn unfinished(&self) -> Vec<i64> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.row.status == "failed")
            .map(|(id, _)| *id)
            .collect()
    }

    async fn enqueue(&mut self, n: usize) -> Checked {
        let now = now();
        let mut keys = Vec::with_capacity(n);
        let tasks: Vec<NewTask> = (0..n)
            .map(|i| {
                let mut task = NewTask::new(&self.handler, vec![i as u8]);
                if self.rng.random_bool(0.4) {
                    let key = [self.rng.random_range(0..ORDER_KEYS)];
                    keys.push(Some(key[0]));
                    task.order_key = Some(redrive::task::order_key(&self.handler, &key));
                }
                let offset = if self.rng.random_bool(0.2) {
                    self.rng.random_range(600..3000)
                } else {
                    -self.rng.random_range(1..3000)
                };
                if keys.len() <= i {
                    keys.push(None);
                }
                task.next_attempt_at = Some(now + chrono::Duration::seconds(offset));
                task
            })
            .collect();
        let stored = db(self.store.enqueue_many(&tasks).await)?;
        for ((task, stored), key) in tasks.iter().zip(stored).zip(keys) {
            ensure!(
                matches!(stored, redrive::Enqueued::Created(_)),
                "enqueue answered {stored:?}"
            );
            let row = Row {
                status: "failed",
                attempts: 0,
                owner: None,
                version: 0,
                leased_at: None,
                next_at: Time::At(task.next_attempt_at.unwrap()),
            };
            self.tasks.insert(
                stored.id().0,
                ModelTask {
                    row,
                    history: Vec::new(),
                    corrupt: false,
                    compensation: None,
                    ordered: task.order_key.is_some(),
                    key,
                },
            );
        }
        self.log.push(format!("enqueue {n}"));
        Ok(())
    }

    /// The name of this case's limited handler whose claims fail.
    fn faulty_handler(&self) -> String {
        format!("{}{FAULTY}", self.handler)
    }

    /// A due task of the faulty handler, outside the model (no claim of it ever lands).
    async fn enqueue_faulty(&mut self) -> Checked {
        let task = NewTask::new(self.faulty_handler(), vec![0]);
        db(self.store.enqueue_many(&[task]).await)?;
        Ok(())
    }

    /// A claim round as a member runs it: the shared claim, then a limited handler's
    /// claim that fails. The second statement changes nothing; what the first claimed
    /// stays claimed, and the worker keeps it to run (it is finished, released or
    /// lapses like any other lease, and so never loses an attempt unrun).
    async fn claim_round_failing_half_way(&mut self, w: usize, limit: u32) -> Checked {
        self.claim(w, limit).await?;
        let faulty = self.faulty_handler();
        let failed = self
            .store
            .claim(std::slice::from_ref(&faulty), limit, &worker_name(w), LEASE)
            .await;
        self.log.push(format!(
            "{} claims the faulty handler: {failed:?}",
            worker_name(w)
        ));
        ensure!(failed.is_err(), "the faulty claim succeeded: {failed:?}");
        let untouched: (i32, Option<String>, i64) = db(sqlx::query_as(
            "SELECT attempts, lease_owner, lease_version FROM recovery_task WHERE handler = $1",
        )
        .bind(&faulty)
        .fetch_one(self.store.pool())
        .await)?;
        ensure!(
            untouched == (0, None, 0),
            "a failed claim left its trace: {untouched:?}"
        );
        Ok(())
    }

    async fn claim(&mut self, w: usize, limit: u32) -> Checked {
        let name = worker_name(w);
        let start = now();
        let claimed = db(self
            .store
            .claim(std::slice::from_ref(&self.handler), limit, &name, LEASE)
            .await)?;
        let end = now();
        let returned: BTreeSet<i64> = claimed.iter().map(|t| t.id.0).collect();
        self.log
            .push(format!("{name} claims up to {limit}: got {returned:?}"));
        let due: Vec<i64> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.row.status == "failed" && t.row.next_at.exact() <= start)
            .map(|(id, _)| *id)
            .filter(|id| !self.held_back(*id))
            .collect();
        // Unreadable rows are claimed too, but ended at once instead of returned.
        let corrupt_due: Vec<i64> = due
            .iter()
            .copied()
            .filter(|id| self.tasks[id].corrupt)
            .collect();
        let versions: Vec<(i64, i64)> = db(sqlx::query_as(
            "SELECT id, lease_version FROM recovery_task WHERE id = ANY($1)",
        )
        .bind(&corrupt_due)
        .fetch_all(self.store.pool())
        .await)?;
        let ended: BTreeSet<i64> = versions
            .into_iter()
            .filter(|(id, version)| *version != self.tasks[id].row.version)
            .map(|(id, _)| id)
            .collect();
        ensure!(
            returned.is_disjoint(&ended),
            "unreadable tasks {ended:?} were returned"
        );
        let taken: BTreeSet<i64> = returned.union(&ended).copied().collect();
        ensure!(
            taken.len() == due.len().min(limit as usize),
            "claimed {taken:?} (limit {limit}) of due {due:?}"
        );
        ensure!(
            taken.iter().all(|id| due.contains(id)),
            "claimed {taken:?}, not all due (due {due:?})"
        );
        let next_at = |id: &i64| self.tasks[id].row.next_at.exact();
        let latest_taken = taken.iter().map(next_at).max();
        let earliest_left = due
            .iter()
            .filter(|id| !taken.contains(id))
            .map(next_at)
            .min();
        if let (Some(taken), Some(left)) = (latest_taken, earliest_left) {
            ensure!(
                taken <= left,
                "a later task was claimed before an earlier one"
            );
        }

        for id in &taken {
            let task = self.tasks.get_mut(id).unwrap();
            let row = &mut task.row;
            if let Some(owner) = row.owner.take() {
                task.history.push(HistoryRow {
                    version: row.version,
                    attempt: row.attempts,
                    worker: owner,
                    outcome: "lease_expired",
                    started_at: row.leased_at.expect("a lease has a start"),
                    error: None,
                });
            }
            row.attempts += 1;
            row.version += 1;
            row.leased_at = Some(Time::Between(start, end));
            row.next_at = Time::within(start, end, LEASE);
            if ended.contains(id) {
                row.status = "permanent_failure";
                row.leased_at = None;
                task.history.push(HistoryRow {
                    version: row.version,
                    attempt: row.attempts,
                    worker: name.clone(),
                    outcome: "permanent_failure",
                    started_at: Time::Between(start, end),
                    error: None,
                });
            } else {
                row.owner = Some(name.clone());
            }
        }
        for task in &claimed {
            let row = &self.tasks[&task.id.0].row;
            ensure!(
                (task.attempts, task.lease_version, task.lease_owner.as_ref())
                    == (row.attempts, row.version, row.owner.as_ref()),
                "claim returned {:?} for task {}, model says {row:?}",
                (task.attempts, task.lease_version, &task.lease_owner),
                task.id
            );
            self.workers[w].push(task.lease());
        }
        Ok(())
    }

    /// A random subset of a worker's leases, at most one per task.
    fn pick_leases(&mut self, w: usize, all: bool) -> Vec<Lease> {
        let mut held = self.workers[w].clone();
        held.shuffle(&mut self.rng);
        let keep = if all || held.is_empty() {
            held.len()
        } else {
            self.rng.random_range(1..=held.len())
        };
        let mut seen = BTreeSet::new();
        held.into_iter()
            .take(keep)
            .filter(|l| seen.insert(l.id))
            .collect()
    }

    /// Whether a write under `lease` should land.
    fn holds(&self, lease: &Lease) -> bool {
        let row = &self.tasks[&lease.id.0].row;
        row.owner.is_some() && row.version == lease.version
    }

    /// Forgets the leases just used, mostly: a worker that keeps one tries again later
    /// with a token that went stale.
    fn forget(&mut self, w: usize, used: &[Lease]) {
        let rng = &mut self.rng;
        self.workers[w].retain(|l| !used.contains(l) || rng.random_bool(0.15));
    }

    async fn heartbeat(&mut self, w: usize) -> Checked {
        let leases = self.pick_leases(w, false);
        let start = now();
        let written = db(self.store.heartbeat(&leases, LEASE).await)?;
        let end = now();
        self.log.push(format!(
            "{} heartbeats {leases:?}: wrote {written:?}",
            worker_name(w)
        ));
        let expected: Vec<Lease> = leases.iter().filter(|l| self.holds(l)).copied().collect();
        same_ids(&written, &expected, "heartbeat")?;
        for lease in expected {
            self.tasks.get_mut(&lease.id.0).unwrap().row.next_at = Time::within(start, end, LEASE);
        }
        Ok(())
    }

    fn random_outcome(&mut self, final_only: bool) -> (FinishOutcome, Option<String>) {
        let now = now();
        let roll = if final_only {
            self.rng.random_range(0..2) * 3
        } else {
            self.rng.random_range(0..4)
        };
        match roll {
            0 => (FinishOutcome::Resolved, None),
            1 => {
                let at = now - chrono::Duration::seconds(self.rng.random_range(1..3000));
                (FinishOutcome::Retry { at }, Some("503, due again".into()))
            }
            2 => {
                let at = now + chrono::Duration::seconds(self.rng.random_range(600..3000));
                (FinishOutcome::Retry { at }, Some("503, later".into()))
            }
            _ => (FinishOutcome::PermanentFailure, Some("invalid".into())),
        }
    }

    async fn finish(&mut self, w: usize, final_only: bool) -> Checked {
        let name = worker_name(w);
        let leases = self.pick_leases(w, final_only);
        let results: Vec<Finish> = leases
            .iter()
            .map(|lease| {
                let (outcome, error) = self.random_outcome(final_only);
                Finish {
                    cause: None,
                    lease: *lease,
                    outcome,
                    started_at: now()
                        - chrono::Duration::milliseconds(self.rng.random_range(0..5000)),
                    duration: Duration::from_millis(self.rng.random_range(0..5000)),
                    error,
                    compensate: self.compensates,
                }
            })
            .collect();
        let sent = now();
        let written = db(self.store.finish(&name, &results).await)?;
        // A retry is due as long after the database's now as it was asked after ours.
        let latency = now() - sent;
        self.log.push(format!(
            "{name} finishes {:?}: wrote {written:?}",
            results
                .iter()
                .map(|r| (r.lease.id.0, r.lease.version, r.outcome.history().as_str()))
                .collect::<Vec<_>>()
        ));
        let expected: Vec<Lease> = leases.iter().filter(|l| self.holds(l)).copied().collect();
        same_ids(&written, &expected, "finish")?;
        for result in results.iter().filter(|r| expected.contains(&r.lease)) {
            let task = self.tasks.get_mut(&result.lease.id.0).unwrap();
            let row = &mut task.row;
            row.status = match result.outcome {
                FinishOutcome::Resolved => "resolved",
                FinishOutcome::Retry { at } => {
                    row.next_at = Time::Between(at, at + latency);
                    "failed"
                }
                FinishOutcome::PermanentFailure | FinishOutcome::NotCalled => "permanent_failure",
            };
            row.owner = None;
            row.leased_at = None;
            if row.status == "permanent_failure" && self.compensates {
                // Owed anew, even by a task compensated before it was retried.
                task.compensation = Some(Compensation {
                    state: "pending",
                    attempts: 0,
                    version: task.compensation.map_or(0, |c| c.version + 1),
                    running: false,
                });
            }
            task.history.push(HistoryRow {
                version: result.lease.version,
                attempt: row.attempts,
                worker: name.clone(),
                outcome: result.outcome.history().as_str(),
                started_at: Time::At(result.started_at),
                error: Some(result.error.clone()),
            });
        }
        self.forget(w, &leases);
        Ok(())
    }

    /// A compensator claims every due compensation, then writes results under some of
    /// the claims it holds (some of them stale: cancelled by an operator, or owed anew).
    async fn compensate(&mut self) -> Checked {
        if self.rng.random_bool(0.25) {
            // Now and then a task owing one cannot be read by the time it is claimed.
            self.corrupt(true).await?;
        }
        let claimed = db(self
            .store
            .claim_compensations(
                std::slice::from_ref(&self.handler),
                100,
                "compensator",
                LEASE,
            )
            .await)?;
        let got: BTreeSet<i64> = claimed.iter().map(|c| c.task.id.0).collect();
        let (unreadable, due): (BTreeSet<i64>, BTreeSet<i64>) = (self.tasks.iter())
            .filter(|(_, t)| {
                t.compensation
                    .is_some_and(|c| c.state == "pending" && !c.running)
            })
            .map(|(id, _)| *id)
            .partition(|id| self.tasks[id].corrupt);
        self.log.push(format!("compensator claims {got:?}"));
        ensure!(got == due, "compensations claimed {got:?}, due {due:?}");
        // One whose task cannot be read is claimed too, but ended failed at once.
        for id in unreadable {
            let c = (self.tasks.get_mut(&id).unwrap().compensation)
                .as_mut()
                .unwrap();
            c.attempts += 1;
            c.version += 2;
            c.state = "failed";
        }
        for claim in &claimed {
            let c = (self.tasks.get_mut(&claim.task.id.0).unwrap().compensation)
                .as_mut()
                .unwrap();
            c.attempts += 1;
            c.version += 1;
            c.running = true;
            ensure!(
                (claim.version, claim.attempt) == (c.version, c.attempts),
                "compensation claim {claim:?} of task {}, model {c:?}",
                claim.task.id
            );
            self.compensation_claims
                .push((claim.task.id.0, claim.version));
        }
        self.compensation_claims.shuffle(&mut self.rng);
        let finishing = self.rng.random_range(0..=self.compensation_claims.len());
        for (id, version) in self.compensation_claims.split_off(finishing) {
            let outcome = match self.rng.random_range(0..3) {
                0 => CompensationOutcome::Compensated,
                1 => CompensationOutcome::Failed,
                _ => CompensationOutcome::Retry { at: now() },
            };
            let written = db(self
                .store
                .finish_compensation(
                    "compensator",
                    &CompensationResult {
                        task_id: TaskId(id),
                        version,
                        outcome,
                        started_at: now(),
                        duration: Duration::ZERO,
                        error: None,
                    },
                )
                .await)?;
            let c = (self.tasks.get_mut(&id).unwrap().compensation)
                .as_mut()
                .unwrap();
            let lands = c.version == version && c.state == "pending";
            self.log.push(format!(
                "compensator finishes {id}@{version} {outcome:?}: {written}"
            ));
            ensure!(
                written == lands,
                "compensation result {outcome:?} under claim {version} of task {id}: \
                 written {written}, model {c:?}"
            );
            if lands {
                c.version += 1;
                c.running = false;
                c.state = match outcome {
                    CompensationOutcome::Compensated => "compensated",
                    CompensationOutcome::Failed => "failed",
                    CompensationOutcome::Retry { .. } => "pending",
                };
            }
        }
        Ok(())
    }

    async fn release(&mut self, w: usize) -> Checked {
        let name = worker_name(w);
        let leases = self.pick_leases(w, false);
        let start = now();
        let written = db(self.store.release(&name, &leases).await)?;
        let end = now();
        self.log
            .push(format!("{name} releases {leases:?}: wrote {written:?}"));
        let expected: Vec<Lease> = leases.iter().filter(|l| self.holds(l)).copied().collect();
        // Release answers with ids (it bumps the token): the leases given of those ids.
        let written: Vec<Lease> = leases
            .iter()
            .filter(|l| written.contains(&l.id))
            .copied()
            .collect();
        same_ids(&written, &expected, "release")?;
        for lease in &expected {
            let task = self.tasks.get_mut(&lease.id.0).unwrap();
            let row = &mut task.row;
            task.history.push(HistoryRow {
                version: lease.version,
                attempt: row.attempts,
                worker: name.clone(),
                outcome: "released",
                started_at: row.leased_at.take().expect("a lease has a start"),
                error: None,
            });
            row.attempts -= 1;
            row.version += 1;
            row.owner = None;
            row.next_at = Time::Between(start, end);
        }
        self.forget(w, &leases);
        Ok(())
    }

    /// A lease's deadline passes (its worker stalled or died).
    async fn lapse(&mut self) -> Checked {
        let leased: Vec<i64> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.row.owner.is_some())
            .map(|(id, _)| *id)
            .collect();
        let Some(&id) = leased.choose(&mut self.rng) else {
            return Ok(());
        };
        let at = now() - chrono::Duration::seconds(self.rng.random_range(1..3000));
        db(
            sqlx::query("UPDATE recovery_task SET next_attempt_at = $2 WHERE id = $1")
                .bind(id)
                .bind(at)
                .execute(self.store.pool())
                .await,
        )?;
        self.tasks.get_mut(&id).unwrap().row.next_at = Time::At(at);
        self.log.push(format!("lease of task {id} lapses"));
        Ok(())
    }

    /// Two hours pass: every lease lapses and every retry is due.
    async fn time_passes(&mut self) -> Checked {
        db(sqlx::query(
            "UPDATE recovery_task SET next_attempt_at = next_attempt_at - interval '2 hours' \
             WHERE handler = $1 AND status = 'failed'",
        )
        .bind(&self.handler)
        .execute(self.store.pool())
        .await)?;
        for task in self.tasks.values_mut() {
            if task.row.status == "failed" {
                task.row.next_at = Time::At(task.row.next_at.exact() - chrono::Duration::hours(2));
            }
        }
        // Every fenced call's old lease (an hour) has ended: nothing is held back.
        let fenced: Vec<i64> = self.stopping.drain(..).map(|(id, _)| id).collect();
        db(sqlx::query(
            "UPDATE recovery_stopping_call SET ends_by = ends_by - interval '2 hours' \
             WHERE task_id = ANY($1)",
        )
        .bind(fenced)
        .execute(self.store.pool())
        .await)?;
        self.log.push("two hours pass".into());
        Ok(())
    }

    /// Someone writes header bytes that cannot be decoded into an unfinished task or
    /// one that owes a compensation (only the latter when `owing`).
    async fn corrupt(&mut self, owing: bool) -> Checked {
        let candidates: Vec<i64> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                !t.corrupt
                    && ((t.row.status == "failed" && !owing)
                        || t.compensation.is_some_and(|c| c.state == "pending"))
            })
            .map(|(id, _)| *id)
            .collect();
        let Some(&id) = candidates.choose(&mut self.rng) else {
            return Ok(());
        };
        db(
            sqlx::query("UPDATE recovery_task SET msg_headers = '\\x0100'::bytea WHERE id = $1")
                .bind(id)
                .execute(self.store.pool())
                .await,
        )?;
        self.tasks.get_mut(&id).unwrap().corrupt = true;
        self.log.push(format!("task {id} gets unreadable headers"));
        Ok(())
    }

    /// Compares every row of this case's tasks and history with the model.
    async fn compare(&mut self) -> Checked {
        type TaskRow = (
            i64,
            String,
            i32,
            Option<String>,
            i64,
            Option<DateTime<Utc>>,
            DateTime<Utc>,
        );
        let rows: Vec<TaskRow> = db(sqlx::query_as(
            "SELECT id, status, attempts, lease_owner, lease_version, leased_at, next_attempt_at \
             FROM recovery_task WHERE handler = $1 ORDER BY id",
        )
        .bind(&self.handler)
        .fetch_all(self.store.pool())
        .await)?;
        ensure!(
            rows.iter().map(|r| r.0).eq(self.tasks.keys().copied()),
            "tasks in the database differ from the model's"
        );
        for (id, status, attempts, owner, version, leased_at, next_at) in rows {
            let task = self.tasks.get_mut(&id).unwrap();
            // An ordered task's due time is its key's business (held, released by the
            // end of the task ahead): taken from the database, checked by `keys_in_order`.
            if task.ordered && status == "failed" && owner.is_none() {
                task.row.next_at = Time::At(next_at);
            }
            let row = &mut task.row;
            let pinned = row.next_at.pin(next_at)
                & match (&mut row.leased_at, leased_at) {
                    (Some(expected), Some(actual)) => expected.pin(actual),
                    (None, None) => true,
                    _ => false,
                };
            ensure!(
                pinned
                    && (status.as_str(), attempts, owner.as_ref(), version)
                        == (row.status, row.attempts, row.owner.as_ref(), row.version),
                "task {id}: database has {:?}, model {row:?}",
                (status, attempts, owner, version, leased_at, next_at)
            );
        }

        self.keys_in_order().await?;
        let compensations: Vec<(i64, String, i32, i64)> = db(sqlx::query_as(
            "SELECT c.task_id, c.state, c.attempts, c.version FROM recovery_compensation c \
             JOIN recovery_task t ON t.id = c.task_id WHERE t.handler = $1 ORDER BY 1",
        )
        .bind(&self.handler)
        .fetch_all(self.store.pool())
        .await)?;
        let expected: Vec<(i64, String, i32, i64)> = (self.tasks.iter())
            .filter_map(|(id, t)| {
                t.compensation
                    .map(|c| (*id, c.state.to_owned(), c.attempts, c.version))
            })
            .collect();
        ensure!(
            compensations == expected,
            "compensations in the database {compensations:?}, model {expected:?}"
        );

        type HistoryDbRow = (i64, i64, i32, String, DateTime<Utc>, String, Option<String>);
        let history: Vec<HistoryDbRow> = db(sqlx::query_as(
            "SELECT a.task_id, a.lease_version, a.attempt, a.worker, a.started_at, a.outcome, a.error \
             FROM recovery_attempt a JOIN recovery_task t ON t.id = a.task_id \
             WHERE t.handler = $1 ORDER BY a.task_id, a.lease_version",
        )
        .bind(&self.handler)
        .fetch_all(self.store.pool())
        .await)?;
        let mut history = history.into_iter().peekable();
        for (id, task) in &mut self.tasks {
            for expected in &mut task.history {
                let Some(actual) = history.next_if(|h| h.0 == *id) else {
                    return Err(format!("task {id}: history row missing: {expected:?}"));
                };
                let (_, version, attempt, worker, started_at, outcome, error) = actual.clone();
                ensure!(
                    expected.started_at.pin(started_at)
                        && (version, attempt, worker.as_str(), outcome.as_str())
                            == (
                                expected.version,
                                expected.attempt,
                                expected.worker.as_str(),
                                expected.outcome
                            )
                        && expected.error.as_ref().map_or(true, |e| *e == error),
                    "task {id}: history row {actual:?}, model {expected:?}"
                );
            }
            ensure!(
                history.peek().map_or(true, |h| h.0 != *id),
                "task {id}: unexpected history row {:?}",
                history.peek()
            );
            // One history row per counted attempt, numbered 1, 2, ... (the running one
            // has none yet).
            let numbers: Vec<i32> = task
                .history
                .iter()
                .filter(|h| h.outcome != "released" && !h.outcome.starts_with("operator_"))
                .map(|h| h.attempt)
                .collect();
            let running = i32::from(task.row.owner.is_some());
            ensure!(
                numbers.iter().copied().eq(1..=task.row.attempts - running),
                "task {id}: {} attempts counted, history numbers {numbers:?}",
                task.row.attempts
            );
        }
        Ok(())
    }
}

impl Case {
    /// Every order key with open tasks has exactly one that is not held (running, or
    /// due when its time comes); the held ones are never due.
    async fn keys_in_order(&self) -> Checked {
        let keys: Vec<(i64, i64, i64)> = db(sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE NOT held), \
                    count(*) FILTER (WHERE held AND next_attempt_at < '9000-01-01') \
             FROM recovery_task WHERE handler = $1 AND order_key IS NOT NULL \
               AND status = 'failed' GROUP BY order_key",
        )
        .bind(&self.handler)
        .fetch_all(self.store.pool())
        .await)?;
        for (open, runnable, held_but_due) in keys {
            ensure!(
                runnable == 1 && held_but_due == 0,
                "an order key with {open} open tasks has {runnable} not held, \
                 {held_but_due} held but due"
            );
        }
        Ok(())
    }
}

/// Checks that a write reported exactly the leases of `expected`.
fn same_ids(written: &[Lease], expected: &[Lease], what: &str) -> Checked {
    let mut written: Vec<(i64, i64)> = written.iter().map(|l| (l.id.0, l.version)).collect();
    written.sort_unstable();
    let mut wanted: Vec<(i64, i64)> = expected.iter().map(|l| (l.id.0, l.version)).collect();
    wanted.sort_unstable();
    ensure!(
        written == wanted,
        "{what} wrote {written:?}, the model expected {wanted:?}"
    );
    Ok(())
}
