-- The task list's incident views ("permanent failures of handler billing", "what was
-- discarded on route orders") find their tasks through these instead of walking every
-- task newest first: with a million newer resolved tasks that walk took 0.4 to 0.7 s.
-- Partial: a task enters them only when it ends a permanent failure or is discarded (an
-- update that already writes an entry in every index), so claims, retries and
-- resolutions, the drain's writes, never touch them. The list counts a narrow selection
-- through them before it plans (store/inspect.rs), so the plan needs no statistics.
CREATE INDEX recovery_task_unsuccessful ON recovery_task (status, id)
    WHERE status IN ('permanent_failure', 'discarded');
CREATE INDEX recovery_task_unsuccessful_handler ON recovery_task (handler, status, id)
    WHERE status IN ('permanent_failure', 'discarded');
CREATE INDEX recovery_task_unsuccessful_route ON recovery_task (route, status, id)
    WHERE status IN ('permanent_failure', 'discarded');
