#!/usr/bin/env python3
"""Writes a pgbench script of redrive's storing statement (src/store/enqueue.rs, INSERT)
with its 33 arrays built on the server: batch rows of 512-byte values with a key, as
`redrive bench ingest` stores them. With --no-keys every dedup key is NULL (no row in
recovery_task_dedup)."""
import re
import sys

source = open(sys.argv[1]).read()
statement = re.search(r'const INSERT: &str = r#"(.*?)"#;', source, re.S).group(1)
no_keys = "--no-keys" in sys.argv
fill = lambda v: f"array_fill({v}, ARRAY[:batch])"
arrays = {
    1: fill("NULL::text") if no_keys else
       "(SELECT array_agg('kafka:t:' || :base::text || ':' || g) FROM generate_series(1, :batch) g)",
    2: fill("'log'::text"), 3: fill("NULL::text"), 4: fill("NULL::text"),
    5: fill("'bench.dlt'::text"), 6: fill("0"),
    7: "(SELECT array_agg(:base::bigint * 1000 + g) FROM generate_series(1, :batch) g)",
    8: fill("now()"), 9: fill("'create_time'::text"),
    10: "(SELECT array_agg(convert_to(g::text, 'UTF8')) FROM generate_series(1, :batch) g)",
    11: fill("decode(repeat('76', 512), 'hex')"), 12: fill("''::bytea"),
    13: fill("NULL::text"), 14: fill("NULL::text"), 15: fill("0"), 16: fill("NULL::int"),
    17: fill("NULL::timestamptz"), 18: fill("NULL::text"), 19: fill("NULL::int"),
    20: fill("NULL::bigint"), 21: fill("NULL::text"), 22: fill("'bench.dlt'::text"),
    23: fill("NULL::text"), 24: fill("512"), 25: fill("true"), 26: fill("'failed'::text"),
    27: fill("NULL::bytea"), 28: fill("1"), 29: fill("NULL::bigint"), 30: fill("NULL::text"),
    31: fill("NULL::text"), 32: fill("NULL::bigint"), 33: fill("NULL::jsonb"),
}
used = {int(n) for n in re.findall(r"\$(\d+)::[a-z]+\[\]", statement)}
if used != set(arrays):
    sys.exit(f"the statement's arrays changed ({sorted(used)}): update {sys.argv[0]}")
body = re.sub(r"\$(\d+)::[a-z]+\[\]", lambda m: arrays[int(m.group(1))], statement)
body = " ".join(re.sub(r"--[^\n]*\n", "\n", body).split())
print("\\set base random(1, 1000000000)")
print(body + ";")
