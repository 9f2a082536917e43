-- Bad-deploy brakes of process-mode routes, shared by the fleet: while `engaged_until`
-- is in the future every member leaves the route's partitions paused. A member whose
-- inline failures pass the route's threshold engages it for the cool-down; an operator
-- releases it early (`redrive brake release ROUTE`, audited).
CREATE TABLE recovery_brake (
    route         text        PRIMARY KEY,
    engaged_until timestamptz,
    engaged_at    timestamptz,
    engaged_by    text,
    reason        text,
    trips         integer     NOT NULL DEFAULT 0,
    released_at   timestamptz,
    released_by   text
);
