-- Fleet-wide figures for the metrics (tasks by status and handler, due work, live
-- members), computed by one member per interval and read by all.
CREATE TABLE recovery_sample (
    id          integer     PRIMARY KEY CHECK (id = 1),
    sampled_at  timestamptz NOT NULL,
    figures     jsonb       NOT NULL
);
