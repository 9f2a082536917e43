-- Four eyes for large actions (issue 31): with `operations.approval_over` set, an action
-- selecting more tasks waits here until a second operator approves it (or someone
-- rejects it); the approver's face then runs it, audited as the requester's, approved by
-- the approver.
CREATE TABLE IF NOT EXISTS recovery_approval (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- retry, discard, resolve, replay or transform
    verb            text        NOT NULL,
    -- The request as the requester sent it (the operations layer's request type), as
    -- JSON text: jsonb would reorder a transform's keys and lose `-0` and `\u0000`.
    request         text        NOT NULL,
    -- Tasks it selected when it was requested.
    selected        bigint      NOT NULL,
    requested_by    text        NOT NULL,
    reason          text,
    status          text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'approved', 'rejected')),
    decided_by      text,
    decided_at      timestamptz,
    decision_reason text,
    -- What the approved action answered, or why it failed.
    outcome         jsonb
);

CREATE INDEX IF NOT EXISTS recovery_approval_pending ON recovery_approval (id)
    WHERE status = 'pending';
