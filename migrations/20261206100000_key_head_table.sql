-- The key head index leaves the task table (issue 18). The console's key filters find
-- their tasks through the first 64 bytes of the Kafka key, which never change; but every
-- row version the drain writes (a claim, a finish) put a new entry into the task table's
-- index on them. Measured with `redrive bench` at batch 500, the index cost the drain a
-- sixth of its rate and a third of its WAL. The heads are now written once, when a task is
-- stored, into a table of their own (a key head and its task), from which a list by a
-- narrow key finds its tasks. Tasks without a key have no row.

-- Members of the previous version may still be storing tasks (a rolling upgrade): the
-- copy holds them off until the triggers below are in place, so no key goes unrecorded.
LOCK TABLE recovery_task IN SHARE MODE;

-- The old index has the table's name (a store may have lost it by hand already).
DROP INDEX IF EXISTS recovery_task_key_head;

CREATE TABLE recovery_task_key_head (
    key_head bytea  NOT NULL,
    task_id  bigint NOT NULL,
    PRIMARY KEY (key_head, task_id)
);

INSERT INTO recovery_task_key_head (key_head, task_id)
SELECT substring(msg_key FROM 1 FOR 64), id FROM recovery_task WHERE msg_key IS NOT NULL;

-- Whoever stores tasks (redrive's statements, a person at psql), their heads are
-- recorded: one statement per storing statement.
CREATE FUNCTION recovery_task_key_head_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'INSERT INTO %I.recovery_task_key_head (key_head, task_id) '
        'SELECT substring(msg_key FROM 1 FOR 64), id FROM stored_tasks '
        'WHERE msg_key IS NOT NULL', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_key_head_stored
    AFTER INSERT ON recovery_task
    REFERENCING NEW TABLE AS stored_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION recovery_task_key_head_record();

-- redrive never changes a stored task's key; an update that does (by hand) moves its head.
CREATE FUNCTION recovery_task_key_head_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'DELETE FROM %I.recovery_task_key_head '
        'WHERE key_head = substring($1 FROM 1 FOR 64) AND task_id = $2', TG_TABLE_SCHEMA)
        USING OLD.msg_key, OLD.id;
    IF NEW.msg_key IS NOT NULL THEN
        EXECUTE format(
            'INSERT INTO %I.recovery_task_key_head (key_head, task_id) '
            'VALUES (substring($1 FROM 1 FOR 64), $2) ON CONFLICT DO NOTHING', TG_TABLE_SCHEMA)
            USING NEW.msg_key, NEW.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_key_head_changed
    AFTER UPDATE OF msg_key, id ON recovery_task
    FOR EACH ROW
    WHEN (OLD.msg_key IS DISTINCT FROM NEW.msg_key OR OLD.id IS DISTINCT FROM NEW.id)
    EXECUTE FUNCTION recovery_task_key_head_move();

-- A deleted task's head goes with it, whoever deletes it (retention, a person at psql).
CREATE FUNCTION recovery_task_key_head_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'DELETE FROM %I.recovery_task_key_head k USING deleted_tasks t '
        'WHERE k.key_head = substring(t.msg_key FROM 1 FOR 64) AND k.task_id = t.id',
        TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_key_head_deleted
    AFTER DELETE ON recovery_task
    REFERENCING OLD TABLE AS deleted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION recovery_task_key_head_release();

CREATE FUNCTION recovery_task_key_head_release_all() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('TRUNCATE %I.recovery_task_key_head', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER recovery_task_key_head_truncated
    AFTER TRUNCATE ON recovery_task
    FOR EACH STATEMENT EXECUTE FUNCTION recovery_task_key_head_release_all();
