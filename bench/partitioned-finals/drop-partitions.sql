-- Retention by partition: the day two days back leaves both tables, detached without
-- blocking the finishes that insert into today's partitions, then dropped.
SELECT format('ALTER TABLE %s DETACH PARTITION %s_%s CONCURRENTLY', t, t, to_char(now() - interval '2 days', 'YYYYMMDD'))
FROM unnest(ARRAY['qf', 'qfa']) t \gexec
SELECT format('DROP TABLE %s_%s', t, to_char(now() - interval '2 days', 'YYYYMMDD'))
FROM unnest(ARRAY['qf', 'qfa']) t \gexec
