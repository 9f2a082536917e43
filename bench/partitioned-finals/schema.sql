-- A store holding :n final tasks finished two days ago, each with one history row, kept two
-- ways: in the live table `q` (as redrive keeps them today, found by a partial index on
-- finished_at) and in a day's partition of `qf` (with its history in a day's partition of
-- `qfa`). `q` also holds :live due tasks for a drain running beside retention.
DROP TABLE IF EXISTS q, qa, qf, qfa;
CREATE TABLE q (
  id bigserial PRIMARY KEY,
  status text NOT NULL DEFAULT 'failed',
  handler text NOT NULL DEFAULT 'h',
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_owner int,
  lease_version int NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  src_topic text NOT NULL DEFAULT 't', src_partition int NOT NULL DEFAULT 0, src_offset bigint NOT NULL DEFAULT 0,
  payload bytea,
  finished_at timestamptz
);
INSERT INTO q (status, attempts, payload, src_offset, finished_at)
SELECT 'resolved', 1, decode(repeat('ab', 256), 'hex'), g, date_trunc('day', now() - interval '2 days') + interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, :n) g;
INSERT INTO q (payload, src_offset) SELECT decode(repeat('ab', 256), 'hex'), :n + g FROM generate_series(1, :live) g;
CREATE INDEX q_due ON q (next_attempt_at) WHERE status = 'failed';
CREATE INDEX q_finished ON q (finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX q_src ON q (src_topic, src_partition, src_offset);
CREATE TABLE qa (task_id bigint NOT NULL, attempt int NOT NULL, worker int, started_at timestamptz, duration_ms int, outcome text, error text, PRIMARY KEY (task_id, attempt));
INSERT INTO qa SELECT id, 1, 0, finished_at, 1, 'resolved' FROM q WHERE status = 'resolved';

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
CREATE TABLE qfa (task_id bigint NOT NULL, attempt int NOT NULL, worker int, started_at timestamptz NOT NULL, duration_ms int, outcome text, error text)
  PARTITION BY RANGE (started_at);
SELECT format('CREATE TABLE %s_%s PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
              t, to_char(d, 'YYYYMMDD'), t, d, d + interval '1 day')
FROM generate_series(date_trunc('day', now()) - interval '3 days',
                     date_trunc('day', now()) + interval '1 day', interval '1 day') d,
     unnest(ARRAY['qf', 'qfa']) t \gexec
CREATE INDEX qf_id ON qf (id);
CREATE INDEX qfa_task ON qfa (task_id, attempt);
INSERT INTO qf SELECT id, status, handler, lease_version, attempts, src_topic, src_partition, src_offset, payload, finished_at
FROM q WHERE status = 'resolved';
INSERT INTO qfa SELECT * FROM qa;
VACUUM ANALYZE q, qa, qf, qfa;
CHECKPOINT;
