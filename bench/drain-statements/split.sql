-- as-stored.sql on the split-state layout (split.schema.sql): the claim and the finish
-- write `task_state`; the claim reads the message's columns from the task table by id.
SELECT quote_literal(:ids1::text) AS ids2, quote_literal(:vers1::text) AS vers2, quote_literal(:ids0::text) AS ids1, quote_literal(:vers0::text) AS vers1 \gset
BEGIN;
SET LOCAL enable_sort = off;
WITH due AS MATERIALIZED (
    SELECT id, lease_owner, lease_version, leased_at, next_attempt_at, attempts
    FROM ds.task_state
    WHERE status = 'failed' AND handler = ANY('{noop}')
      AND next_attempt_at <= now()
      AND next_attempt_at >= '-infinity'
      AND (lease_owner IS NULL OR next_attempt_at <= now())
      AND (NOT EXISTS (SELECT 1 FROM ds.recovery_stopping_call WHERE ends_by > now()))
    ORDER BY next_attempt_at LIMIT :batch FOR UPDATE SKIP LOCKED),
lost AS (
    INSERT INTO ds.recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, lease_version, attempts, lease_owner, coalesce(leased_at, next_attempt_at), 0, 'lease_expired', 'x'
    FROM due WHERE lease_owner IS NOT NULL ON CONFLICT DO NOTHING),
upd AS (UPDATE ds.task_state t
SET lease_version = t.lease_version + 1, lease_owner = 'member-' || :client_id, leased_at = now(),
    next_attempt_at = now() + 30000 * interval '1 millisecond', attempts = least(t.attempts, 2147483646) + 1, updated_at = now()
FROM due WHERE t.id = due.id
RETURNING t.*, due.lease_owner IS NOT NULL AS recovered, due.next_attempt_at AS was_due),
w AS (SELECT upd.*, wide.msg_value, wide.msg_key, wide.msg_headers, wide.source_topic, wide.source_partition, wide.source_offset, wide.error_class, wide.error_message, wide.created_at, wide.dedup_key, wide.event_type, wide.correlation_id FROM upd JOIN ds.recovery_task wide ON wide.id = upd.id)
SELECT quote_literal(coalesce(array_agg(id), '{}')::text) AS ids0, quote_literal(coalesce(array_agg(lease_version), '{}')::text) AS vers0, sum(length(msg_value)) AS bytes FROM w \gset
COMMIT;
WITH r AS (
    SELECT id, version, status, now() + (next_at - now()) AS next_at, error, outcome, started_at, duration_ms, compensate
    FROM unnest(:ids2::bigint[], :vers2::bigint[]) AS u(id, version)
    CROSS JOIN LATERAL (SELECT 'resolved'::text AS status, NULL::timestamptz AS next_at, NULL::text AS error, 'resolved'::text AS outcome, now() AS started_at, 1 AS duration_ms, false AS compensate) c),
done AS (
    UPDATE ds.task_state t
    SET status = r.status,
        next_attempt_at = CASE WHEN r.next_at IS NULL THEN t.next_attempt_at ELSE (SELECT due_at FROM ds.recovery_due_at(t.handler, r.next_at)) END,
        last_error = coalesce(r.error, t.last_error), lease_owner = NULL, leased_at = NULL,
        finished_at = CASE WHEN r.status = 'failed' THEN NULL ELSE now() END, updated_at = now()
    FROM r WHERE t.id = r.id AND t.lease_version = r.version AND t.lease_owner IS NOT NULL
    RETURNING t.id, t.attempts, r.version, r.started_at, r.duration_ms, r.outcome, r.error, r.status, r.compensate),
history AS (
    INSERT INTO ds.recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
    SELECT id, version, attempts, 'member-' || :client_id, started_at, duration_ms, outcome, error FROM done),
compensation AS (
    INSERT INTO ds.recovery_compensation AS c (task_id)
    SELECT id FROM done WHERE status = 'permanent_failure' AND compensate
    ON CONFLICT (task_id) DO UPDATE SET state = 'pending', attempts = 0, due_at = now(), last_error = NULL, finished_at = NULL, version = c.version + 1)
SELECT count(*) FROM done;
