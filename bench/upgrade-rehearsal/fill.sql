-- :n tasks in schema :schema (migrated by the previous release), shaped like a store
-- that has run a while: 90% resolved, 10% failed and due over the next hour, keys over
-- 5000 customers, a 200-byte value, each with its dedup key claimed and one attempt.
SET search_path = :schema;
INSERT INTO recovery_task
    (dedup_key, handler, route, event_type, source_topic, source_partition, source_offset,
     source_timestamp, msg_key, msg_value, value_size, error_class, error_message,
     original_topic, original_partition, original_offset, status, attempts, last_error,
     next_attempt_at, created_at, updated_at, finished_at)
SELECT 'kafka:orders.DLT:' || (i % 12) || ':' || i, 'republish', 'orders', 'order.failed',
       'orders.DLT', i % 12, i, now() - interval '1 day',
       convert_to('order-' || (i % 5000), 'UTF8'),
       convert_to('{"id": ' || i || ', "pad": "' || repeat('x', 180) || '"}', 'UTF8'), 200,
       'java.lang.IllegalStateException', 'order ' || i || ' failed',
       'orders', i % 12, 1000000 + i,
       CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'resolved' END, 1, 'HTTP 503',
       now() + (i % 3600) * interval '1 second',
       now() - interval '1 day', now() - interval '1 day',
       CASE WHEN i % 10 = 0 THEN NULL ELSE now() - interval '1 day' END
FROM generate_series(1, :n) AS i;
INSERT INTO recovery_task_dedup (dedup_key, task_id)
SELECT dedup_key, id FROM recovery_task WHERE dedup_key IS NOT NULL
ON CONFLICT DO NOTHING;
INSERT INTO recovery_attempt (task_id, lease_version, attempt, worker, started_at, duration_ms, outcome, error)
SELECT id, 1, 1, 'fill', created_at, 5, CASE WHEN status = 'failed' THEN 'retry' ELSE 'resolved' END,
       CASE WHEN status = 'failed' THEN 'HTTP 503' END
FROM recovery_task;
VACUUM ANALYZE recovery_task;
VACUUM ANALYZE recovery_attempt;
CHECKPOINT;
