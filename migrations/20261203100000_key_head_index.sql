-- The task list's key filters (an exact key, a key prefix) find their tasks through the
-- key's first 64 bytes instead of walking every task newest first: on a million tasks a
-- prefix that matches a few walked them all (over 200 ms). 64 bytes, not the whole key:
-- a Kafka key may be far larger than an index entry can be, and no message may fail to
-- be stored for its key. With the id after it, the tasks of one exact key come in id
-- order from the index alone. Updates already move every task off HOT (the due index's
-- columns change), so this costs each write one index entry more.
CREATE INDEX recovery_task_key_head ON recovery_task ((substring(msg_key FROM 1 FOR 64)), id);
