-- Payload transforms (issue 31): an operator fixes stored payloads before redriving them.
-- The value as it came is kept in `original_value` at the first transform (NULL: never
-- transformed), and `payload_version` counts the versions (1: as it came). A constant
-- default is a catalog change only: no rewrite, no long lock.
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS original_value bytea;
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS payload_version integer NOT NULL DEFAULT 1;
