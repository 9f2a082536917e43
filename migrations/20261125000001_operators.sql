-- Operators: attempts granted by hand, the audit log, live fleet members, replay jobs,
-- and the index retention walks.

-- Attempts an operator granted (`tasks retry`): a task may make max_attempts +
-- attempt_grants attempts in all.
ALTER TABLE recovery_task ADD COLUMN attempt_grants integer NOT NULL DEFAULT 0
    CHECK (attempt_grants >= 0);

-- Retention deletes final tasks oldest first.
CREATE INDEX recovery_task_finished ON recovery_task (finished_at)
    WHERE finished_at IS NOT NULL;

-- Every operator action: who, what, on which tasks, why, and how many it changed.
-- A bulk action writes its row with its first batch and adds each later batch's count
-- in that batch's transaction, so the row never claims more than was done.
CREATE TABLE recovery_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    action      text        NOT NULL,
    ids         bigint[],
    filter      jsonb,
    reason      text,
    details     jsonb,
    count       bigint      NOT NULL DEFAULT 0
);

-- Fleet members, each upserting its row on a timer; "live" is "seen recently".
CREATE TABLE recovery_member (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    version     text        NOT NULL,
    roles       text[]      NOT NULL,
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL
);

-- Replay jobs: produce the stored bytes of the tasks a filter selects, in task id
-- order. `cursor` is the last task id whose message is known produced; `pending_*`
-- describe a batch being produced (what a resume must look for on the target topic
-- before producing it again).
CREATE TABLE recovery_replay (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,
    filter          jsonb       NOT NULL,
    target_topic    text,
    mark_resolved   boolean     NOT NULL DEFAULT false,
    rate            double precision,
    detached        boolean     NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'done', 'cancelled', 'failed')),
    runner          text,
    heartbeat_at    timestamptz,
    cursor          bigint      NOT NULL DEFAULT 0,
    produced        bigint      NOT NULL DEFAULT 0,
    skipped         bigint      NOT NULL DEFAULT 0,
    total           bigint,
    pending_upto    bigint,
    pending_marks   jsonb,
    error           text,
    finished_at     timestamptz
);
