-- What broke: each failure's cause, an error class and the fingerprint of its message
-- (src/task/cause.rs), one row per distinct cause: grouping a million tasks then reads
-- a narrow index of cause ids, never their error texts.
CREATE TABLE IF NOT EXISTS recovery_cause (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    class       text        NOT NULL,
    fingerprint text        NOT NULL,
    -- The first message seen with this cause.
    example     text        NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (class, fingerprint)
);

-- A task's cause and when it was set: at ingest from its report, then by each failed
-- attempt. Columns without a default: a catalog change only, no rewrite, no long lock.
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS cause_id bigint;
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS cause_at timestamptz;

-- The groups of what is not done (unfinished or given up), by cause and when each task
-- last failed: counts, last seen and the trend read this index alone.
CREATE INDEX IF NOT EXISTS recovery_task_cause ON recovery_task (cause_id, cause_at)
    WHERE status IN ('failed', 'permanent_failure');

-- Work that members do after a migration, in small batches, beside the drain: the
-- causes of tasks stored before this migration (or by a member of an earlier release
-- during a rolling upgrade; each member that starts raises `upto` to the newest task).
CREATE TABLE IF NOT EXISTS recovery_backfill (
    name      text   PRIMARY KEY,
    done_upto bigint NOT NULL,
    upto      bigint NOT NULL
);
INSERT INTO recovery_backfill (name, done_upto, upto)
SELECT 'causes', 0, coalesce(max(id), 0) FROM recovery_task
ON CONFLICT (name) DO NOTHING;
