-- The attempts' outcomes counted per minute as they are written, so that the console's
-- chart and the last hour's outcomes read at most 60 minutes x outcomes x backends
-- small rows instead of every history row of the hour (the history has no index on
-- its start time, and at 10,000 attempts a second an hour holds 36 million rows).
--
-- One row per minute, outcome and backend: a statement adds to its own backend's rows,
-- so the fleet's finishers never wait on one another's counts. The count is written in
-- the transaction that writes the history rows, by every statement that does (members
-- of an earlier release during a rolling upgrade too): it is exact from then on. The members'
-- sampler deletes rows older than two hours.
CREATE TABLE IF NOT EXISTS recovery_outcome_minute (
    minute   timestamptz NOT NULL,
    outcome  text        NOT NULL,
    backend  integer     NOT NULL,
    attempts bigint      NOT NULL,
    PRIMARY KEY (minute, outcome, backend)
);

-- The function keeps the migration's search_path: a row written by a session of another
-- search_path (psql, a data-only restore that empties it) is counted in this schema's
-- table, not refused or counted in another install's.
CREATE OR REPLACE FUNCTION recovery_count_outcomes() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    -- Most claims write no history row, and fire this all the same.
    IF NOT EXISTS (SELECT FROM added) THEN
        RETURN NULL;
    END IF;
    INSERT INTO recovery_outcome_minute AS m (minute, outcome, backend, attempts)
    SELECT date_trunc('minute', started_at), outcome, pg_backend_pid(), count(*)
    FROM added GROUP BY 1, 2
    ON CONFLICT (minute, outcome, backend)
        DO UPDATE SET attempts = m.attempts + excluded.attempts;
    RETURN NULL;
END;
$$;

-- The last hour so far, counted before the trigger exists: creating it locks the history
-- against writes until this migration commits, and the fleet's finishes should not wait
-- while the whole history is scanned (it has no index on the start time). Attempts
-- written between the two statements miss this hour's chart; none is counted twice.
INSERT INTO recovery_outcome_minute (minute, outcome, backend, attempts)
SELECT date_trunc('minute', started_at), outcome, 0, count(*)
FROM recovery_attempt WHERE started_at > now() - interval '1 hour'
GROUP BY 1, 2
ON CONFLICT (minute, outcome, backend)
    DO UPDATE SET attempts = recovery_outcome_minute.attempts + excluded.attempts;

CREATE OR REPLACE TRIGGER recovery_attempt_counted
    AFTER INSERT ON recovery_attempt REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION recovery_count_outcomes();
