-- Re-failures: a message redrive produced (republish, replay) that its consumer
-- dead-lettered again is captured as a new task linked to the task it came from.
-- `generation` is 1 for a first failure and the previous task's generation + 1 for a
-- re-failure; `previous_error` keeps the previous task's error, so the chain still reads
-- after retention has deleted the previous task (hence no foreign key).
ALTER TABLE recovery_task
    ADD COLUMN generation       integer NOT NULL DEFAULT 1,
    ADD COLUMN previous_task_id bigint,
    ADD COLUMN previous_error   text;

-- NOT VALID: existing rows all hold the default; checking them would scan the table
-- under an exclusive lock.
ALTER TABLE recovery_task
    ADD CONSTRAINT recovery_task_generation_positive CHECK (generation >= 1) NOT VALID;

-- `tasks list --previous-task N`: the re-failures of one task.
CREATE INDEX recovery_task_previous_task ON recovery_task (previous_task_id)
    WHERE previous_task_id IS NOT NULL;
