//! The worker's claim rounds: a claim statement that fails half way, a probe claim
//! stuck on a breaker's row, or a task at the attempt counter's limit holds up nothing
//! else the round claimed, nor the rest of its handler's tasks.

use redrive::config::HandlerSettings;
use redrive::{Fleet, NewTask};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::{eventually, fresh_store, scalar, Counting, Member};

/// Regression: a claim round ran the shared claim, then each limited handler's claim,
/// with `?` between them. When the limited claim failed, the tasks the shared claim had
/// already leased (attempt counted) were dropped unstarted; they came back after their
/// leases, lost an attempt each time, and ended "no attempts left" without a call.
#[tokio::test]
async fn a_claim_round_that_fails_half_way_starts_what_it_claimed() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    settings.worker.lease = Duration::from_secs(60);
    settings.handlers.insert(
        "limited".into(),
        HandlerSettings {
            max_concurrency: Some(2),
            ..HandlerSettings::default()
        },
    );
    let (plain, limited) = (Counting::default(), Counting::default());
    let fleet = Fleet::builder(settings)
        .handler("plain", plain.clone())
        .handler("limited", limited.clone())
        .build()
        .unwrap();
    // Every claim of a `limited` task fails, as a data error would.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_limited() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'planted fault' USING ERRCODE = '22003'; END $$; \
         CREATE TRIGGER refuse_limited BEFORE UPDATE ON recovery_task FOR EACH ROW \
         WHEN (NEW.handler = 'limited' AND NEW.lease_owner IS NOT NULL) \
         EXECUTE FUNCTION refuse_limited()",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let mut tasks: Vec<NewTask> = (0..3)
        .map(|i| NewTask {
            max_attempts: Some(2),
            dedup_key: Some(format!("{i}")),
            ..NewTask::new("plain", format!("{i}"))
        })
        .collect();
    tasks.push(NewTask {
        dedup_key: Some("x".into()),
        ..NewTask::new("limited", "x")
    });
    store.enqueue_many(&tasks).await.unwrap();

    let member = Member::start(fleet, &store);
    eventually(
        Duration::from_secs(15),
        "the plain tasks resolved",
        || async {
            scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE handler = 'plain' AND status = 'resolved'",
        )
        .await
            == 3
        },
    )
    .await;
    member.stop().await;
    assert_eq!(
        plain.0.load(Ordering::SeqCst),
        3,
        "each plain task called once"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_attempt WHERE outcome = 'lease_expired'",
        )
        .await,
        0,
        "no lease lapsed"
    );
    assert_eq!(limited.0.load(Ordering::SeqCst), 0);
}

/// Regression: a task whose attempt count was at the integer limit made every claim of
/// its handler fail ("integer out of range"), so nothing else of that handler ran.
#[tokio::test]
async fn a_task_at_the_attempt_counters_limit_does_not_stop_its_handlers_claims() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    let counting = Counting::default();
    let fleet = Fleet::builder(settings)
        .handler("plain", counting.clone())
        .build()
        .unwrap();
    let tasks: Vec<NewTask> = (0..3)
        .map(|i| NewTask {
            dedup_key: Some(format!("{i}")),
            ..NewTask::new("plain", format!("{i}"))
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    sqlx::query(
        "UPDATE recovery_task SET attempts = 2147483647 \
         WHERE dedup_key = '0'",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let member = Member::start(fleet, &store);
    eventually(Duration::from_secs(15), "every task final", || async {
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status <> 'failed'",
        )
        .await
            == 3
    })
    .await;
    member.stop().await;
    assert_eq!(
        counting.0.load(Ordering::SeqCst),
        2,
        "the other two ran; the one out of attempts did not"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE status = 'permanent_failure' AND dedup_key = '0'",
        )
        .await,
        1
    );
}

/// Regression: the half-open probe claim waited for the breaker row with no lock
/// timeout while the tasks the same round had already claimed sat unstarted (their
/// leases running down, another member free to take them over once they lapsed).
#[tokio::test]
async fn a_probe_claim_stuck_on_the_breaker_row_does_not_hold_up_claimed_tasks() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_millis(50);
    settings.handlers.insert(
        "guarded".into(),
        HandlerSettings {
            breaker: Some(redrive::config::BreakerSettings::default()),
            ..HandlerSettings::default()
        },
    );
    let (plain, guarded) = (Counting::default(), Counting::default());
    let fleet = Fleet::builder(settings)
        .handler("plain", plain.clone())
        .handler("guarded", guarded.clone())
        .build()
        .unwrap();
    sqlx::query(
        "INSERT INTO recovery_breaker (handler, state, hold_until) \
         VALUES ('guarded', 'half_open', now())",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store
        .enqueue_many(&[NewTask {
            dedup_key: Some("g".into()),
            ..NewTask::new("guarded", "g")
        }])
        .await
        .unwrap();
    // Another session holds the breaker row, as a member updating it would.
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM recovery_breaker WHERE handler = 'guarded' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();

    let member = Member::start(fleet, &store);
    // Let the member see the breaker half-open, then give it plain work.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tasks: Vec<NewTask> = (0..5)
        .map(|i| NewTask {
            dedup_key: Some(format!("{i}")),
            ..NewTask::new("plain", format!("{i}"))
        })
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the plain tasks resolved while the breaker row is locked",
        || async {
            scalar(
                &store,
                "SELECT count(*) FROM recovery_task WHERE handler = 'plain' AND status = 'resolved'",
            )
            .await
                == 5
        },
    )
    .await;
    holder.rollback().await.unwrap();
    member.stop().await;
    assert_eq!(plain.0.load(Ordering::SeqCst), 5);
}
