//! Recording failures: one statement for many tasks, idempotent on the dedup key.

use sqlx::{PgConnection, Row};
use std::collections::{HashMap, HashSet, VecDeque};

use super::causes::cause_ids;
use super::row::{task_columns, task_from_row};
use super::{Result, Store, StoreError, KEYED_PROBES};
use crate::headers;
use crate::task::{AttemptOutcome, Cause, InlineAttempt, NewTask, Task, TaskId};

/// What the store holds for messages about to be stored ([`Store::recorded`]).
#[derive(Debug, Default)]
pub struct Recorded {
    /// Messages a task records already (redelivered).
    pub repeats: HashSet<usize>,
    /// Messages whose coordinates another message's task holds (a topic recreated, or
    /// another cluster), with that task: they are stored under their content digest.
    pub collisions: HashMap<usize, TaskId>,
}

/// What enqueueing one task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new task was stored.
    Created(TaskId),
    /// A task with the same dedup key and content already existed: nothing was stored.
    Existing(TaskId),
    /// The dedup key belongs to a task with different content: nothing was stored.
    Conflict(TaskId),
}

impl Enqueued {
    /// The id of the created or existing task.
    pub fn id(self) -> TaskId {
        match self {
            Enqueued::Created(id) | Enqueued::Existing(id) | Enqueued::Conflict(id) => id,
        }
    }
}

// A task's dedup key is claimed in `recovery_task_dedup` (the first input of a key wins,
// as does a task stored before); only tasks without a key or whose key was claimed are
// stored. The inputs are read once (`i`), their ids drawn there, so the key and the task
// agree on the id. The id sequence is looked up once per statement (`s`): looked up for
// each row it cost the statement a seventh of its rate.
const INSERT: &str = r#"
WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('recovery_task', 'id')::regclass AS seq),
i AS MATERIALIZED (
    SELECT u.*, COALESCE(u.id, nextval((SELECT seq FROM s))) AS task_id
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
                $5::text[], $6::int[], $7::bigint[], $8::timestamptz[], $9::text[],
                $10::bytea[], $11::bytea[], $12::bytea[], $13::text[], $14::text[],
                $15::int[], $16::int[], $17::timestamptz[],
                $18::text[], $19::int[], $20::bigint[], $21::text[],
                $22::text[], $23::text[], $24::int[], $25::bool[], $26::text[], $27::bytea[],
                $28::int[], $29::bigint[], $30::text[], $31::text[],
                $32::bigint[], $33::jsonb[], $34::text[], $35::bigint[])
        WITH ORDINALITY AS u(dedup_key, handler, event_type, correlation_id,
                source_topic, source_partition, source_offset, source_timestamp, source_timestamp_type,
                msg_key, msg_value, msg_headers, error_class, error_message,
                attempts, max_attempts, next_attempt_at,
                original_topic, original_partition, original_offset, error_stacktrace,
                route, ingest_note, value_size, payload_stored, status, order_key,
                generation, previous_task_id, previous_error, final_error, id, checkpoint,
                disposition, cause_id, ord)),
keyed AS (
    INSERT INTO recovery_task_dedup (dedup_key, task_id)
    SELECT dedup_key, task_id FROM i WHERE dedup_key IS NOT NULL ORDER BY ord
    ON CONFLICT (dedup_key) DO NOTHING
    RETURNING task_id)
INSERT INTO recovery_task (
    dedup_key, handler, event_type, correlation_id,
    source_topic, source_partition, source_offset, source_timestamp, source_timestamp_type,
    msg_key, msg_value, msg_headers, error_class, error_message,
    attempts, max_attempts, next_attempt_at, last_error,
    original_topic, original_partition, original_offset, error_stacktrace,
    route, ingest_note, value_size, payload_stored, status, finished_at, order_key,
    generation, previous_task_id, previous_error, id, checkpoint, disposition, cause_id, cause_at)
-- A reserved id (process mode's inline attempt had it) is kept; the others are drawn.
OVERRIDING SYSTEM VALUE
SELECT i.dedup_key, i.handler, i.event_type, i.correlation_id,
       i.source_topic, i.source_partition, i.source_offset, i.source_timestamp, i.source_timestamp_type,
       i.msg_key, i.msg_value, i.msg_headers, i.error_class, i.error_message,
       i.attempts, i.max_attempts,
       -- A handler's open breaker holds its new tasks too.
       d.due_at,
       coalesce(i.final_error, CASE WHEN i.attempts > 0 THEN i.error_message END),
       i.original_topic, i.original_partition, i.original_offset, i.error_stacktrace,
       i.route, i.ingest_note, i.value_size, i.payload_stored, i.status,
       CASE WHEN i.status <> 'failed' THEN now() END, i.order_key,
       i.generation, i.previous_task_id, i.previous_error,
       i.task_id, i.checkpoint, i.disposition, i.cause_id, now()
FROM i CROSS JOIN LATERAL recovery_due_at(i.handler, COALESCE(i.next_attempt_at, now())) d
WHERE i.dedup_key IS NULL OR i.task_id IN (SELECT task_id FROM keyed)
ORDER BY i.ord
RETURNING id, dedup_key
"#;

/// The attempt history of tasks stored with an inline attempt (process mode).
const INLINE_HISTORY: &str = r#"
INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
SELECT id, 0, 1, worker, started_at, duration_ms, outcome, error
FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::int[], $5::text[], $6::text[])
    AS a(id, worker, started_at, duration_ms, outcome, error)
"#;

/// The compensations owed by tasks stored as permanent failures by an inline attempt.
const INLINE_COMPENSATION: &str =
    "INSERT INTO recovery_compensation (task_id) SELECT unnest($1::bigint[])";

impl Store {
    /// Stores one task. A repeat of an existing task returns it; the same dedup key with
    /// different content is a [`StoreError::Conflict`].
    pub async fn enqueue(&self, task: &NewTask) -> Result<Enqueued> {
        let outcome = self.enqueue_many(std::slice::from_ref(task)).await?[0];
        match outcome {
            Enqueued::Conflict(existing) => Err(StoreError::Conflict {
                dedup_key: task.effective_dedup_key().unwrap_or_default(),
                existing,
            }),
            other => Ok(other),
        }
    }

    /// `count` task ids taken from the id sequence, in increasing order, for tasks about
    /// to be stored ([`NewTask::id`]): one statement for a whole batch.
    pub async fn reserve_ids(&self, count: usize) -> Result<Vec<TaskId>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = sqlx::query_scalar(
            "WITH s AS MATERIALIZED \
                 (SELECT pg_get_serial_sequence('recovery_task', 'id')::regclass AS seq) \
             SELECT nextval((SELECT seq FROM s)) AS id \
             FROM generate_series(1, $1) ORDER BY id",
        )
        .bind(i32::try_from(count).unwrap_or(i32::MAX))
        .fetch_all(&self.pool)
        .await?;
        Ok(ids.into_iter().map(TaskId).collect())
    }

    /// The order keys among `keys` that have an open (unfinished) task: one probe of
    /// the order index per key. The status is tested through a `CASE`, which the partial
    /// due index cannot serve: on a store never analysed the planner walked all of that
    /// index instead (233 ms a batch on 200k tasks, against 0.05 ms).
    pub async fn open_order_keys(&self, keys: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        let mut tx = self.pool.begin_with(KEYED_PROBES).await?;
        let open = sqlx::query_scalar(
            "SELECT k.order_key FROM unnest($1::bytea[]) AS k(order_key) \
             WHERE EXISTS (SELECT 1 FROM recovery_task t WHERE t.order_key = k.order_key \
                 AND CASE WHEN t.status = 'failed' THEN true ELSE false END)",
        )
        .bind(keys)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(open)
    }

    /// For each (order key, topic, partition) of `keys`, the task of that key from that
    /// partition with the newest source offset, where there is one: its offset, and the
    /// task unless its row cannot be read. One index probe per key.
    pub async fn newest_ordered_tasks(&self, keys: &[KeyPartition]) -> Result<NewestOrdered> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let order_keys: Vec<&[u8]> = keys.iter().map(|(key, _, _)| key.as_slice()).collect();
        let topics: Vec<&str> = keys.iter().map(|(_, topic, _)| topic.as_str()).collect();
        let partitions: Vec<i32> = keys.iter().map(|(_, _, partition)| *partition).collect();
        let rows = sqlx::query(concat!(
            "SELECT k.ord, ",
            task_columns!("t."),
            " FROM unnest($1::bytea[], $2::text[], $3::int[]) WITH ORDINALITY AS k(order_key, topic, partition, ord) \
             CROSS JOIN LATERAL (SELECT * FROM recovery_task t \
                 WHERE t.order_key = k.order_key AND t.source_topic = k.topic \
                   AND t.source_partition = k.partition \
                 ORDER BY t.source_offset DESC LIMIT 1) t",
        ))
        .bind(&order_keys)
        .bind(&topics)
        .bind(&partitions)
        .fetch_all(&self.pool)
        .await?;
        let mut newest = HashMap::new();
        for row in &rows {
            let ord: i64 = row.try_get("ord")?;
            let offset: i64 = row.try_get("source_offset")?;
            let key = usize::try_from(ord - 1)
                .ok()
                .and_then(|i| keys.get(i))
                .ok_or_else(|| StoreError::MalformedRow(format!("newest ordered task {ord}")))?;
            newest.insert(key.clone(), (offset, task_from_row(row).ok()));
        }
        Ok(newest)
    }

    /// The readable tasks holding `keys` as their dedup key, by key.
    pub(crate) async fn by_dedup_keys(&self, keys: &[String]) -> Result<HashMap<String, Task>> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let held = holders(&mut *self.pool.acquire().await?, &keys).await?;
        Ok((held.into_iter())
            .filter_map(|(key, (_, task))| Some((key, task?)))
            .collect())
    }

    /// What the store holds for each of `tasks`' messages, by index into `tasks`: the
    /// same message under its dedup key or under the key a collision gives it (the key
    /// and the content digest), or another message under its dedup key. A task that
    /// cannot be read holds its key with what was recorded: a repeat.
    pub async fn recorded(&self, tasks: &[&NewTask]) -> Result<Recorded> {
        let wanted: Vec<(usize, String, String)> = tasks
            .iter()
            .enumerate()
            .filter_map(|(index, task)| {
                let key = task.effective_dedup_key()?;
                let digested = format!("{key}#{}", task.failure.content_digest());
                Some((index, key, digested))
            })
            .collect();
        let mut recorded = Recorded::default();
        if wanted.is_empty() {
            return Ok(recorded);
        }
        let keys: Vec<&str> = (wanted.iter())
            .flat_map(|(_, key, digested)| [key.as_str(), digested.as_str()])
            .collect();
        let held = holders(&mut *self.pool.acquire().await?, &keys).await?;
        for (index, key, digested) in wanted {
            match (held.contains_key(&digested), held.get(&key)) {
                (true, _) => {
                    recorded.repeats.insert(index);
                }
                (false, Some((id, Some(task))))
                    if !tasks[index].failure.same_message_as(&task.failure) =>
                {
                    recorded.collisions.insert(index, *id);
                }
                // Unreadable: what is stored cannot be compared, and is what was recorded.
                (false, Some(_)) => {
                    recorded.repeats.insert(index);
                }
                (false, None) => {}
            }
        }
        Ok(recorded)
    }

    /// Stores many tasks in one statement; the result has one entry per input, in order.
    /// Tasks with an inline attempt are stored with their history row atomically.
    pub async fn enqueue_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>> {
        if tasks.iter().any(|t| t.inline_attempt.is_some()) {
            let mut tx = self.pool.begin().await?;
            let outcomes = enqueue_many_in(&mut tx, tasks).await?;
            tx.commit().await?;
            Ok(outcomes)
        } else {
            let mut conn = self.pool.acquire().await?;
            enqueue_many_in(&mut conn, tasks).await
        }
    }
}

/// An order key, a topic and a partition.
pub type KeyPartition = (Vec<u8>, String, i32);

/// Per order key, topic and partition, the newest task's source offset and the task
/// (unless its row cannot be read): [`Store::newest_ordered_tasks`].
pub type NewestOrdered = HashMap<KeyPartition, (i64, Option<Task>)>;

/// Stores many tasks on the caller's connection, typically inside the caller's own
/// transaction, so a failure is recorded atomically with the application's writes.
/// The connection's `search_path` must reach redrive's schema (a [`Store`] pool's does).
pub async fn enqueue_many_in(conn: &mut PgConnection, tasks: &[NewTask]) -> Result<Vec<Enqueued>> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<Option<String>> = tasks.iter().map(NewTask::effective_dedup_key).collect();
    let mut results = store_new(conn, tasks, &keys).await?;
    let repeated: Vec<usize> = (0..tasks.len()).filter(|&i| results[i].is_none()).collect();
    let unheld = resolve_repeats(conn, tasks, &keys, &repeated, &mut results).await?;
    if !unheld.is_empty() {
        // Their keys are claimed for tasks that are gone or hold other keys: the claims
        // are taken back, and those messages stored once more.
        release_orphaned_claims(conn, &unheld, &keys).await?;
        let retried: Vec<NewTask> = unheld.iter().map(|&i| tasks[i].clone()).collect();
        let retried_keys: Vec<Option<String>> = unheld.iter().map(|&i| keys[i].clone()).collect();
        let mut again = store_new(conn, &retried, &retried_keys).await?;
        let repeated: Vec<usize> = (0..retried.len()).filter(|&i| again[i].is_none()).collect();
        let still = resolve_repeats(conn, &retried, &retried_keys, &repeated, &mut again).await?;
        if let Some(&i) = still.first() {
            return Err(StoreError::MalformedRow(format!(
                "dedup key {:?} conflicted but no task holds it",
                retried_keys[i].as_deref().unwrap_or_default()
            )));
        }
        for (&i, outcome) in unheld.iter().zip(again) {
            results[i] = outcome;
        }
    }
    let results: Vec<Enqueued> = results
        .into_iter()
        .map(|r| r.expect("every input resolved"))
        .collect();
    record_inline_attempts(conn, tasks, &results).await?;
    Ok(results)
}

/// Runs the storing statement: each input's task if it was created, `None` where its key
/// was claimed already.
async fn store_new(
    conn: &mut PgConnection,
    tasks: &[NewTask],
    keys: &[Option<String>],
) -> Result<Vec<Option<Enqueued>>> {
    let causes: Vec<Cause> = tasks.iter().map(NewTask::cause).collect();
    let causes: Vec<Option<&Cause>> = causes.iter().map(Some).collect();
    let cause_ids = cause_ids(conn, &causes).await?;
    let rows = sqlx::query(INSERT)
        .bind(keys)
        .bind(column(tasks, |t| t.handler.as_str()))
        .bind(column(tasks, |t| t.failure.event_type.as_deref()))
        .bind(column(tasks, |t| t.failure.correlation_id.as_deref()))
        .bind(column(tasks, |t| {
            t.failure.source.as_ref().map(|s| s.topic.as_str())
        }))
        .bind(column(tasks, |t| {
            t.failure.source.as_ref().map(|s| s.partition)
        }))
        .bind(column(tasks, |t| {
            t.failure.source.as_ref().map(|s| s.offset)
        }))
        .bind(column(tasks, |t| t.failure.source_timestamp))
        .bind(column(tasks, |t| {
            t.failure.source_timestamp_type.as_deref()
        }))
        .bind(column(tasks, |t| t.failure.key.as_deref()))
        .bind(column(tasks, |t| t.failure.value.as_deref()))
        .bind(column(tasks, |t| headers::encode(&t.failure.headers)))
        .bind(column(tasks, |t| t.failure.error_class.as_deref()))
        .bind(column(tasks, |t| t.failure.error_message.as_deref()))
        .bind(column(tasks, |t| t.attempts))
        .bind(column(tasks, |t| t.max_attempts))
        .bind(column(tasks, |t| t.next_attempt_at))
        .bind(column(tasks, |t| {
            t.failure.original.as_ref().map(|s| s.topic.as_str())
        }))
        .bind(column(tasks, |t| {
            t.failure.original.as_ref().and_then(|s| s.partition)
        }))
        .bind(column(tasks, |t| {
            t.failure.original.as_ref().and_then(|s| s.offset)
        }))
        .bind(column(tasks, |t| t.failure.error_stacktrace.as_deref()))
        .bind(column(tasks, |t| t.failure.route.as_deref()))
        .bind(column(tasks, |t| t.failure.ingest_note.as_deref()))
        .bind(column(tasks, |t| t.failure.value_size))
        .bind(column(tasks, |t| t.failure.payload_stored))
        .bind(column(tasks, |t| t.status.as_str()))
        .bind(column(tasks, |t| t.order_key.as_deref()))
        .bind(column(tasks, |t| t.failure.generation))
        .bind(column(tasks, |t| t.failure.previous_task.map(|id| id.0)))
        .bind(column(tasks, |t| t.failure.previous_error.as_deref()))
        .bind(column(tasks, |t| t.final_error.as_deref()))
        .bind(column(tasks, |t| t.id.map(|id| id.0)))
        .bind(column(tasks, |t| t.checkpoint.as_ref()))
        .bind(column(tasks, |t| t.failure.disposition.as_deref()))
        .bind(cause_ids)
        .fetch_all(&mut *conn)
        .await?;

    // Keyed rows map back by key; unkeyed rows never conflict and come back in order.
    let mut created_by_key = HashMap::new();
    let mut created_unkeyed = VecDeque::new();
    for row in &rows {
        let id = TaskId(row.try_get("id")?);
        match row.try_get::<Option<String>, _>("dedup_key")? {
            Some(key) => {
                created_by_key.insert(key, id);
            }
            None => created_unkeyed.push_back(id),
        }
    }
    Ok(keys
        .iter()
        .map(|key| {
            match key {
                Some(key) => created_by_key.remove(key),
                None => created_unkeyed.pop_front(),
            }
            .map(Enqueued::Created)
        })
        .collect())
}

/// Takes back the claims of the keys of `inputs` whose task is gone or holds another key.
async fn release_orphaned_claims(
    conn: &mut PgConnection,
    inputs: &[usize],
    keys: &[Option<String>],
) -> Result<()> {
    let keys: Vec<&str> = inputs.iter().filter_map(|&i| keys[i].as_deref()).collect();
    sqlx::query(
        "DELETE FROM recovery_task_dedup d WHERE d.dedup_key = ANY($1) \
         AND NOT EXISTS (SELECT 1 FROM recovery_task t \
                         WHERE t.id = d.task_id AND t.dedup_key = d.dedup_key)",
    )
    .bind(&keys)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Writes the history row of every created task that carries an inline attempt.
async fn record_inline_attempts(
    conn: &mut PgConnection,
    tasks: &[NewTask],
    results: &[Enqueued],
) -> Result<()> {
    let attempts: Vec<(TaskId, &InlineAttempt)> = tasks
        .iter()
        .zip(results)
        .filter_map(|(task, result)| match (result, &task.inline_attempt) {
            (Enqueued::Created(id), Some(attempt)) => Some((*id, attempt)),
            _ => None,
        })
        .collect();
    if attempts.is_empty() {
        return Ok(());
    }
    sqlx::query(INLINE_HISTORY)
        .bind(column(&attempts, |(id, _)| id.0))
        .bind(column(&attempts, |(_, a)| a.worker.as_str()))
        .bind(column(&attempts, |(_, a)| a.started_at))
        .bind(column(&attempts, |(_, a)| a.duration_ms))
        .bind(column(&attempts, |(_, a)| a.outcome.as_str()))
        .bind(column(&attempts, |(_, a)| a.error.as_deref()))
        .execute(&mut *conn)
        .await?;
    let compensated: Vec<i64> = attempts
        .iter()
        .filter(|(_, a)| {
            a.compensate
                && matches!(
                    a.outcome,
                    AttemptOutcome::PermanentFailure | AttemptOutcome::NotCalled
                )
        })
        .map(|(id, _)| id.0)
        .collect();
    if !compensated.is_empty() {
        sqlx::query(INLINE_COMPENSATION)
            .bind(compensated)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Compares inputs whose key was taken with the stored tasks holding those keys; answers
/// the inputs whose key no task holds (left `None`).
async fn resolve_repeats(
    conn: &mut PgConnection,
    tasks: &[NewTask],
    keys: &[Option<String>],
    repeated: &[usize],
    results: &mut [Option<Enqueued>],
) -> Result<Vec<usize>> {
    if repeated.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: Vec<&str> = repeated
        .iter()
        .filter_map(|&i| keys[i].as_deref())
        .collect();
    let existing = holders(conn, &wanted).await?;
    let mut unheld = Vec::new();
    for &index in repeated {
        let key = keys[index].as_deref().expect("only keyed inputs repeat");
        let Some((id, task)) = existing.get(key) else {
            unheld.push(index);
            continue;
        };
        results[index] = Some(match task {
            Some(task) if !tasks[index].same_content_as(task) => Enqueued::Conflict(*id),
            // Unreadable: what is stored cannot be compared, and is what was recorded.
            _ => Enqueued::Existing(*id),
        });
    }
    Ok(unheld)
}

/// The tasks holding `keys` as their dedup key, by key: each with its id, and the task
/// itself unless its row cannot be read (it still holds its key, and must not fail what
/// is looked up beside it; its claim ends it).
async fn holders(
    conn: &mut PgConnection,
    keys: &[&str],
) -> Result<HashMap<String, (TaskId, Option<Task>)>> {
    // Each key's task by its primary key (`OFFSET 0` keeps the lookup per key, whatever
    // the statistics say).
    let rows = sqlx::query(concat!(
        "SELECT ",
        task_columns!("t."),
        " FROM recovery_task_dedup d \
         CROSS JOIN LATERAL (SELECT * FROM recovery_task WHERE id = d.task_id OFFSET 0) t \
         WHERE d.dedup_key = ANY($1) AND t.dedup_key = d.dedup_key",
    ))
    .bind(keys)
    .fetch_all(&mut *conn)
    .await?;
    let mut held = HashMap::new();
    for row in &rows {
        let key: String = row.try_get("dedup_key")?;
        let id = TaskId(row.try_get("id")?);
        held.insert(key, (id, task_from_row(row).ok()));
    }
    Ok(held)
}

/// One column of a multi-row statement (`unnest($1::text[], ...)`): `value` of each item.
fn column<'a, T, U>(items: &'a [T], value: impl FnMut(&'a T) -> U) -> Vec<U> {
    items.iter().map(value).collect()
}
