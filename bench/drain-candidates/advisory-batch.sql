-- Candidate: session advisory locks are the lease (two batches per client in flight; a
-- client's own locks are re-entrant, so the claim passes over its tasks in flight by id,
-- in a CASE: the planner ranks that test costlier than the lock and would take the lock
-- first, stacking one more on each task in flight at every claim);
-- the attempts of a batch are counted before the call by one row per claimed batch (its
-- ids, its owner's backend); the finish counts them in the task rows, writes the history
-- and deletes the batch row. A member that died leaves its batch rows behind: the next
-- claim counts those attempts as lost. The lock is taken under the claim's snapshot, so a
-- task finished and unlocked since then can be locked again: a second statement (a fresh
-- snapshot) keeps what is still due and unlocks the rest.
SELECT quote_literal(:ids1::text) AS ids2, quote_literal(:vers1::text) AS vers2, quote_literal(:ids0::text) AS ids1, quote_literal(:vers0::text) AS vers1, :batch1 AS batch2, :batch0 AS batch1 \gset
SELECT quote_literal(coalesce(array_agg(id), '{}')::text) AS locked FROM (SELECT id FROM q WHERE status = 'failed' AND next_attempt_at <= now() AND handler = ANY('{h}') AND CASE WHEN id <> ALL(:ids1::bigint[]) AND id <> ALL(:ids2::bigint[]) THEN pg_try_advisory_lock(id) ELSE false END ORDER BY next_attempt_at LIMIT :batch) c \gset
WITH ok AS MATERIALIZED (SELECT id, attempts FROM q WHERE id = ANY(:locked::bigint[]) AND status = 'failed'), b AS (INSERT INTO qclaim (worker, backend, ids) SELECT :client_id, pg_backend_pid(), array_agg(id) FROM ok HAVING count(*) > 0 RETURNING id) SELECT coalesce((SELECT id FROM b), 0) AS batch0, quote_literal(coalesce(array_agg(id), '{}')::text) AS ids0, quote_literal(coalesce(array_agg(attempts), '{}')::text) AS vers0, (SELECT count(pg_advisory_unlock(l)) FROM unnest(:locked::bigint[]) AS l WHERE l NOT IN (SELECT id FROM ok)) AS stale FROM ok \gset
WITH fin AS (UPDATE q SET status = 'resolved', attempts = f.a + 1 FROM unnest(:ids2::bigint[], :vers2::int[]) AS f(id, a) WHERE q.id = f.id AND q.status = 'failed' AND q.attempts = f.a RETURNING q.id, q.attempts), h AS (INSERT INTO qa (task_id, attempt, worker, started_at, duration_ms, outcome) SELECT id, attempts, :client_id, now(), 1, 'resolved' FROM fin), d AS (DELETE FROM qclaim WHERE id = :batch2) SELECT count(pg_advisory_unlock(id)) FROM unnest(:ids2::bigint[]) AS u(id);
