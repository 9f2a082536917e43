-- An operator who retries, discards or resolves a task while a member is calling its
-- handler fences that call out; the member stops it as soon as it hears of it (a NOTIFY,
-- then its heartbeat). Until that call has stopped, no other call of the task, nor of
-- any task of its ordering key, may start: the action writes a row here, the member
-- deletes it once the call has ended, and the claim skips what a live row names.
-- `ends_by` is the old lease's deadline at the action: by then the member's own lease
-- deadline has stopped the call whatever happened to the member, so a row past it no
-- longer holds anything back (a dead member never deletes its rows).
CREATE TABLE recovery_stopping_call (
    task_id       bigint      NOT NULL,
    -- The fenced lease: the member names the call it stopped by it.
    lease_version bigint      NOT NULL,
    -- The task's ordering key, if any: the key's other tasks wait as well.
    order_key     bytea,
    ends_by       timestamptz NOT NULL,
    PRIMARY KEY (task_id, lease_version)
);

CREATE INDEX recovery_stopping_call_key ON recovery_stopping_call (order_key)
    WHERE order_key IS NOT NULL;
