-- Compensation: what a handler undoes once its task has ended in PERMANENT_FAILURE (a
-- saga's backwards recovery). One row per such task whose handler compensates, written
-- by the statement that commits the permanent failure, so it cannot be forgotten.
CREATE TABLE recovery_compensation (
    task_id     bigint      PRIMARY KEY,
    state       text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'compensated', 'failed', 'cancelled')),
    attempts    integer     NOT NULL DEFAULT 0,
    -- When the next attempt is due. A claim pushes it a lease ahead: a member that dies
    -- mid-call leaves the row to be claimed again then.
    due_at      timestamptz NOT NULL DEFAULT now(),
    -- Fencing token: every claim bumps it, every result must carry it.
    version     bigint      NOT NULL DEFAULT 0,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CHECK ((state = 'pending') = (finished_at IS NULL))
);

CREATE INDEX recovery_compensation_due ON recovery_compensation (due_at) WHERE state = 'pending';

-- One row per finished compensation attempt, as recovery_attempt is for attempts.
CREATE TABLE recovery_compensation_attempt (
    task_id     bigint      NOT NULL,
    version     bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker      text        NOT NULL,
    started_at  timestamptz NOT NULL,
    duration_ms integer     NOT NULL,
    outcome     text        NOT NULL,
    error       text,
    PRIMARY KEY (task_id, version)
);
