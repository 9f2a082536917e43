-- A job an approval started (operations.approval_over) keeps the approval and the rate
-- it was approved at: resuming it may slow it down, never speed it past that rate
-- (a faster pace is a new action, approved again).
ALTER TABLE recovery_replay ADD COLUMN IF NOT EXISTS approval_id bigint;
ALTER TABLE recovery_replay ADD COLUMN IF NOT EXISTS approved_rate double precision;
