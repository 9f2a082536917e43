-- One rule for when a task may run, written once and used by every path that sets a
-- task due (enqueue, finish, operator actions, the ordering triggers), and a key's
-- reopened tasks that go first oldest first whatever order a statement visits them in.

-- A task of a handler whose breaker is open or half-open is due no earlier than the
-- breaker's hold_until; otherwise when wanted. A table function, so the planner inlines
-- it into the statement that uses it (an index probe, not a function call per row).
CREATE FUNCTION recovery_due_at(handler text, wanted timestamptz)
RETURNS TABLE (due_at timestamptz) LANGUAGE sql STABLE AS $$
    SELECT greatest(wanted, b.hold_until)
    FROM (VALUES (1)) AS one
    LEFT JOIN recovery_breaker b ON b.handler = recovery_due_at.handler
$$;

CREATE OR REPLACE FUNCTION recovery_task_release_next() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM recovery_lock_order_key(NEW.order_key);
    IF NOT EXISTS (SELECT 1 FROM recovery_task
                   WHERE order_key = NEW.order_key AND status = 'failed' AND NOT held) THEN
        UPDATE recovery_task t
        SET held = false,
            next_attempt_at = (SELECT due_at FROM recovery_due_at(t.handler, now())),
            updated_at = now()
        WHERE t.id = (SELECT id FROM recovery_task
                      WHERE order_key = NEW.order_key AND status = 'failed' AND held
                      ORDER BY id LIMIT 1);
    END IF;
    RETURN NULL;
END;
$$;

-- A statement that reopens several tasks of a key visits them in its plan's order (a
-- multi-batch hash join reorders rows), and the first one visited found no open task
-- of its key, so it was left due while the others were held behind it. Once the
-- statement is done, the key's oldest open task takes that turn (and its due time).
-- Every other open task of the key was opened by the same statement after that first
-- one: a task opened earlier would have held it.
CREATE FUNCTION recovery_task_reopened_oldest_first() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    oldest bigint;
BEGIN
    SELECT id INTO oldest FROM recovery_task
    WHERE order_key = NEW.order_key AND status = 'failed'
    ORDER BY id LIMIT 1;
    IF oldest <> NEW.id THEN
        UPDATE recovery_task
        SET held = true, next_attempt_at = '9999-12-31 00:00:00+00'
        WHERE id = NEW.id;
        UPDATE recovery_task t
        SET held = false,
            next_attempt_at = (SELECT due_at FROM recovery_due_at(t.handler, NEW.next_attempt_at)),
            updated_at = now()
        WHERE t.id = oldest;
    END IF;
    RETURN NULL;
END;
$$;

-- After-row triggers run once the statement has changed all its rows.
CREATE TRIGGER recovery_task_ordered_reopened
    AFTER UPDATE OF status ON recovery_task
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL AND OLD.status <> 'failed'
                       AND NEW.status = 'failed' AND NOT NEW.held)
    EXECUTE FUNCTION recovery_task_reopened_oldest_first();
