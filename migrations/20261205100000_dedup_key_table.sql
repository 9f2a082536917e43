-- Dedup keys move out of the task table into a table of their own (issue 18). A task's
-- dedup key never changes, but every row version the drain writes (a claim, a finish)
-- put a new entry into the task table's unique index on it, at a place of the index as
-- scattered as the keys: on ten million tasks each claim read and dirtied index pages
-- all over a 500 MB index, and the drain fell to 0.4 of its rate on a small store. The
-- key is now claimed once, when the task is stored, in `recovery_task_dedup`; the task
-- keeps the column for reading.
CREATE TABLE recovery_task_dedup (
    dedup_key text   PRIMARY KEY,
    task_id   bigint NOT NULL
);

-- Members of the previous version may still be storing tasks (a rolling upgrade): the
-- copy holds them off until the old index is gone, so no key is stored unseen.
LOCK TABLE recovery_task IN SHARE MODE;

INSERT INTO recovery_task_dedup (dedup_key, task_id)
SELECT dedup_key, id FROM recovery_task WHERE dedup_key IS NOT NULL;

DROP INDEX recovery_task_dedup_key;

-- A deleted task gives its key back, whoever deletes it (retention, a person at psql):
-- one statement per deleting statement, through the key's primary key. A key claimed
-- for a task that is gone anyway (deleted with triggers off, its key changed by hand) is
-- taken back by the next message that wants it (`src/store/enqueue.rs`), and `tasks
-- check` reports it.
CREATE FUNCTION recovery_task_dedup_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'DELETE FROM %I.recovery_task_dedup d USING deleted_tasks t '
        'WHERE d.dedup_key = t.dedup_key AND d.task_id = t.id', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_deleted
    AFTER DELETE ON recovery_task
    REFERENCING OLD TABLE AS deleted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION recovery_task_dedup_release();

CREATE FUNCTION recovery_task_dedup_release_all() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('TRUNCATE %I.recovery_task_dedup', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_truncated
    AFTER TRUNCATE ON recovery_task
    FOR EACH STATEMENT EXECUTE FUNCTION recovery_task_dedup_release_all();
