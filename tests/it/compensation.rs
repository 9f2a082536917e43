//! Compensation: a compensating handler's permanent failures are undone once, retried
//! on their own budget, fenced against stale claims, cancelled by an operator's retry,
//! recorded in their own history and kept from retention while owed; a running one is
//! heartbeated, stopped when its claim is lost and bounded at shutdown; a retry or
//! resolve over a started one needs force.

use async_trait::async_trait;
use chrono::Utc;
use redrive::store::{
    Action, Budget, CompensationOutcome, CompensationResult, Finish, Operator, Selection,
};
use redrive::task::{AttemptOutcome, FinishOutcome};
use redrive::{
    Backoff, Fleet, Handler, HandlerContext, HandlerError, InlineAttempt, Jitter, NewTask, Status,
    Store, Task, TaskId,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{eventually, fresh_store, scalar, Member};

/// Fails every task for good; compensates as the task's value says, counting calls.
struct Undoing {
    compensations: Arc<Mutex<HashMap<i64, u32>>>,
}

#[async_trait]
impl Handler for Undoing {
    async fn handle(&self, _: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        match task.failure.value.as_deref() {
            Some(b"ok") => Ok(()),
            _ => Err(HandlerError::permanent("refused")),
        }
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(3)
    }

    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff {
            base: Duration::from_millis(20),
            factor: 1.0,
            cap: Duration::from_millis(20),
            jitter: Jitter::None,
        })
    }

    fn compensates(&self) -> bool {
        true
    }

    async fn compensate(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        *self
            .compensations
            .lock()
            .unwrap()
            .entry(task.id.0)
            .or_default() += 1;
        match task.failure.value.as_deref() {
            Some(b"undo-flaky") if ctx.attempt < 2 => {
                Err(HandlerError::transient("refund api down"))
            }
            Some(b"undo-down") => Err(HandlerError::transient("refund api down")),
            Some(b"undo-refused") => Err(HandlerError::permanent("refund refused")),
            Some(b"undo-panics") => panic!("compensation bug"),
            _ => Ok(()),
        }
    }
}

async fn compensation_state(store: &Store, id: TaskId) -> (String, i32, usize) {
    let view = store
        .compensation(id)
        .await
        .unwrap()
        .expect("a compensation");
    (view.state, view.attempts, view.history.len())
}

#[tokio::test]
async fn permanent_failures_are_compensated_once_with_their_own_budget() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    let compensations = Arc::new(Mutex::new(HashMap::new()));
    let fleet = Fleet::builder(settings.clone())
        .handler(
            "h",
            Undoing {
                compensations: compensations.clone(),
            },
        )
        .build()
        .unwrap();
    let values = [
        "ok",
        "undo",
        "undo-flaky",
        "undo-down",
        "undo-refused",
        "undo-panics",
    ];
    let tasks: Vec<NewTask> = values.iter().map(|v| NewTask::new("h", *v)).collect();
    let ids: Vec<TaskId> = store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();
    let member = Member::start(fleet, &store);
    eventually(
        Duration::from_secs(20),
        "every compensation ended",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_compensation WHERE state <> 'pending'",
            )
            .await
                == 5
        },
    )
    .await;
    // Let a wrongly repeated compensation show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    member.stop().await;

    assert!(
        store.compensation(ids[0]).await.unwrap().is_none(),
        "resolved: nothing owed"
    );
    let expected = [
        ("compensated", 1),
        ("compensated", 2),
        ("failed", 3),
        ("failed", 1),
        ("failed", 3),
    ];
    let calls = compensations.lock().unwrap().clone();
    for (id, (state, attempts)) in ids[1..].iter().zip(expected) {
        assert_eq!(
            compensation_state(&store, *id).await,
            (state.to_owned(), attempts, attempts as usize),
            "task {id}"
        );
        assert_eq!(calls[&id.0], attempts as u32, "calls of task {id}");
        let task = store.get(*id).await.unwrap().unwrap();
        assert_eq!(
            (task.status, task.attempts),
            (Status::PermanentFailure, 1),
            "compensation attempts are not the task's"
        );
    }
    let panicked = store.compensation(ids[5]).await.unwrap().unwrap();
    assert!(
        panicked
            .last_error
            .as_deref()
            .unwrap()
            .contains("compensation bug"),
        "{panicked:?}"
    );
    assert_eq!(
        panicked
            .history
            .iter()
            .map(|a| a.outcome.as_str())
            .collect::<Vec<_>>(),
        ["retry", "retry", "failed"]
    );
}

fn permanent(task: &Task) -> Finish {
    Finish {
        cause: None,
        lease: task.lease(),
        outcome: FinishOutcome::PermanentFailure,
        started_at: Utc::now(),
        duration: Duration::ZERO,
        error: Some("refused".into()),
        compensate: true,
    }
}

fn result(id: TaskId, version: i64) -> CompensationResult {
    CompensationResult {
        task_id: id,
        version,
        outcome: CompensationOutcome::Compensated,
        started_at: Utc::now(),
        duration: Duration::ZERO,
        error: None,
    }
}

/// Fails task `id` for good through a claim, owing a compensation.
async fn fail_for_good(store: &Store, id: TaskId) {
    let handlers = ["h".to_owned()];
    let claimed = store
        .claim(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let task = claimed.iter().find(|t| t.id == id).expect("claimed");
    assert_eq!(
        store.finish("w", &[permanent(task)]).await.unwrap().len(),
        1
    );
}

#[tokio::test]
async fn a_stale_claims_result_is_refused_and_an_operators_retry_cancels_what_is_owed() {
    let (store, _) = fresh_store().await;
    let handlers = ["h".to_owned()];
    let id = store.enqueue(&NewTask::new("h", "x")).await.unwrap().id();
    fail_for_good(&store, id).await;

    // A member claims it and dies: its claim lapses and another member claims it.
    let first = store
        .claim_compensations(&handlers, 10, "w", Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert!(
        store
            .claim_compensations(&handlers, 10, "w", Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "held while claimed"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = store
        .claim_compensations(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((second.len(), second[0].attempt), (1, 2));
    assert!(!store
        .finish_compensation("dead", &result(id, first[0].version))
        .await
        .unwrap());
    assert!(store
        .finish_compensation("alive", &result(id, second[0].version))
        .await
        .unwrap());
    assert_eq!(
        compensation_state(&store, id).await,
        ("compensated".into(), 2, 1)
    );

    // An operator's retry cancels a compensation still owed; failing again owes a new one.
    let again = store.enqueue(&NewTask::new("h", "y")).await.unwrap().id();
    fail_for_good(&store, again).await;
    let operator = Operator {
        actor: "ops".into(),
        reason: Some("fixed downstream".into()),
    };
    let retry = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    store
        .act(&operator, &retry, &Selection::Ids(vec![again]))
        .await
        .unwrap();
    assert_eq!(compensation_state(&store, again).await.0, "cancelled");
    assert!(store
        .claim_compensations(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    fail_for_good(&store, again).await;
    assert_eq!(
        compensation_state(&store, again).await,
        ("pending".into(), 0, 0)
    );

    // A discard leaves it owed: the failure stands.
    store
        .act(&operator, &Action::Discard, &Selection::Ids(vec![again]))
        .await
        .unwrap();
    assert_eq!(compensation_state(&store, again).await.0, "pending");
    let owed = store
        .claim_compensations(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(owed.len(), 1);
    assert_eq!(owed[0].task.status, Status::Discarded);
}

#[tokio::test]
async fn inline_permanent_failures_owe_compensations_and_retention_keeps_them_while_owed() {
    let (store, _) = fresh_store().await;
    let inline = |compensate| NewTask {
        status: Status::PermanentFailure,
        attempts: 1,
        inline_attempt: Some(InlineAttempt {
            worker: "ingest".into(),
            started_at: Utc::now(),
            duration_ms: 1,
            outcome: AttemptOutcome::PermanentFailure,
            error: Some("refused".into()),
            compensate,
        }),
        ..NewTask::new("h", "x")
    };
    let ids: Vec<TaskId> = store
        .enqueue_many(&[inline(true), inline(false)])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();
    assert_eq!(compensation_state(&store, ids[0]).await.0, "pending");
    assert!(store.compensation(ids[1]).await.unwrap().is_none());

    let deleted = store
        .delete_expired(Status::PermanentFailure, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "only the task owing nothing goes");
    let claimed = store
        .claim_compensations(&["h".to_owned()], 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(store
        .finish_compensation("w", &result(ids[0], claimed[0].version))
        .await
        .unwrap());
    assert_eq!(
        store
            .delete_expired(Status::PermanentFailure, Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    for table in ["recovery_compensation", "recovery_compensation_attempt"] {
        assert_eq!(
            scalar(&store, &format!("SELECT count(*) FROM {table}")).await,
            0
        );
    }
}

/// Fails a task for good on its first call and resolves it on the next; its
/// compensation runs for `hold` (stopping early when its token fires, if it `heeds` it),
/// counting calls and cancellations.
#[derive(Clone)]
struct SlowUndo {
    hold: Duration,
    heeds: bool,
    handled: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
    cancelled: Arc<AtomicU32>,
}

impl SlowUndo {
    fn new(hold: Duration, heeds: bool) -> SlowUndo {
        SlowUndo {
            hold,
            heeds,
            handled: Arc::default(),
            calls: Arc::default(),
            cancelled: Arc::default(),
        }
    }
}

#[async_trait]
impl Handler for SlowUndo {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        match self.handled.fetch_add(1, Ordering::SeqCst) {
            0 => Err(HandlerError::permanent("refused")),
            _ => Ok(()),
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(120))
    }

    fn compensates(&self) -> bool {
        true
    }

    async fn compensate(&self, ctx: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let heeded = async {
            if self.heeds {
                ctx.cancellation.cancelled().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = heeded => {
                self.cancelled.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::transient("cancelled"))
            }
            _ = tokio::time::sleep(self.hold) => Ok(()),
        }
    }
}

/// Settings for members that heartbeat every 100 ms under a `lease`.
fn quick(settings: &redrive::Settings, lease: Duration) -> redrive::Settings {
    let mut settings = settings.clone();
    settings.worker.poll_interval = Duration::from_millis(50);
    settings.worker.lease = lease;
    settings.worker.heartbeat = Duration::from_millis(100);
    settings
}

fn start(settings: &redrive::Settings, store: &Store, handler: &SlowUndo) -> Member {
    let fleet = Fleet::builder(settings.clone())
        .handler("h", handler.clone())
        .build()
        .unwrap();
    Member::start(fleet, store)
}

/// Regression: the compensate call got a token nothing cancelled, so an operator's
/// retry fenced its result but let it keep undoing while the reopened task redid. (A
/// retry over a running compensation now needs force.)
#[tokio::test]
async fn an_operators_retry_during_a_compensation_cancels_the_call() {
    let (store, settings) = fresh_store().await;
    let undo = SlowUndo::new(Duration::from_secs(60), true);
    let id = store.enqueue(&NewTask::new("h", "x")).await.unwrap().id();
    let member = start(&quick(&settings, Duration::from_secs(2)), &store, &undo);
    eventually(
        Duration::from_secs(10),
        "the compensation running",
        || async { undo.calls.load(Ordering::SeqCst) == 1 },
    )
    .await;

    let operator = Operator {
        actor: "ops".into(),
        reason: None,
    };
    let retry = |force| Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force,
    };
    let just = Selection::Ids(vec![id]);
    let report = store.act(&operator, &retry(false), &just).await.unwrap();
    assert_eq!((report.changed, report.refused), (0, 1), "refused unforced");
    let report = store.act(&operator, &retry(true), &just).await.unwrap();
    assert_eq!(report.changed, 1);
    eventually(
        Duration::from_secs(3),
        "the call's token cancelled",
        || async { undo.cancelled.load(Ordering::SeqCst) == 1 },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the retried task resolved",
        || async { store.get(id).await.unwrap().unwrap().status == Status::Resolved },
    )
    .await;
    member.stop().await;
    assert_eq!(
        compensation_state(&store, id).await,
        ("cancelled".into(), 1, 0)
    );
}

/// Regression: compensation claims were never heartbeated, so a call longer than the
/// lease was claimed and run again by another member while the first still ran.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_compensation_longer_than_the_lease_runs_once_among_members() {
    let (store, settings) = fresh_store().await;
    let undo = SlowUndo::new(Duration::from_secs(3), true);
    let id = store.enqueue(&NewTask::new("h", "x")).await.unwrap().id();
    let settings = quick(&settings, Duration::from_secs(1));
    let members = [
        start(&settings, &store, &undo),
        start(&settings, &store, &undo),
    ];
    eventually(Duration::from_secs(15), "the compensation done", || async {
        undo.calls.load(Ordering::SeqCst) > 1
            || scalar(
                &store,
                "SELECT count(*) FROM recovery_compensation WHERE state = 'compensated'",
            )
            .await
                == 1
    })
    .await;
    for member in members {
        member.stop().await;
    }
    assert_eq!(undo.calls.load(Ordering::SeqCst), 1, "called once");
    assert_eq!(undo.cancelled.load(Ordering::SeqCst), 0);
    assert_eq!(
        compensation_state(&store, id).await,
        ("compensated".into(), 1, 1)
    );
}

/// Regression: the pool waited for the compensator's whole batch before its shutdown
/// drain began, so SIGTERM waited up to the handler's timeout. Now a compensate call
/// that ignores its token is interrupted at `shutdown_timeout` and its claim given back
/// (another member takes it at once, not a lease later).
#[tokio::test]
async fn shutdown_interrupts_a_long_compensation_and_gives_its_claim_back() {
    let (store, settings) = fresh_store().await;
    let mut settings = quick(&settings, Duration::from_secs(60));
    settings.worker.shutdown_timeout = Duration::from_millis(500);
    let stubborn = SlowUndo::new(Duration::from_secs(100), false);
    let id = store.enqueue(&NewTask::new("h", "x")).await.unwrap().id();
    let member = start(&settings, &store, &stubborn);
    eventually(
        Duration::from_secs(10),
        "the compensation running",
        || async { stubborn.calls.load(Ordering::SeqCst) == 1 },
    )
    .await;
    let stopping = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), member.stop())
        .await
        .expect("the member stops");
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    let view = store.compensation(id).await.unwrap().unwrap();
    assert_eq!(view.state, "pending");
    assert_eq!(
        view.history
            .iter()
            .map(|a| a.outcome.as_str())
            .collect::<Vec<_>>(),
        ["released"]
    );

    let quick_undo = SlowUndo::new(Duration::ZERO, true);
    let next = start(&settings, &store, &quick_undo);
    eventually(
        Duration::from_secs(5),
        "the next member compensated",
        || async { compensation_state(&store, id).await.0 == "compensated" },
    )
    .await;
    next.stop().await;
}

/// Fails task `id` for good through a claim after saving `checkpoint`.
async fn fail_after(store: &Store, id: TaskId, checkpoint: serde_json::Value) {
    let claimed = store
        .claim(&["h".to_owned()], 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let task = claimed.iter().find(|t| t.id == id).expect("claimed");
    assert!(store
        .save_checkpoint(task.lease(), &checkpoint)
        .await
        .unwrap());
    assert_eq!(
        store.finish("w", &[permanent(task)]).await.unwrap().len(),
        1
    );
}

/// Regression: a retry after the compensation ran resumed from the checkpoint the
/// compensation had undone, and a retry or resolve while it ran left it undoing.
#[tokio::test]
async fn retry_and_resolve_leave_a_task_whose_compensation_started_alone_unless_forced() {
    let (store, _) = fresh_store().await;
    let handlers = ["h".to_owned()];
    let done = serde_json::json!({"steps_done": 2});
    let mut ids = Vec::new();
    for value in ["compensated", "running", "failed", "owed"] {
        let id = store.enqueue(&NewTask::new("h", value)).await.unwrap().id();
        fail_after(&store, id, done.clone()).await;
        ids.push(id);
    }
    let (compensated, running, failed, owed) = (ids[0], ids[1], ids[2], ids[3]);
    let claimed = store
        .claim_compensations(&handlers, 3, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let claim_of = |id: TaskId| claimed.iter().find(|c| c.task.id == id).unwrap().version;
    assert!(store
        .finish_compensation("w", &result(compensated, claim_of(compensated)))
        .await
        .unwrap());
    let refused = CompensationResult {
        outcome: CompensationOutcome::Failed,
        ..result(failed, claim_of(failed))
    };
    assert!(store.finish_compensation("w", &refused).await.unwrap());

    let operator = Operator {
        actor: "ops".into(),
        reason: Some("downstream fixed".into()),
    };
    let retry = |force| Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force,
    };
    let everything = Selection::Ids(ids.clone());
    let applicable = store
        .count_applicable(&retry(false), &everything)
        .await
        .unwrap();
    assert_eq!((applicable.changes, applicable.refused), (1, 3));
    let report = store
        .act(&operator, &retry(false), &everything)
        .await
        .unwrap();
    assert_eq!(
        (report.changed, report.refused),
        (1, 3),
        "only the task whose compensation never started"
    );
    let task = store.get(owed).await.unwrap().unwrap();
    assert_eq!(task.status, Status::Failed);
    assert_eq!(task.checkpoint, Some(done.clone()), "nothing was undone");
    assert_eq!(compensation_state(&store, owed).await.0, "cancelled");
    let resolve = |force| Action::Resolve { force };
    let three = Selection::Ids(vec![compensated, running, failed]);
    let report = store.act(&operator, &resolve(false), &three).await.unwrap();
    assert_eq!((report.changed, report.refused), (0, 3));
    for id in [compensated, running, failed] {
        let task = store.get(id).await.unwrap().unwrap();
        assert_eq!(
            (task.status, task.checkpoint),
            (Status::PermanentFailure, Some(done.clone()))
        );
    }
    assert_eq!(compensation_state(&store, running).await.0, "pending");

    // Forced: the retried tasks start over from no checkpoint; the running compensation
    // is cancelled (its claim's result refused), the finished ones stay as they ended.
    let two = Selection::Ids(vec![compensated, running]);
    let report = store.act(&operator, &retry(true), &two).await.unwrap();
    assert_eq!((report.changed, report.refused), (2, 0));
    assert!(!store
        .finish_compensation("w", &result(running, claim_of(running)))
        .await
        .unwrap());
    assert_eq!(compensation_state(&store, running).await.0, "cancelled");
    assert_eq!(
        compensation_state(&store, compensated).await.0,
        "compensated"
    );
    let again = store
        .claim(&handlers, 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let mut started_over: Vec<_> = again.iter().map(|t| (t.id, t.checkpoint.clone())).collect();
    started_over.sort_by_key(|(id, _)| *id);
    assert_eq!(
        started_over,
        [
            (compensated, None),
            (running, None),
            (owed, Some(done.clone()))
        ]
    );
    let report = store
        .act(&operator, &resolve(true), &Selection::Ids(vec![failed]))
        .await
        .unwrap();
    assert_eq!((report.changed, report.refused), (1, 0));
    assert_eq!(
        store.get(failed).await.unwrap().unwrap().status,
        Status::Resolved
    );
    let audit = store.audit(&Default::default()).await.unwrap();
    assert_eq!(
        audit.iter().map(|a| a.details.clone()).collect::<Vec<_>>(),
        [
            Some(serde_json::json!({"force": true})),
            Some(serde_json::json!({"at": null, "more_attempts": null, "force": true})),
            None,
            Some(serde_json::json!({"at": null, "more_attempts": null})),
        ],
        "forcing is in the audit log, beside a retry's time and budget"
    );
}

/// Regression: the compensation claim decoded every claimed task and failed the whole
/// batch, after committing it, on one whose row cannot be read (here, stored headers
/// that do not decode): every compensation of the batch lost an attempt and came due
/// again only a lease later, and the bad row did the same to every batch it was in.
/// Now the rest of the batch runs at once and the unreadable one ends `failed`, its
/// reason in its history, without a call, as the task claim ends such rows.
#[tokio::test]
async fn a_compensation_whose_task_cannot_be_read_ends_failed_and_the_rest_of_its_batch_runs() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    let tasks: Vec<NewTask> = (0..4).map(|_| NewTask::new("h", "undo")).collect();
    let ids: Vec<TaskId> = store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();
    let claimed = store
        .claim(&["h".to_owned()], 10, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let failures: Vec<Finish> = claimed.iter().map(permanent).collect();
    assert_eq!(store.finish("w", &failures).await.unwrap().len(), 4);
    let unreadable = ids[1];
    sqlx::query("UPDATE recovery_task SET msg_headers = '\\x0100'::bytea WHERE id = $1")
        .bind(unreadable.0)
        .execute(store.pool())
        .await
        .unwrap();

    let compensations = Arc::new(Mutex::new(HashMap::new()));
    let fleet = Fleet::builder(settings.clone())
        .handler(
            "h",
            Undoing {
                compensations: compensations.clone(),
            },
        )
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    // Well within the 30 s lease a failed claim would have pushed them back by.
    eventually(
        Duration::from_secs(10),
        "every compensation ended",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_compensation WHERE state <> 'pending'",
            )
            .await
                == 4
        },
    )
    .await;
    member.stop().await;

    for id in ids.iter().filter(|id| **id != unreadable) {
        assert_eq!(
            compensation_state(&store, *id).await,
            ("compensated".into(), 1, 1),
            "task {id}"
        );
    }
    let calls = compensations.lock().unwrap().clone();
    assert_eq!(calls.len(), 3, "calls: {calls:?}");
    assert!(!calls.contains_key(&unreadable.0), "never called");

    let ended = store.compensation(unreadable).await.unwrap().unwrap();
    assert_eq!((ended.state.as_str(), ended.attempts), ("failed", 1));
    let reason = ended.last_error.clone().expect("the reason is kept");
    assert!(
        reason.contains("cannot be read") && reason.contains("msg_headers"),
        "{reason}"
    );
    assert_eq!(
        ended
            .history
            .iter()
            .map(|a| (a.attempt, a.outcome.as_str(), a.error.as_deref()))
            .collect::<Vec<_>>(),
        [(1, "failed", Some(reason.as_str()))]
    );

    // Ended, not corrupt: the store's invariants hold.
    let budgets = redrive::store::Budgets {
        default: 3,
        ..Default::default()
    };
    let report = store.check(&budgets).await.unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);

    // `tasks show` tells it as it tells other failed compensations, and why the task
    // cannot be shown whole.
    let shown = crate::support::cli::run(&settings, &["tasks", "show", &unreadable.to_string()]);
    let stdout = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        stdout.contains("compensation           failed after 1 attempt(s)")
            && stdout.contains("not compensated: the task's row cannot be read"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("unreadable") && l.contains("msg_headers")),
        "{stdout}"
    );
}
