-- Recovery tasks, their attempt history, and the wake-up trigger for idle workers.
-- Everything lives in the schema named by `database.schema` (the connection's search_path).

CREATE TABLE recovery_task (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Idempotency: source coordinates ("kafka:topic:partition:offset") or a caller's key.
    dedup_key             text,
    handler               text        NOT NULL,
    event_type            text,
    correlation_id        text,
    -- Failure context, kept exactly as it came.
    source_topic          text,
    source_partition      integer,
    source_offset         bigint,
    source_timestamp      timestamptz,
    source_timestamp_type text,
    msg_key               bytea,
    msg_value             bytea,
    msg_headers           bytea       NOT NULL DEFAULT '\x',
    error_class           text,
    error_message         text,
    -- Business outcome.
    status                text        NOT NULL DEFAULT 'failed'
        CHECK (status IN ('failed', 'resolved', 'permanent_failure', 'discarded')),
    attempts              integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts          integer     CHECK (max_attempts > 0),
    next_attempt_at       timestamptz NOT NULL DEFAULT now(),
    last_error            text,
    -- Lease: who works on it now. lease_version is the fencing token.
    lease_owner           text,
    lease_version         bigint      NOT NULL DEFAULT 0,
    leased_at             timestamptz,
    checkpoint            jsonb,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    finished_at           timestamptz
);

-- A queue table churns: analyze and vacuum it early so the claim keeps its index plan.
ALTER TABLE recovery_task SET (
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- NULLs are distinct: a task enqueued without a dedup key is never deduplicated.
CREATE UNIQUE INDEX recovery_task_dedup_key ON recovery_task (dedup_key);

-- The claim reads only this index, which holds unfinished tasks alone.
CREATE INDEX recovery_task_due ON recovery_task (next_attempt_at) WHERE status = 'failed';


-- One row per finished attempt. No foreign key: the finish statement writes both tables
-- together, and a per-row RI trigger would cost the hot path for no extra safety.
CREATE TABLE recovery_attempt (
    task_id       bigint      NOT NULL,
    lease_version bigint      NOT NULL,
    attempt       integer     NOT NULL,
    worker        text        NOT NULL,
    started_at    timestamptz NOT NULL,
    duration_ms   integer     NOT NULL,
    outcome       text        NOT NULL,
    error         text,
    PRIMARY KEY (task_id, lease_version)
);

-- Idle workers LISTEN on "<schema>_due"; one notification per inserting statement.
CREATE FUNCTION notify_task_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_due', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_inserted
    AFTER INSERT ON recovery_task
    FOR EACH STATEMENT EXECUTE FUNCTION notify_task_inserted();
