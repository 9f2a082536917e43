//! Operator actions on the store: fencing against running attempts, budgets, audit,
//! the invariant check against planted corruption, and retention across members.

use async_trait::async_trait;
use redrive::store::{Action, Budget, Budgets, Due, Operator, Selection, TaskFilter};
use redrive::{Fleet, Handler, HandlerContext, HandlerError, NewTask, Status, Store, Task, TaskId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

use crate::support::{fresh_store, scalar};

fn operator(reason: &str) -> Operator {
    Operator {
        actor: "test-operator".into(),
        reason: Some(reason.into()),
    }
}

/// Waits inside its attempt until released, then fails transiently.
struct Gate {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

#[async_trait]
impl Handler for Gate {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.entered.notify_one();
        self.release.notified().await;
        Err(HandlerError::transient("downstream down"))
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(30))
    }
}

async fn enqueue(store: &Store, handler: &str, values: &[&[u8]]) -> Vec<TaskId> {
    let tasks: Vec<NewTask> = values
        .iter()
        .map(|v| NewTask::new(handler, v.to_vec()))
        .collect();
    store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id())
        .collect()
}

/// An operator discards a task while its handler runs: the handler's late result is
/// fenced out, the history records both, and every invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_during_an_attempt_fences_its_late_result() {
    let (store, settings) = fresh_store().await;
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let fleet = Fleet::builder(settings)
        .handler(
            "gate",
            Gate {
                entered: entered.clone(),
                release: release.clone(),
            },
        )
        .build()
        .unwrap();
    let ids = enqueue(&store, "gate", &[b"x"]).await;
    let pool = fleet.worker_pool(store.clone());
    let running = tokio::spawn(async move { pool.process_next().await });
    entered.notified().await;

    let report = store
        .act(
            &operator("bad data"),
            &Action::Discard,
            &Selection::Ids(ids.clone()),
        )
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    release.notify_one();
    let processed = running.await.unwrap().unwrap().expect("a task was claimed");
    assert!(!processed.written, "the late result must be fenced out");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_stopping_call").await,
        0,
        "the stopped call still holds its task back"
    );

    let task = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(task.status, Status::Discarded);
    assert!(task.finished_at.is_some() && task.lease_owner.is_none());
    let outcomes: Vec<String> = store
        .attempts(ids[0])
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, ["fenced", "operator_discard"]);
    let audit = store.audit(&Default::default()).await.unwrap();
    assert_eq!(
        (
            audit[0].action.as_str(),
            audit[0].count,
            audit[0].reason.as_deref()
        ),
        ("discard", 1, Some("bad data"))
    );
    assert_eq!(store.check(&fleet.budgets()).await.unwrap().violations, []);
}

/// Retry gives an exhausted task a whole budget again, or exactly N more attempts.
#[tokio::test]
async fn retry_grants_a_fresh_budget_or_n_more_attempts() {
    let (store, settings) = fresh_store().await;
    let fleet = Fleet::builder(settings)
        .handler("always-fails", AlwaysFails)
        .build()
        .unwrap();
    let ids = enqueue(&store, "always-fails", &[b"a", b"b"]).await;
    let pool = fleet.worker_pool(store.clone());
    let drain = || async {
        let mut attempts = 0;
        while pool.process_next().await.unwrap().is_some() {
            attempts += 1;
        }
        attempts
    };
    assert_eq!(drain().await, 6, "two tasks, three attempts each");

    store
        .act(
            &operator("again"),
            &Action::Retry {
                at: None,
                budget: Budget::Fresh,
                force: false,
            },
            &Selection::Ids(vec![ids[0]]),
        )
        .await
        .unwrap();
    store
        .act(
            &operator("one more"),
            &Action::Retry {
                at: None,
                budget: Budget::More {
                    attempts: 1,
                    budgets: fleet.budgets(),
                },
                force: false,
            },
            &Selection::Ids(vec![ids[1]]),
        )
        .await
        .unwrap();
    assert_eq!(drain().await, 4, "a fresh budget of 3, and 1 more");
    for (id, attempts) in [(ids[0], 6), (ids[1], 4)] {
        let task = store.get(id).await.unwrap().unwrap();
        assert_eq!(
            (task.status, task.attempts),
            (Status::PermanentFailure, attempts)
        );
    }
    assert_eq!(store.check(&fleet.budgets()).await.unwrap().violations, []);
}

/// A task whose last attempt lapsed ends "no attempts left" on the claim after (an
/// attempt counted, no call made). `--more-attempts N` then gives it exactly N calls,
/// as it does a task that used its budget up by calls, and the check agrees.
#[tokio::test]
async fn more_attempts_after_no_attempts_left_gives_exactly_that_many_calls() {
    let (store, settings) = fresh_store().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let fleet = Fleet::builder(settings)
        .handler("counted", CountedFailures(calls.clone()))
        .build()
        .unwrap();
    let ids = enqueue(&store, "counted", &[b"a"]).await;
    let pool = fleet.worker_pool(store.clone());
    for _ in 0..2 {
        pool.process_next().await.unwrap().unwrap();
    }
    // The third attempt's member dies: its lease lapses, and the claim after it finds
    // the budget used up.
    let handlers = ["counted".to_owned()];
    let lost = store
        .claim(&handlers, 1, "dead", Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(lost.len(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    pool.process_next().await.unwrap().unwrap();
    let ended = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(
        (ended.status, ended.attempts),
        (Status::PermanentFailure, 4)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let more = Action::Retry {
        at: None,
        budget: Budget::More {
            attempts: 2,
            budgets: fleet.budgets(),
        },
        force: false,
    };
    store
        .act(&operator("two more"), &more, &Selection::Ids(ids.clone()))
        .await
        .unwrap();
    while pool.process_next().await.unwrap().is_some() {}
    assert_eq!(calls.load(Ordering::SeqCst), 4, "exactly two more calls");
    let task = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!((task.status, task.attempts), (Status::PermanentFailure, 6));
    assert_eq!(store.check(&fleet.budgets()).await.unwrap().violations, []);
}

/// A retry's audit row records when the tasks are due and the attempts granted.
#[tokio::test]
async fn a_retrys_time_and_budget_are_in_its_audit_row() {
    let (store, _) = fresh_store().await;
    let ids = enqueue(&store, "h", &[b"a"]).await;
    let more = Action::Retry {
        at: Some(Due::In(Duration::from_secs(5400))),
        budget: Budget::More {
            attempts: 2,
            budgets: Budgets::default(),
        },
        force: false,
    };
    let fresh = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    for action in [more, fresh] {
        store
            .act(&operator("again"), &action, &Selection::Ids(ids.clone()))
            .await
            .unwrap();
    }
    let audit = store.audit(&Default::default()).await.unwrap();
    let details: Vec<_> = audit.into_iter().map(|a| a.details).collect();
    assert_eq!(
        details,
        [
            Some(serde_json::json!({"at": null, "more_attempts": null})),
            Some(serde_json::json!({"at": "1h 30m", "more_attempts": 2})),
        ]
    );
}

/// The check reads any budget, with grants on top of it.
#[tokio::test]
async fn the_check_reads_the_largest_budget_with_grants() {
    let (store, _) = fresh_store().await;
    let ids = enqueue(&store, "h", &[b"a"]).await;
    let largest = Budgets {
        default: i32::MAX,
        ..Budgets::default()
    };
    let more = Action::Retry {
        at: None,
        budget: Budget::More {
            attempts: 5,
            budgets: largest.clone(),
        },
        force: false,
    };
    store
        .act(&operator("again"), &more, &Selection::Ids(ids))
        .await
        .unwrap();
    assert_eq!(store.check(&largest).await.unwrap().violations, []);
}

/// Fails every call transiently, counting them; three attempts.
struct CountedFailures(Arc<AtomicUsize>);

#[async_trait]
impl Handler for CountedFailures {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::transient("still down"))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(3)
    }

    fn backoff(&self) -> Option<redrive::Backoff> {
        AlwaysFails.backoff()
    }
}

struct AlwaysFails;

#[async_trait]
impl Handler for AlwaysFails {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        Err(HandlerError::transient("still down"))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(3)
    }

    fn backoff(&self) -> Option<redrive::Backoff> {
        Some(redrive::Backoff {
            base: Duration::ZERO,
            factor: 1.0,
            cap: Duration::ZERO,
            jitter: redrive::Jitter::None,
        })
    }
}

/// A filter acts on exactly the tasks it selects, in the statuses the action applies
/// to, across many batches; resolved tasks are never retried.
#[tokio::test]
async fn actions_by_filter_change_exactly_what_the_filter_selects() {
    let (store, _) = fresh_store().await;
    let many: Vec<Vec<u8>> = (0..1_234).map(|i| format!("v{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
    enqueue(&store, "a", &refs).await;
    let others = enqueue(&store, "b", &[b"1", b"2"]).await;
    store
        .act(
            &operator("done"),
            &Action::Resolve { force: false },
            &Selection::Ids(vec![others[0]]),
        )
        .await
        .unwrap();
    let handler_a = TaskFilter {
        handler: Some("a".into()),
        ..TaskFilter::default()
    };
    let report = store
        .act(
            &operator("bulk"),
            &Action::Discard,
            &Selection::Filter(handler_a.clone()),
        )
        .await
        .unwrap();
    assert_eq!(report.changed, 1_234);
    let audit = store.audit(&Default::default()).await.unwrap();
    assert_eq!((audit[0].count, audit[0].filter.is_some()), (1_234, true));
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'discarded'"
        )
        .await,
        1_234
    );
    // Retrying everything leaves the resolved task alone.
    let everything = Selection::Filter(TaskFilter::default());
    let retry = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    assert_eq!(
        store
            .count_applicable(&retry, &everything)
            .await
            .unwrap()
            .changes,
        1_235
    );
    let report = store
        .act(&operator("all"), &retry, &everything)
        .await
        .unwrap();
    assert_eq!(report.changed, 1_235);
    let resolved = store.get(others[0]).await.unwrap().unwrap();
    assert_eq!(resolved.status, Status::Resolved);
    // Unknown ids are refused before anything changes.
    let error = store
        .act(
            &operator("x"),
            &Action::Discard,
            &Selection::Ids(vec![others[1], TaskId(999_999)]),
        )
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "no such task: 999999");
    assert_eq!(
        store.get(others[1]).await.unwrap().unwrap().status,
        Status::Failed
    );
}

/// `check` passes on a clean store and names each kind of planted corruption.
#[tokio::test]
async fn check_finds_each_kind_of_planted_corruption() {
    let (store, _) = fresh_store().await;
    let ids = enqueue(
        &store,
        "h",
        &[b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8"],
    )
    .await;
    let budgets = Budgets {
        default: 3,
        ..Budgets::default()
    };
    assert_eq!(store.check(&budgets).await.unwrap().violations, []);
    let plant = |sql: String| {
        let store = store.clone();
        async move {
            sqlx::raw_sql(&sql).execute(store.pool()).await.unwrap();
        }
    };
    // The table's own guards would refuse some corruptions: lift them, as a bad
    // migration or a hand-written UPDATE could have.
    plant(
        "ALTER TABLE recovery_task DROP CONSTRAINT recovery_task_lease_only_while_unfinished"
            .into(),
    )
    .await;
    let id = |n: usize| ids[n].0;
    plant(format!(
        "UPDATE recovery_task SET next_attempt_at = 'infinity' WHERE id = {}",
        id(0)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET status = 'resolved', finished_at = now(), lease_owner = 'w', lease_version = 1 WHERE id = {}",
        id(1)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET status = 'discarded' WHERE id = {}",
        id(2)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET attempts = 9 WHERE id = {}",
        id(3)
    ))
    .await;
    plant(format!(
        "INSERT INTO recovery_attempt VALUES ({}, 1, 1, 'w', now(), 1, 'retry', 'x')",
        id(4)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET dedup_key = 'same' WHERE id IN ({}, {})",
        id(5),
        id(6)
    ))
    .await;
    plant(format!(
        "INSERT INTO recovery_member VALUES ('live-w', 'h', 'v', '{{worker}}', now(), now()); \
         UPDATE recovery_task SET lease_owner = 'live-w', attempts = 1, lease_version = 1, \
             leased_at = now() - interval '1 hour', next_attempt_at = now() - interval '10 minutes' \
         WHERE id = {}",
        id(7)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET finished_at = now() WHERE id = {}",
        id(7)
    ))
    .await;
    plant(format!(
        "INSERT INTO recovery_compensation (task_id) VALUES ({})",
        id(5)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET order_key = '\\x01', held = true WHERE id = {}",
        id(6)
    ))
    .await;
    plant(format!(
        "UPDATE recovery_task SET msg_key = 'k' WHERE id = {0}; \
         DELETE FROM recovery_task_key_head WHERE task_id = {0}",
        id(4)
    ))
    .await;

    let report = store.check(&budgets).await.unwrap();
    let found: Vec<(String, i64)> = report
        .violations
        .iter()
        .map(|v| (v.kind.clone(), v.task_id.0))
        .collect();
    for expected in [
        ("failed_without_next_attempt", id(0)),
        ("final_with_lease", id(1)),
        ("final_without_finish_time", id(2)),
        ("attempts_over_budget", id(3)),
        ("history_mismatch", id(3)),
        ("history_mismatch", id(4)),
        ("duplicate_dedup_key", id(6)),
        ("dedup_key_unclaimed", id(5)),
        ("dedup_key_unclaimed", id(6)),
        ("expired_lease_of_live_member", id(7)),
        ("failed_with_finish_time", id(7)),
        ("compensation_owed_by_unfinished_task", id(5)),
        ("held_with_nothing_ahead", id(6)),
        ("key_head_unrecorded", id(4)),
    ] {
        assert!(
            found.contains(&(expected.0.to_owned(), expected.1)),
            "{expected:?} not in {found:?}"
        );
    }
    let planted: Vec<i64> = ids.iter().map(|i| i.0).collect();
    assert!(
        found.iter().all(|(_, id)| planted.contains(id)),
        "{found:?}"
    );
}

/// Retention deletes exactly the expired final tasks and their history, with two
/// members deleting at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_exactly_the_expired_tasks_with_two_members_at_once() {
    let (store, settings) = fresh_store().await;
    let values: Vec<Vec<u8>> = (0..3_000).map(|i| format!("{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let ids = enqueue(&store, "h", &refs).await;
    let ids_of = |range: std::ops::Range<usize>| ids[range].to_vec();
    for (range, action) in [
        (0..1_000, Action::Resolve { force: false }),
        (1_000..2_000, Action::Discard),
        (2_000..2_500, Action::Resolve { force: false }),
    ] {
        store
            .act(&operator("setup"), &action, &Selection::Ids(ids_of(range)))
            .await
            .unwrap();
    }
    // The first 2,000 finished long ago; 2,000..2,500 just now; the rest never.
    sqlx::query(&format!(
        "UPDATE recovery_task SET finished_at = now() - interval '8 days' WHERE id <= {}",
        ids[1_999].0
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    let second = Store::connect(&settings.database).await.unwrap();
    let delete_all = |store: Store| async move {
        let mut deleted = 0;
        for status in [
            Status::Resolved,
            Status::Discarded,
            Status::PermanentFailure,
        ] {
            loop {
                let n = store.delete_expired(status, week).await.unwrap();
                deleted += n;
                if n == 0 {
                    break;
                }
            }
        }
        deleted
    };
    let (a, b) = tokio::join!(delete_all(store.clone()), delete_all(second));
    assert_eq!(a + b, 2_000, "each expired task deleted once ({a} + {b})");
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        1_000
    );
    assert_eq!(
        scalar(
            &store,
            &format!(
                "SELECT count(*) FROM recovery_task WHERE id <= {}",
                ids[1_999].0
            )
        )
        .await,
        0
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt a WHERE NOT EXISTS (SELECT 1 FROM recovery_task t WHERE t.id = a.task_id)").await,
        0,
        "their history went with them"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt").await,
        500,
        "the recent tasks keep theirs"
    );
}

/// Regression: with statistics taken before an action (every task `failed`), a batch
/// over `status = discarded` was planned as a scan and sort of the whole table, once per
/// batch of 500: quadratic, 0.7 s a batch on a million tasks. Batches walk the primary
/// key; the table's scan counter proves it (flushed when the acting connections close).
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn bulk_batches_walk_the_key_even_with_stale_statistics() {
    let (setup, settings) = fresh_store().await;
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_value) \
         SELECT 'h', '\\x00'::bytea FROM generate_series(1, 20000)",
    )
    .execute(setup.pool())
    .await
    .unwrap();
    sqlx::query("ANALYZE recovery_task")
        .execute(setup.pool())
        .await
        .unwrap();
    // Closed connections flush their statistics: the counters then stop moving.
    setup.pool().close().await;
    let observer = Store::connect(&settings.database).await.unwrap();
    let counters = || {
        let observer = observer.clone();
        async move {
            sqlx::query("SELECT pg_stat_clear_snapshot()")
                .execute(observer.pool())
                .await
                .unwrap();
            sqlx::query_as::<_, (i64, i64, i64)>(
                "SELECT seq_scan, n_tup_ins, n_tup_upd FROM pg_stat_user_tables \
                 WHERE schemaname = current_schema() AND relname = 'recovery_task'",
            )
            .fetch_one(observer.pool())
            .await
            .unwrap()
        }
    };
    crate::support::eventually(
        Duration::from_secs(10),
        "the set-up's statistics",
        || async { counters().await.1 >= 20_000 },
    )
    .await;
    let (_, _, updates_before) = counters().await;

    let acting = Store::connect(&settings.database).await.unwrap();
    let failed = Selection::Filter(TaskFilter {
        status: vec![Status::Failed],
        ..TaskFilter::default()
    });
    acting
        .act(&operator("x"), &Action::Discard, &failed)
        .await
        .unwrap();
    acting.pool().close().await;
    crate::support::eventually(
        Duration::from_secs(10),
        "the discard's statistics",
        || async { counters().await.2 >= updates_before + 20_000 },
    )
    .await;
    // (On a table this small the planner may join each batch by hashing the table:
    // only the batches planned on stale statistics are counted.)
    let (scans_before, _, _) = counters().await;
    let acting = Store::connect(&settings.database).await.unwrap();
    // The statistics still say every task is failed: "discarded" looks rare.
    let stale = Selection::Filter(TaskFilter {
        status: vec![Status::Discarded],
        ..TaskFilter::default()
    });
    let retry = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    let report = acting.act(&operator("y"), &retry, &stale).await.unwrap();
    assert_eq!(report.changed, 20_000);
    acting.pool().close().await;
    crate::support::eventually(
        Duration::from_secs(10),
        "the actions' statistics",
        || async { counters().await.2 >= updates_before + 40_000 },
    )
    .await;
    let scans = counters().await.0 - scans_before;
    assert_eq!(scans, 0, "{scans} whole-table scans in 41 batches");
}
