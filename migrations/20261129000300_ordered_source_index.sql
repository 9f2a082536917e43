-- Where each ordered key's stored messages are in their source partitions: process
-- mode asks it of a redelivered batch ("does a newer message of this key have a task?")
-- so that a message handled inline before is not applied again after a newer one.
-- Only ordered tasks are indexed.
CREATE INDEX recovery_task_ordered_source
    ON recovery_task (order_key, source_topic, source_partition, source_offset)
    WHERE order_key IS NOT NULL;
