-- Retention as redrive runs it today: the expired final tasks, oldest first, 500 per
-- transaction, with their history, until none is left.
DO $$
DECLARE
  gone int;
BEGIN
  LOOP
    WITH expired AS (
        SELECT id FROM q
        WHERE finished_at IS NOT NULL AND finished_at < now() - interval '1 day' AND status = 'resolved'
        ORDER BY finished_at LIMIT 500 FOR UPDATE SKIP LOCKED),
    history AS (DELETE FROM qa WHERE task_id IN (SELECT id FROM expired)),
    deleted AS (DELETE FROM q WHERE id IN (SELECT id FROM expired) RETURNING id)
    SELECT count(*) INTO gone FROM deleted;
    COMMIT;
    EXIT WHEN gone = 0;
  END LOOP;
END;
$$;
