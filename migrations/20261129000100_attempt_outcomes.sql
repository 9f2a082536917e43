-- One vocabulary of attempt outcomes: `recovery_attempt.outcome` holds the values of
-- `AttemptOutcome` (src/task/outcome.rs) and no other.

-- An attempt that ended its task without calling the handler ("no attempts left") was
-- written as a permanent failure, told apart by its error text only; it is `not_called`
-- now, and `tasks check` tells it apart by its outcome.
UPDATE recovery_attempt SET outcome = 'not_called'
WHERE outcome = 'permanent_failure' AND error LIKE 'no attempts left%';

-- Every value an earlier version wrote is in the list; anything else was written by hand
-- and is named here rather than guessed at.
DO $$
DECLARE
    unknown text;
BEGIN
    SELECT string_agg(DISTINCT quote_literal(outcome), ', ') INTO unknown
    FROM recovery_attempt
    WHERE outcome NOT IN ('resolved', 'retry', 'permanent_failure', 'not_called',
                          'lease_expired', 'released', 'fenced',
                          'operator_retry', 'operator_discard', 'operator_resolve');
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'recovery_attempt holds outcomes redrive never writes: %', unknown
            USING HINT = 'update or delete those history rows, then start redrive again';
    END IF;
END
$$;

ALTER TABLE recovery_attempt ADD CONSTRAINT recovery_attempt_outcome_known
    CHECK (outcome IN ('resolved', 'retry', 'permanent_failure', 'not_called',
                       'lease_expired', 'released', 'fenced',
                       'operator_retry', 'operator_discard', 'operator_resolve'));
