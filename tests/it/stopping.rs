//! An operator acting on a task mid-call: the member stops the call at once (it is told,
//! not left to its next heartbeat), and nothing of the task, nor of its ordering key,
//! runs before that call has stopped. A call whose lease is lost (taken over, or not
//! renewed in time while its member is cut off from the database) is stopped too, even
//! if its handler ignores its token.

use async_trait::async_trait;
use redrive::store::{Action, Budget, Operator, Selection};
use redrive::task::{order_key, Failure};
use redrive::{Fleet, Handler, HandlerContext, HandlerError, NewTask, Status, Store, Task, TaskId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{eventually, fresh_store, scalar, Member};

/// One handler call: its task's value, when it started, when it ended (returned or was
/// dropped).
#[derive(Debug, Clone)]
struct Call {
    value: String,
    started: Instant,
    ended: Option<Instant>,
}

/// The first call hangs, deaf to its cancellation (its future must be dropped); later
/// calls succeed at once. Every call is written down.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
}

/// Notes when the call ended, however it ended.
struct Ends(Arc<Mutex<Vec<Call>>>, usize);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1].ended = Some(Instant::now());
    }
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(&self, _: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let value =
            String::from_utf8_lossy(task.failure.value.as_deref().unwrap_or_default()).into_owned();
        let (first, index) = {
            let mut calls = self.calls.lock().unwrap();
            let first = calls.is_empty();
            calls.push(Call {
                value,
                started: Instant::now(),
                ended: None,
            });
            (first, calls.len() - 1)
        };
        let _ends = Ends(self.calls.clone(), index);
        if first {
            tokio::time::sleep(Duration::from_secs(50)).await;
        }
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }
}

impl Recorder {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

fn operator() -> Operator {
    Operator {
        actor: "test-operator".into(),
        reason: Some("mid-call".into()),
    }
}

/// A task of ordered route "r" for key "k".
fn ordered(value: &str) -> NewTask {
    NewTask {
        order_key: Some(order_key("r", b"k")),
        failure: Failure {
            key: Some(b"k".to_vec()),
            value: Some(value.as_bytes().to_vec()),
            route: Some("r".into()),
            ..Failure::default()
        },
        ..NewTask::new("recorder", Vec::new())
    }
}

/// A member whose heartbeat and lease are far longer than the test: only being told
/// can stop a fenced call in time.
async fn member(store: &Store, settings: redrive::Settings, recorder: &Recorder) -> Member {
    let mut settings = settings;
    settings.worker.heartbeat = Duration::from_secs(30);
    settings.worker.lease = Duration::from_secs(90);
    let fleet = Fleet::builder(settings)
        .handler("recorder", recorder.clone())
        .build()
        .unwrap();
    Member::start(fleet, store)
}

async fn first_call_started(recorder: &Recorder) {
    eventually(
        Duration::from_secs(20),
        "the first call started",
        || async { !recorder.calls().is_empty() },
    )
    .await;
}

/// The calls, once task `id` is resolved.
async fn calls_once_resolved(store: &Store, recorder: &Recorder, id: TaskId) -> Vec<Call> {
    eventually(Duration::from_secs(20), "the task resolved", || async {
        store.get(id).await.unwrap().unwrap().status == Status::Resolved
    })
    .await;
    recorder.calls()
}

/// The first call stopped within a few seconds of the action (its member was told;
/// its heartbeat is 30 s away), and `later` started only after it had.
fn assert_stopped_before(calls: &[Call], acted: Instant, later: &str) {
    let first = &calls[0];
    let ended = first.ended.expect("the fenced call ended");
    assert!(
        ended.duration_since(acted) < Duration::from_secs(5),
        "the fenced call was stopped {:?} after the action: {calls:?}",
        ended.duration_since(acted)
    );
    let next = calls
        .iter()
        .find(|c| c.value == later && c.started > first.started)
        .expect("the later call ran");
    assert!(
        next.started >= ended,
        "{later} started {:?} before the fenced call stopped: {calls:?}",
        ended.duration_since(next.started)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_retried_mid_call_runs_again_only_after_the_old_call_stopped() {
    let (store, settings) = fresh_store().await;
    let recorder = Recorder::default();
    let id = store
        .enqueue(&NewTask::new("recorder", b"a".to_vec()))
        .await
        .unwrap()
        .id();
    let running = member(&store, settings, &recorder).await;
    first_call_started(&recorder).await;
    let acted = Instant::now();
    let retry = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    let report = store
        .act(&operator(), &retry, &Selection::Ids(vec![id]))
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    let calls = calls_once_resolved(&store, &recorder, id).await;
    running.stop().await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_stopped_before(&calls, acted, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_next_task_released_by_a_discard_mid_call_waits_for_the_call_to_stop() {
    let (store, settings) = fresh_store().await;
    let recorder = Recorder::default();
    let ids: Vec<_> = store
        .enqueue_many(&[ordered("1"), ordered("2")])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id())
        .collect();
    let running = member(&store, settings, &recorder).await;
    first_call_started(&recorder).await;
    let acted = Instant::now();
    let report = store
        .act(&operator(), &Action::Discard, &Selection::Ids(vec![ids[0]]))
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    let calls = calls_once_resolved(&store, &recorder, ids[1]).await;
    running.stop().await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_stopped_before(&calls, acted, "2");
}

/// Without word from the member (it died mid-call), the task waits for the old lease's
/// deadline, by which the member's own deadline would have stopped the call; with word,
/// it runs at once. A lease lost otherwise has nothing to say.
#[tokio::test]
async fn a_fenced_call_holds_its_task_until_its_member_says_it_stopped_or_its_lease_ends() {
    let (store, _settings) = fresh_store().await;
    for value in ["told", "silent"] {
        store
            .enqueue(&NewTask::new("h", value.as_bytes().to_vec()))
            .await
            .unwrap();
    }
    let handlers = ["h".to_string()];
    let lease = Duration::from_secs(3);
    let leased = store.claim(&handlers, 2, "dying", lease).await.unwrap();
    assert_eq!(leased.len(), 2);
    let ids = leased.iter().map(|t| t.id).collect();
    let retry = Action::Retry {
        at: None,
        budget: Budget::Fresh,
        force: false,
    };
    store
        .act(&operator(), &retry, &Selection::Ids(ids))
        .await
        .unwrap();
    assert!(
        (store.claim(&handlers, 2, "other", lease).await.unwrap()).is_empty(),
        "a task was claimed while its fenced call may run"
    );
    let told = leased
        .iter()
        .find(|t| t.failure.value.as_deref() == Some(b"told"))
        .unwrap();
    store.calls_stopped(&[told.lease()]).await.unwrap();
    let other_lease = Duration::from_secs(60);
    let claimed = store
        .claim(&handlers, 2, "other", other_lease)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, told.id);
    // The idle claimers' wait passes over the task held back (it is not due for them).
    let next = store
        .next_due(&handlers, None)
        .await
        .unwrap()
        .expect("a task");
    assert!(next > Duration::from_secs(30), "next due in {next:?}");
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let silent = store
        .claim(&handlers, 2, "other", other_lease)
        .await
        .unwrap();
    assert_eq!(
        silent.len(),
        1,
        "the silent member's task came back at its deadline"
    );
    assert_ne!(silent[0].id, told.id);
    // Its row holds nothing back any more; the next action clears it.
    let stale = "SELECT count(*) FROM recovery_stopping_call WHERE ends_by < now()";
    assert_eq!(scalar(&store, stale).await, 1);
    let idle = store
        .enqueue(&NewTask::new("idle", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    store
        .act(&operator(), &Action::Discard, &Selection::Ids(vec![idle]))
        .await
        .unwrap();
    assert_eq!(scalar(&store, stale).await, 0, "a stale row was left");
}

/// Sleeps without watching its context's token, then records a side effect.
#[derive(Clone, Default)]
struct Deaf {
    started: Arc<AtomicUsize>,
    effects: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler for Deaf {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(4)).await;
        self.effects.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }
}

/// Regression: a handler that ignored its token ran on after its lease was taken
/// over, and its side effect landed after the new owner's attempt began.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_call_whose_lease_was_taken_over_is_stopped_even_if_it_ignores_its_token() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.lease = Duration::from_secs(10);
    settings.worker.heartbeat = Duration::from_millis(100);
    settings.worker.poll_interval = Duration::from_millis(50);
    let deaf = Deaf::default();
    let fleet = Fleet::builder(settings)
        .handler("deaf", deaf.clone())
        .build()
        .unwrap();
    store.enqueue(&NewTask::new("deaf", "x")).await.unwrap();
    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(10), "the call started", || async {
        deaf.started.load(Ordering::SeqCst) == 1
    })
    .await;
    sqlx::query(
        "UPDATE recovery_task SET lease_version = lease_version + 1, lease_owner = 'rival'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // Past the end of the 4 s call.
    tokio::time::sleep(Duration::from_secs(5)).await;
    member.stop().await;
    assert_eq!(
        deaf.effects.load(Ordering::SeqCst),
        0,
        "the call was stopped"
    );
}

/// Regression: a member cut off from PostgreSQL had no local lease deadline: its call
/// ran on past the lease, while another member could take the task (and the next task
/// of its key) over. The call is stopped once its lease could not be renewed in time.
#[tokio::test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: scripts/test runs it"
)]
async fn a_member_cut_off_from_the_database_stops_calls_whose_lease_ran_out() {
    let (store, settings) = fresh_store().await;
    let proxy = crate::support::PgProxy::start().await;
    let mut settings = proxy.route(&settings);
    settings.worker.lease = Duration::from_secs(2);
    settings.worker.heartbeat = Duration::from_millis(200);
    settings.worker.poll_interval = Duration::from_millis(50);
    let proxied = redrive::Store::connect(&settings.database).await.unwrap();
    let deaf = Deaf::default();
    let fleet = Fleet::builder(settings)
        .handler("deaf", deaf.clone())
        .build()
        .unwrap();
    store.enqueue(&NewTask::new("deaf", "x")).await.unwrap();
    let member = Member::start(fleet, &proxied);
    eventually(Duration::from_secs(10), "the call started", || async {
        deaf.started.load(Ordering::SeqCst) == 1
    })
    .await;
    proxy.cut();
    // The call would end 4 s after it started; the lease ends after 2 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        deaf.effects.load(Ordering::SeqCst),
        0,
        "the call was stopped"
    );
    proxy.restore();
    member.stop().await;
}
