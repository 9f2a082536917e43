#!/usr/bin/python3
"""The rehearsal's Kafka: librdkafka's mock cluster (one broker), kept alive by this
process, which also produces the load.

usage: cluster.py WORKDIR CAPTURE_RATE PROCESS_RATE KEYS

- WORKDIR/bootstrap: the broker's address, once it listens.
- Topics are auto-created (4 partitions each) by producing: `orders` and
  `replay.target` get one seed record ("seed", no headers) before anything else.
- Load, until WORKDIR/stop-load exists: CAPTURE_RATE dead letters a second to
  `orders.DLT` with Spring's headers (kafka_dlt-original-topic "orders", partition and
  offset as 4- and 8-byte big-endian numbers, exception class, message, stack trace),
  and PROCESS_RATE messages a second to `payments`, keyed by one of KEYS customer keys,
  each value {"id", "key", "seq"} with seq counting up per key.
- WORKDIR/produced.jsonl: one line per acknowledged message: kind (cap|pay), id, key,
  seq, partition, offset. Delivery errors are counted.
- WORKDIR/load-done: {"cap": N, "pay": M, "errors": E}, written once the load stopped
  and every message was acknowledged. The process then keeps the broker up until
  SIGTERM.
"""
import json
import logging
import os
import random
import re
import signal
import struct
import sys
import time

import confluent_kafka

work = sys.argv[1]
cap_rate, pay_rate, keys = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
found = []


class Catch(logging.Handler):
    def emit(self, record):
        m = re.search(r"replaced with (\S+)", record.getMessage())
        if m:
            found.append(m.group(1).rstrip(".,"))


logger = logging.getLogger("mock")
logger.addHandler(Catch())
logger.setLevel(logging.DEBUG)
producer = confluent_kafka.Producer({
    "bootstrap.servers": "unused:9092",
    "test.mock.num.brokers": 1,
    "debug": "conf",
    "acks": "all",
    "linger.ms": 5,
}, logger=logger)
deadline = time.time() + 20
while not found and time.time() < deadline:
    producer.poll(0.1)
if not found:
    sys.exit("the mock cluster's address never appeared in librdkafka's log")
bootstrap = found[0]

stopping = False


def on_term(*_):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)

errors = 0
counts = {"cap": 0, "pay": 0}
out = open(os.path.join(work, "produced.jsonl"), "a", buffering=1)


def delivered(meta):
    def report(err, msg):
        global errors
        if err is not None:
            errors += 1
            print(f"delivery failed: {meta}: {err}", file=sys.stderr, flush=True)
            return
        if meta is None:
            return
        meta.update(partition=msg.partition(), offset=msg.offset())
        out.write(json.dumps(meta) + "\n")
        counts[meta["kind"]] += 1
    return report


for topic in ("orders", "replay.target"):
    producer.produce(topic, b"seed", on_delivery=delivered(None))
if producer.flush(30) != 0:
    sys.exit("the seed records were not acknowledged")
with open(os.path.join(work, "bootstrap.tmp"), "w") as f:
    f.write(bootstrap)
os.rename(os.path.join(work, "bootstrap.tmp"), os.path.join(work, "bootstrap"))
print(f"mock cluster at {bootstrap}", flush=True)

rng = random.Random(7)
seq = {}
cap_n = pay_n = 0
stack = ("java.lang.IllegalStateException: rehearsal\n"
         "\tat com.example.Orders.handle(Orders.java:42)\n").encode()
t0 = time.time()
stop_file = os.path.join(work, "stop-load")
while not stopping and not os.path.exists(stop_file):
    elapsed = time.time() - t0
    while cap_n < elapsed * cap_rate:
        cap_n += 1
        ident = f"c{cap_n:06d}"
        producer.produce(
            "orders.DLT",
            key=f"order-{cap_n % 97}".encode(),
            value=json.dumps({"id": ident, "kind": "cap"}).encode(),
            headers=[
                ("kafka_dlt-original-topic", b"orders"),
                ("kafka_dlt-original-partition", struct.pack(">i", cap_n % 4)),
                ("kafka_dlt-original-offset", struct.pack(">q", 100000 + cap_n)),
                ("kafka_dlt-exception-fqcn", b"java.lang.IllegalStateException"),
                ("kafka_dlt-exception-message", f"order {ident} failed".encode()),
                ("kafka_dlt-exception-stacktrace", stack),
            ],
            on_delivery=delivered({"kind": "cap", "id": ident}))
    while pay_n < elapsed * pay_rate:
        pay_n += 1
        key = f"cust-{rng.randrange(keys):03d}"
        seq[key] = seq.get(key, 0) + 1
        ident = f"p{pay_n:06d}"
        producer.produce(
            "payments", key=key.encode(),
            value=json.dumps({"id": ident, "key": key, "seq": seq[key]}).encode(),
            on_delivery=delivered({"kind": "pay", "id": ident, "key": key, "seq": seq[key]}))
    producer.poll(0.05)

left = producer.flush(60)
with open(os.path.join(work, "load-done.tmp"), "w") as f:
    json.dump({"cap": counts["cap"], "pay": counts["pay"], "errors": errors + left,
               "sent_cap": cap_n, "sent_pay": pay_n}, f)
os.rename(os.path.join(work, "load-done.tmp"), os.path.join(work, "load-done"))
print(f"load stopped: {counts} acknowledged, {errors + left} not", flush=True)
while not stopping:
    producer.poll(0.5)
