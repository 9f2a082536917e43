//! The claim's walk of the due tasks: the earliest due across the lane's handlers, rows
//! another claim holds passed over, and never a read of the due tasks of handlers the
//! lane does not serve.

use chrono::Utc;
use redrive::{Fleet, NewTask, Store, Task};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::{eventually, fresh_store, scalar, Counting, Member};

const LEASE: Duration = Duration::from_secs(30);

fn lane(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

/// A task of `handler` named `name`, due `seconds_ago` seconds ago.
fn due_ago(handler: &str, name: &str, seconds_ago: i64) -> NewTask {
    let mut task = NewTask::new(handler, name.as_bytes().to_vec());
    task.next_attempt_at = Some(Utc::now() - chrono::Duration::seconds(seconds_ago));
    task
}

fn values(tasks: &[Task]) -> Vec<String> {
    let mut values: Vec<String> = tasks
        .iter()
        .map(|t| {
            String::from_utf8_lossy(t.failure.value.as_deref().unwrap_or_default()).into_owned()
        })
        .collect();
    values.sort();
    values
}

/// The claim walks each handler's due tasks on its own; it must still take the earliest
/// due across them, count a handler named twice once, and pass a row another
/// transaction holds without locking a row it does not take.
#[tokio::test]
async fn a_claim_takes_the_earliest_due_across_its_handlers_and_passes_held_rows() {
    let (store, _) = fresh_store().await;
    store
        .enqueue_many(&[
            due_ago("other", "other-60", 60),
            due_ago("a", "a-50", 50),
            due_ago("b", "b-40", 40),
            due_ago("a", "a-30", 30),
            due_ago("b", "b-20", 20),
            due_ago("a", "a-10", 10),
            due_ago("b", "b-5", 5),
        ])
        .await
        .unwrap();

    let first = store
        .claim(&lane(&["a", "b", "a"]), 3, "w1", LEASE)
        .await
        .unwrap();
    assert_eq!(values(&first), ["a-30", "a-50", "b-40"]);

    // Another transaction holds a-10, the earliest left: the claim passes it and takes
    // b-20 and b-5 in its place (found by an attack: the claim counted a-10 in a's share,
    // took nothing for it, and took b's tasks only once a-10 was let go).
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM recovery_task WHERE msg_value = 'a-10'::bytea FOR UPDATE")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let second = store
        .claim(&lane(&["a", "b"]), 2, "w2", LEASE)
        .await
        .unwrap();
    assert_eq!(values(&second), ["b-20", "b-5"]);
    holder.rollback().await.unwrap();

    let third = store
        .claim(&lane(&["a", "b"]), 10, "w3", LEASE)
        .await
        .unwrap();
    assert_eq!(values(&third), ["a-10"], "the held row once let go");
    assert!(
        store
            .claim(&lane(&["a", "b"]), 10, "w4", LEASE)
            .await
            .unwrap()
            .is_empty(),
        "every task of the lane is leased"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM recovery_task WHERE handler = 'other' AND lease_owner IS NULL"
        )
        .await,
        1,
        "the other handler's task is untouched"
    );
}

/// Found by attacks on the claim by shares: a handler whose share met a held row was left
/// out of the rest of the claim, so a lane of one handler came back short, or empty,
/// while it had unheld tasks due (eight members on one lane took nothing in 72% of their
/// claims). A held row's place goes to the next due task of its handler.
#[tokio::test]
async fn held_rows_never_leave_a_claim_short_while_unheld_tasks_are_due() {
    let (store, _) = fresh_store().await;
    let tasks: Vec<NewTask> = (1..=30)
        .map(|i| due_ago("a", &format!("a{i:02}"), 100 - i))
        .chain((1..=5).map(|i| due_ago("b", &format!("b{i:02}"), 50 - i)))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let names = |range: std::ops::RangeInclusive<i64>| -> Vec<String> {
        range.map(|i| format!("a{i:02}")).collect()
    };
    let hold = |values: Vec<String>| {
        let pool = store.pool().clone();
        async move {
            let mut holder = pool.begin().await.unwrap();
            let values: Vec<Vec<u8>> = values.into_iter().map(String::into_bytes).collect();
            sqlx::query("SELECT id FROM recovery_task WHERE msg_value = ANY($1) FOR UPDATE")
                .bind(values)
                .fetch_all(&mut *holder)
                .await
                .unwrap();
            holder
        }
    };

    let holder = hold(names(1..=1)).await;
    let claimed = store.claim(&lane(&["a"]), 5, "w", LEASE).await.unwrap();
    assert_eq!(values(&claimed), names(2..=6), "a01 is held");
    holder.rollback().await.unwrap();

    let holder = hold(names(7..=16)).await;
    let claimed = store.claim(&lane(&["a"]), 5, "w", LEASE).await.unwrap();
    let mut expected = vec!["a01".to_owned()];
    expected.extend(names(17..=20));
    assert_eq!(
        values(&claimed),
        expected,
        "a01 is let go, a07 to a16 are held"
    );
    // Two handlers: every task of a due before b's is held or taken; b's come next.
    let claimed = (store.claim(&lane(&["a", "b"]), 20, "w", LEASE).await).unwrap();
    let mut expected = names(21..=30);
    expected.extend((1..=5).map(|i| format!("b{i:02}")));
    assert_eq!(values(&claimed), expected);
    holder.rollback().await.unwrap();
}

/// Found by an attack: a claim made at most four turns, so four handlers whose first
/// tasks were held used them all, and a fifth handler's tasks were never claimed while
/// the hold lasted.
#[tokio::test]
async fn handlers_whose_tasks_are_held_do_not_keep_the_claim_from_the_others() {
    let (store, _) = fresh_store().await;
    // Six handlers of 21 tasks each, one handler's block due before the next's; all but
    // the last of each are held. Each turn's share goes to one of them, which yields one
    // task and is left out; r's tasks come last.
    let held = ["h1", "h2", "h3", "h4", "h5", "h6"];
    let tasks: Vec<NewTask> = held
        .iter()
        .enumerate()
        .flat_map(|(k, h)| {
            (0..21).map(move |j| due_ago(h, &format!("{h}-{j:02}"), 1000 - 30 * k as i64 - j))
        })
        .chain((0..5).map(|i| due_ago("r", &format!("r{i}"), 10 - i)))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query(
        "SELECT id FROM recovery_task WHERE handler <> 'r' \
         AND msg_value <> convert_to(handler || '-20', 'UTF8') FOR UPDATE",
    )
    .fetch_all(&mut *holder)
    .await
    .unwrap();
    let mut names = held.to_vec();
    names.push("r");
    let claimed = store.claim(&lane(&names), 10, "w", LEASE).await.unwrap();
    let mut expected: Vec<String> = held.iter().map(|h| format!("{h}-20")).collect();
    expected.extend((0..4).map(|i| format!("r{i}")));
    assert_eq!(values(&claimed), expected);
    holder.rollback().await.unwrap();
}

/// Found by an attack on the claim by shares: a handler whose first tasks were held
/// counted them in its share of the earliest and took as many of its later tasks in their
/// place, ahead of another handler's earlier tasks that nobody held. While the hold lasted
/// a's whole later backlog went first (100 claims of a's tasks before the first of b's).
/// Here 40 of a's tasks are held, more than a claim reads in its first turns.
#[tokio::test]
async fn held_rows_of_one_handler_do_not_let_its_later_tasks_go_ahead_of_anothers() {
    let (store, _) = fresh_store().await;
    let tasks: Vec<NewTask> = (0..60)
        .map(|i| {
            let ago = if i < 40 { 3600 - i } else { 600 - i };
            due_ago("a", &format!("a{i:02}"), ago)
        })
        .chain((0..10).map(|i| due_ago("b", &format!("b{i}"), 1800 - i)))
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let mut holder = store.pool().begin().await.unwrap();
    let held: Vec<Vec<u8>> = (0..40).map(|i| format!("a{i:02}").into_bytes()).collect();
    sqlx::query("SELECT id FROM recovery_task WHERE msg_value = ANY($1) FOR UPDATE")
        .bind(held)
        .fetch_all(&mut *holder)
        .await
        .unwrap();
    let names = |prefix: &str, range: std::ops::Range<i64>| -> Vec<String> {
        range.map(|i| format!("{prefix}{i}")).collect()
    };
    let claimed = store
        .claim(&lane(&["a", "b"]), 10, "w", LEASE)
        .await
        .unwrap();
    assert_eq!(
        values(&claimed),
        names("b", 0..10),
        "b's tasks are due first"
    );
    let claimed = store
        .claim(&lane(&["a", "b"]), 10, "w", LEASE)
        .await
        .unwrap();
    assert_eq!(values(&claimed), names("a", 40..50), "then a's not held");
    holder.rollback().await.unwrap();
    let claimed = store
        .claim(&lane(&["a", "b"]), 10, "w", LEASE)
        .await
        .unwrap();
    let mut expected: Vec<String> = (0..10).map(|i| format!("a{i:02}")).collect();
    expected.sort();
    assert_eq!(values(&claimed), expected, "a's first tasks once let go");
}

/// Found by the next attack: the turns by ids read twice as many ids each time, but
/// counted from the tasks still wanted, not from the claim's size: a claim of 100 that
/// took 99 at once read 30 ids more before it walked each handler, and the walk let a's
/// later task go ahead of b's earlier one past 41 held rows.
#[tokio::test]
async fn a_claim_nearly_full_still_passes_held_rows_in_due_order() {
    let (store, _) = fresh_store().await;
    let tasks: Vec<NewTask> = (1..=140)
        .map(|i| due_ago("a", &format!("a{i:03}"), 10_000 - i))
        .chain([
            due_ago("a", "a-late", 9_000),
            due_ago("b", "b-middle", 9_500),
        ])
        .collect();
    store.enqueue_many(&tasks).await.unwrap();
    let mut holder = store.pool().begin().await.unwrap();
    let held: Vec<Vec<u8>> = (100..=140)
        .map(|i| format!("a{i:03}").into_bytes())
        .collect();
    sqlx::query("SELECT id FROM recovery_task WHERE msg_value = ANY($1) FOR UPDATE")
        .bind(held)
        .fetch_all(&mut *holder)
        .await
        .unwrap();
    let claimed = store
        .claim(&lane(&["a", "b"]), 100, "w", LEASE)
        .await
        .unwrap();
    let mut expected: Vec<String> = (1..=99).map(|i| format!("a{i:03}")).collect();
    expected.push("b-middle".into());
    expected.sort();
    assert_eq!(values(&claimed), expected);
    holder.rollback().await.unwrap();
}

/// Regression (issue 30, the drain beside a console on 10M tasks): the due index was
/// keyed on the due time alone, so every claim that walked from its start (once a second
/// a lane does, see `worker::due_floor`) and every look for the next due task read the
/// entries of every task of other handlers due before the lane's own: 400,000 tasks of
/// handlers no member served cost each claim 14 ms and 5,500 buffers on average. Here
/// 20,000 such tasks lie before the lane's; the claims and looks must read few index
/// entries, by PostgreSQL's own counter. They run on a new connection, whose first plans
/// are made for their parameters: an attack found the first claims of each connection
/// joining the rows they update by reading the whole table (a hash join over a
/// sequential scan, 340 ms beside 200,000 tasks), so no task row may be read by a
/// sequential scan either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_never_read_the_due_tasks_of_handlers_they_do_not_serve() {
    let (store, mut settings) = fresh_store().await;
    sqlx::query(
        "INSERT INTO recovery_task (handler, msg_value, next_attempt_at) \
         SELECT 'unserved', convert_to(g::text, 'UTF8'), now() - interval '1 hour' + g * interval '1 ms' \
         FROM generate_series(1, 20000) AS g",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let served: Vec<NewTask> = (0..40)
        .map(|i| due_ago(if i % 2 == 0 { "a" } else { "b" }, &format!("s{i}"), 1))
        .collect();
    store.enqueue_many(&served).await.unwrap();
    sqlx::query("ANALYZE recovery_task")
        .execute(store.pool())
        .await
        .unwrap();

    // One connection, so that its counters can be flushed on demand.
    settings.database.max_connections = 1;
    let member = Store::connect(&settings.database).await.unwrap();
    let counters = || async {
        let row: (i64, i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(i.idx_scan), 0)::bigint, coalesce(sum(i.idx_tup_read), 0)::bigint, \
                    (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables t \
                     WHERE t.schemaname = current_schema() AND t.relname = 'recovery_task') \
             FROM pg_stat_user_indexes i \
             WHERE i.schemaname = current_schema() AND i.relname = 'recovery_task'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        row
    };
    let flush = || async {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(member.pool())
            .await
            .unwrap();
    };
    // Every other connection reports its counters when idle, at the latest about ten
    // seconds on: let them, so that only the claims below move the counters.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let before = counters().await;

    let mut claimed = 0;
    for lane_names in [&["a"][..], &["a", "b"], &["b", "a", "b"], &["a", "b"]] {
        let lane = lane(lane_names);
        assert_eq!(
            member.next_due(&lane, None).await.unwrap(),
            Some(Duration::ZERO)
        );
        claimed += member
            .claim_from(&lane, 5, "w", LEASE, None)
            .await
            .unwrap()
            .tasks
            .len();
    }
    assert_eq!(claimed, 20);
    flush().await;

    // Eight statements, each at least one index scan: wait until all are counted.
    let waited = std::time::Instant::now();
    let after = loop {
        let after = counters().await;
        if after.0 - before.0 >= 8 {
            break after;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "the claims' index scans were not counted within 15 s: {before:?} then {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let read = after.1 - before.1;
    assert!(
        read < 2_000,
        "8 claims and looks read {read} index entries ({} scans) beside 20,000 due tasks of an unserved handler",
        after.0 - before.0
    );
    let scanned = after.2 - before.2;
    assert_eq!(
        scanned, 0,
        "8 claims and looks read {scanned} task rows by sequential scans"
    );
}

/// An attack saw, by SQL, the claim's turn by ids planned as a walk of its handlers'
/// whole due index, filtering out the ids it was not given, with statistics taken while
/// the table was empty (299,999 index entries read to take one task; the turn no longer
/// names the handlers). Here 200,000 tasks are due after such statistics; three claims of
/// one must read a few entries of the due index. (This test did not reproduce the plan
/// on the claim before the change: it guards the figure.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_probes_the_ids_it_takes_when_statistics_are_stale() {
    let (store, mut settings) = fresh_store().await;
    for statement in [
        "ALTER TABLE recovery_task SET (autovacuum_enabled = off)",
        "ANALYZE recovery_task",
        "INSERT INTO recovery_task (handler, msg_value, next_attempt_at) \
         SELECT 'a', convert_to(g::text, 'UTF8'), now() - interval '1 hour' + g * interval '1 ms' \
         FROM generate_series(1, 200000) AS g",
    ] {
        sqlx::query(statement).execute(store.pool()).await.unwrap();
    }
    settings.database.max_connections = 1;
    let member = Store::connect(&settings.database).await.unwrap();
    let due_index = || async {
        let row: (i64, i64) = sqlx::query_as(
            "SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes \
             WHERE schemaname = current_schema() \
               AND indexrelname = 'recovery_task_due_by_handler'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        row
    };
    let before = due_index().await;
    for _ in 0..3 {
        let claimed = member.claim(&lane(&["a"]), 1, "w", LEASE).await.unwrap();
        assert_eq!(claimed.len(), 1);
    }
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(member.pool())
        .await
        .unwrap();
    let waited = std::time::Instant::now();
    let after = loop {
        let after = due_index().await;
        if after.0 - before.0 >= 3 {
            break after;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "the claims' scans were not counted within 15 s: {before:?} then {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let read = after.1 - before.1;
    assert!(
        read < 1_000,
        "3 claims of one task read {read} entries of the due index ({} scans)",
        after.0 - before.0
    );
}

/// Found by an attack: while another transaction held a handler's due rows, an idle
/// member claimed nothing, heard that a task was due now, and claimed again at once,
/// 16,702 scans of the due index in 10 s. It looks again after a short pause, and takes
/// the rows as soon as they are let go. (Scans of the due index are counted: a claim also
/// probes the primary key once for each held row it was about to take.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_does_not_spin_on_due_rows_another_transaction_holds() {
    let (store, mut settings) = fresh_store().await;
    settings.worker.poll_interval = Duration::from_secs(1);
    let tasks: Vec<NewTask> = (0..20).map(|i| due_ago("a", &format!("{i}"), 1)).collect();
    store.enqueue_many(&tasks).await.unwrap();
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM recovery_task FOR UPDATE")
        .fetch_all(&mut *holder)
        .await
        .unwrap();

    let calls = Counting::default();
    let fleet = Fleet::builder(settings)
        .handler("a", calls.clone())
        .build()
        .unwrap();
    let member = Member::start(fleet, &store);
    let scans = || {
        scalar(
            &store,
            "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes \
             WHERE schemaname = current_schema() \
               AND indexrelname = 'recovery_task_due_by_handler'",
        )
    };
    // Counters of the member's connections reach the view when they are idle, at the
    // latest about ten seconds on: count over a window longer than that delay.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = scans().await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let scanned = scans().await - before;
    assert_eq!(calls.0.load(Ordering::SeqCst), 0, "every row was held");
    holder.rollback().await.unwrap();

    eventually(Duration::from_secs(10), "the held tasks called", || async {
        calls.0.load(Ordering::SeqCst) == 20
    })
    .await;
    member.stop().await;
    // Spinning, it made 7,621 to 16,702 scans; its two claim loops each looking again
    // every 100 ms (a claim and a look for the next due task), about 1,100.
    assert!(
        scanned < 2_000,
        "{scanned} index scans in 12 s by a member whose every due row was held"
    );
}
