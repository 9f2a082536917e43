#!/bin/bash
# redrive's storing statement (src/store/enqueue.rs) run by pgbench on a migrated schema,
# piece by piece, beside the insert ceiling of ../../../shared/bench/pg-ceiling.sh: 4
# clients, batch 500, SECONDS each, ROUNDS interleaved rounds. The arrays are built on the
# server (script.py), so the member's side (encoding, the wire) is not in these figures.
# Variants: as stored; without the key head index; without dedup keys; without both.
# usage: run.sh [PORT] [SECONDS] [ROUNDS]   (host 127.0.0.1, user postgres; needs
# target/release/redrive, for `redrive migrate`). It creates and drops the schema
# `ingest_statement` in database `postgres` and the database `redrive_ceiling`.
set -eu
P=${1:-5432}; T=${2:-10}; R=${3:-2}; H=127.0.0.1; S=ingest_statement
d=$(cd "$(dirname "$0")" && pwd); root=$d/../..
PSQL="psql -h $H -p $P -U postgres -q -X -v ON_ERROR_STOP=1"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 "$d/script.py" "$root/src/store/enqueue.rs" > "$work/keys.sql"
python3 "$d/script.py" "$root/src/store/enqueue.rs" --no-keys > "$work/nokeys.sql"
$PSQL -c "DROP SCHEMA IF EXISTS $S CASCADE" 2>/dev/null
REDRIVE__DATABASE__URL="postgres://postgres@$H:$P/postgres" REDRIVE__DATABASE__SCHEMA=$S \
  "$root/target/release/redrive" migrate >/dev/null
$PSQL -c 'DROP DATABASE IF EXISTS redrive_ceiling' -c 'CREATE DATABASE redrive_ceiling' >/dev/null 2>&1
$PSQL -d redrive_ceiling -v n=1000000 -f "$root/../shared/bench/ceiling-schema.sql" >/dev/null 2>&1
rate() { # script database [search_path] -> rows/s
  local tps
  tps=$(PGOPTIONS="-c search_path=${3:-public}" pgbench -h $H -p $P -U postgres -n -c 4 -j 2 -T "$T" -D batch=500 -f "$1" "$2" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  echo "$tps*500/1" | bc
}
key_head() { $PSQL -c "$1" >/dev/null; }
drop_key_head="DROP INDEX $S.recovery_task_key_head"
make_key_head="CREATE INDEX recovery_task_key_head ON $S.recovery_task ((substring(msg_key FROM 1 FOR 64)), id)"
for round in $(seq 1 "$R"); do
  $PSQL -c "TRUNCATE $S.recovery_task" -c CHECKPOINT
  echo "round $round: insert ceiling $(rate "$root/../shared/bench/ceiling-ingest.sql" redrive_ceiling) rows/s"
  echo "round $round: storing statement $(rate "$work/keys.sql" postgres $S) rows/s"
  key_head "$drop_key_head"
  echo "round $round: without the key head index $(rate "$work/keys.sql" postgres $S) rows/s"
  key_head "$make_key_head"
  echo "round $round: without dedup keys $(rate "$work/nokeys.sql" postgres $S) rows/s"
  key_head "$drop_key_head"
  echo "round $round: without both $(rate "$work/nokeys.sql" postgres $S) rows/s"
  key_head "$make_key_head"
done
stored=$($PSQL -Atc "SELECT count(*) FROM $S.recovery_task")
[ "$stored" -gt 0 ] || { echo "nothing was stored: FAILED" >&2; exit 1; }
$PSQL -c "DROP SCHEMA $S CASCADE" -c 'DROP DATABASE redrive_ceiling' >/dev/null
