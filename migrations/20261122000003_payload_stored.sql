-- Whether key, value and headers are stored. False for a message kept in minimal form
-- (over ingest.max_message_bytes, or refused by the database): its payload is absent
-- because it was left out, which a handler must tell apart from a tombstone.
ALTER TABLE recovery_task ADD COLUMN payload_stored boolean NOT NULL DEFAULT true;
