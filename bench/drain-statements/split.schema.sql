-- Split-state on redrive's own table: the columns the drain and operators write, copied
-- into a narrow table `task_state` with the task table's drain indexes; the task table
-- keeps the rest and is no longer written by the drain.
CREATE TABLE ds.task_state AS SELECT id, handler, route, status, attempts, max_attempts, attempt_grants, next_attempt_at, last_error, lease_owner, lease_version, leased_at, checkpoint, held, order_key, updated_at, finished_at FROM ds.recovery_task;
ALTER TABLE ds.task_state ADD PRIMARY KEY (id);
CREATE INDEX task_state_due ON ds.task_state (next_attempt_at) WHERE status = 'failed';
CREATE INDEX task_state_finished ON ds.task_state (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX task_state_order ON ds.task_state (order_key, id) WHERE order_key IS NOT NULL AND status = 'failed';
CREATE INDEX task_state_unsuccessful ON ds.task_state (status, id) WHERE status IN ('permanent_failure', 'discarded');
VACUUM ANALYZE ds.task_state;
