#!/usr/bin/python3
"""Looks at the rehearsal's mock cluster without joining any group.

usage: kafka_tool.py lag BOOTSTRAP GROUP TOPIC...   prints {"lag": N, "partitions": {...}}
                                                    (end offset less the group's commit)
       kafka_tool.py read BOOTSTRAP TOPIC           prints one JSON line per record:
                                                    partition, offset, headers, value
"""
import json
import sys

from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING


def partitions(consumer, topic):
    md = consumer.list_topics(topic, timeout=10)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        sys.exit(f"topic {topic}: {t.error if t else 'missing'}")
    return sorted(t.partitions)


def lag(bootstrap, group, topics):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    total, parts = 0, {}
    for topic in topics:
        tps = [TopicPartition(topic, p) for p in partitions(c, topic)]
        for tp in c.committed(tps, timeout=10):
            low, high = c.get_watermark_offsets(tp, timeout=10)
            done = tp.offset if tp.offset >= 0 else low
            parts[f"{topic}[{tp.partition}]"] = {"end": high, "committed": tp.offset}
            total += max(0, high - done)
    c.close()
    print(json.dumps({"lag": total, "partitions": parts}))


def read(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rehearsal-reader",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    want = {}
    tps = []
    for p in partitions(c, topic):
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > low:
            want[p] = high
            tps.append(TopicPartition(topic, p, OFFSET_BEGINNING))
    c.assign(tps)
    pos = {p: -1 for p in want}
    idle = 0
    while any(pos[p] + 1 < want[p] for p in want):
        m = c.poll(1.0)
        if m is None:
            idle += 1
            if idle > 30:
                sys.exit(f"reading {topic}: stuck at {pos}, ends {want}")
            continue
        if m.error():
            continue
        idle = 0
        pos[m.partition()] = m.offset()
        headers = {}
        for k, v in m.headers() or []:
            headers.setdefault(k, []).append(v.decode("utf-8", "replace") if v is not None else None)
        print(json.dumps({"partition": m.partition(), "offset": m.offset(), "headers": headers,
                          "value": (m.value() or b"").decode("utf-8", "replace")}))
    c.close()


if sys.argv[1] == "lag":
    lag(sys.argv[2], sys.argv[3], sys.argv[4:])
elif sys.argv[1] == "read":
    read(sys.argv[2], sys.argv[3])
else:
    sys.exit(__doc__)
