-- The attempts a task may make in all, written once for the check and for operators'
-- grants: its own max_attempts, else its route's, else its handler's, else the default
-- (the budgets the caller's fleet applies, as parallel arrays of names and budgets),
-- plus the attempts granted since. A bigint: a budget may be as large as an integer,
-- with grants on top.
CREATE FUNCTION recovery_attempts_allowed(
    task recovery_task,
    route_names text[], route_budgets int[],
    handler_names text[], handler_budgets int[],
    fallback int)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT task.attempt_grants::bigint + coalesce(
        task.max_attempts,
        (SELECT r.budget FROM unnest(route_names, route_budgets) AS r(name, budget)
         WHERE r.name = task.route),
        (SELECT h.budget FROM unnest(handler_names, handler_budgets) AS h(name, budget)
         WHERE h.name = task.handler),
        fallback)
$$;
