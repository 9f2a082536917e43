-- Candidate: two-update's claim, and a finish that moves the task out of the live table
-- into `qf`, a table of final tasks partitioned by day of `finished_at` (so retention can
-- drop a day instead of deleting its rows). The finish deletes the live row and inserts
-- the final one: a dead row version in the live table and a new row with its index entry
-- in the partition, where two-update writes one new row version. Two batches per client
-- in flight.
SELECT quote_literal(:ids1::text) AS ids2, quote_literal(:vers1::text) AS vers2, quote_literal(:ids0::text) AS ids1, quote_literal(:vers0::text) AS vers1 \gset
WITH due AS MATERIALIZED (SELECT id FROM q WHERE status = 'failed' AND next_attempt_at <= now() AND handler = ANY('{h}') ORDER BY next_attempt_at LIMIT :batch FOR UPDATE SKIP LOCKED), upd AS (UPDATE q SET lease_version = q.lease_version + 1, lease_owner = :client_id, next_attempt_at = now() + interval '30 s', attempts = q.attempts + 1 FROM due WHERE q.id = due.id RETURNING q.id, q.lease_version) SELECT quote_literal(coalesce(array_agg(id), '{}')::text) AS ids0, quote_literal(coalesce(array_agg(lease_version), '{}')::text) AS vers0 FROM upd \gset
WITH gone AS (DELETE FROM q USING unnest(:ids2::bigint[], :vers2::int[]) AS f(id, v) WHERE q.id = f.id AND q.lease_version = f.v RETURNING q.*), fin AS (INSERT INTO qf (id, status, handler, lease_version, attempts, src_topic, src_partition, src_offset, payload, finished_at) SELECT id, 'resolved', handler, lease_version, attempts, src_topic, src_partition, src_offset, payload, now() FROM gone RETURNING id, attempts) INSERT INTO qa (task_id, attempt, worker, started_at, duration_ms, outcome) SELECT id, attempts, :client_id, now(), 1, 'resolved' FROM fin;
