-- Time arithmetic written once. PostgreSQL 15 cannot subtract an infinite time, and
-- chrono (the members' reader) cannot hold a time outside its years: a time read from
-- a row is clamped to that range before any arithmetic (a task given `infinity` by hand
-- once failed every claim of its handlers; see src/store/time.rs). Both functions are
-- single expressions, which the planner inlines into the statements that call them.

-- `t` within the range every program here can read and subtract.
CREATE FUNCTION recovery_clamp_time(t timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT least(greatest(t, '4713-12-01 BC'::timestamptz), '262142-01-01'::timestamptz)
$$;

-- Whole milliseconds from `since` to `until`, both clamped, held to what an attempt's
-- `duration_ms` (an int) holds: 0 when `until` is earlier.
CREATE FUNCTION recovery_elapsed_ms(since timestamptz, until timestamptz) RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT least(greatest(extract(epoch FROM recovery_clamp_time(until)
                                      - recovery_clamp_time(since)) * 1000, 0),
                 2147483647)::int
$$;
