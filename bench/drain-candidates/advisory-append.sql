-- Candidate: session advisory locks are the lease (two batches per client in flight; a
-- client's own locks are re-entrant, so the claim passes over its tasks in flight by id,
-- in a CASE: the planner ranks that test costlier than the lock and would take the lock
-- first, stacking one more on each task in flight at every claim);
-- the attempt is counted before the call by appending its history row ('running'), whose
-- primary key (task, attempt) is the fencing token: a task finished and unlocked since the
-- claim's snapshot conflicts there and is left alone (and unlocked). The finish writes the task and
-- completes that row (a HOT update when the page has room).
SELECT quote_literal(:ids1::text) AS ids2, quote_literal(:vers1::text) AS vers2, quote_literal(:ids0::text) AS ids1, quote_literal(:vers0::text) AS vers1 \gset
WITH c AS (SELECT id, attempts FROM q WHERE status = 'failed' AND next_attempt_at <= now() AND handler = ANY('{h}') AND CASE WHEN id <> ALL(:ids1::bigint[]) AND id <> ALL(:ids2::bigint[]) THEN pg_try_advisory_lock(id) ELSE false END ORDER BY next_attempt_at LIMIT :batch), s AS (INSERT INTO qa (task_id, attempt, worker, started_at, outcome) SELECT id, attempts + 1, :client_id, now(), 'running' FROM c ON CONFLICT DO NOTHING RETURNING task_id, attempt), stale AS (SELECT count(pg_advisory_unlock(id)) AS n FROM c WHERE id NOT IN (SELECT task_id FROM s)) SELECT quote_literal(coalesce(array_agg(task_id), '{}')::text) AS ids0, quote_literal(coalesce(array_agg(attempt), '{}')::text) AS vers0, (SELECT n FROM stale) AS stale FROM s \gset
WITH fin AS (UPDATE q SET status = 'resolved', attempts = f.a FROM unnest(:ids2::bigint[], :vers2::int[]) AS f(id, a) WHERE q.id = f.id AND q.status = 'failed' AND q.attempts = f.a - 1 RETURNING q.id, q.attempts), h AS (UPDATE qa SET outcome = 'resolved', duration_ms = 1 FROM fin WHERE qa.task_id = fin.id AND qa.attempt = fin.attempts) SELECT count(pg_advisory_unlock(id)) FROM unnest(:ids2::bigint[]) AS u(id);
