-- Circuit breakers, one row per handler that has one, shared by the whole fleet.
-- While a breaker is open or half-open, `hold_until` is when the handler's waiting
-- tasks become due again: opening pushes their next_attempt_at to it, so no member
-- claims them (nor walks past them in the due index) until then.
CREATE TABLE recovery_breaker (
    handler              text        PRIMARY KEY,
    state                text        NOT NULL DEFAULT 'closed'
        CHECK (state IN ('closed', 'open', 'half_open')),
    -- Set by an operator: the breaker stays in this state until released.
    forced               text        CHECK (forced IN ('open', 'closed')),
    consecutive_failures integer     NOT NULL DEFAULT 0,
    window_started_at    timestamptz NOT NULL DEFAULT now(),
    window_calls         integer     NOT NULL DEFAULT 0,
    window_failures      integer     NOT NULL DEFAULT 0,
    hold_until           timestamptz,
    probes_granted       integer     NOT NULL DEFAULT 0,
    changed_at           timestamptz NOT NULL DEFAULT now(),
    reason               text,
    CHECK ((state = 'closed') = (hold_until IS NULL))
);
