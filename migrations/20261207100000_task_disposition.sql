-- How a dead letter was given up, where its dialect says (a Kafka share group's DLQ:
-- 'rejected' by the consumer or 'delivery_count_exceeded'); a filter of every face.
-- A column without a default: a catalog change only, no rewrite, no long lock.
ALTER TABLE recovery_task ADD COLUMN IF NOT EXISTS disposition text;
