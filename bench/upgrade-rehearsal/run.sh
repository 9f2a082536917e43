#!/bin/bash
# A rolling upgrade, rehearsed: a fleet of the previous release under load is upgraded
# member by member while it works, and every message must end exactly once.
#
#  1. Lock time: a store of LOCK_TASKS (1M) tasks written in the previous release's
#     schema; each migration new since then is applied alone (psql, one transaction,
#     search_path set) while two sessions beside it run a claim-like transaction
#     (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100) back to back and a task INSERT every
#     50 ms. For each migration: how long it took, and the longest either statement
#     took while it ran (at most 1 s, or FAIL).
#  2. The fleet: librdkafka's mock cluster (cluster.py, which also produces the load),
#     a webhook that answers FAIL_SHARE of its calls 503 (webhook.py), 3 members of the
#     previous release with a capture route (`orders.DLT`, Spring dead letters,
#     republished to `orders`) and a process route (`payments`, keyed, ordering = "key",
#     the `billing` webhook). After WARM s a replay of the capture tasks stored so far
#     (the previous release's CLI, detached, paced) to `replay.target`; then the new
#     binary's `migrate` while the old members work; an old member restarted on the
#     migrated schema (with and without migrations on start); then each old member is
#     stopped (SIGTERM) and replaced by a new one, GAP s apart; TAIL s more load; the
#     load stops and the fleet drains (no open task, lag 0, the replay finished).
#  3. Checks (check.py): every dead letter has exactly one task, RESOLVED; every
#     process-mode message succeeded at the webhook exactly once (inline, or by its one
#     task, RESOLVED); no two tasks share source coordinates; each key's messages first
#     succeeded in order; the replay is done and put every selected task on the target
#     topic once (its `redrive-replay` headers); the new binary's `tasks check` passes;
#     no member panicked; every member exited 0 on SIGTERM.
#
# usage: bench/upgrade-rehearsal/run.sh [PREVIOUS_COMMIT] [NEW_BINARY]
#   PREVIOUS_COMMIT  default 78cebd5; built from `git archive` in /tmp/redrive-prev-src
#                    into /tmp/redrive-prev-target (reused when built from that commit)
#   NEW_BINARY       default <repo>/target/release/redrive (waited for up to 20 min)
# Environment knobs (defaults): CAP_RATE=30 PAY_RATE=40 (messages/s) KEYS=100
#   FAIL_SHARE=0.3 WARM=20 GAP=10 TAIL=15 DRAIN=300 (s) LOCK_TASKS=1000000
#   SKIP_LOCKS=1 skips part 1; KEEP=1 keeps the work directory's logs (always kept on
#   failure). PostgreSQL: 127.0.0.1:5432, user postgres (PGHOST/PGPORT/PGUSER).
# It creates and drops its own schemas (upg_fleet_PID, upg_lock_PID).
set -u
PREV=${1:-78cebd5}
d=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$d/../.." && pwd)
NEW=${2:-$repo/target/release/redrive}
CAP_RATE=${CAP_RATE:-30}; PAY_RATE=${PAY_RATE:-40}; KEYS=${KEYS:-100}; FAIL_SHARE=${FAIL_SHARE:-0.3}
WARM=${WARM:-20}; GAP=${GAP:-10}; TAIL=${TAIL:-15}; DRAIN=${DRAIN:-300}; LOCK_TASKS=${LOCK_TASKS:-1000000}
PY=/usr/bin/python3
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
DBURL="postgres://$PGUSER@$PGHOST:$PGPORT/postgres"
PSQL="psql -X -q -At -v ON_ERROR_STOP=1 -d postgres"
SRC=/tmp/redrive-prev-src; TARGET=/tmp/redrive-prev-target; OLD=$TARGET/release/redrive
FLEET=upg_fleet_$$; LOCKS=upg_lock_$$; GROUP=upg-$$
WORK=$(mktemp -d /tmp/upgrade-rehearsal.XXXXXX)

declare -A mpid=()      # member name -> pid (while it runs)
declare -A mexit=()     # member name -> exit status
helpers=()              # pids of the python helpers
failures=()             # what failed
summary=()              # lines of the summary block

log() { echo "[$(date +%T)] $*" | tee -a "$WORK/run.log"; }
fig() { summary+=("$*"); log "$*"; }
failed() { failures+=("$*"); log "FAILED: $*"; }
now() { date +%s.%N; }
secs() { echo "scale=2; ($2 - $1) / 1" | bc; }
ms() { echo "($2 - $1) * 1000 / 1" | bc; }

print_summary() {
  echo
  echo "==================== upgrade rehearsal: $PREV -> $NEW ===================="
  local line; for line in "${summary[@]}"; do echo "  $line"; done
  if [ ${#failures[@]} -eq 0 ]; then
    echo "  RESULT: PASS"
  else
    echo "  RESULT: FAIL (${#failures[@]})"
    for line in "${failures[@]}"; do echo "    - $line"; done
  fi
  echo "  logs: $WORK"
  echo "=========================================================================="
}

# Fatal: say what was seen, summarise, and leave (the trap cleans up).
die() { failed "$*"; exit 1; }

stopped=""
stop_pid() { # PID BOUND_SECONDS: SIGTERM, then SIGKILL after the bound; sets $stopped to the exit status
  local pid=$1 bound=$2 t=0
  kill -TERM "$pid" 2>/dev/null
  while kill -0 "$pid" 2>/dev/null && [ "$t" -lt $((bound * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; stopped="killed after ${bound}s"; return; fi
  wait "$pid" 2>/dev/null; stopped=$?
}

cleanup() {
  local status=$? name pid
  trap - EXIT INT TERM
  for name in "${!mpid[@]}"; do
    stop_pid "${mpid[$name]}" 30; log "cleanup: stopped member $name (pid ${mpid[$name]}): exit $stopped"
  done
  for pid in "${helpers[@]}"; do stop_pid "$pid" 10; done
  $PSQL -c "DROP SCHEMA IF EXISTS $FLEET CASCADE" -c "DROP SCHEMA IF EXISTS $LOCKS CASCADE" >/dev/null 2>&1 \
    || echo "could not drop schemas $FLEET, $LOCKS" >&2
  [ $status -ne 0 ] && [ ${#failures[@]} -eq 0 ] && failures+=("stopped with status $status")
  print_summary | tee -a "$WORK/run.log"
  if [ ${#failures[@]} -eq 0 ] && [ -z "${KEEP:-}" ]; then
    rm -rf "$WORK"; echo "(work directory removed; KEEP=1 keeps it)"
  fi
  [ ${#failures[@]} -eq 0 ] && exit 0 || exit 1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for DESCRIPTION BOUND_SECONDS COMMAND...: polls COMMAND once a second.
wait_for() {
  local what=$1 bound=$2 t0; shift 2; t0=$(date +%s)
  until "$@" >"$WORK/wait.out" 2>&1; do
    [ $(( $(date +%s) - t0 )) -ge "$bound" ] && die "$what: not within ${bound}s; last look: $(tail -c 600 "$WORK/wait.out")"
    sleep 1
  done
}

# ---------------------------------------------------------------- the two binaries
full=$(git -C "$repo" rev-parse --verify --quiet "$PREV^{commit}") || die "no commit $PREV in $repo"
log "previous release $PREV = $full; work directory $WORK"
if [ "$(cat "$SRC/.rehearsal-commit" 2>/dev/null)" != "$full" ]; then
  rm -rf "$SRC" && mkdir -p "$SRC" && git -C "$repo" archive "$full" | tar -x -C "$SRC" \
    && echo "$full" >"$SRC/.rehearsal-commit" || die "could not extract $full into $SRC"
fi
if [ "$(cat "$TARGET/.rehearsal-built" 2>/dev/null)" != "$full" ] || [ ! -x "$OLD" ]; then
  log "building $PREV (flock /tmp/cargo.lock cargo build --release; log $WORK/build-old.log)"
  flock /tmp/cargo.lock cargo build --release --manifest-path "$SRC/Cargo.toml" --target-dir "$TARGET" \
    >"$WORK/build-old.log" 2>&1 || die "building $PREV failed: $(tail -5 "$WORK/build-old.log")"
  echo "$full" >"$TARGET/.rehearsal-built"
fi
t0=$(date +%s)
until [ -x "$NEW" ]; do
  [ $(( $(date +%s) - t0 )) -ge 1200 ] && die "the new binary $NEW did not appear within 20 minutes"
  log "waiting for $NEW"; sleep 30
done
fig "old: $OLD ($PREV); new: $NEW (built $(date -u -r "$NEW" +%FT%TZ), copied for the run)"
cp "$NEW" "$WORK/redrive-new" || die "could not copy $NEW"
NEW=$WORK/redrive-new   # a rebuild of the original during the run changes nothing here

# ---------------------------------------------------------------- 1. lock time
# Migrations the new tree has and the previous commit has not (committed or not).
new_migrations=$(comm -13 <(git -C "$repo" ls-tree --name-only "$full" migrations/ | xargs -rn1 basename | sort) \
                          <(ls "$repo/migrations" | grep '\.sql$' | sort))
fig "migrations new since $PREV: $(echo $new_migrations)"
if [ -n "${SKIP_LOCKS:-}" ]; then
  fig "lock time: skipped (SKIP_LOCKS)"
elif [ -z "$new_migrations" ]; then
  fig "lock time: no new migration"
else
  log "lock time: $LOCK_TASKS tasks in the schema of $PREV ($LOCKS)"
  REDRIVE__DATABASE__URL=$DBURL REDRIVE__DATABASE__SCHEMA=$LOCKS "$OLD" migrate >"$WORK/lock-migrate-old.log" 2>&1 \
    || die "$PREV's migrate of $LOCKS failed: $(tail -3 "$WORK/lock-migrate-old.log")"
  t1=$(now)
  $PSQL -v n="$LOCK_TASKS" -v schema="$LOCKS" -f "$d/fill.sql" >"$WORK/fill.log" 2>&1 || die "filling $LOCKS failed: $(tail -3 "$WORK/fill.log")"
  fig "lock time: $LOCK_TASKS tasks stored in $(secs "$t1" "$(now)") s ($($PSQL -c "SELECT pg_size_pretty(pg_total_relation_size('$LOCKS.recovery_task'))"), 10% failed)"
  $PY "$d/probe.py" "$LOCKS" "$WORK/probe.txt" 2>"$WORK/probe.log" & helpers+=($!); probe=$!
  sleep 7
  kill -0 $probe 2>/dev/null || die "the lock probe stopped: $(tail -3 "$WORK/probe.log")"
  read -r bc bi nc ni <<<"$($PY "$d/probe.py" max "$WORK/probe.txt" "$(echo "$(now) - 5" | bc)" "$(now)")"
  fig "lock time: probe alone, 5 s: claim max ${bc} ms ($nc runs), insert max ${bi} ms ($ni runs)"
  for m in $new_migrations; do
    file=$repo/migrations/$m
    if head -1 "$file" | grep -q 'no-transaction'; then begin=""; commit=""; set_path="SET search_path = $LOCKS;"
    else begin="BEGIN;"; commit="COMMIT;"; set_path="SET LOCAL search_path = $LOCKS;"; fi
    a=$(now)
    { echo "$begin"; echo "$set_path"; echo '\timing on'; cat "$file"; echo; echo "$commit"; } \
      | psql -X -v ON_ERROR_STOP=1 -d postgres >"$WORK/lock-$m.log" 2>&1 || die "applying $m failed: $(tail -3 "$WORK/lock-$m.log")"
    b=$(now)
    stmt=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$WORK/lock-$m.log" | paste -sd+ | bc)
    sleep 2   # statements blocked by it finish and are recorded
    read -r wc wi nc ni <<<"$($PY "$d/probe.py" max "$WORK/probe.txt" "$a" "$b")"
    fig "lock time: $m: $(ms "$a" "$b") ms (statements ${stmt:-0} ms); beside it claim max ${wc} ms ($nc runs), insert max ${wi} ms ($ni runs)"
    [ "$wc" -le 1000 ] && [ "$wi" -le 1000 ] || failed "$m held claims or ingest for more than 1 s (claim ${wc} ms, insert ${wi} ms)"
  done
  stop_pid $probe 10
  $PSQL -c "DROP SCHEMA $LOCKS CASCADE" >/dev/null
fi

# ---------------------------------------------------------------- 2. the fleet
$PY "$d/webhook.py" "$WORK" "$FAIL_SHARE" 11 >"$WORK/webhook.log" 2>&1 & helpers+=($!)
$PY "$d/cluster.py" "$WORK" "$CAP_RATE" "$PAY_RATE" "$KEYS" >"$WORK/cluster.log" 2>&1 & helpers+=($!); cluster=$!
wait_for "the webhook listens" 15 test -s "$WORK/webhook.port"
wait_for "the mock cluster listens" 30 test -s "$WORK/bootstrap"
BOOT=$(cat "$WORK/bootstrap"); HOOK=$(cat "$WORK/webhook.port")
load_t0=$(now)
log "mock cluster at $BOOT (load: $CAP_RATE dead letters/s, $PAY_RATE payments/s over $KEYS keys); webhook at :$HOOK failing $FAIL_SHARE"

cat >"$WORK/fleet.toml" <<EOF
[database]
url = "$DBURL"
schema = "$FLEET"
max_connections = 8

[worker]
concurrency = 32
batch_size = 50
lease = "10s"
heartbeat = "3s"
poll_interval = "200ms"
shutdown_timeout = "10s"

[retry]
max_attempts = 40
backoff_base = "100ms"
backoff_cap = "1s"

[kafka]
bootstrap_servers = "$BOOT"
group_id = "$GROUP"

[log]
format = "json"
level = "info"

[[routes]]
name = "orders"
topics = ["orders.DLT"]
mode = "capture"
handler = "republish"

[[routes]]
name = "payments"
topics = ["payments"]
mode = "process"
handler = "billing"
ordering = "key"

[webhooks.billing]
url = "http://127.0.0.1:$HOOK/payments"
body = "raw"
timeout = "5s"
EOF
OLDC=("$OLD" --config "$WORK/fleet.toml"); NEWC=("$NEW" --config "$WORK/fleet.toml")
"${OLDC[@]}" migrate >"$WORK/migrate-old.log" 2>&1 || die "$PREV's migrate failed: $(tail -3 "$WORK/migrate-old.log")"

start_member() { # NAME BINARY [run options]
  local name=$1 bin=$2; shift 2
  "$bin" --config "$WORK/fleet.toml" run "$@" >"$WORK/member-$name.log" 2>&1 &
  mpid[$name]=$!
  log "started $name (pid $!): $(basename "$(dirname "$(dirname "$bin")")")/$(basename "$bin") run $*"
}
started() { # NAME: the worker pool and ingest both started
  local name=$1
  if ! kill -0 "${mpid[$name]}" 2>/dev/null; then
    wait "${mpid[$name]}"; mexit[$name]=$?; unset "mpid[$name]"
    echo "$name exited with ${mexit[$name]}: $(tail -5 "$WORK/member-$name.log")"; return 2
  fi
  grep -q 'worker pool started' "$WORK/member-$name.log" && grep -q 'ingest started' "$WORK/member-$name.log"
}
wait_started() { # NAME BOUND
  local t0; t0=$(date +%s)
  while true; do
    started "$1" >"$WORK/wait.out" 2>&1; case $? in 0) return 0 ;; 2) die "$(cat "$WORK/wait.out")" ;; esac
    [ $(( $(date +%s) - t0 )) -ge "$2" ] && die "$1 did not start within $2 s: $(tail -5 "$WORK/member-$1.log")"
    sleep 0.5
  done
}
stop_member() { # NAME BOUND
  local name=$1 t0; t0=$(now)
  stop_pid "${mpid[$name]}" "$2"; mexit[$name]=$stopped; unset "mpid[$name]"
  log "stopped $name in $(secs "$t0" "$(now)") s: exit ${mexit[$name]}"
  [ "${mexit[$name]}" = 0 ] || failed "$name exited ${mexit[$name]} on SIGTERM (bound $2 s): $(grep -E '"level":"ERROR"|panicked' "$WORK/member-$name.log" | tail -3 | cut -c1-300)"
}
alive() { local name; for name in "$@"; do kill -0 "${mpid[$name]}" 2>/dev/null || die "$name died: $(tail -5 "$WORK/member-$name.log")"; done; }
q() { $PSQL -c "SET search_path = $FLEET" -c "$1"; }

for i in 1 2 3; do start_member old-$i "$OLD"; done
for i in 1 2 3; do wait_started old-$i 60; done
sleep "$WARM"; alive old-1 old-2 old-3
log "after ${WARM} s: $(q "SELECT count(*) || ' tasks, ' || count(*) FILTER (WHERE status = 'failed') || ' open' FROM recovery_task")"

# The replay: every capture task stored so far, paced to outlast the member replacements.
cutoff=$(q "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
selected=$(q "SELECT count(*) FROM recovery_task WHERE route = 'orders' AND created_at < '$cutoff'")
span=$(( 3 * (GAP + 10) + 40 ))
rate=$(echo "scale=1; r = $selected / $span; if (r < 1) r = 1; r" | bc)
"${OLDC[@]}" tasks replay --route orders --created-before "$cutoff" --to replay.target --rate "$rate" \
  --detach --yes --reason "upgrade rehearsal" >"$WORK/replay-start.log" 2>&1 \
  || die "$PREV's tasks replay failed: $(tail -3 "$WORK/replay-start.log")"
job=$(q "SELECT max(id) FROM recovery_replay")
fig "replay: job $job started by $PREV's CLI (detached): $selected capture tasks created before $cutoff, at $rate/s to replay.target"
sleep 5; alive old-1 old-2 old-3

# The new release's migrations while the old members work.
a=$(now); migrated_at=$(q "SELECT now()"); migrated_utc=$(date -u +%FT%T)
"${NEWC[@]}" migrate >"$WORK/migrate-new.log" 2>&1; st=$?
fig "new migrate beside 3 old members: exit $st in $(ms "$a" "$(now)") ms: $(tr '\n' ' ' <"$WORK/migrate-new.log" | cut -c1-200)"
[ $st = 0 ] || die "the new binary's migrate failed"
sleep 3; alive old-1 old-2 old-3

# An old member restarted on the migrated schema, as in a crash mid-rollout: with
# migrations on start (the default), then with --no-migrate. It is not part of the
# verdict (the previous release's behaviour is what it is); the summary says it.
start_member old-restart "$OLD"
t0=$(date +%s); outcome=""
while [ -z "$outcome" ]; do
  started old-restart >"$WORK/wait.out" 2>&1; case $? in
    0) outcome="started"; stop_member old-restart 30 ;;
    2) outcome="exit ${mexit[old-restart]}: $(grep -m1 -iE 'error' "$WORK/member-old-restart.log" | cut -c1-220)" ;;
  esac
  [ -z "$outcome" ] && [ $(( $(date +%s) - t0 )) -ge 30 ] && { outcome="neither started nor exited in 30 s"; stop_member old-restart 30; }
  sleep 0.5
done
fig "old member restarted on the migrated schema, migrations on start: $outcome"
start_member old-restart-nomigrate "$OLD" --no-migrate
t0=$(date +%s); outcome=""
while [ -z "$outcome" ]; do
  started old-restart-nomigrate >"$WORK/wait.out" 2>&1; case $? in
    0) outcome="started, worked 5 s"; sleep 5; stop_member old-restart-nomigrate 30; outcome="$outcome, exit ${mexit[old-restart-nomigrate]} on SIGTERM" ;;
    2) outcome="exit ${mexit[old-restart-nomigrate]}: $(grep -m1 -iE 'error' "$WORK/member-old-restart-nomigrate.log" | cut -c1-220)"
       failed "an old member with --no-migrate cannot start on the migrated schema" ;;
  esac
  [ -z "$outcome" ] && [ $(( $(date +%s) - t0 )) -ge 30 ] && { outcome="neither started nor exited in 30 s"; failed "old member --no-migrate: $outcome"; stop_member old-restart-nomigrate 30; }
  sleep 0.5
done
fig "old member restarted on the migrated schema, --no-migrate: $outcome"

# Member by member.
for i in 1 2 3; do
  alive old-$i
  stop_member old-$i 30
  start_member new-$i "$NEW"
  wait_started new-$i 60
  sleep "$GAP"
done
worker_of() { sed -n 's/.*"message":"worker pool started","worker":"\([^"]*\)".*/\1/p' "$WORK/member-$1.log" | head -1; }
old_attempts=$(q "SELECT count(*) FROM recovery_attempt WHERE started_at >= '$migrated_at' AND worker IN ('$(worker_of old-1)', '$(worker_of old-2)', '$(worker_of old-3)')")
after_migrate() { # PATTERN: lines of old-1..3 logged after the migration that match it
  cat "$WORK"/member-old-[123].log | awk -v t="$migrated_utc" 'substr($0, 15, 19) >= t' | grep -c "$1"; }
fig "old members after the migration: $old_attempts attempts finished, $(after_migrate '"level":"ERROR"') errors logged ($(after_migrate '"level":"ERROR".*cached plan must not change result type') of them 'cached plan must not change result type'), $(after_migrate 'could not tell redelivered') process-mode batches stored without running inline"
[ "$old_attempts" -gt 0 ] || failed "the old members finished no attempt after the migration"
fig "members replaced: 3 (old-1..3 -> new-1..3, $GAP s apart); exits on SIGTERM: ${mexit[old-1]} ${mexit[old-2]} ${mexit[old-3]}"
sleep "$TAIL"; alive new-1 new-2 new-3
touch "$WORK/stop-load"
wait_for "the load stops and every message is acknowledged" 90 test -s "$WORK/load-done"
load=$(cat "$WORK/load-done")
fig "load: $load over $(secs "$load_t0" "$(now)") s"
[ "$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['errors'])" "$WORK/load-done")" = 0 ] || failed "the load had delivery errors"
cap=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['cap'])" "$WORK/load-done")

# Drained: no open task, every dead letter stored, lag 0, the replay over.
drained() {
  local open stored lag job_status
  alive new-1 new-2 new-3
  open=$(q "SELECT count(*) FROM recovery_task WHERE status = 'failed'")
  stored=$(q "SELECT count(*) FROM recovery_task WHERE route = 'orders'")
  lag=$($PY "$d/kafka_tool.py" lag "$BOOT" "$GROUP" orders.DLT payments | $PY -c "import json,sys; print(json.load(sys.stdin)['lag'])")
  job_status=$(q "SELECT status || ' ' || produced || '/' || coalesce(total::text, '?') FROM recovery_replay WHERE id = $job")
  echo "open tasks $open, dead letters stored $stored of $cap, lag $lag, replay $job_status"
  [ "$open" = 0 ] && [ "$stored" -ge "$cap" ] && [ "$lag" = 0 ] && [[ "$job_status" != running* && "$job_status" != pending* ]]
}
a=$(now); t0=$(date +%s)
until drained >"$WORK/drain.out" 2>&1; do
  [ $(( $(date +%s) - t0 )) -ge "$DRAIN" ] && die "not drained within $DRAIN s: $(cat "$WORK/drain.out")"
  [ $(( ($(date +%s) - t0) % 15 )) -lt 2 ] && log "draining: $(cat "$WORK/drain.out")"
  sleep 2
done
fig "drained in $(secs "$a" "$(now)") s after the load stopped: $(cat "$WORK/drain.out")"
for i in 1 2 3; do stop_member new-$i 30; done

# ---------------------------------------------------------------- 3. checks
"${NEWC[@]}" tasks check >"$WORK/tasks-check.log" 2>&1; st=$?
fig "new tasks check: exit $st: $(tr '\n' ' ' <"$WORK/tasks-check.log" | cut -c1-200)"
[ $st = 0 ] || failed "tasks check exited $st: $(head -5 "$WORK/tasks-check.log")"
$PY "$d/kafka_tool.py" read "$BOOT" replay.target >"$WORK/replay-target.jsonl" 2>"$WORK/replay-read.log" \
  || failed "reading replay.target failed: $(tail -3 "$WORK/replay-read.log")"
runners=$(grep -l "running a replay job" "$WORK"/member-*.log | sed 's/.*member-\(.*\)\.log/\1/' | paste -sd, -)
fig "replay job $job was run by: $runners ($(q "SELECT status || ', produced ' || produced || ', skipped ' || skipped || ', total ' || coalesce(total::text, '?') FROM recovery_replay WHERE id = $job"))"
[[ "$runners" == *new-* ]] || failed "no new member ran the replay job (runners: $runners): it finished before the upgrade; raise WARM or lower the rate"
$PY "$d/check.py" "$WORK" "$FLEET" "$job" "$cutoff" >"$WORK/check.out" 2>&1; st=$?
sed 's/^/  /' "$WORK/check.out" | tee -a "$WORK/run.log"
fig "$(grep '^figures' "$WORK/check.out" | cut -c9-)"
[ $st = 0 ] || failed "message checks: $(grep -c '^FAILED' "$WORK/check.out") failed (see above)"
for f in "$WORK"/member-*.log; do
  n=$(basename "$f" .log); n=${n#member-}
  grep -q 'panicked' "$f" && failed "$n panicked: $(grep -m1 panicked "$f")"
  e=$(grep -c '"level":"ERROR"' "$f"); w=$(grep -c '"level":"WARN"' "$f")
  [ "$e$w" != 00 ] && log "$n logged $e errors, $w warnings; by message: $(grep -E '"level":"(ERROR|WARN)"' "$f" \
    | sed 's/.*"level":"\([A-Z]*\)","message":"\([^"]\{0,90\}\).*/\1 \2/' | sort | uniq -c | sort -rn | head -6 | tr -s ' ' | tr '\n' '|')"
  # A deadlock PostgreSQL broke is retried by the member (it is counted in the summary);
  # any other error fails the rehearsal.
  e=$(grep '"level":"ERROR"' "$f" | grep -vc 'deadlock detected')
  [ "$e" = 0 ] || failed "$n logged $e errors, the first: $(grep '"level":"ERROR"' "$f" | grep -v 'deadlock detected' | head -1 | cut -c1-400)"
done
fig "deadlocks PostgreSQL broke (statement retried by its member): $(cat "$WORK"/member-*.log | grep '"level":"ERROR"' | grep 'deadlock detected' | sed 's/.*"operation":"\([a-z_]*\)".*/\1/' | sort | uniq -c | tr -s ' ' | paste -sd, -)"
fig "member logs: $(for f in "$WORK"/member-*.log; do n=$(basename "$f" .log); printf '%s %s errors/%s warnings; ' "${n#member-}" "$(grep -c '"level":"ERROR"' "$f")" "$(grep -c '"level":"WARN"' "$f")"; done)"
