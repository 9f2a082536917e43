#!/bin/bash
# Retention of final tasks two ways, measured with psql and pgbench: deleting them row by row
# (500 per transaction with their history, as redrive does today) against dropping the
# day's partition of a table of final tasks partitioned by finished_at (and of its
# history). Prints, for ROWS final tasks each with one history row: the time and WAL of
# each way, the VACUUM the deletes leave to do, and the rate of a drain running beside
# each (the drain-candidates' two-update script for the deletes, finish-move for the
# partitions, 4 clients, batch 500, DRAIN seconds) against the same drain alone.
# usage: run.sh [PORT] [ROWS] [DRAIN]   (host 127.0.0.1, user postgres)
# It creates and drops its own database `redrive_finals`.
set -eu
P=${1:-5432}; N=${2:-1000000}; D=${3:-8}; LIVE=1000000; H=127.0.0.1
d=$(cd "$(dirname "$0")" && pwd); drain=$d/../drain-candidates
PSQL="psql -h $H -p $P -U postgres -q -X -v ON_ERROR_STOP=1"
DB=redrive_finals
$PSQL -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
load() { $PSQL -d $DB -v n="$N" -v live="$LIVE" -f "$d/schema.sql" >/dev/null; }
lsn() { $PSQL -d $DB -Atc "SELECT pg_current_wal_lsn()"; }
wal_mb() { $PSQL -d $DB -Atc "SELECT round(pg_wal_lsn_diff('$2', '$1') / 1048576.0, 1)"; }
now_s() { date +%s.%N; }
secs() { echo "scale=2; ($2 - $1) / 1" | bc; }
# tasks/s of a drain of SCRIPT for D seconds (4 clients, batch 500)
drain_rate() {
  local tps
  tps=$(pgbench -h $H -p $P -U postgres -n -c 4 -j 2 -T "$D" -D batch=500 -D "ids0='{}'" -D "vers0='{}'" -D "ids1='{}'" -D "vers1='{}'" \
        -f "$drain/$1.sql" $DB 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  echo "$tps*500/1" | bc
}
# Every final task of the day is gone from where it was kept, and nothing else.
check() {
  local left live
  left=$($PSQL -d $DB -Atc "SELECT (SELECT count(*) FROM q WHERE finished_at < now() - interval '1 day') + (SELECT count(*) FROM qa WHERE started_at < now() - interval '1 day') + (SELECT count(*) FROM qf WHERE finished_at < now() - interval '1 day') + (SELECT count(*) FROM qfa WHERE started_at < now() - interval '1 day')")
  live=$($PSQL -d $DB -Atc "SELECT count(*) FROM q WHERE status = 'failed' OR finished_at > now() - interval '1 day'")
  [ "$left" = 0 ] && [ "$live" -ge 1 ] || { echo "$1: $left expired rows left, $live live: FAILED" >&2; exit 1; }
}

echo "retention of $N final tasks (each with one history row); PostgreSQL autovacuum: $($PSQL -d $DB -Atc 'SHOW autovacuum')"
load
a=$(lsn); t0=$(now_s); $PSQL -d $DB -f "$d/delete-rows.sql"; t1=$(now_s); b=$(lsn)
$PSQL -d $DB -c "DROP TABLE qf, qfa"
echo "  row by row: $(secs "$t0" "$t1") s, $(wal_mb "$a" "$b") MB of WAL"
a=$(lsn); t0=$(now_s); $PSQL -d $DB -c "VACUUM q, qa"; t1=$(now_s); b=$(lsn)
echo "  and the VACUUM it leaves: $(secs "$t0" "$t1") s, $(wal_mb "$a" "$b") MB of WAL"
load
a=$(lsn); t0=$(now_s); $PSQL -d $DB -f "$d/drop-partitions.sql" >/dev/null; t1=$(now_s); b=$(lsn)
$PSQL -d $DB -c "DELETE FROM qa WHERE started_at < now() - interval '1 day'" -c "DELETE FROM q WHERE finished_at IS NOT NULL"
check "dropping partitions"
echo "  dropping the day's partitions: $(secs "$t0" "$t1") s, $(wal_mb "$a" "$b") MB of WAL"

echo "a drain beside retention ($D s, 4 clients, batch 500):"
load
echo "  two-update alone: $(drain_rate two-update) tasks/s"
load
$PSQL -d $DB -f "$d/delete-rows.sql" & deleting=$!
t0=$(now_s); rate=$(drain_rate two-update); t1=$(now_s)
still=running; kill -0 $deleting 2>/dev/null || still=done
wait $deleting; t2=$(now_s)
echo "  two-update while deleting row by row: $rate tasks/s (retention $still at the drain's end; took $(secs "$t0" "$t2") s)"
$PSQL -d $DB -c "DROP TABLE qf, qfa"; $PSQL -d $DB -c "CREATE TABLE qf (LIKE q)" -c "CREATE TABLE qfa (LIKE qa)"
check "deleting rows"
load
echo "  finish-move alone: $(drain_rate finish-move) tasks/s"
load
( sleep 1; $PSQL -d $DB -f "$d/drop-partitions.sql" >/dev/null ) & dropping=$!
rate=$(drain_rate finish-move); wait $dropping
echo "  finish-move while dropping the day's partitions: $rate tasks/s"
$PSQL -d $DB -c "DELETE FROM qa WHERE started_at < now() - interval '1 day'" -c "DELETE FROM q WHERE finished_at < now() - interval '1 day'"
check "dropping partitions beside a drain"
$PSQL -c "DROP DATABASE $DB" >/dev/null
