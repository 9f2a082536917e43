-- 1M due tasks of the bench's shape (handler noop, 256-byte value, no key) in a migrated
-- schema `ds`, analyzed, as the drain-candidates' table is.
SET search_path = ds;
TRUNCATE recovery_task, recovery_attempt;
INSERT INTO recovery_task (handler, source_topic, source_partition, source_offset, msg_key, msg_value, msg_headers, error_class, error_message, route, value_size)
SELECT 'noop', 'bench', 0, g, NULL, decode(repeat('ab', 256), 'hex'), '\x'::bytea, 'bench', 'bench failure', NULL, 256 FROM generate_series(1, :n) g;
VACUUM ANALYZE recovery_task;
