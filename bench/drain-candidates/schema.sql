-- The ceiling's table (../../../shared/bench/ceiling-schema.sql) with what the candidates
-- need: an unindexed lease deadline, a fillfactor, and a table of claimed batches.
DROP TABLE IF EXISTS q, qa, qclaim;
CREATE TABLE q (
  id bigserial PRIMARY KEY,
  status text NOT NULL DEFAULT 'failed',
  handler text NOT NULL DEFAULT 'h',
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_until timestamptz,
  lease_owner int,
  lease_version int NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  src_topic text NOT NULL DEFAULT 't', src_partition int NOT NULL DEFAULT 0, src_offset bigint NOT NULL DEFAULT 0,
  payload bytea
) WITH (fillfactor = :fillfactor);
CREATE INDEX q_due ON q (next_attempt_at) WHERE status = 'failed';
-- The toasted candidate: the payload kept out of line, so a new row version copies a
-- pointer to it rather than the payload.
\if :toasted
ALTER TABLE q SET (toast_tuple_target = 128);
ALTER TABLE q ALTER COLUMN payload SET STORAGE EXTERNAL;
\endif
INSERT INTO q (payload, src_offset) SELECT decode(repeat('ab', 256), 'hex'), g FROM generate_series(1, :n) g;
-- The unindexed-source candidate: two-update on a table whose only full index is its
-- primary key (the dedup key claimed elsewhere, as redrive's `recovery_task_dedup` does).
\if :source_indexed
CREATE UNIQUE INDEX q_src ON q (src_topic, src_partition, src_offset);
\endif
CREATE TABLE qa (task_id bigint NOT NULL, attempt int NOT NULL, worker int, started_at timestamptz, duration_ms int, outcome text, error text, PRIMARY KEY (task_id, attempt)) WITH (fillfactor = :fillfactor);
CREATE TABLE qclaim (id bigserial PRIMARY KEY, worker int NOT NULL, backend int NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(), lease_until timestamptz NOT NULL DEFAULT now() + interval '30 s', ids bigint[] NOT NULL, attempts int[]);
VACUUM ANALYZE q;
-- The split-state candidate: the columns a drain writes, in a narrow table of their own.
DROP TABLE IF EXISTS qs;
CREATE TABLE qs (
  id bigint PRIMARY KEY,
  status text NOT NULL DEFAULT 'failed',
  handler text NOT NULL DEFAULT 'h',
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_owner int,
  lease_version int NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0);
INSERT INTO qs (id, next_attempt_at) SELECT id, next_attempt_at FROM q;
CREATE INDEX qs_due ON qs (next_attempt_at) WHERE status = 'failed';
VACUUM ANALYZE qs;
-- The finish-move candidate: final tasks in a table partitioned by day of finished_at,
-- with yesterday's, today's and tomorrow's partitions, found by id through an index.
DROP TABLE IF EXISTS qf;
CREATE TABLE qf (
  id bigint NOT NULL,
  status text NOT NULL,
  handler text NOT NULL,
  lease_version int NOT NULL,
  attempts int NOT NULL,
  src_topic text NOT NULL, src_partition int NOT NULL, src_offset bigint NOT NULL,
  payload bytea,
  finished_at timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);
SELECT format('CREATE TABLE qf_%s PARTITION OF qf FOR VALUES FROM (%L) TO (%L)',
              to_char(d, 'YYYYMMDD'), d, d + interval '1 day')
FROM generate_series(date_trunc('day', now()) - interval '1 day',
                     date_trunc('day', now()) + interval '1 day', interval '1 day') d \gexec
CREATE INDEX qf_id ON qf (id);
