-- The attempt budgets each member applies (its handlers', its routes', its default), so
-- that a reader with another configuration (the CLI on a laptop, a member that serves
-- other handlers) shows and checks a task against the budget of the fleet that runs
-- it. NULL for a member older than this column: the reader's own budgets stand in.
ALTER TABLE recovery_member ADD COLUMN budgets jsonb;
