//! The worker pool: outcomes, retries, wake-ups, heartbeats, shutdown.

use async_trait::async_trait;
use redrive::task::FinishOutcome;
use redrive::{
    Backoff, Fleet, Handler, HandlerContext, HandlerError, Jitter, NewTask, Settings, Status,
    Store, Task,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{eventually, fresh_store, scalar, Member};

/// Behaves as the task's value says, retrying after `Scripted::0` (doubling, no jitter).
struct Scripted(Duration);

#[async_trait]
impl Handler for Scripted {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        match task.failure.value.as_deref().unwrap_or_default() {
            b"ok" => Ok(()),
            b"transient" => Err(HandlerError::transient("downstream unavailable")),
            b"permanent" => Err(HandlerError::permanent("invalid order")),
            b"retry-after" => Err(HandlerError::retry_after(Duration::from_secs(60), "429")),
            b"panic" => panic!("handler bug"),
            b"slow" => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(())
            }
            b"flaky" if ctx.attempt < 2 => Err(HandlerError::transient("first try fails")),
            b"flaky" => Ok(()),
            other => Err(HandlerError::permanent(format!("unknown script {other:?}"))),
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(200))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(3)
    }

    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff {
            base: self.0,
            factor: 2.0,
            cap: self.0 * 5,
            jitter: Jitter::None,
        })
    }
}

fn fleet(settings: &Settings, handler: impl Handler) -> Fleet {
    Fleet::builder(settings.clone())
        .handler("h", handler)
        .build()
        .unwrap()
}

async fn status(store: &Store, id: redrive::TaskId) -> Task {
    store.get(id).await.unwrap().unwrap()
}

#[tokio::test]
async fn each_verdict_leads_to_its_status() {
    let (store, settings) = fresh_store().await;
    let pool = fleet(&settings, Scripted(Duration::from_secs(3600))).worker_pool(store.clone());
    let cases: &[(&[u8], FinishOutcome, Status, &str)] = &[
        (b"ok", FinishOutcome::Resolved, Status::Resolved, ""),
        (
            b"permanent",
            FinishOutcome::PermanentFailure,
            Status::PermanentFailure,
            "invalid order",
        ),
        (
            b"transient",
            FinishOutcome::Resolved,
            Status::Failed,
            "downstream unavailable",
        ),
        (
            b"panic",
            FinishOutcome::Resolved,
            Status::Failed,
            "handler panicked: handler bug",
        ),
        (
            b"slow",
            FinishOutcome::Resolved,
            Status::Failed,
            "timed out after 200ms",
        ),
        (
            b"retry-after",
            FinishOutcome::Resolved,
            Status::Failed,
            "429",
        ),
    ];
    for (value, expected, expected_status, error) in cases {
        let id = store
            .enqueue(&NewTask::new("h", value.to_vec()))
            .await
            .unwrap()
            .id();
        let processed = pool.process_next().await.unwrap().expect("a due task");
        assert_eq!(processed.id, id);
        assert!(processed.written);
        if *expected_status != Status::Failed {
            assert_eq!(processed.outcome, *expected);
        } else {
            assert!(
                matches!(processed.outcome, FinishOutcome::Retry { .. }),
                "{:?}",
                processed.outcome
            );
        }
        let task = status(&store, id).await;
        assert_eq!(
            task.status,
            *expected_status,
            "{}",
            String::from_utf8_lossy(value)
        );
        assert!(
            task.last_error
                .as_deref()
                .unwrap_or_default()
                .contains(error),
            "{:?}",
            task.last_error
        );
        assert_eq!(store.attempts(id).await.unwrap().len(), 1);
    }
    let retry_after = scalar(
        &store,
        "SELECT extract(epoch FROM next_attempt_at - updated_at)::bigint FROM recovery_task WHERE msg_value = 'retry-after'",
    )
    .await;
    assert_eq!(retry_after, 60, "the handler's retry-after is honoured");
}

#[tokio::test]
async fn retries_stop_at_max_attempts() {
    let (store, settings) = fresh_store().await;
    let pool = fleet(&settings, Scripted(Duration::from_millis(20))).worker_pool(store.clone());
    let id = store
        .enqueue(&NewTask::new("h", b"transient".to_vec()))
        .await
        .unwrap()
        .id();
    let mut outcomes = Vec::new();
    while outcomes.len() < 10 {
        match pool.process_next().await.unwrap() {
            Some(p) => outcomes.push(p.outcome),
            None if status(&store, id).await.status.is_final() => break,
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert_eq!(outcomes[2], FinishOutcome::PermanentFailure);
    let task = status(&store, id).await;
    assert_eq!((task.status, task.attempts), (Status::PermanentFailure, 3));
    assert!(task
        .last_error
        .unwrap()
        .contains("gave up after 3 of 3 attempts"));
    let history = store.attempts(id).await.unwrap();
    let labels: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(labels, ["retry", "retry", "permanent_failure"]);
}

#[tokio::test]
async fn the_running_pool_retries_with_backoff_until_resolved() {
    let (store, settings) = fresh_store().await;
    let member = Member::start(
        fleet(&settings, Scripted(Duration::from_millis(20))),
        &store,
    );
    let ids: Vec<_> = store
        .enqueue_many(&[
            NewTask::new("h", b"flaky".to_vec()),
            NewTask::new("h", b"ok".to_vec()),
        ])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();
    eventually(Duration::from_secs(10), "both tasks resolved", || async {
        store.status_counts().await.unwrap().resolved == 2
    })
    .await;
    assert_eq!(status(&store, ids[0]).await.attempts, 2);
    assert_eq!(status(&store, ids[1]).await.attempts, 1);
    member.stop().await;
}

#[tokio::test]
async fn an_idle_pool_is_woken_by_new_tasks_not_by_polling() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_secs(60);
    let member = Member::start(
        fleet(&settings, Scripted(Duration::from_millis(20))),
        &store,
    );
    // Let the pool go idle with its listener connected.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    store
        .enqueue(&NewTask::new("h", b"ok".to_vec()))
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "the task resolved", || async {
        store.status_counts().await.unwrap().resolved == 1
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "woken long before the 60 s poll"
    );
    member.stop().await;
}

/// A member's claims start their walk of the due index near where the last one found
/// work (see `worker::due_floor`). A task set due before that point while tasks keep
/// arriving (here: stored by a transaction that set it due an hour ago) is still
/// claimed, by the walk from the start each lane makes every second.
#[tokio::test]
async fn a_task_due_before_the_claims_floor_is_claimed_while_work_keeps_arriving() {
    let (store, settings) = fresh_store().await;
    let member = Member::start(
        fleet(&settings, Scripted(Duration::from_millis(20))),
        &store,
    );
    let feeding = tokio_util::sync::CancellationToken::new();
    let feeder = tokio::spawn({
        let (store, feeding) = (store.clone(), feeding.clone());
        async move {
            while !feeding.is_cancelled() {
                store
                    .enqueue(&NewTask::new("h", b"ok".to_vec()))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    eventually(Duration::from_secs(10), "the stream drained", || async {
        store.status_counts().await.unwrap().resolved >= 20
    })
    .await;
    let mut late = NewTask::new("h", b"ok".to_vec());
    late.next_attempt_at = Some(chrono::Utc::now() - chrono::Duration::hours(1));
    let late = store.enqueue(&late).await.unwrap().id();
    eventually(
        Duration::from_secs(10),
        "the late task resolved",
        || async { status(&store, late).await.status == Status::Resolved },
    )
    .await;
    feeding.cancel();
    feeder.await.unwrap();
    member.stop().await;
}

/// Waits until it is cancelled (its lease lost) or forever.
struct Hang {
    cancelled: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Hang {
    async fn handle(&self, ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        ctx.cancellation.cancelled().await;
        self.cancelled.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::transient("cancelled"))
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(3600))
    }
}

#[tokio::test]
async fn shutdown_releases_the_leases_of_handlers_still_running_at_the_deadline() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.shutdown_timeout = Duration::from_millis(300);
    let hang = Hang {
        cancelled: Arc::default(),
    };
    let member = Member::start(fleet(&settings, hang), &store);
    let tasks: Vec<NewTask> = (0..3).map(|i| NewTask::new("h", vec![i])).collect();
    store.enqueue_many(&tasks).await.unwrap();
    eventually(Duration::from_secs(10), "three leases", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE lease_owner IS NOT NULL",
        )
        .await
            == 3
    })
    .await;
    let stopping = Instant::now();
    member.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopping.elapsed()
    );
    let leased = "SELECT count(*) FROM recovery_task WHERE lease_owner IS NOT NULL OR next_attempt_at > now() OR attempts > 0";
    assert_eq!(
        scalar(&store, leased).await,
        0,
        "every lease given back, attempt not counted"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_attempt WHERE outcome = 'released'"
        )
        .await,
        3
    );
}

/// Sleeps a while, then succeeds.
struct Sleepy(Duration);

#[async_trait]
impl Handler for Sleepy {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}

#[tokio::test]
async fn shutdown_lets_running_handlers_finish_within_the_deadline() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.shutdown_timeout = Duration::from_secs(10);
    let member = Member::start(fleet(&settings, Sleepy(Duration::from_millis(500))), &store);
    store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "a lease", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE lease_owner IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    member.stop().await;
    assert_eq!(store.status_counts().await.unwrap().resolved, 1);
}

#[tokio::test]
async fn heartbeats_keep_the_lease_of_a_long_handler() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.lease = Duration::from_millis(600);
    settings.worker.heartbeat = Duration::from_millis(150);
    let member = Member::start(
        fleet(&settings, Sleepy(Duration::from_millis(2000))),
        &store,
    );
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    eventually(Duration::from_secs(10), "the pool's lease", || async {
        status(&store, id).await.lease_owner.is_some()
    })
    .await;
    let rival = ["h".to_owned()];
    let deadline = Instant::now() + Duration::from_millis(1700);
    while Instant::now() < deadline {
        let stolen = store
            .claim(&rival, 1, "rival", Duration::from_secs(30))
            .await
            .unwrap();
        assert!(stolen.is_empty(), "the lease lapsed while its handler ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually(Duration::from_secs(10), "resolved", || async {
        status(&store, id).await.status == Status::Resolved
    })
    .await;
    assert_eq!(status(&store, id).await.attempts, 1);
    member.stop().await;
}

#[tokio::test]
async fn a_lost_lease_cancels_the_handler_and_drops_its_result() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.lease = Duration::from_secs(2);
    settings.worker.heartbeat = Duration::from_millis(100);
    let cancelled = Arc::new(AtomicUsize::new(0));
    let fleet = fleet(
        &settings,
        Hang {
            cancelled: cancelled.clone(),
        },
    );
    let metrics = fleet.metrics().clone();
    let member = Member::start(fleet, &store);
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    eventually(Duration::from_secs(10), "a lease", || async {
        status(&store, id).await.lease_owner.is_some()
    })
    .await;
    // Another worker takes the task over (as after a lease lapse).
    sqlx::query(
        "UPDATE recovery_task SET lease_version = lease_version + 1, lease_owner = 'rival', \
         next_attempt_at = now() + interval '1 hour'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    eventually(Duration::from_secs(10), "the handler cancelled", || async {
        cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    let fenced = metrics
        .fenced_writes
        .with_label_values(&["heartbeat"])
        .get();
    assert_eq!(fenced, 1);
    member.stop().await;
    let task = status(&store, id).await;
    assert_eq!(
        (task.status, task.lease_owner.as_deref()),
        (Status::Failed, Some("rival"))
    );
    assert!(
        store.attempts(id).await.unwrap().is_empty(),
        "no result written for the lost lease"
    );
}

/// Regression (issue 30, seen in `redrive bench console` on 10M tasks: "leases were
/// taken over" for a batch of 100 no other member could have touched): a heartbeat that
/// read the held leases just before the finisher wrote their results found them gone and
/// counted them as taken over, raising `redrive_fenced_writes_total{operation=
/// "heartbeat"}` (an alert's input) on a lone member. Heartbeats every 2 ms beside a
/// drain of 6,000 tasks meet many such writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_meeting_results_being_written_counts_no_lease_taken_over() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.heartbeat = Duration::from_millis(2);
    settings.worker.batch_size = 50;
    let fleet = fleet(&settings, Scripted(Duration::from_secs(1)));
    let metrics = fleet.metrics().clone();
    let tasks: Vec<NewTask> = (0..6_000)
        .map(|_| NewTask::new("h", b"ok".to_vec()))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(60), "6,000 tasks resolved", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'resolved'",
        )
        .await
            == 6_000
    })
    .await;
    member.stop().await;
    let taken_over = metrics
        .fenced_writes
        .with_label_values(&["heartbeat"])
        .get();
    assert_eq!(
        taken_over, 0,
        "leases counted as taken over on a lone member"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt").await,
        6_000,
        "each task attempted once"
    );
}

/// Answers once the test lets it: each call takes a permit of `gate`.
struct Gated {
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl Handler for Gated {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        self.gate.acquire().await.expect("gate open").forget();
        Ok(())
    }
}

/// Regression (attack on the heartbeat fix, two members, one stopped past its lease):
/// a real takeover of a lease whose result waited for the finisher was counted twice in
/// `redrive_fenced_writes_total`, by the heartbeat and again by the fenced write; and
/// (second attack) once more as lapsed locally when its deadline passed. Here the results
/// wait past their lease (the history table locked, so no result can be written) while a
/// rival takes every lease; each must be counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_while_its_result_waits_to_be_written_is_counted_once() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.lease = Duration::from_secs(1);
    settings.worker.heartbeat = Duration::from_millis(50);
    settings.worker.batch_size = 4;
    settings.worker.concurrency = 20;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let fleet = fleet(&settings, Gated { gate: gate.clone() });
    let metrics = fleet.metrics().clone();
    let tasks: Vec<NewTask> = (0..20).map(|_| NewTask::new("h", b"x".to_vec())).collect();
    store.enqueue_many(&tasks).await.unwrap();
    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(10), "20 tasks leased", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE lease_owner IS NOT NULL",
        )
        .await
            == 20
    })
    .await;
    let mut lock = store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE recovery_attempt IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    gate.add_permits(20);
    // The handlers answer; their results wait on the lock, in the finisher's writes or
    // queued for them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = sqlx::query(
        "UPDATE recovery_task SET lease_version = lease_version + 1, lease_owner = 'rival', \
         next_attempt_at = now() + interval '1 hour'",
    )
    .execute(store.pool())
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(taken, 20);
    // Heartbeats meet the leases gone, and their deadlines pass.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    lock.rollback().await.unwrap();
    let counted = || {
        let [heartbeat, finish] = ["heartbeat", "finish"]
            .map(|operation| metrics.fenced_writes.with_label_values(&[operation]).get());
        [heartbeat, finish, metrics.leases_lapsed_locally.get()]
    };
    eventually(
        Duration::from_secs(10),
        "every result written or dropped",
        || async { counted().iter().sum::<u64>() >= 20 && metrics.in_flight.get() == 0 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        counted().iter().sum::<u64>(),
        20,
        "20 leases taken over, counted (heartbeat, finish, lapsed locally) {:?}",
        counted()
    );
    member.stop().await;
}

/// Ignores cancellation: the first attempt takes 1.5 s, later ones 4 s.
struct Stubborn {
    calls: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Stubborn {
    async fn handle(&self, ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let secs = if ctx.attempt == 1 { 1.5 } else { 4.0 };
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }
}

/// Regression: in-flight leases were keyed by task id alone, so when this process
/// re-claimed a task whose lease had lapsed, the old attempt's (fenced) result removed
/// the new lease's entry; the new lease was no longer heartbeated, lapsed in turn, and
/// a handler that always succeeds never got its result written.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_lapsed_lease_reclaimed_by_the_same_process_keeps_its_new_lease_alive() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.lease = Duration::from_secs(1);
    settings.worker.heartbeat = Duration::from_millis(300);
    let calls = Arc::new(AtomicUsize::new(0));
    let fleet = fleet(
        &settings,
        Stubborn {
            calls: calls.clone(),
        },
    );
    let member = Member::start(fleet, &store);
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    eventually(Duration::from_secs(10), "the first lease", || async {
        status(&store, id).await.lease_owner.is_some()
    })
    .await;
    // The lease lapses (as after a stalled heartbeat); a new task's notification wakes
    // the claim loop, which takes the lapsed task again. Repeated until it wins the race
    // with the heartbeat.
    eventually(
        Duration::from_secs(10),
        "the same process re-claims",
        || async {
            sqlx::query(
                "UPDATE recovery_task SET next_attempt_at = now() - interval '1 second' \
             WHERE id = $1 AND lease_version = 1",
            )
            .bind(id.0)
            .execute(store.pool())
            .await
            .unwrap();
            store
                .enqueue(&NewTask::new("h", b"wake".to_vec()))
                .await
                .unwrap();
            status(&store, id).await.lease_version >= 2
        },
    )
    .await;
    eventually(Duration::from_secs(30), "the task final", || async {
        status(&store, id).await.status.is_final()
    })
    .await;
    let task = status(&store, id).await;
    assert_eq!(
        (task.status, task.lease_version),
        (Status::Resolved, 2),
        "the second lease's result is written, no third lease"
    );
    member.stop().await;
}

/// Regression: with `database.max_connections = 1` the LISTEN connection took the
/// pool's only slot and nothing was ever claimed.
#[tokio::test]
async fn a_pool_of_one_connection_still_claims() {
    let (store, mut settings) = fresh_store().await;
    settings.database.max_connections = 1;
    let small = Store::connect(&settings.database).await.unwrap();
    let fleet = fleet(&settings, Scripted(Duration::from_millis(10)));
    let member = Member::start(fleet, &small);
    let id = store
        .enqueue(&NewTask::new("h", b"ok".to_vec()))
        .await
        .unwrap()
        .id();
    eventually(Duration::from_secs(10), "resolved", || async {
        status(&store, id).await.status == Status::Resolved
    })
    .await;
    member.stop().await;
}

/// Asks to be retried in about 10^12 years.
struct FarFuture;

#[async_trait]
impl Handler for FarFuture {
    async fn handle(&self, _ctx: &HandlerContext, _task: &Task) -> Result<(), HandlerError> {
        Err(HandlerError::retry_after(
            Duration::MAX,
            "come back much later",
        ))
    }
}

/// Regression: a huge Retry-After (or backoff cap) overflowed `now + delay` outside
/// the handler's panic guard; the lease was then heartbeated forever and the task never
/// ended. The delay is clamped and the retry written.
#[tokio::test]
async fn a_huge_retry_after_is_clamped_and_written() {
    let (store, settings) = fresh_store().await;
    let member = Member::start(fleet(&settings, FarFuture), &store);
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    eventually(Duration::from_secs(10), "the retry written", || async {
        let task = status(&store, id).await;
        task.attempts == 1 && task.lease_owner.is_none()
    })
    .await;
    member.stop().await;
    let task = status(&store, id).await;
    let wait = task.next_attempt_at - chrono::Utc::now();
    assert!(
        wait > chrono::Duration::days(360) && wait <= chrono::Duration::days(367),
        "{wait}"
    );
    assert_eq!(store.attempts(id).await.unwrap()[0].outcome, "retry");
}
