#!/usr/bin/python3
"""What a migration's locks cost the fleet: two sessions beside it, timing each
statement until SIGTERM.

usage: probe.py SCHEMA OUTFILE   (PostgreSQL from PGHOST/PGPORT/PGUSER)
- claim: a claim-like transaction every 20 ms: BEGIN; SELECT id FROM recovery_task
  WHERE status = 'failed' ORDER BY next_attempt_at LIMIT 100 FOR UPDATE SKIP LOCKED;
  COMMIT (the worker pool's lock on the task table).
- insert: an INSERT of one task every 50 ms (ingest's lock on the task table).
Each session is one psql process fed through a pipe; a statement's time is from its
write to psql's echo of a marker after it. OUTFILE gets "kind start_epoch seconds" per
statement.

       probe.py max OUTFILE FROM TO   prints the longest statement of each kind that
                                      started or was running between FROM and TO (epochs)
"""
import signal
import subprocess
import sys
import threading
import time

if sys.argv[1] == "max":
    lo, hi = float(sys.argv[3]), float(sys.argv[4])
    worst = {"claim": 0.0, "insert": 0.0}
    count = {"claim": 0, "insert": 0}
    for line in open(sys.argv[2]):
        kind, start, secs = line.split()
        start, secs = float(start), float(secs)
        if start <= hi and start + secs >= lo:
            worst[kind] = max(worst[kind], secs)
            count[kind] += 1
    print(f"{worst['claim'] * 1000:.0f} {worst['insert'] * 1000:.0f} {count['claim']} {count['insert']}")
    sys.exit(0)

schema, outfile = sys.argv[1], sys.argv[2]
out = open(outfile, "a", buffering=1)
out_lock = threading.Lock()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())

CLAIM = ("BEGIN; SELECT count(*) FROM (SELECT id FROM recovery_task WHERE status = 'failed' "
         "ORDER BY next_attempt_at LIMIT 100 FOR UPDATE SKIP LOCKED) s; COMMIT;")
INSERT = ("INSERT INTO recovery_task (handler, status, finished_at, msg_value) "
          "VALUES ('probe', 'resolved', now(), '\\x7b7d');")


def session(kind, sql, every):
    psql = subprocess.Popen(
        ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", "postgres"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    psql.stdin.write(f"SET search_path = {schema};\n")
    n = 0
    while not stop.is_set():
        n += 1
        t0 = time.time()
        psql.stdin.write(f"{sql}\n\\echo __done {n}\n")
        psql.stdin.flush()
        while True:
            line = psql.stdout.readline()
            if not line:
                sys.exit(f"{kind}: psql ended")
            if line.strip() == f"__done {n}":
                break
        secs = time.time() - t0
        with out_lock:
            out.write(f"{kind} {t0:.6f} {secs:.6f}\n")
        if every:
            stop.wait(max(0.0, every - secs))
    psql.stdin.close()
    psql.wait(10)


threads = [threading.Thread(target=session, args=("claim", CLAIM, 0.02)),
           threading.Thread(target=session, args=("insert", INSERT, 0.05))]
for t in threads:
    t.start()
for t in threads:
    t.join()
