#!/bin/bash
# redrive's own claim and finish statements run by pgbench, on its own table as stored and
# on the split-state layout, beside the two-update yardstick of ../drain-candidates (with
# and without the source's unique index), interleaved: 1M due tasks, batch 500, 4 clients
# with two batches each in flight, ROUNDS rounds, medians. No member runs: the figures are
# what PostgreSQL does with redrive's statements, apart from the member's share of the CPU.
# Each run checks that every claimed task was resolved once, with one history row.
# usage: run.sh [PORT] [ROUNDS]   (host 127.0.0.1, user postgres; needs
# target/release/redrive, for `redrive migrate`). It creates and drops the databases
# `redrive_drain_statements` and `redrive_candidates`.
set -eu
P=${1:-5432}; R=${2:-3}; N=1000000; B=500; H=127.0.0.1; DB=redrive_drain_statements
d=$(cd "$(dirname "$0")" && pwd); root=$d/../..
PSQL="psql -h $H -p $P -U postgres -q -X -v ON_ERROR_STOP=1"
$PSQL -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null 2>&1
pgbench_rate() { # database script -> tasks/s of 80% of the rows claimed and finished
  local t=$(( N * 8 / 10 / (4 * B) )) tps
  tps=$(pgbench -h $H -p $P -U postgres -n -c 4 -j 2 -t "$t" -D batch=$B -D "ids0='{}'" -D "vers0='{}'" \
        -D "ids1='{}'" -D "vers1='{}'" -D batch0=0 -D batch1=0 -f "$2" "$1" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  echo "$tps*$B/1" | bc
}
statements() { # layout -> tasks/s
  $PSQL -d $DB -c 'DROP SCHEMA IF EXISTS ds CASCADE' >/dev/null 2>&1
  REDRIVE__DATABASE__URL="postgres://postgres@$H:$P/$DB" REDRIVE__DATABASE__SCHEMA=ds \
    "$root/target/release/redrive" migrate >/dev/null
  $PSQL -d $DB -v n=$N -f "$d/fill.sql" >/dev/null
  local state=recovery_task
  if [ "$1" = split ]; then $PSQL -d $DB -f "$d/split.schema.sql" >/dev/null; state=task_state; fi
  local rate; rate=$(pgbench_rate $DB "$d/$1.sql")
  local check; check=$($PSQL -d $DB -Atc "SELECT (SELECT count(*) FROM ds.$state WHERE status = 'resolved') || ' ' || (SELECT count(*) FROM ds.recovery_attempt WHERE outcome = 'resolved') || ' ' || (SELECT count(*) FROM ds.$state WHERE status = 'resolved' AND attempts <> 1)")
  set -- $check
  if [ "$1" != "$2" ] || [ "$3" != 0 ] || [ "$1" = 0 ]; then echo "resolved $1, history $2, attempts<>1: $3: FAILED" >&2; exit 1; fi
  echo "$rate"
}
declare -A figures
for round in $(seq 1 "$R"); do
  for c in two-update unindexed-source; do
    rate=$(CANDIDATES=$c "$d/../drain-candidates/run.sh" "$P" $N 1 2>/dev/null | sed -n "s/^round 1 $c ([^)]*): \([0-9]*\) tasks.*/\1/p")
    [ -n "$rate" ] || { echo "$c: no figure" >&2; exit 1; }
    echo "round $round $c: $rate tasks/s"; figures[$c]="${figures[$c]:-} $rate"
  done
  for c in as-stored split; do
    rate=$(statements $c)
    echo "round $round redrive-$c: $rate tasks/s"; figures[redrive-$c]="${figures[redrive-$c]:-} $rate"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(echo "${figures[two-update]}" | median)
for c in two-update unindexed-source redrive-as-stored redrive-split; do
  m=$(echo "${figures[$c]}" | median)
  printf '%-18s median %7d tasks/s  %.2f x two-update\n' "$c" "$m" "$(echo "$m/$base" | bc -l)"
done
$PSQL -c "DROP DATABASE $DB" >/dev/null
