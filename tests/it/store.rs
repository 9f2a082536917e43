//! The store's guarantees: byte-exact storage, idempotent enqueue, fenced writes.

use chrono::Utc;
use redrive::store::{enqueue_many_in, Finish};
use redrive::task::{Failure, FinishOutcome};
use redrive::{Enqueued, Header, NewTask, SourceCoordinates, Status, Store, StoreError};
use std::time::Duration;

use crate::support::{fresh_store, scalar};

const LEASE: Duration = Duration::from_secs(30);

fn handlers() -> Vec<String> {
    vec!["h".to_owned()]
}

fn finish(task: &redrive::Task, outcome: FinishOutcome) -> Finish {
    Finish {
        cause: None,
        lease: task.lease(),
        outcome,
        started_at: Utc::now(),
        duration: Duration::from_millis(3),
        error: None,
        compensate: false,
    }
}

#[tokio::test]
async fn stored_bytes_come_back_exactly() {
    let (store, _) = fresh_store().await;
    let task = NewTask {
        handler: "h".into(),
        failure: Failure {
            source: Some(SourceCoordinates {
                topic: "orders.dlt".into(),
                partition: 2,
                offset: 99,
            }),
            key: None,
            value: Some(vec![0xff, 0xfe, 0x00, 0x80, b'{']),
            headers: vec![
                Header::new("trace", vec![0x00, 0xff]),
                Header {
                    name: "empty".into(),
                    value: None,
                },
                Header::new("trace", b"second".to_vec()),
            ],
            error_class: Some("java.lang.IllegalStateException".into()),
            error_message: Some("boom".into()),
            event_type: Some("order.created".into()),
            correlation_id: Some("c-1".into()),
            ..Failure::default()
        },
        ..NewTask::default()
    };
    let id = store.enqueue(&task).await.unwrap().id();
    let stored = store.get(id).await.unwrap().unwrap();
    assert!(task.same_content_as(&stored));
    assert_eq!(stored.failure.key, None);
    assert_eq!(
        stored.failure.value.as_deref(),
        Some(&[0xff, 0xfe, 0x00, 0x80, b'{'][..])
    );
    assert_eq!(stored.dedup_key.as_deref(), Some("kafka:orders.dlt:2:99"));
    assert_eq!(stored.status, Status::Failed);
    assert_eq!(
        stored.failure.error_class.as_deref(),
        Some("java.lang.IllegalStateException")
    );

    let empty = store
        .enqueue(&NewTask::new("h", Vec::new()))
        .await
        .unwrap()
        .id();
    assert_eq!(
        store.get(empty).await.unwrap().unwrap().failure.value,
        Some(Vec::new())
    );
}

/// A stored task that cannot be read (here, malformed headers) still holds its dedup
/// key: a repeat of it is the existing task, and the tasks beside it in the batch are
/// stored, instead of the whole enqueue failing (an ingest flush would retry forever).
#[tokio::test]
async fn a_repeat_of_an_unreadable_task_is_the_existing_one_and_its_batch_is_stored() {
    let (store, _) = fresh_store().await;
    let mut task = NewTask::new("h", b"payload".to_vec());
    task.dedup_key = Some("order-1".into());
    let stored = store.enqueue(&task).await.unwrap().id();
    sqlx::query("UPDATE recovery_task SET msg_headers = '\\x0100'::bytea WHERE id = $1")
        .bind(stored.0)
        .execute(store.pool())
        .await
        .unwrap();
    let beside = NewTask::new("h", b"beside".to_vec());
    let results = store.enqueue_many(&[task, beside]).await.unwrap();
    assert_eq!(results[0], Enqueued::Existing(stored));
    assert!(matches!(results[1], Enqueued::Created(_)), "{results:?}");
}

/// Process mode asks which consumed messages are recorded before running them inline:
/// one unreadable task among them is a repeat (what it stores is what was recorded),
/// and the answer for the others still comes (it failed the whole lookup, and every
/// message of the batch went unattempted to the pool).
#[tokio::test]
async fn an_unreadable_task_is_a_repeat_and_the_messages_beside_it_are_still_told_apart() {
    let (store, _) = fresh_store().await;
    let mut task = NewTask::new("h", b"payload".to_vec());
    task.dedup_key = Some("order-1".into());
    let stored = store.enqueue(&task).await.unwrap().id();
    sqlx::query("UPDATE recovery_task SET msg_headers = '\\x0100'::bytea WHERE id = $1")
        .bind(stored.0)
        .execute(store.pool())
        .await
        .unwrap();
    let mut beside = NewTask::new("h", b"beside".to_vec());
    beside.dedup_key = Some("order-2".into());
    let recorded = store.recorded(&[&task, &beside]).await.unwrap();
    assert_eq!(recorded.repeats, [0].into());
    assert!(recorded.collisions.is_empty(), "{recorded:?}");
}

#[tokio::test]
async fn enqueue_is_idempotent_on_the_dedup_key_and_reports_conflicts() {
    let (store, _) = fresh_store().await;
    let mut task = NewTask::new("h", b"payload".to_vec());
    task.dedup_key = Some("order-1".into());
    let first = store.enqueue(&task).await.unwrap();
    assert!(matches!(first, Enqueued::Created(_)));
    assert_eq!(
        store.enqueue(&task).await.unwrap(),
        Enqueued::Existing(first.id())
    );

    let mut different = task.clone();
    different.failure.value = Some(b"other payload".to_vec());
    match store.enqueue(&different).await {
        Err(StoreError::Conflict {
            dedup_key,
            existing,
        }) => {
            assert_eq!((dedup_key.as_str(), existing), ("order-1", first.id()));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }

    // In one batch: a new task, a repeat inside the batch, an existing one, a conflict,
    // and unkeyed tasks that are never deduplicated.
    let mut fresh = NewTask::new("h", b"fresh".to_vec());
    fresh.dedup_key = Some("order-2".into());
    let unkeyed = NewTask::new("h", b"same".to_vec());
    let batch = [
        fresh.clone(),
        unkeyed.clone(),
        fresh,
        task,
        different,
        unkeyed,
    ];
    let outcomes = store.enqueue_many(&batch).await.unwrap();
    let Enqueued::Created(new_id) = outcomes[0] else {
        panic!("{outcomes:?}")
    };
    assert!(matches!(outcomes[1], Enqueued::Created(_)));
    assert_eq!(outcomes[2], Enqueued::Existing(new_id));
    assert_eq!(outcomes[3], Enqueued::Existing(first.id()));
    assert_eq!(outcomes[4], Enqueued::Conflict(first.id()));
    assert!(matches!(outcomes[5], Enqueued::Created(id) if id != outcomes[1].id()));
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        4
    );
}

/// A dedup key is claimed in a table of its own (the drain never rewrites its index): a
/// task deleted by any statement gives its key back, one left alone keeps it, and a key
/// claimed in a rolled-back transaction is free again.
#[tokio::test]
async fn a_deleted_task_gives_its_dedup_key_back_and_a_rolled_back_claim_leaves_it_free() {
    let (store, _) = fresh_store().await;
    let keyed = |key: &str, value: &[u8]| {
        let mut task = NewTask::new("h", value.to_vec());
        task.dedup_key = Some(key.into());
        task
    };
    let gone = store.enqueue(&keyed("gone", b"a")).await.unwrap().id();
    let kept = store.enqueue(&keyed("kept", b"b")).await.unwrap().id();
    sqlx::query("DELETE FROM recovery_task WHERE id = $1")
        .bind(gone.0)
        .execute(store.pool())
        .await
        .unwrap();
    let again = store
        .enqueue(&keyed("gone", b"other content"))
        .await
        .unwrap();
    assert!(
        matches!(again, Enqueued::Created(id) if id != gone),
        "{again:?}"
    );
    assert_eq!(
        store.enqueue(&keyed("kept", b"b")).await.unwrap(),
        Enqueued::Existing(kept)
    );

    let mut tx = store.pool().begin().await.unwrap();
    enqueue_many_in(&mut tx, &[keyed("rolled-back", b"c")])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.enqueue(&keyed("rolled-back", b"d")).await.unwrap(),
        Enqueued::Created(_)
    ));
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task t JOIN recovery_task_dedup d \
             ON d.dedup_key = t.dedup_key AND d.task_id = t.id"
        )
        .await,
        3,
        "each stored task holds its key"
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task_dedup").await,
        3
    );
}

#[tokio::test]
async fn enqueue_inside_the_callers_transaction_commits_or_rolls_back_with_it() {
    let (store, _) = fresh_store().await;
    let mut tx = store.pool().begin().await.unwrap();
    enqueue_many_in(&mut tx, &[NewTask::new("h", b"a".to_vec())])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task").await,
        0
    );

    let mut tx = store.pool().begin().await.unwrap();
    let ids = enqueue_many_in(&mut tx, &[NewTask::new("h", b"b".to_vec())])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(store.get(ids[0].id()).await.unwrap().is_some());
}

#[tokio::test]
async fn a_claim_leases_due_tasks_once_and_bumps_the_fencing_token() {
    let (store, _) = fresh_store().await;
    let mut later = NewTask::new("h", b"later".to_vec());
    later.next_attempt_at = Some(Utc::now() + chrono::Duration::hours(1));
    store
        .enqueue_many(&[
            NewTask::new("h", b"1".to_vec()),
            NewTask::new("other", b"2".to_vec()),
            later,
        ])
        .await
        .unwrap();
    let claimed = store.claim(&handlers(), 10, "w1", LEASE).await.unwrap();
    assert_eq!(claimed.len(), 1, "only due tasks of served handlers");
    let task = &claimed[0];
    assert_eq!((task.lease_version, task.attempts), (1, 1));
    assert_eq!(task.lease_owner.as_deref(), Some("w1"));
    assert!(task.next_attempt_at > Utc::now() + chrono::Duration::seconds(25));
    assert!(store
        .claim(&handlers(), 10, "w2", LEASE)
        .await
        .unwrap()
        .is_empty());
}

/// A claim walking the due index from a due time (the member's floor) leaves what is due
/// before it, says the earliest due time it took, and a walk from the start finds the
/// rest; the look for the next due task honours the same start.
#[tokio::test]
async fn a_claim_from_a_due_time_leaves_what_is_due_before_it_to_a_walk_from_the_start() {
    let (store, _) = fresh_store().await;
    let at = |seconds_ago: i64| Utc::now() - chrono::Duration::seconds(seconds_ago);
    let tasks: Vec<NewTask> = [100, 10, 5]
        .into_iter()
        .map(|ago| {
            let mut task = NewTask::new("h", ago.to_string().into_bytes());
            task.next_attempt_at = Some(at(ago));
            task
        })
        .collect();
    let ids: Vec<_> = store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id())
        .collect();
    let due = |i: usize| tasks[i].next_attempt_at.unwrap();
    let from = at(50);
    assert_eq!(
        store.next_due(&handlers(), Some(from)).await.unwrap(),
        Some(Duration::ZERO)
    );

    let claimed = store
        .claim_from(&handlers(), 10, "w", LEASE, Some(from))
        .await
        .unwrap();
    let mut got: Vec<_> = claimed.tasks.iter().map(|t| t.id).collect();
    got.sort();
    assert_eq!(
        got,
        ids[1..],
        "the tasks due after the start, not the one before"
    );
    let first_due = claimed.first_due.expect("a due time");
    assert!(
        (first_due - due(1)).num_milliseconds().abs() < 2,
        "{first_due}: the 10 s old task's"
    );

    // Those two are leased now: from the start the old one is due, from `from` nothing
    // comes before their lease deadlines.
    assert_eq!(
        store.next_due(&handlers(), None).await.unwrap(),
        Some(Duration::ZERO)
    );
    let leased = store
        .next_due(&handlers(), Some(from))
        .await
        .unwrap()
        .expect("the leases");
    assert!(leased > LEASE / 2, "{leased:?}");
    let none = store
        .claim_from(&handlers(), 10, "w", LEASE, Some(from))
        .await
        .unwrap();
    assert!(none.tasks.is_empty() && none.first_due.is_none());

    let rest = store
        .claim_from(&handlers(), 10, "w", LEASE, None)
        .await
        .unwrap();
    assert_eq!(
        rest.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        ids[..1]
    );
    assert!((rest.first_due.unwrap() - due(0)).num_milliseconds().abs() < 2);
}

#[tokio::test]
async fn a_late_worker_cannot_finish_or_heartbeat_a_task_taken_over() {
    let (store, _) = fresh_store().await;
    store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap();
    let old = store
        .claim(&handlers(), 1, "slow", Duration::from_millis(1))
        .await
        .unwrap()
        .remove(0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let new = store
        .claim(&handlers(), 1, "fast", LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(new.id, old.id);
    assert_eq!(new.lease_version, old.lease_version + 1);

    assert!(store
        .heartbeat(&[old.lease()], LEASE)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .finish("slow", &[finish(&old, FinishOutcome::Resolved)])
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .release("slow", &[old.lease()])
        .await
        .unwrap()
        .is_empty());
    let current = store.get(old.id).await.unwrap().unwrap();
    assert_eq!(
        (current.status, current.lease_owner.as_deref()),
        (Status::Failed, Some("fast"))
    );

    assert_eq!(
        store.heartbeat(&[new.lease()], LEASE).await.unwrap(),
        vec![new.lease()]
    );
    let written = store
        .finish("fast", &[finish(&new, FinishOutcome::Resolved)])
        .await
        .unwrap();
    assert_eq!(written, vec![new.lease()]);
    // A second write of the same result (say, a retry after a lost reply) changes nothing.
    assert!(store
        .finish("fast", &[finish(&new, FinishOutcome::Resolved)])
        .await
        .unwrap()
        .is_empty());
    let history = store.attempts(new.id).await.unwrap();
    let rows: Vec<_> = history
        .iter()
        .map(|a| (a.attempt, a.worker.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(
        rows,
        vec![(1, "slow", "lease_expired"), (2, "fast", "resolved")]
    );
}

#[tokio::test]
async fn finishing_in_one_statement_writes_each_outcome_and_its_history() {
    let (store, _) = fresh_store().await;
    let tasks: Vec<NewTask> = (0..3).map(|i| NewTask::new("h", vec![i])).collect();
    store.enqueue_many(&tasks).await.unwrap();
    let claimed = store.claim(&handlers(), 3, "w", LEASE).await.unwrap();
    let retry_at = Utc::now() + chrono::Duration::minutes(5);
    let mut results = vec![
        finish(&claimed[0], FinishOutcome::Resolved),
        finish(&claimed[1], FinishOutcome::Retry { at: retry_at }),
        finish(&claimed[2], FinishOutcome::PermanentFailure),
    ];
    results[1].error = Some("503".into());
    results[2].error = Some("invalid".into());
    let written = store.finish("w", &results).await.unwrap();
    assert_eq!(written.len(), 3);

    let resolved = store.get(claimed[0].id).await.unwrap().unwrap();
    assert_eq!(resolved.status, Status::Resolved);
    assert!(resolved.finished_at.is_some() && resolved.lease_owner.is_none());
    let retrying = store.get(claimed[1].id).await.unwrap().unwrap();
    assert_eq!(
        (retrying.status, retrying.last_error.as_deref()),
        (Status::Failed, Some("503"))
    );
    // Due the asked backoff after the database's now: no earlier, and late by no more
    // than the statement took.
    let late = (retrying.next_attempt_at - retry_at).num_milliseconds();
    assert!((0..1_000).contains(&late), "{late} ms");
    assert!(retrying.finished_at.is_none());
    let permanent = store.get(claimed[2].id).await.unwrap().unwrap();
    assert_eq!(permanent.status, Status::PermanentFailure);
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_attempt").await,
        3
    );
    // The retry keeps its schedule: a heartbeat after the finish must not move it.
    assert!(store
        .heartbeat(&[claimed[1].lease()], LEASE)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_database_error_during_finish_leaves_the_task_to_come_back_after_its_lease() {
    let (store, settings) = fresh_store().await;
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    let broken = redrive::Store::connect(&settings.database).await.unwrap();
    let task = broken
        .claim(&handlers(), 1, "doomed", Duration::from_millis(300))
        .await
        .unwrap()
        .remove(0);
    broken.pool().close().await;
    assert!(broken
        .finish("doomed", &[finish(&task, FinishOutcome::Resolved)])
        .await
        .is_err());

    assert!(
        store
            .claim(&handlers(), 1, "next", LEASE)
            .await
            .unwrap()
            .is_empty(),
        "still leased"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = store
        .claim(&handlers(), 1, "next", LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!((again.id, again.attempts), (id, 2));
    assert_eq!(
        store
            .finish("next", &[finish(&again, FinishOutcome::Resolved)])
            .await
            .unwrap(),
        vec![again.lease()]
    );
    let outcomes: Vec<String> = store
        .attempts(id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, ["lease_expired", "resolved"], "finished once");
}

#[tokio::test]
async fn released_leases_are_claimable_at_once_and_do_not_use_up_attempts() {
    let (store, _) = fresh_store().await;
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    let task = store
        .claim(&handlers(), 1, "w", LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(store.release("w", &[task.lease()]).await.unwrap(), vec![id]);
    let released = store.get(id).await.unwrap().unwrap();
    assert_eq!((released.attempts, released.lease_owner.clone()), (0, None));
    assert_eq!(store.attempts(id).await.unwrap()[0].outcome, "released");
    let again = store
        .claim(&handlers(), 1, "w2", LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (again.attempts, again.lease_version),
        (1, task.lease_version + 2)
    );
}

#[tokio::test]
async fn migrations_can_run_again_and_from_two_processes_at_once() {
    let (store, settings) = fresh_store().await;
    let other = redrive::Store::connect(&settings.database).await.unwrap();
    let (a, b) = tokio::join!(store.migrate(), other.migrate());
    a.unwrap();
    b.unwrap();
}

#[tokio::test]
async fn a_lapsed_lease_taken_over_leaves_the_lost_attempt_in_the_history() {
    let (store, _) = fresh_store().await;
    let id = store
        .enqueue(&NewTask::new("h", b"x".to_vec()))
        .await
        .unwrap()
        .id();
    let lost = store
        .claim(&handlers(), 1, "crashed", LEASE)
        .await
        .unwrap()
        .remove(0);
    lapse(&store, id).await;
    let again = store
        .claim(&handlers(), 1, "next", LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!((again.attempts, again.lease_version), (2, 2));

    let history = store.attempts(id).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    let expired = &history[0];
    assert_eq!(
        (
            expired.attempt,
            expired.lease_version,
            expired.worker.as_str(),
            expired.outcome.as_str()
        ),
        (1, 1, "crashed", "lease_expired")
    );
    assert_eq!(Some(expired.started_at), lost.leased_at);
    assert!(expired.duration_ms >= 0);

    store
        .finish("next", &[finish(&again, FinishOutcome::Resolved)])
        .await
        .unwrap();
    let history = store.attempts(id).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|a| (a.attempt, a.outcome.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "lease_expired"), (2, "resolved")],
        "one history row per counted attempt"
    );
}

/// Stores `count` tasks of handler `h`; their ids, in order.
async fn enqueue_several(store: &Store, count: u8) -> Vec<redrive::TaskId> {
    let tasks: Vec<NewTask> = (0..count).map(|i| NewTask::new("h", vec![i])).collect();
    store
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(Enqueued::id)
        .collect()
}

#[tokio::test]
async fn an_unreadable_row_ends_permanent_and_the_rest_of_its_claim_runs() {
    let (store, _) = fresh_store().await;
    let ids = enqueue_several(&store, 4).await;
    let bad = ids[1];
    sqlx::query("UPDATE recovery_task SET msg_headers = '\\x0100'::bytea WHERE id = $1")
        .bind(bad.0)
        .execute(store.pool())
        .await
        .unwrap();

    let claimed = store.claim(&handlers(), 10, "w", LEASE).await.unwrap();
    let mut claimed_ids: Vec<_> = claimed.iter().map(|t| t.id).collect();
    claimed_ids.sort();
    assert_eq!(claimed_ids, vec![ids[0], ids[2], ids[3]]);

    let ended = raw_status(&store, bad).await;
    assert_eq!(ended.0, "permanent_failure");
    assert_eq!(ended.1, None, "lease given up");
    let reason = ended.2.expect("the reason is kept");
    assert!(
        reason.contains("msg_headers") && reason.contains(&bad.to_string()),
        "{reason}"
    );
    let history = store.attempts(bad).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].attempt, history[0].outcome.as_str()),
        (1, "permanent_failure")
    );
    assert_eq!(history[0].error.as_deref(), Some(reason.as_str()));

    // Every lease lapses: the good tasks come back, the unreadable one does not.
    for id in &ids {
        lapse(&store, *id).await;
    }
    let mut again: Vec<_> = store
        .claim(&handlers(), 10, "w2", LEASE)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    again.sort();
    assert_eq!(again, vec![ids[0], ids[2], ids[3]]);
}

/// Moves a task's lease deadline (or due time) into the past, as if time had passed.
/// Found by the attack on issue 18's webhook change: a task whose `source_timestamp` was
/// set by hand to `infinity` (or a year past chrono's 262142) panicked in sqlx's decoding
/// of the claimed row, the member stopped, and every restart claimed it again; the tasks
/// claimed beside it spent attempts without a call. Such a row is unreadable, like one
/// with malformed headers: it ends permanent with the reason, the rest of its claim runs.
#[tokio::test]
async fn a_time_beyond_what_a_task_can_hold_makes_its_row_unreadable_not_a_panic() {
    let (store, _) = fresh_store().await;
    let ids = enqueue_several(&store, 5).await;
    let planted = [
        (ids[1], "source_timestamp", "infinity"),
        (ids[2], "source_timestamp", "294000-01-01"),
        (ids[3], "created_at", "-infinity"),
    ];
    for (id, column, value) in planted {
        sqlx::query(&format!(
            "UPDATE recovery_task SET {column} = '{value}' WHERE id = $1"
        ))
        .bind(id.0)
        .execute(store.pool())
        .await
        .unwrap();
        let shown = store
            .get(id)
            .await
            .expect_err("an unreadable row")
            .to_string();
        assert!(
            shown.contains(column) && shown.contains(&id.to_string()),
            "{shown}"
        );
    }

    // A list shows no page rather than a wrong one, and says which task is the cause.
    let listed = store
        .list(&redrive::store::TaskFilter::default(), None, 50)
        .await
        .expect_err("an unreadable row")
        .to_string();
    assert!(listed.contains(&ids[3].to_string()), "{listed}");

    let claimed = store.claim(&handlers(), 10, "w", LEASE).await.unwrap();
    let mut claimed_ids: Vec<_> = claimed.iter().map(|t| t.id).collect();
    claimed_ids.sort();
    assert_eq!(claimed_ids, vec![ids[0], ids[4]]);
    for (id, column, _) in planted {
        let (status, owner, reason) = raw_status(&store, id).await;
        assert_eq!(
            (status.as_str(), owner),
            ("permanent_failure", None),
            "{id}"
        );
        let reason = reason.expect("the reason is kept");
        assert!(
            reason.contains(column) && reason.contains("out of range"),
            "{reason}"
        );
    }
}

/// Found by the second attack on issue 18's fixes: a time no task or row can hold, set
/// by hand in a table beside the tasks', panicked in sqlx's decoding. A claim of a task
/// due at `-infinity` stopped the member; a replay job created at `infinity` stopped
/// every member that took it over, one after another; the attempt history, the audit
/// and the member list panicked the CLI and dropped the API's connection. Each is now
/// an error naming the column, and the replay job ends failed.
#[tokio::test]
async fn a_time_out_of_range_in_any_table_is_an_error_not_a_panic() {
    let (store, _) = fresh_store().await;
    let run = |sql: String| {
        let store = store.clone();
        async move {
            sqlx::query(&sql).execute(store.pool()).await.unwrap();
        }
    };
    let id = store
        .enqueue(&NewTask::new("h", b"v".to_vec()))
        .await
        .unwrap()
        .id();
    run(format!(
        "UPDATE recovery_task SET next_attempt_at = '-infinity' WHERE id = {id}"
    ))
    .await;
    let claimed = store.claim(&handlers(), 10, "w", LEASE).await.unwrap();
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), vec![id]);

    run(format!(
        "INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, \
             duration_ms, outcome) VALUES ({id}, 99, 1, 'w', 'infinity', 1, 'retry')"
    ))
    .await;
    let history = store
        .attempts(id)
        .await
        .expect_err("unreadable")
        .to_string();
    assert!(history.contains("started_at"), "{history}");

    run(
        "INSERT INTO recovery_audit (at, actor, action) VALUES ('-infinity', 'a', 'discard')"
            .into(),
    )
    .await;
    let audit = store
        .audit(&redrive::store::AuditQuery::default())
        .await
        .expect_err("unreadable")
        .to_string();
    assert!(audit.contains("at:"), "{audit}");

    run(
        "INSERT INTO recovery_member (id, host, version, roles, started_at, last_seen) \
         VALUES ('m', 'h', 'v', '{}', '-infinity', 'infinity')"
            .into(),
    )
    .await;
    // Members are read at the edges of the readable years instead: one member's row
    // must not stop the overview, `members` or the readers of the fleet's budgets
    // (found by an attack).
    let members = store.live_members().await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].started_at.format("%Y").to_string(), "0001");
    assert_eq!(members[0].last_seen.format("%Y").to_string(), "9999");

    run(
        "INSERT INTO recovery_replay (created_at, actor, filter, target_topic, detached, \
             status, heartbeat_at) VALUES ('infinity', 'a', '{\"ids\":[1]}', 't', true, \
             'running', '-infinity')"
            .into(),
    )
    .await;
    let taken = store
        .claim_detached_replay("r")
        .await
        .expect_err("unreadable")
        .to_string();
    assert!(taken.contains("created_at"), "{taken}");
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM recovery_replay")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        status, "failed",
        "the job ends, not taken again by the next member"
    );
    assert!(error.unwrap_or_default().contains("created_at"));
    assert!(store.claim_detached_replay("r2").await.unwrap().is_none());
    assert!(store.replays(10, None).await.is_err());

    // Resuming or cancelling such a job answers the error and changes nothing: each used
    // to act on the job and then fail to show it, so the operator was told it had failed.
    let operator = redrive::store::Operator {
        actor: "ops".into(),
        reason: None,
    };
    let id = scalar(&store, "SELECT id FROM recovery_replay").await;
    let resumed = store
        .resume_replay(&operator, id, "ops-runner", true, None, None)
        .await
        .expect_err("unreadable")
        .to_string();
    assert!(resumed.contains("created_at"), "{resumed}");
    let status = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM recovery_replay")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    assert_eq!(
        status().await,
        "failed",
        "the resume left the job as it was"
    );
    let cancelled = store
        .cancel_replay(&operator, id)
        .await
        .expect_err("unreadable")
        .to_string();
    assert!(cancelled.contains("created_at"), "{cancelled}");
    assert_eq!(
        status().await,
        "failed",
        "the cancel left the job as it was"
    );
    let audited = scalar(
        &store,
        "SELECT count(*) FROM recovery_audit WHERE action LIKE 'replay_%'",
    )
    .await;
    assert_eq!(audited, 0, "nothing was done, so nothing is audited");
}

/// Found by the third attack: PostgreSQL 15 cannot subtract an infinite time. One task
/// whose lapsed lease began at `-infinity` (set by hand) failed every claim of its
/// handlers, for every member; one due at `infinity` failed every look for the next due
/// task (twenty errors a second) and `tasks stats`. Times from a row are clamped to what
/// a time can hold before any arithmetic.
#[tokio::test]
async fn an_infinite_lease_or_due_time_stops_no_claim_and_no_figure() {
    let (store, _) = fresh_store().await;
    let ids = enqueue_several(&store, 4).await;
    let (ghost, healthy, never, always) = (ids[0], ids[1], ids[2], ids[3]);
    for sql in [
        format!(
            "UPDATE recovery_task SET lease_owner = 'ghost', lease_version = lease_version + 1, \
             leased_at = '-infinity', attempts = 1, next_attempt_at = now() - interval '1 second' \
             WHERE id = {ghost}"
        ),
        format!("UPDATE recovery_task SET next_attempt_at = 'infinity' WHERE id = {never}"),
        format!("UPDATE recovery_task SET next_attempt_at = '-infinity' WHERE id = {always}"),
    ] {
        sqlx::query(&sql).execute(store.pool()).await.unwrap();
    }
    store.stats().await.expect("the figures despite the times");
    assert_eq!(
        store.next_due(&handlers(), None).await.unwrap(),
        Some(Duration::ZERO)
    );
    let claimed = store.claim(&handlers(), 10, "w", LEASE).await.unwrap();
    let mut claimed_ids: Vec<_> = claimed.iter().map(|t| t.id).collect();
    claimed_ids.sort();
    assert_eq!(claimed_ids, vec![ghost, healthy, always]);
    let history = store.attempts(ghost).await.expect("a readable history");
    assert_eq!(
        history
            .iter()
            .map(|a| a.outcome.as_str())
            .collect::<Vec<_>>(),
        vec!["lease_expired"]
    );
    // Left: the claimed tasks, due again when their leases lapse, and the one at
    // `infinity` behind them.
    let wait = store.next_due(&handlers(), None).await.unwrap().unwrap();
    assert!(wait <= LEASE, "{wait:?}");
}

async fn lapse(store: &redrive::Store, id: redrive::TaskId) {
    sqlx::query(
        "UPDATE recovery_task SET next_attempt_at = now() - interval '1 second' \
         WHERE id = $1 AND status = 'failed'",
    )
    .bind(id.0)
    .execute(store.pool())
    .await
    .unwrap();
}

/// Status, lease owner and last error of a task, read without decoding the whole row.
async fn raw_status(
    store: &redrive::Store,
    id: redrive::TaskId,
) -> (String, Option<String>, Option<String>) {
    sqlx::query_as("SELECT status, lease_owner, last_error FROM recovery_task WHERE id = $1")
        .bind(id.0)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Regression: on a million tasks every operator batch took 0.7 s, PostgreSQL compiling
/// each execution of its (generic, costly-looking) plan with JIT.
#[tokio::test]
async fn connections_run_without_jit() {
    let (store, _) = fresh_store().await;
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(jit, "off");
}

/// The ids of the tasks `filter` lists (at most 100), in increasing order.
async fn listed_ids(store: &Store, filter: redrive::store::TaskFilter) -> Vec<i64> {
    let mut ids: Vec<i64> = (store.list(&filter, None, 100).await.unwrap())
        .iter()
        .map(|t| t.id.0)
        .collect();
    ids.sort();
    ids
}

/// The key filters find their tasks through the key's first 64 bytes (its head): keys
/// that share those 64 bytes, a prefix longer than 64 bytes, and bytes 0xff after a prefix
/// are each matched exactly as the full key says.
#[tokio::test]
async fn key_filters_match_whole_keys_beyond_the_indexed_head() {
    let (store, _) = fresh_store().await;
    let head = "a".repeat(64);
    let keys: Vec<Vec<u8>> = vec![
        format!("{head}x").into_bytes(),
        format!("{head}y").into_bytes(),
        b"ab".to_vec(),
        vec![b'a', 0xff, 0xff],
        b"b".to_vec(),
        head.clone().into_bytes(),
    ];
    for key in &keys {
        sqlx::query("INSERT INTO recovery_task (handler, msg_key) VALUES ('h', $1)")
            .bind(key)
            .execute(store.pool())
            .await
            .unwrap();
    }
    let listed = |filter: redrive::store::TaskFilter| listed_ids(&store, filter);
    let prefix = |p: &str| redrive::store::TaskFilter {
        key_prefix: Some(p.into()),
        ..Default::default()
    };
    let exact = |k: &str| redrive::store::TaskFilter {
        key: Some(k.into()),
        ..Default::default()
    };
    assert_eq!(listed(prefix(&format!("{head}x"))).await, vec![1]);
    assert_eq!(listed(prefix(&head)).await, vec![1, 2, 6]);
    assert_eq!(listed(prefix("a")).await, vec![1, 2, 3, 4, 6]);
    assert_eq!(listed(prefix("ab")).await, vec![3]);
    assert_eq!(listed(prefix("")).await, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(listed(exact(&format!("{head}y"))).await, vec![2]);
    assert_eq!(listed(exact(&head)).await, vec![6]);
    assert_eq!(listed(exact("a")).await, Vec::<i64>::new());
}

/// The key filters read the key heads recorded beside the tasks (the task table has no
/// index on the key, so the drain's row versions write none): a head is recorded by
/// redrive's storing statement and by a plain INSERT, follows a key changed by hand, and
/// goes with a deleted or truncated task.
#[tokio::test]
async fn key_heads_follow_their_tasks_through_stores_key_changes_and_deletes() {
    let (store, _) = fresh_store().await;
    let keyed = |key: &[u8]| {
        let mut task = NewTask::new("h", b"v".to_vec());
        task.failure.key = Some(key.to_vec());
        task
    };
    let stored = store
        .enqueue_many(&[keyed(b"a1"), keyed(b"a2"), NewTask::new("h", b"v".to_vec())])
        .await
        .unwrap();
    let [a1, a2, unkeyed] = [stored[0].id().0, stored[1].id().0, stored[2].id().0];
    let b1: i64 = sqlx::query_scalar(
        "INSERT INTO recovery_task (handler, msg_key) VALUES ('h', 'b1') RETURNING id",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    let listed = |prefix: &str| {
        let filter = redrive::store::TaskFilter {
            key_prefix: Some(prefix.into()),
            ..Default::default()
        };
        listed_ids(&store, filter)
    };
    let heads = || scalar(&store, "SELECT count(*) FROM recovery_task_key_head");
    let exec = |sql: String| {
        let store = store.clone();
        async move {
            sqlx::raw_sql(&sql).execute(store.pool()).await.unwrap();
        }
    };
    assert_eq!(listed("a").await, vec![a1, a2]);
    assert_eq!(listed("b").await, vec![b1]);
    assert_eq!(
        listed("").await,
        vec![a1, a2, b1],
        "a task without a key has no head"
    );
    assert_eq!(heads().await, 3);

    exec(format!(
        "UPDATE recovery_task SET msg_key = 'b2' WHERE id = {a2}"
    ))
    .await;
    exec(format!(
        "UPDATE recovery_task SET msg_key = NULL WHERE id = {b1}"
    ))
    .await;
    exec(format!(
        "UPDATE recovery_task SET msg_key = 'a3' WHERE id = {unkeyed}"
    ))
    .await;
    assert_eq!(listed("a").await, vec![a1, unkeyed]);
    assert_eq!(listed("b").await, vec![a2]);
    assert_eq!(heads().await, 3);

    exec(format!("DELETE FROM recovery_task WHERE id = {a1}")).await;
    assert_eq!(listed("a").await, vec![unkeyed]);
    assert_eq!(heads().await, 2);
    let budgets = redrive::store::Budgets {
        default: 3,
        ..Default::default()
    };
    assert_eq!(store.check(&budgets).await.unwrap().violations, []);

    exec("TRUNCATE recovery_task".into()).await;
    assert_eq!(heads().await, 0);
}

/// Upgrading a store of the version before the key heads' table: the migration records
/// the head of every task stored before it, also when the old index on the task table
/// was already gone (dropped by hand), and lists by key find those tasks.
#[tokio::test]
async fn the_key_heads_migration_records_the_heads_of_tasks_stored_before_it() {
    const MIGRATION: &str = include_str!("../../migrations/20261206100000_key_head_table.sql");
    let (store, _) = fresh_store().await;
    // Back to the version before it, without its index on the task table.
    sqlx::raw_sql(
        "DROP FUNCTION recovery_task_key_head_record, recovery_task_key_head_move, \
             recovery_task_key_head_release, recovery_task_key_head_release_all CASCADE; \
         DROP TABLE recovery_task_key_head; \
         INSERT INTO recovery_task (handler, msg_key) VALUES ('h', 'old-1'), ('h', 'old-2'), ('h', NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::raw_sql(MIGRATION)
        .execute(store.pool())
        .await
        .unwrap();
    let prefix = redrive::store::TaskFilter {
        key_prefix: Some("old-".into()),
        ..Default::default()
    };
    assert_eq!(listed_ids(&store, prefix).await.len(), 2);
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM recovery_task_key_head").await,
        2
    );
}

/// The fleet's sample counts unfinished and unsuccessful tasks at every turn, but reuses
/// its count of resolved tasks (a scan of the bulk of the store) for 50 times as long as
/// it took, up to `RESOLVED_RECOUNT`, on PostgreSQL's clock: a small store's resolved
/// tasks are counted every turn, a huge store's every few minutes.
#[tokio::test]
async fn the_fleet_sample_recounts_resolved_tasks_only_when_their_count_is_old() {
    let (store, _) = fresh_store().await;
    let count = |figures: &redrive::store::FleetFigures, status: &str| -> i64 {
        (figures.tasks.iter())
            .filter(|(s, _, _)| s == status)
            .map(|(_, _, n)| n)
            .sum()
    };
    let add = |status: &'static str, n: i64| {
        let store = store.clone();
        async move {
            sqlx::query(
                "INSERT INTO recovery_task (handler, status, finished_at) \
                 SELECT 'h', $1, CASE WHEN $1 <> 'failed' THEN now() END FROM generate_series(1, $2)",
            )
            .bind(status)
            .bind(n)
            .execute(store.pool())
            .await
            .unwrap();
        }
    };
    add("resolved", 3).await;
    add("failed", 2).await;
    let first = store.sample_figures(Duration::ZERO).await.unwrap();
    assert_eq!((count(&first, "resolved"), count(&first, "failed")), (3, 2));

    // Each turn below comes after the last one's wait (see the next test).
    let age_last_turn = || {
        let store = store.clone();
        async move {
            sqlx::query("UPDATE recovery_sample SET sampled_at = now() - interval '1 hour'")
                .execute(store.pool())
                .await
                .unwrap();
        }
    };
    // A count that took no time is taken again at the next turn.
    assert!(
        first.resolved_count_ms.is_some_and(|ms| ms < 1000.0),
        "{first:?}"
    );
    sqlx::query(
        "UPDATE recovery_sample SET figures = jsonb_set(figures, '{resolved_count_ms}', '0')",
    )
    .execute(store.pool())
    .await
    .unwrap();
    add("resolved", 1).await;
    age_last_turn().await;
    let cheap = store.sample_figures(Duration::ZERO).await.unwrap();
    assert_eq!(
        count(&cheap, "resolved"),
        4,
        "a cheap count is taken every turn"
    );

    // One that took 10 s (a huge store's) is reused for `RESOLVED_RECOUNT`.
    sqlx::query(
        "UPDATE recovery_sample SET figures = jsonb_set(figures, '{resolved_count_ms}', '10000')",
    )
    .execute(store.pool())
    .await
    .unwrap();
    add("resolved", 3).await;
    add("failed", 1).await;
    add("discarded", 5).await;
    age_last_turn().await;
    let second = store.sample_figures(Duration::ZERO).await.unwrap();
    assert_eq!(
        (
            count(&second, "resolved"),
            count(&second, "failed"),
            count(&second, "discarded")
        ),
        (4, 3, 5),
        "the resolved count is reused, the others are current"
    );
    assert_eq!(second.resolved_counted_at, cheap.resolved_counted_at);

    let recount_age = redrive::store::RESOLVED_RECOUNT.as_secs() as i64 + 1;
    sqlx::query(
        "UPDATE recovery_sample SET figures = jsonb_set(figures, '{resolved_counted_at}', \
         to_jsonb(now() - $1 * interval '1 second'))",
    )
    .bind(recount_age)
    .execute(store.pool())
    .await
    .unwrap();
    age_last_turn().await;
    let third = store.sample_figures(Duration::ZERO).await.unwrap();
    assert_eq!(count(&third, "resolved"), 7, "an old count is taken again");
    assert!(third.resolved_counted_at > first.resolved_counted_at);
}

/// A sample turn that took long to count makes the next turn wait ten times as long
/// (the counting keeps to a tenth of one backend's time on a huge backlog); a count time
/// that is not a sane number in the stored row (edited by hand) is read as none.
#[tokio::test]
async fn a_slow_sample_turn_makes_the_next_wait_ten_times_as_long() {
    let (store, _) = fresh_store().await;
    store.sample_figures(Duration::ZERO).await.unwrap();
    let plant = |count_ms: &'static str| {
        let store = store.clone();
        async move {
            sqlx::query(
                "UPDATE recovery_sample SET sampled_at = now() - interval '20 seconds', \
                 figures = jsonb_set(figures, '{count_ms}', $1::jsonb)",
            )
            .bind(count_ms)
            .execute(store.pool())
            .await
            .unwrap();
        }
    };
    let took_turn = || {
        let store = store.clone();
        async move {
            store.sample_figures(Duration::from_secs(15)).await.unwrap();
            scalar(&store, "SELECT count(*) FROM recovery_sample WHERE sampled_at > now() - interval '5 seconds'").await == 1
        }
    };
    plant("2500").await;
    assert!(
        !took_turn().await,
        "a 2.5 s count: the next turn after 25 s, not 15"
    );
    plant("1500").await;
    assert!(took_turn().await, "a 1.5 s count: after 15 s");
    for hostile in ["\"x\"", "-5", "null", "[1]", "1e-400", "-1e400"] {
        plant(hostile).await;
        assert!(took_turn().await, "count_ms {hostile} read as none");
    }
    plant("1e400").await;
    assert!(
        !took_turn().await,
        "a huge count time waits (two minutes at most), no error"
    );
}

/// A key left claimed for a task that is gone or holds another key (a TRUNCATE, a delete
/// with triggers off as during a restore, a key changed by hand) does not wedge storing:
/// the message is stored, its key taken back; `tasks check` reports such a claim.
#[tokio::test]
async fn a_key_claimed_for_a_vanished_task_is_taken_back_and_check_reports_it() {
    let (store, _) = fresh_store().await;
    let keyed = |key: &str| {
        let mut task = NewTask::new("h", format!("value of {key}").into_bytes());
        task.dedup_key = Some(key.into());
        task
    };
    let raw = |sql: &'static str| {
        let store = store.clone();
        async move {
            sqlx::raw_sql(sql).execute(store.pool()).await.unwrap();
        }
    };
    let orphaned = |store: Store| async move {
        let report = store
            .check(&redrive::store::Budgets::default())
            .await
            .unwrap();
        report
            .violations
            .iter()
            .filter(|v| v.kind == "dedup_claim_orphaned")
            .count()
    };

    store.enqueue(&keyed("truncated")).await.unwrap();
    raw("TRUNCATE recovery_task").await;
    assert!(matches!(
        store.enqueue(&keyed("truncated")).await.unwrap(),
        Enqueued::Created(_)
    ));

    store.enqueue(&keyed("restored")).await.unwrap();
    raw("BEGIN; SET LOCAL session_replication_role = replica; \
         DELETE FROM recovery_task WHERE dedup_key = 'restored'; COMMIT")
    .await;
    store.enqueue(&keyed("renamed")).await.unwrap();
    raw("UPDATE recovery_task SET dedup_key = 'renamed by hand' WHERE dedup_key = 'renamed'").await;
    assert_eq!(orphaned(store.clone()).await, 2, "both claims reported");

    for key in ["restored", "renamed"] {
        let again = store.enqueue(&keyed(key)).await.unwrap();
        assert!(matches!(again, Enqueued::Created(_)), "{key}: {again:?}");
        assert_eq!(
            store.enqueue(&keyed(key)).await.unwrap(),
            Enqueued::Existing(again.id())
        );
    }
    assert_eq!(orphaned(store.clone()).await, 0);
}

/// Found by an attack: a replay job whose filter was edited by hand made `replays list`
/// answer "task row is malformed: replay: ...", naming neither the job nor the column.
#[tokio::test]
async fn a_malformed_replay_job_is_named_by_its_id_and_column() {
    let (store, _) = fresh_store().await;
    sqlx::query(
        "INSERT INTO recovery_replay (actor, filter, target_topic, detached) \
         VALUES ('a', '\"garbage\"', 't', false)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let id = scalar(&store, "SELECT id FROM recovery_replay").await;
    let error = store.replays(10, None).await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "a stored row is malformed: replay job {id}: filter: "
        )),
        "{error}"
    );
}

/// Regression: on a store never analysed, with tasks arriving while the pool drains,
/// the drain collapsed (3.1k to 0.9k tasks/s in 50 s): the finish, heartbeat and
/// release statements run a cached generic plan, built while the table was small (a
/// hash join over a sequential scan of the task table), which nothing replaced as the
/// table grew, so every batch read the whole table. Their plans must probe the primary
/// key whatever the statistics: here no sequential scan of the task table follows a
/// table grown to 100k rows under cached plans, by PostgreSQL's own counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drains_fenced_writes_probe_the_primary_key_on_a_store_never_analysed() {
    let (store, mut settings) = fresh_store().await;
    sqlx::query("ALTER TABLE recovery_task SET (autovacuum_enabled = false)")
        .execute(store.pool())
        .await
        .unwrap();
    // One connection: the statements' plans are cached on it while the table is small.
    settings.database.max_connections = 1;
    let drain = Store::connect(&settings.database).await.unwrap();
    let round = |n: usize| {
        let drain = drain.clone();
        async move {
            let tasks: Vec<NewTask> = (0..n).map(|i| NewTask::new("h", format!("v{i}"))).collect();
            drain.enqueue_many(&tasks).await.unwrap();
            let claimed = drain
                .claim(&handlers(), n as u32, "w", LEASE)
                .await
                .unwrap();
            let leases: Vec<_> = claimed.iter().map(|t| t.lease()).collect();
            drain.heartbeat(&leases, LEASE).await.unwrap();
            let (first, rest) = claimed.split_at(1);
            drain.release("w", &[first[0].lease()]).await.unwrap();
            let done: Vec<Finish> = rest
                .iter()
                .map(|t| finish(t, FinishOutcome::Resolved))
                .collect();
            assert_eq!(drain.finish("w", &done).await.unwrap().len(), n - 1);
        }
    };
    // Past PostgreSQL's five custom plans: the generic plans are cached now.
    for _ in 0..8 {
        round(3).await;
    }
    sqlx::query(
        "INSERT INTO recovery_task (handler, status, finished_at) \
         SELECT 'other', 'resolved', now() FROM generate_series(1, 100000)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let read_by_scans = || async {
        let read: i64 = sqlx::query_scalar(
            "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables \
             WHERE schemaname = current_schema() AND relname = 'recovery_task'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        read
    };
    // A backend reports its counters when idle, at the latest about ten seconds on.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let before = read_by_scans().await;
    round(5).await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    let read = read_by_scans().await - before;
    assert!(
        read < 10_000,
        "the drain's statements read {read} task rows by sequential scans"
    );
}

/// A view reads the fleet's sample as the members last counted it and never takes the
/// turn from them (on a huge backlog the count outlasts a request); only a sample no
/// member has touched for `SAMPLE_ABANDONED` (none running) is counted by the view.
#[tokio::test]
async fn a_view_reads_the_members_sample_and_counts_only_an_abandoned_one() {
    let (store, _) = fresh_store().await;
    let failed = |stats: &redrive::store::Stats| -> i64 {
        (stats.tasks.iter())
            .filter(|c| c.status == redrive::Status::Failed)
            .map(|c| c.count)
            .sum()
    };
    let add_failed = |n: i64| {
        let store = store.clone();
        async move {
            sqlx::query("INSERT INTO recovery_task (handler, status) SELECT 'h', 'failed' FROM generate_series(1, $1)")
                .bind(n)
                .execute(store.pool())
                .await
                .unwrap();
        }
    };
    add_failed(2).await;
    // No sample yet: the view counts.
    let sampled = store.sampled_stats().await.unwrap();
    let (first, counted_at) = (sampled.stats, sampled.counted_at);
    assert_eq!(failed(&first), 2);
    assert!(counted_at.is_some());

    // A member's turn began a moment ago: the view shows its figures, not a count.
    add_failed(3).await;
    sqlx::query("UPDATE recovery_sample SET sampled_at = now()")
        .execute(store.pool())
        .await
        .unwrap();
    let sampled = store.sampled_stats().await.unwrap();
    let (read, read_at) = (sampled.stats, sampled.counted_at);
    assert_eq!(failed(&read), 2, "the view took the members' turn");
    assert_eq!(read_at, counted_at);

    // Just short of abandoned, still the members'; past it, the view counts.
    let abandoned = redrive::store::SAMPLE_ABANDONED.as_secs() as i64;
    for (age, expected) in [(abandoned - 5, 2), (abandoned + 5, 5)] {
        sqlx::query("UPDATE recovery_sample SET sampled_at = now() - $1 * interval '1 second'")
            .bind(age)
            .execute(store.pool())
            .await
            .unwrap();
        let stats = store.sampled_stats().await.unwrap().stats;
        assert_eq!(failed(&stats), expected, "a sample {age} s old");
    }

    // Abandoned, and its row held by another session: the view answers the last figures
    // within seconds instead of waiting for the lock, past the request's statement
    // timeout (found by a review).
    sqlx::query("UPDATE recovery_sample SET sampled_at = now() - $1 * interval '1 second'")
        .bind(abandoned + 5)
        .execute(store.pool())
        .await
        .unwrap();
    add_failed(4).await;
    let mut hold = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM recovery_sample WHERE id = 1 FOR UPDATE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), store.sampled_stats())
        .await
        .expect("the view answered within 10 s")
        .unwrap();
    assert_eq!(failed(&read.stats), 5, "the last figures");
    hold.rollback().await.unwrap();
    let stats = store.sampled_stats().await.unwrap().stats;
    assert_eq!(failed(&stats), 9, "released, the view counts");
}
