"""PostgresSink throughput against the FileSink parquet baseline, side by side in one run.

A generated stream of ``--rows`` rows ``(id, key, value, t)`` (parallelism 2, unthrottled)
goes to one sink per mode:

* ``file-parquet``: ``FileSink(format="parquet")``, exactly-once (the baseline);
* ``postgres``: ``PostgresSink``, exactly-once (COPY per epoch, PREPARE, COMMIT PREPARED);
* ``postgres-at-least-once``: the same, committed at every barrier;
* ``postgres-upsert``: exactly-once with ``upsert_key="key"``; each key is written twice
  (``key = id // 2``), so half the rows update a row of the same epoch.

Checkpoints every ``--interval`` s. ``t`` is stamped by a map chained right before the sink,
so the steady rate = rows / (last − first ``t``) measures every sink the same way. Each run's
output is read back (psycopg / pyarrow) and must hold every row once (upsert: one row per
key). Modes are interleaved across repetitions; the server is a throw-away PostgreSQL 15 on
this machine (tests/postgres_server.py, default settings but ``max_prepared_transactions``).

    python benchmarks/postgres.py [--rows 400000] [--repetitions 3] [--runtime local|spark] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import harness  # noqa: E402
from postgres_server import start_server  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink, PostgresSink, read_committed  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "postgres.json"
MODES = ["file-parquet", "postgres", "postgres-at-least-once", "postgres-upsert"]


def rows(split: int, offset: int):
    i = offset
    while True:
        n = split * 1_000_000_000 + i
        yield {"id": n, "key": n // 2, "value": f"v{n % 997}"}
        i += 1


def stamp(row: dict) -> dict:
    row["t"] = time.time()
    return row


def run(mode: str, args, server, spark) -> dict:
    per_split = args.rows // 2
    flow = ep.Dataflow(f"pg-bench-{uuid.uuid4().hex[:6]}", parallelism=2)
    # keyed by the upsert key: each key's rows come from one sink subtask (PostgresSink lock_timeout)
    stream = (flow.source("in", ep.sources.GeneratorSource(rows, num_splits=2, limit=per_split))
                  .key_by(lambda r: r["key"]).map("stamp", stamp))
    if mode == "file-parquet":
        out = tempfile.mkdtemp(dir=args.tmp)
        stream.sink("out", FileSink(out, format="parquet"))
    else:
        key = " PRIMARY KEY" if mode == "postgres-upsert" else ""
        table = server.new_table(f"id bigint NOT NULL, key bigint NOT NULL{key}, value text, t double precision")
        stream.sink("out", PostgresSink(server.dsn, table, upsert_key="key" if mode == "postgres-upsert" else None))
    rec = {"mode": mode, "rows": 2 * per_split}
    options = {"guarantee": "at-least-once" if mode == "postgres-at-least-once" else "exactly-once",
               "runtime": args.runtime,
               "checkpoint": ep.CheckpointConfig(interval=args.interval, storage="file://" + tempfile.mkdtemp(dir=args.tmp))}
    if spark is not None:
        options["spark"] = spark
    result = harness.run_job(flow, rec, 900, **options)
    if result is None:
        return rec
    if mode == "file-parquet":
        stamps = [r["t"] for r in read_committed(out, format="parquet")]
        count = len(stamps)
    elif mode == "postgres-upsert":
        count, t0, t1 = server.execute(f"SELECT count(*), min(t), max(t) FROM {table}")[0]
        stamps = [t0, t1]
    else:
        count, distinct, t0, t1 = server.execute(f"SELECT count(*), count(DISTINCT id), min(t), max(t) FROM {table}")[0]
        stamps = [t0, t1]
        if mode == "postgres" and distinct != count:
            rec["error"] = f"{mode}: {count - distinct} duplicate rows"
    expected = rec["rows"] // 2 if mode == "postgres-upsert" else rec["rows"]
    if count != expected:
        rec["error"] = f"{mode}: {count} rows in the output, expected {expected}"
    span = max(stamps) - min(stamps) if stamps else 0
    # upsert: t is each key's second write, the first of which came right before it
    rec.update(output_rows=count, records_per_s=rec["rows"] / span if span > 0 else None,
               epochs=len(result.completed_epochs), attempts=result.attempts,
               checkpoint_s_p50=harness.median([e["duration_s"] for e in result.completed_epochs]))
    if mode != "file-parquet":
        rec["prepared_left"] = len(server.prepared())
        if rec["prepared_left"]:
            rec["error"] = f"{mode}: {rec['prepared_left']} prepared transactions left"
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--runtime", default="local", choices=["local", "spark"])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.repetitions = 20_000, 1
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="epochal-pg-bench-")
    info = harness.machine()
    doc = harness.new_doc("postgres", args, info)
    doc.update(runs=[], errors=[])
    server = start_server()
    spark = None
    try:
        doc["server"] = server.execute("SELECT version()")[0][0]
        if args.runtime == "spark":
            from epochal.runtime.launch.spark import _local_session

            spark = _local_session(8)
        for rep in range(args.repetitions):
            for mode in harness.rotated(MODES, rep):
                rec = run(mode, args, server, spark)
                rec.update(repetition=rep, loadavg_before=list(os.getloadavg()))
                doc["runs"].append(rec)
                print(json.dumps({k: rec.get(k) for k in ("mode", "repetition", "records_per_s", "error")}), flush=True)
                if rec.get("error"):
                    doc["errors"].append(rec["error"])
    finally:
        server.stop()
    doc["modes"] = harness.compare(doc["runs"], "records_per_s", "mode", "file-parquet", MODES)
    return harness.write_and_report(args.out, doc, info, [
        f"{mode:24s} {harness.fmt(m['records_per_s']['median'])} rows/s  vs parquet "
        f"{[round(x, 2) for x in m['vs_file_parquet_per_repetition']]}" for mode, m in doc["modes"].items()])


if __name__ == "__main__":
    sys.exit(main())
