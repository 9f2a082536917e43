-- Candidate: no row version at the claim. The claim locks due rows (FOR UPDATE SKIP
-- LOCKED: a lock record, no new version, no index entry) that no live batch holds, and
-- records one row per claimed batch (its ids, the attempts they had, a lease); the batch
-- row is the lease and counts the batch's attempts before the call. A second statement
-- (a fresh snapshot, the rows still locked) drops what a batch committed since the first
-- one's snapshot holds. The finish counts the attempt in the task row, writes the history
-- and deletes the batch row. Two batches per client in flight.
SELECT quote_literal(:ids1::text) AS ids2, quote_literal(:vers1::text) AS vers2, quote_literal(:ids0::text) AS ids1, quote_literal(:vers0::text) AS vers1, :batch1 AS batch2, :batch0 AS batch1 \gset
BEGIN;
SELECT quote_literal(coalesce(array_agg(id), '{}')::text) AS locked FROM (SELECT id FROM q WHERE status = 'failed' AND next_attempt_at <= now() AND handler = ANY('{h}') AND id NOT IN (SELECT unnest(ids) FROM qclaim WHERE lease_until > now()) ORDER BY next_attempt_at LIMIT :batch FOR UPDATE SKIP LOCKED) c \gset
WITH ok AS MATERIALIZED (SELECT id, attempts FROM q WHERE id = ANY(:locked::bigint[]) AND id NOT IN (SELECT unnest(ids) FROM qclaim WHERE lease_until > now())), b AS (INSERT INTO qclaim (worker, backend, ids, attempts) SELECT :client_id, pg_backend_pid(), array_agg(id), array_agg(attempts) FROM ok HAVING count(*) > 0 RETURNING id) SELECT coalesce((SELECT id FROM b), 0) AS batch0, quote_literal(coalesce(array_agg(id), '{}')::text) AS ids0, quote_literal(coalesce(array_agg(attempts), '{}')::text) AS vers0 FROM ok \gset
COMMIT;
WITH fin AS (UPDATE q SET status = 'resolved', attempts = f.a + 1 FROM unnest(:ids2::bigint[], :vers2::int[]) AS f(id, a) WHERE q.id = f.id AND q.status = 'failed' AND q.attempts = f.a RETURNING q.id, q.attempts), h AS (INSERT INTO qa (task_id, attempt, worker, started_at, duration_ms, outcome) SELECT id, attempts, :client_id, now(), 1, 'resolved' FROM fin) DELETE FROM qclaim WHERE id = :batch2;
