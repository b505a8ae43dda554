"""Nexmark on epochal (record path) and Spark Structured Streaming, side by side.

    python benchmarks/nexmark.py                      # 1M events per query, check on 20k
    python benchmarks/nexmark.py --events 200000 --check-events 5000 --queries q1,q3
    python benchmarks/nexmark.py --smoke              # tiny, local; JSON to --out

For each query (benchmarks/nexmark_queries.py: q1, q2, q3, q4, q5, q7, q8) and each engine
(epochal's record path, its columnar path, Spark SS), the same generated events (a deterministic function of the event number):

1. **check**: a small run (``--check-events``) whose output is compared with the
   plain-Python oracle as a multiset — a query counts only if its check passed;
2. **capacity**: a run over a backlog of ``--events`` events, as fast as the engine goes:
   events / wall time of the run. epochal: parallelism 2,
   exactly-once, 1 s epochs, the ``FileSink`` (JSON lines), local processes, reading the
   events from JSON-lines files written beforehand (one per source subtask, not timed);
   the time is the job's ``duration_s`` (driver: start → final commit, task start-up
   included; the zygote the tasks fork from has imported the runtime before the clock
   starts — ``epochal.runtime.launch.warm.prewarm`` —, as Spark's session is up before its
   query starts); ``cpu_s`` is the CPU time of this process tree over the run (tasks, driver,
   and for Spark its JVM), ``events_per_cpu_s`` the events per CPU-second, ``task_cpu_s`` epochal's
   CPU seconds per task (its own metrics). Spark: the events were written to Parquet beforehand (not timed); ``trigger(availableNow=True)``
   reads them all, ``local[2]``, 2 shuffle partitions, the Parquet file sink (exactly-once;
   like epochal's: no compression, no dictionary pages);
   the time is ``start()`` → ``awaitTermination()`` (the session exists already); the
   data files come in one micro-batch (``maxFilesPerTrigger``: all of them). A last
   file holds sentinel events far past the input so that Spark's watermark passes the last
   windows (q7, q8); their rows are left out.
3. **marginal capacity** (with ``--baseline-events B``: a run of B events between the check
   and the capacity run): ``(events - B) / (capacity seconds - baseline seconds)`` — the
   rate at which a bigger backlog costs more time, so the fixed start-up of each engine's
   run (epochal: task processes; Spark: planning the query, its first batch) cancels out;
   likewise ``marginal_events_per_cpu_s`` from the CPU seconds of both runs (less sensitive
   to other tenants of the machine than wall time). Not from the check run: Spark's first
   query of the session pays the JVM's warm-up there (q1's check took more CPU than its 4M
   run), nor from a run that pays the JIT's warm-up of the query the next run no longer
   pays: ``--warmup-events W`` runs W events first, untimed. The columnar path reads only the columns its query uses
   (``ArrowFileSource(columns=...)``, nexmark_queries.COLUMNS), as Spark's Parquet scan does.

Writes ``benchmarks/results/nexmark.json`` and prints events/s per query and engine and
the ratio epochal / Spark.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import nexmark_queries as nq  # noqa: E402

QUERIES = ("q1", "q2", "q3", "q4", "q5", "q7", "q8")


def _ship_queries() -> None:
    """Task processes cannot import this directory's modules: the query code travels by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(nq)


def _spark_files(directory: str) -> list:
    """The data files of Spark's Parquet file sink (not its log)."""
    return [p for p in glob.glob(os.path.join(directory, "**", "*.parquet"), recursive=True)
            if "_staging" not in p and "_spark_metadata" not in p]


def _rows(directory: str) -> collections.Counter:
    """The rows of Spark's Parquet file sink."""
    import pyarrow.parquet as pq

    out = collections.Counter()
    for path in _spark_files(directory):
        table = pq.read_table(path)
        out.update(zip(*(table.column(i).to_pylist() for i in range(table.num_columns))))
    return out


def _spark_count(query: str, directory: str, n: int) -> int:
    """How many rows Spark wrote, the sentinel's left out (:func:`_sentinel`, column-wise):
    a capacity run's output is counted, not compared (its check run was)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    count = 0
    for path in _spark_files(directory):
        table = pq.read_table(path)
        if query in _WINDOW_START:
            sentinel = pc.greater(table.column(_WINDOW_START[query]), _far(n))
        else:
            sentinel = pa.array([False] * table.num_rows, pa.bool_())
            for column in table.columns:
                if pa.types.is_integer(column.type):
                    sentinel = pc.or_(sentinel, pc.fill_null(pc.equal(column, -1), False))
        count += table.num_rows - (pc.sum(sentinel).as_py() or 0)
    return count


def _committed_count(out: str) -> int:
    """The rows of epochal's committed Parquet part files (a capacity run: counted, not compared)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in glob.glob(os.path.join(out, "part-*.parquet")))


def _fresh(out: str) -> str:
    """``out`` with no output or checkpoints of an earlier run (a reused ``--work``)."""
    for d in (out, out + "-ck", out + "-late"):
        shutil.rmtree(d, ignore_errors=True)
    return out


def prewarm() -> None:
    """A spare zygote for the next local job, imported now (epochal.runtime.launch.warm)."""
    from epochal.runtime.launch.warm import prewarm as spare

    spare()


def run_epochal(query: str, n: int, work: str, parallelism: int, tag: str) -> dict:
    import epochal as ep

    out = _fresh(os.path.join(work, f"epochal-{query}-{tag}"))
    indir = nq.write_jsonl(os.path.join(work, f"epochal-in-{n}"), n, parallelism)  # not timed
    flow = nq.epochal_flow(query, indir, out, parallelism)
    rec: dict = {}
    prewarm()  # the task runtime imported before the clock starts (Spark: the session is up)
    result = harness.run_job(flow, rec, 1800, runtime="local",
                             checkpoint=ep.CheckpointConfig(interval=1.0, storage="file://" + out + "-ck"))
    if result is None:
        raise RuntimeError(rec.get("error"))
    assert result.records_in == n, (result.records_in, n)
    rows = collections.Counter(tuple(r) for r in ep.sinks.read_committed(out))
    return {"seconds": result.duration_s, "cpu_s": rec.get("cpu_s"), "rows": rows, "attempts": result.attempts,
            "task_cpu_s": _task_cpu(result)}


def _task_cpu(result) -> dict:
    """CPU seconds per task name (``events[0]``, ``q3[1]``: the task's first operator), from
    the tasks' own final metrics: where a run's CPU goes."""
    return {task: round(m["cpu_s"], 3) for task, m in sorted(result.task_metrics.items()) if "cpu_s" in m}


def run_epochal_columnar(query: str, n: int, work: str, parallelism: int, tag: str) -> dict:
    import epochal as ep

    out = _fresh(os.path.join(work, f"columnar-{query}-{tag}"))
    flow = nq.epochal_columnar_flow(query, write_parquet(n, work), out, parallelism)  # files not timed
    rec: dict = {}
    prewarm()  # the task runtime imported before the clock starts (Spark: the session is up)
    result = harness.run_job(flow, rec, 1800, runtime="local",
                             checkpoint=ep.CheckpointConfig(interval=1.0, storage="file://" + out + "-ck"))
    if result is None:
        raise RuntimeError(rec.get("error"))
    if tag == "check":
        rows = collections.Counter(tuple(r.values()) if isinstance(r, dict) else tuple(r)
                                   for r in ep.sinks.read_committed(out))
    else:
        rows = collections.Counter({"count": _committed_count(out)})
    late = len(ep.sinks.read_committed(out + "-late", format="parquet")) if os.path.isdir(out + "-late") else 0
    if late:  # rows a window dropped as late: the output misses them
        raise AssertionError(f"columnar {query}: {late} late rows dropped by a window")
    return {"seconds": result.duration_s, "cpu_s": rec.get("cpu_s"), "rows": rows, "attempts": result.attempts,
            "task_cpu_s": _task_cpu(result)}


def _parquet_schema():
    import pyarrow as pa

    return pa.schema([(c.split()[0], {"INT": pa.int32(), "LONG": pa.int64(), "STRING": pa.string()}[c.split()[1]])
                      for c in nq.SPARK_SCHEMA.split(", ")])


#: events generated and written at a time (pyarrow's default row group: the files' layout is
#: as when each file was one ``write_table`` call, the memory a chunk's, not a file's)
_CHUNK = 1 << 20


def _write_part(path: str, lo: int, hi: int) -> None:
    """Events ``lo`` to ``hi`` (excluded) as one Parquet file, written chunk by chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _parquet_schema()
    with pq.ParquetWriter(path + ".tmp", schema) as writer:
        for start in range(lo, hi, _CHUNK):
            rows = [nq.spark_row(nq.event(g)) for g in range(start, min(hi, start + _CHUNK))]
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    os.rename(path + ".tmp", path)


#: events per data file of a large backlog: its files are shared (hard links) by every
#: backlog of a multiple of it — the warm-up, baseline and capacity runs read the same files
_FILE_EVENTS = 2_000_000


def write_parquet(n: int, work: str, files: int = 8, workers: int = 2) -> str:
    """The ``n`` events as Parquet files (in event order) and the sentinel file, in a
    directory of their own under ``work``: ``files`` files, or for a multiple of
    ``_FILE_EVENTS`` (at least two) files of that many events each, generated once per
    ``work`` and linked into every backlog that starts with them. Generated by ``workers``
    processes, not timed."""
    import concurrent.futures
    import multiprocessing

    import pyarrow as pa
    import pyarrow.parquet as pq

    d = os.path.join(work, f"spark-in-{n}")
    if os.path.isdir(d):
        return d
    shared = n >= 2 * _FILE_EVENTS and n % _FILE_EVENTS == 0
    per = _FILE_EVENTS if shared else (n + files - 1) // files
    pool_dir = os.path.join(work, "parts") if shared else d + ".tmp"
    os.makedirs(pool_dir, exist_ok=True)
    parts = [(os.path.join(pool_dir, f"events-{lo}-{min(n, lo + per)}.parquet" if shared else f"part-{k:04d}.parquet"),
              lo, min(n, lo + per)) for k, lo in enumerate(range(0, n, per))]
    todo = [part for part in parts if not os.path.exists(part[0])]
    if workers > 1 and len(todo) > 1:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            for done in [pool.submit(_write_part, *part) for part in todo]:
                done.result()
    else:
        for part in todo:
            _write_part(*part)
    os.makedirs(d + ".tmp", exist_ok=True)
    for k, (path, _, _) in enumerate(parts):
        name = os.path.join(d + ".tmp", f"part-{k:04d}.parquet")
        if path != name:
            os.link(path, name)
    t_far = nq.T0_MS + n * 1000 // nq.EVENTS_PER_S + nq.SENTINEL_MS
    sentinel = [{"kind": 0, "id": -1, "name": "", "city": "", "state": "", "t": t_far},
                {"kind": 1, "id": -1, "seller": -2, "category": 0, "reserve": 0, "expires": t_far + 60_000, "t": t_far},
                {"kind": 2, "auction": -1, "bidder": -1, "price": 0, "t": t_far}]
    pq.write_table(pa.Table.from_pylist(sentinel, schema=_parquet_schema()),
                   os.path.join(d + ".tmp", "part-9999-sentinel.parquet"))
    os.rename(d + ".tmp", d)
    return d


def spark_session(parallelism: int, memory: str = "4g"):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from epochal.runtime.launch.java import ensure_java

    ensure_java()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{parallelism}]").appName("nexmark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(parallelism))
             # the default 1 GB heap: q4's one micro-batch of 1M events ran out of it (its join
             # state), and the other queries' large micro-batches ran slower (docs/joins.md, run 6)
             .config("spark.driver.memory", memory)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_spark(spark, query: str, n: int, work: str, tag: str) -> dict:
    indir = write_parquet(n, work)
    out = _fresh(os.path.join(work, f"spark-{query}-{tag}"))
    ck = out + "-ck"
    files = len(os.listdir(indir))
    events = spark.readStream.schema(nq.SPARK_SCHEMA).option("maxFilesPerTrigger", files - 1).parquet(indir)
    frame = nq.spark_query(query, events)
    cpu0, t0 = harness.tree_cpu_seconds(), time.monotonic()
    q = (frame.writeStream.format("parquet").outputMode("append").option("path", out)
         .option("compression", "none").option("parquet.enable.dictionary", "false")  # as epochal's sink
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    seconds = time.monotonic() - t0
    cpu1 = harness.tree_cpu_seconds()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    if tag == "check":
        rows = collections.Counter({r: c for r, c in _rows(out).items() if not _sentinel(query, r, n)})
    else:
        rows = collections.Counter({"count": _spark_count(query, out, n)})
    return {"seconds": seconds, "rows": rows, "batches": len(q.recentProgress),
            "cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0}


_WINDOW_START = {"q4": 1, "q5": 0, "q7": 0, "q8": 2}  # the column holding a window's start


def _far(n: int) -> int:
    """Window starts past this come from the sentinel events (``n`` events before them)."""
    return nq.T0_MS + n * 1000 // nq.EVENTS_PER_S + nq.SENTINEL_MS // 2


def _sentinel(query: str, row: tuple, n: int) -> bool:
    if query in _WINDOW_START:
        return row[_WINDOW_START[query]] > _far(n)
    return -1 in row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--check-events", type=int, default=20_000)
    p.add_argument("--queries", default=",".join(QUERIES))
    p.add_argument("--engines", default="epochal,epochal-columnar,spark",
                   help="epochal-columnar runs the queries in nexmark_queries.COLUMNAR only")
    p.add_argument("--baseline-events", type=int, default=None,
                   help="also run this many events (after the check, before the capacity run): marginal rates")
    p.add_argument("--warmup-events", type=int, default=None,
                   help="first run this many events, not timed (before the baseline: its time must not hold the "
                        "JIT's warm-up that the capacity run no longer pays)")
    p.add_argument("--query-events", default="",
                   help="smaller backlogs for slow queries, e.g. q4=1000000,q5=1000000: that query's --events; "
                        "its warm-up and baseline scale by the same factor")
    p.add_argument("--spark-memory", default="4g", help="Spark's driver (= executor, local) heap")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "nexmark.json")
    p.add_argument("--work", default=None)
    p.add_argument("--smoke", action="store_true", help="2k events, check on 1k, epochal only")
    args = p.parse_args(argv)
    if args.smoke:
        args.events, args.check_events, args.engines = 2000, 1000, "epochal,epochal-columnar"
    queries, engines = args.queries.split(","), args.engines.split(",")
    sizes = {q: int(n) for q, n in (item.split("=") for item in args.query_events.split(",") if item)}
    _ship_queries()
    info = harness.machine()
    doc = harness.new_doc("nexmark", args, info)
    doc.update({"queries": {}, "errors": []})
    work = args.work or tempfile.mkdtemp(prefix="nexmark-")
    spark = spark_session(args.parallelism, args.spark_memory) if "spark" in engines else None
    try:
        for query in queries:
            entry = doc["queries"][query] = {}
            expected = nq.oracle(query, args.check_events)
            events = sizes.get(query, args.events)  # this query's backlog; warm-up and baseline scaled alike
            warmup = args.warmup_events and args.warmup_events * events // args.events
            baseline = args.baseline_events and args.baseline_events * events // args.events
            for engine in engines:
                if engine == "epochal-columnar" and query not in nq.COLUMNAR:
                    continue
                rec = entry[engine] = {}
                try:
                    if engine == "epochal":
                        def run(n, tag):
                            return run_epochal(query, n, work, args.parallelism, tag)
                    elif engine == "epochal-columnar":
                        def run(n, tag):
                            return run_epochal_columnar(query, n, work, args.parallelism, tag)
                    else:
                        def run(n, tag):
                            return run_spark(spark, query, n, work, tag)
                    check = run(args.check_events, "check")
                    rec["check_ok"] = check["rows"] == expected
                    rec["check_rows"] = sum(expected.values())
                    if not rec["check_ok"]:
                        missing, extra = expected - check["rows"], check["rows"] - expected
                        raise AssertionError(f"{engine} {query}: output differs from the oracle: "
                                             f"{sum(missing.values())} missing (e.g. {list(missing)[:2]}), "
                                             f"{sum(extra.values())} extra (e.g. {list(extra)[:2]})")
                    if warmup:  # not timed: the JVM's JIT (Spark) compiles this query's code here
                        run(warmup, "warmup")
                    base = run(baseline, "baseline") if baseline else None
                    full = run(events, "capacity")
                    rec.update({"events": events, "seconds": full["seconds"],
                                "events_per_s": events / full["seconds"], "output_rows": sum(full["rows"].values())})
                    if base is not None:  # the start-up both runs pay cancels out
                        more = events - baseline
                        rec.update({"baseline_events": baseline, "baseline_seconds": base["seconds"],
                                    "baseline_cpu_s": base.get("cpu_s")})
                        if more > 0 and full["seconds"] > base["seconds"]:
                            rec["marginal_events_per_s"] = more / (full["seconds"] - base["seconds"])
                        if more > 0 and full.get("cpu_s") and base.get("cpu_s") and full["cpu_s"] > base["cpu_s"]:
                            rec["marginal_events_per_cpu_s"] = more / (full["cpu_s"] - base["cpu_s"])
                    if full.get("task_cpu_s"):
                        rec["task_cpu_s"] = full["task_cpu_s"]
                    if full.get("cpu_s"):  # this process tree's CPU seconds (Spark: the JVM's too)
                        rec["cpu_s"] = full["cpu_s"]
                        rec["events_per_cpu_s"] = events / full["cpu_s"]
                except Exception as exc:  # noqa: BLE001 — report, go on with the others
                    rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                    doc["errors"].append(f"{query} {engine}: {rec['error']}")
            e, c, s = entry.get("epochal", {}), entry.get("epochal-columnar", {}), entry.get("spark", {})
            if e.get("events_per_s") and s.get("events_per_s"):
                entry["ratio_epochal_to_spark"] = e["events_per_s"] / s["events_per_s"]
            if c.get("events_per_s") and s.get("events_per_s"):
                entry["ratio_columnar_to_spark"] = c["events_per_s"] / s["events_per_s"]
            for name, r in (("epochal", e), ("columnar", c)):
                if r.get("marginal_events_per_s") and s.get("marginal_events_per_s"):
                    entry[f"marginal_ratio_{name}_to_spark"] = r["marginal_events_per_s"] / s["marginal_events_per_s"]
                if r.get("marginal_events_per_cpu_s") and s.get("marginal_events_per_cpu_s"):
                    entry[f"marginal_cpu_ratio_{name}_to_spark"] = (r["marginal_events_per_cpu_s"]
                                                                    / s["marginal_events_per_cpu_s"])
            harness.write_json(args.out, doc)  # so far: a later query's crash keeps these
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception as exc:  # noqa: BLE001 — a JVM that died (its error is in the doc already)
                doc["errors"].append(f"spark.stop: {type(exc).__name__}: {exc}"[:500])
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    harness.finish(doc, info)
    harness.write_json(args.out, doc)
    qs = doc["queries"]
    rows = [[q, harness.fmt(qs[q].get("epochal", {}).get("events_per_s")),
             harness.fmt(qs[q].get("epochal-columnar", {}).get("events_per_s")),
             harness.fmt(qs[q].get("spark", {}).get("events_per_s")),
             harness.fmt(qs[q].get("ratio_epochal_to_spark"), ".2f"),
             harness.fmt(qs[q].get("ratio_columnar_to_spark"), ".2f"),
             harness.fmt(qs[q].get("epochal-columnar", {}).get("marginal_events_per_s")),
             harness.fmt(qs[q].get("spark", {}).get("marginal_events_per_s")),
             harness.fmt(qs[q].get("marginal_ratio_columnar_to_spark"), ".2f")] for q in queries]
    print(harness.table(["query", "epochal events/s", "columnar events/s", "spark-ss events/s", "epochal/spark",
                         "columnar/spark", "columnar marginal", "spark marginal", "marginal columnar/spark"], rows))
    print(f"wrote {args.out}")
    if doc["errors"]:
        print("ERRORS:\n  " + "\n  ".join(doc["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
