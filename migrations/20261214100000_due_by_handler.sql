-- The due index leads with the handler: a claim (and the look for the next due task)
-- walks each of its handlers' due tasks in due order and never passes the due tasks of
-- handlers it does not serve. Keyed on the due time alone, a claim's walk passed every
-- task of every other handler due before its own: once a second (`worker::due_floor`)
-- each member walked past the 400,000 due tasks of handlers it did not serve in the
-- 10M-task bench, 14 ms and 5,500 buffers a claim on average (docs/what-broke.md).
--
-- Replaced, not added: with both, the planner walks the old one whenever statistics
-- spread the served handler's tasks evenly, and every claim would write both.
-- During a rolling upgrade, members of the earlier release claim by sorting their
-- handlers' due tasks until they are replaced (milliseconds for thousands of due tasks,
-- about a second for a million): upgrade them promptly.
CREATE INDEX IF NOT EXISTS recovery_task_due_by_handler
    ON recovery_task (handler, next_attempt_at) WHERE status = 'failed';
DROP INDEX IF EXISTS recovery_task_due;
