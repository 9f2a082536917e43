-- Paced redrive (issue 31): a redrive job is a replay (produce to a topic) or a retry (make
-- tasks due again), run batch by batch at a pace that ramps through checkpoints and
-- pauses itself when what it redrove fails again. The table keeps its name.
--
-- `by_fleet`: run by the fleet's members. Jobs a member of an earlier release must not
-- take (a retry, or any paced job: it would run them unpaced or as a replay) are recorded
-- with `detached = false, by_fleet = true`; earlier releases only ever claim `detached`
-- jobs, so during a rolling upgrade only members of this release run them.
ALTER TABLE recovery_replay
    ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'replay',
    ADD COLUMN IF NOT EXISTS by_fleet boolean NOT NULL DEFAULT false,
    -- The pace (src/pace.rs) as JSON; none: as fast as `rate` allows, never paused.
    ADD COLUMN IF NOT EXISTS pace jsonb,
    -- A retry's options (its attempt budget, whether compensations are overridden).
    ADD COLUMN IF NOT EXISTS retry jsonb,
    -- The ramp step under way (0 for the first), where it began (the cursor, and
    -- produced + skipped then) and when; outcomes are judged per step.
    ADD COLUMN IF NOT EXISTS step integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS step_cursor bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS step_base bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS step_started_at timestamptz,
    -- Why it is paused (by itself or by an operator).
    ADD COLUMN IF NOT EXISTS paused_reason text,
    -- Redrive tasks another job redrove too (the operator's `--force`).
    ADD COLUMN IF NOT EXISTS force boolean NOT NULL DEFAULT false,
    -- The newest task id when it was recorded: tasks stored later never join it.
    ADD COLUMN IF NOT EXISTS upto_id bigint;

ALTER TABLE recovery_replay DROP CONSTRAINT IF EXISTS recovery_replay_status_check;
ALTER TABLE recovery_replay ADD CONSTRAINT recovery_replay_status_check
    CHECK (status IN ('pending', 'running', 'paused', 'done', 'cancelled', 'failed'));
ALTER TABLE recovery_replay DROP CONSTRAINT IF EXISTS recovery_replay_kind_check;
ALTER TABLE recovery_replay ADD CONSTRAINT recovery_replay_kind_check
    CHECK (kind IN ('replay', 'retry'));

-- `redrive_job`: the job whose release made a task due now (a paced retry) or that
-- replayed it: its webhook calls carry it, and a job judges its outcomes by it; any
-- other operator action clears it. `redriven_by`: the last job that redrove it, never
-- cleared: a later job needs `force` to redrive it again. Columns without a default: a
-- catalog change only.
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS redrive_job bigint;
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS redriven_by bigint;

-- A job's tasks in id order (the step it judges is a range of ids).
CREATE INDEX IF NOT EXISTS recovery_task_redrive_job ON recovery_task (redrive_job, id)
    WHERE redrive_job IS NOT NULL;
