-- Per-key ordering (a route's `ordering = "key"`): a task whose route and message key
-- already have an open task waits behind it, `held`, and becomes due only when every
-- task ahead of it is final. `order_key` is a digest of the route and the key (NULL:
-- not ordered). A held task's next attempt is the far future, so the claim, which
-- reads the due index up to now, never walks past it.
ALTER TABLE recovery_task
    ADD COLUMN order_key bytea,
    ADD COLUMN held boolean NOT NULL DEFAULT false;

ALTER TABLE recovery_task
    ADD CONSTRAINT recovery_task_held_only_while_unfinished_and_ordered
    CHECK (NOT held OR (status = 'failed' AND order_key IS NOT NULL AND lease_owner IS NULL));

-- The open tasks of a key, oldest first.
CREATE INDEX recovery_task_order ON recovery_task (order_key, id)
    WHERE order_key IS NOT NULL AND status = 'failed';

-- Serializes the decisions about one key across transactions (a transaction-level
-- advisory lock in redrive's own lock class).
CREATE FUNCTION recovery_lock_order_key(key bytea) RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(1919247734, hashtext(encode(key, 'hex')))
$$;

-- A task that opens (inserted unfinished, or retried by an operator) while its key has
-- another open task is held; a task that ends is not held.
CREATE FUNCTION recovery_task_hold_behind_open() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'failed' THEN
        NEW.held := false;
        RETURN NEW;
    END IF;
    PERFORM recovery_lock_order_key(NEW.order_key);
    IF EXISTS (SELECT 1 FROM recovery_task
               WHERE order_key = NEW.order_key AND status = 'failed' AND id <> NEW.id) THEN
        NEW.held := true;
        NEW.next_attempt_at := '9999-12-31 00:00:00+00';
    END IF;
    RETURN NEW;
END;
$$;

-- When an open task ends and no unheld open task of its key is left, the oldest held
-- one becomes due (after its handler's breaker hold, if any).
CREATE FUNCTION recovery_task_release_next() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM recovery_lock_order_key(NEW.order_key);
    IF NOT EXISTS (SELECT 1 FROM recovery_task
                   WHERE order_key = NEW.order_key AND status = 'failed' AND NOT held) THEN
        UPDATE recovery_task t
        SET held = false,
            next_attempt_at = greatest(now(),
                (SELECT b.hold_until FROM recovery_breaker b WHERE b.handler = t.handler)),
            updated_at = now()
        WHERE t.id = (SELECT id FROM recovery_task
                      WHERE order_key = NEW.order_key AND status = 'failed' AND held
                      ORDER BY id LIMIT 1);
    END IF;
    RETURN NULL;
END;
$$;

-- The WHEN clauses keep unordered tasks off these paths entirely.
CREATE TRIGGER recovery_task_ordered_insert
    BEFORE INSERT ON recovery_task
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL)
    EXECUTE FUNCTION recovery_task_hold_behind_open();

CREATE TRIGGER recovery_task_ordered_reopen
    BEFORE UPDATE OF status ON recovery_task
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION recovery_task_hold_behind_open();

CREATE TRIGGER recovery_task_ordered_release
    AFTER UPDATE OF status ON recovery_task
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL AND OLD.status = 'failed' AND NEW.status <> 'failed')
    EXECUTE FUNCTION recovery_task_release_next();
