-- Failure context read from dead-letter headers, and the route that ingested the task.

ALTER TABLE recovery_task
    -- Where the message lived before it was dead-lettered (from known DLT headers);
    -- for process mode, the consumed message itself.
    ADD COLUMN original_topic     text,
    ADD COLUMN original_partition integer,
    ADD COLUMN original_offset    bigint,
    ADD COLUMN error_stacktrace   text,
    -- The ingest route whose policy applies (NULL for tasks enqueued by hand).
    ADD COLUMN route              text,
    -- What ingest could not read or had to leave out (malformed headers, a payload
    -- over the size limit), in words.
    ADD COLUMN ingest_note        text,
    -- Size in bytes of the message as it came (value, even when not stored).
    ADD COLUMN value_size         integer;
