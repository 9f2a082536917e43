#!/usr/bin/python3
"""The downstream of the rehearsal's process-mode route: answers a share of calls 503
(a transient failure redrive retries) and 200 to the rest, and records every call.

usage: webhook.py WORKDIR FAIL_SHARE SEED
Writes WORKDIR/webhook.port once listening and one JSON line per call to
WORKDIR/webhook.jsonl: {"t", "status", "body", "attempt", "task"} (body: the message
value, sent raw)."""
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

work, share, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
lock = threading.Lock()
log = open(os.path.join(work, "webhook.jsonl"), "a", buffering=1)


class Hook(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with lock:
            status = 503 if rng.random() < share else 200
            # Recorded before the answer leaves: a 2xx the client never read is still
            # a call the downstream applied.
            log.write(json.dumps({
                "t": time.time(), "status": status,
                "body": body.decode("utf-8", "replace"),
                "attempt": self.headers.get("X-Redrive-Attempt"),
                "task": self.headers.get("X-Redrive-Task-Id"),
            }) + "\n")
        out = b"ok" if status == 200 else b"unavailable"
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
server.daemon_threads = True
with open(os.path.join(work, "webhook.port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(work, "webhook.port.tmp"), os.path.join(work, "webhook.port"))
server.serve_forever()
