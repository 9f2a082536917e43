#!/bin/bash
# Drain candidates measured with pgbench beside the two-update ceiling, interleaved,
# on the same table shape as ../../../shared/bench/pg-ceiling.sh: 4 clients with two batches
# each in flight (each round claims a batch and finishes the one claimed two rounds before), a fixed
# number of transactions that claims 80% of the rows (no empty claim is counted), batch 500.
# Prints tasks/s of every round and the median per candidate, with the ratio to two-update.
# usage: [CANDIDATES="two-update ..."] run.sh [PORT] [ROWS] [ROUNDS] [FILLFACTOR]   (host 127.0.0.1, user postgres)
# The advisory candidates hold a session lock per task in flight in the server's shared
# lock table (max_locks_per_transaction x max_connections slots, 6,400 by default): with
# more tasks in flight than that, every session of the server fails "out of shared memory".
# The finish-move candidate finishes a task by moving it into `qf`, a table of final tasks
# partitioned by day of finished_at (schema.sql), and is checked there.
# The toasted candidate runs two-update.sql on a table whose payload is kept out of line
# (schema.sql: toast_tuple_target = 128, storage EXTERNAL); the unindexed-source candidate
# runs it on a table without the source's unique index (the ceiling's dedup key).
# It creates and drops its own database `redrive_candidates`.
set -eu
P=${1:-5432}; N=${2:-1000000}; R=${3:-3}; FF=${4:-100}; B=500; H=127.0.0.1
d=$(cd "$(dirname "$0")" && pwd)
PSQL="psql -h $H -p $P -U postgres -q -X"
$PSQL -c 'DROP DATABASE IF EXISTS redrive_candidates' -c 'CREATE DATABASE redrive_candidates' >/dev/null 2>&1
candidates=${CANDIDATES:-two-update hot-lease batch-lease split-state toasted unindexed-source advisory-append advisory-batch finish-move}
declare -A figures
for round in $(seq 1 "$R"); do
  for c in $candidates; do
    case $c in hot-lease|advisory-append) ff=$FF ;; *) ff=100 ;; esac
    toasted=false; indexed=true; script=$c
    [ "$c" != toasted ] || { toasted=true; script=two-update; }
    [ "$c" != unindexed-source ] || { indexed=false; script=two-update; }
    [ -f "$d/$script.sql" ] || { echo "no candidate $c" >&2; exit 2; }
    $PSQL -d redrive_candidates -v n="$N" -v fillfactor="$ff" -v toasted=$toasted -v source_indexed=$indexed -f "$d/schema.sql" >/dev/null 2>&1
    t=$(( N * 8 / 10 / (4 * B) ))
    out=$(pgbench -h $H -p $P -U postgres -n -c 4 -j 2 -t "$t" -D batch=$B -D "ids0='{}'" -D "vers0='{}'" -D "ids1='{}'" -D "vers1='{}'" -D batch0=0 -D batch1=0 \
          -f "$d/$script.sql" redrive_candidates 2>&1) || true
    if echo "$out" | grep -qi 'error\|aborted'; then echo "$c: pgbench failed:" >&2; echo "$out" | grep -i 'error\|aborted' | head -3 >&2; figures[$c]="${figures[$c]:-} 0"; continue; fi
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    # Every claimed task must have been resolved once, with one history row.
    state=q; [ "$c" != split-state ] || state=qs; [ "$c" != finish-move ] || state=qf
    check=$($PSQL -d redrive_candidates -Atc "SELECT (SELECT count(*) FROM $state WHERE status = 'resolved') || ' ' || (SELECT count(*) FROM qa WHERE outcome = 'resolved') || ' ' || (SELECT count(*) FROM $state WHERE status = 'resolved' AND attempts <> 1)")
    set -- $check
    if [ "$1" != "$2" ] || [ "$3" != 0 ] || [ "$1" = 0 ]; then echo "$c: resolved $1, history $2, attempts<>1: $3: FAILED" >&2; exit 1; fi
    # Claims may come back short (a candidate's race guard drops tasks): count what was resolved.
    rate=$(echo "$tps*$1/($t*4)/1" | bc)
    echo "round $round $c (fillfactor $ff): $rate tasks/s ($1 resolved)"
    figures[$c]="${figures[$c]:-} $rate"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(echo "${figures[two-update]}" | median)
for c in $candidates; do
  m=$(echo "${figures[$c]}" | median)
  printf '%-16s median %7d tasks/s  %.2f x two-update\n' "$c" "$m" "$(echo "$m/$base" | bc -l)"
done
$PSQL -c 'DROP DATABASE redrive_candidates' >/dev/null
