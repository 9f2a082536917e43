-- A lease exists only on an unfinished task: every write that ends a task (finish, and
-- any operator action) gives its lease up in the same statement. With this invariant the
-- fenced writes (finish, heartbeat, release) match on (id, lease_version) and
-- lease_owner alone; they need no `status = 'failed'` test, which would let the planner
-- scan the partial due index in place of primary-key probes whenever stale statistics
-- call that index empty.
ALTER TABLE recovery_task
    ADD CONSTRAINT recovery_task_lease_only_while_unfinished
    CHECK (lease_owner IS NULL OR status = 'failed') NOT VALID;

ALTER TABLE recovery_task VALIDATE CONSTRAINT recovery_task_lease_only_while_unfinished;
