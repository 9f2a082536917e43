-- The handlers a member's worker pool serves: a fleet rate limit is shared among the
-- live members that serve its handler, not among every worker. Members recorded before
-- this column existed serve, as far as anyone can tell, every handler ('{}').
ALTER TABLE recovery_member ADD COLUMN handlers text[] NOT NULL DEFAULT '{}';
