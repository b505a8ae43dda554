"""One windowed aggregation per engine, run in its own process by ``benchmarks/event_windows.py``.

    python benchmarks/event_window_runners.py ENGINE --events N --work DIR --out RESULT.json [workload flags]

Every engine sums ``value`` per key over 10 s tumbling event-time windows of the same
events (``workload.event``: ``(key, t_us, value)``, 10k keys, bounded disorder) with a
watermark of ``--bound-us`` and a 1 s checkpoint / trigger / snapshot interval, and writes
one row per (key, window) to a file sink. The runner returns the rows it finds in the sink,
each with three wall-clock times (``time.time()``, one machine):

* ``fired`` — the engine produced the window's result because its watermark passed the
  window's end (epochal and Bytewax: a ``map`` right after the window operator, in the
  same task / worker, stamps it — ``epochal-columnar``: a ``with_column`` there, one stamp
  per batch of fired windows; Spark: ``current_timestamp()``, the start of the
  micro-batch whose watermark passed the end);
* ``committed`` — the result is part of the engine's durable, exactly-once output
  (epochal: the completion of the epoch whose transaction holds it, ``JobResult.
  completed_epochs[...]["wall_time"]``; Spark: the micro-batch's entry in the file sink's
  ``_spark_metadata`` log, its mtime; Bytewax: written and fsync'd — Bytewax has no
  transactional sink, see SETTINGS in event_windows.py);
* ``visible`` — a reader of the directory can see it (epochal: the rename of the part file
  out of ``_staging``, its ``st_ctime``; Spark and Bytewax: as ``committed``).

Rows are ``[key, start_us, end_us, value, fired, committed, visible]``; ``event_windows.py``
checks them against a plain-Python oracle and derives rates and latencies. Each engine
imports its package inside its function.
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import re
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402

_EPOCH_OF_PART = re.compile(r"-e(\d+)-s\d+-")  # FileSink's committed part-<tag>-e<epoch>-s<subtask>-<seq>


def events_fn(args):
    """``(split, offset) -> iterator`` over this run's events (bound with functools.partial)."""
    return functools.partial(workload.events_of, splits=args.splits, per_split=args.events // args.splits,
                             keys=args.keys, event_us=args.event_us, disorder_us=args.disorder_us)


# ---------------------------------------------------------------------- epochal
def run_epochal(args, checkpoints: bool) -> dict:
    import cloudpickle

    cloudpickle.register_pickle_by_value(workload)  # events_of runs in the task processes
    import epochal as ep
    from epochal.sinks import FileSink
    from epochal.windows import Sum, Tumbling

    t0 = time.time()
    flow = ep.Dataflow("event-windows", parallelism=args.parallelism)
    (flow.source("events", ep.sources.GeneratorSource(events_fn(args), num_splits=args.splits))
         .with_watermarks("ts", timestamp=lambda e: e[1] / 1e6, max_out_of_orderness=args.bound_us / 1e6)
         .key_by(lambda e: e[0])
         .window(Tumbling(args.window_s))
         .aggregate("sum", Sum(lambda e: e[2]))
         .map("stamp", lambda r: [r.key, r.start, r.end, r.value, time.time()])
         .sink("out", FileSink(os.path.join(args.work, "out"), format="jsonl")))
    return {"started_at": t0, **_run_epochal_job(args, flow, checkpoints, _jsonl_rows, args.interval)}


def _jsonl_rows(path: str):
    """``(key, start µs, end µs, value, fired)`` of a part file of :func:`run_epochal`."""
    with open(path) as f:
        for line in f:
            k, start, end, value, fired = json.loads(line)
            yield k, round(start * 1e6), round(end * 1e6), value, fired


def run_epochal_columnar(args, interval: float | None = None) -> dict:
    """The same windows on Arrow batches: ``ArrowFileSource`` reads the CSV files Spark reads
    (:func:`write_event_files`, written before the job, without Spark's sentinel: a bounded
    input ends event time) → ``with_watermarks`` on ``t_us`` → ``key_by("key").window(Tumbling)
    .aggregate(value=sum("value"))`` → ``with_column("fired", time.time())``, chained after the
    window in its task, so ``fired`` is when the batch of fired windows leaves the window
    operator → exactly-once parquet FileSink, checkpoints every ``interval`` s (``--interval``,
    1 s; 0.25 s for ``epochal-columnar-250ms``, the latency-oriented setting). Rows as
    :func:`run_epochal`'s."""
    interval = args.interval if interval is None else interval
    import pyarrow as pa

    import epochal as ep
    from epochal.columnar import ArrowFileSource
    from epochal.columnar import sum as asum
    from epochal.sinks import FileSink
    from epochal.windows import Tumbling

    indir, files = write_event_files(args, sentinel=False)
    schema = pa.schema([("key", pa.int64()), ("t_us", pa.int64()), ("value", pa.int64())])
    t0 = time.time()
    flow = ep.Dataflow("event-windows-columnar", parallelism=args.parallelism)
    (flow.source("events", ArrowFileSource(indir, pattern="events-*.csv", format="csv", schema=schema,
                                          header=False))
         .with_watermarks("ts", timestamp="t_us", timestamp_unit="us", max_out_of_orderness=args.bound_us / 1e6)
         .key_by("key")
         .window(Tumbling(args.window_s))
         .aggregate("sum", value=asum("value"))
         .with_column("stamp", "fired", lambda b: time.time())
         .sink("out", FileSink(os.path.join(args.work, "out"), format="parquet")))
    return {"started_at": t0, "input_files": files, "interval_s": interval,
            **_run_epochal_job(args, flow, True, _parquet_rows, interval)}


def _parquet_rows(path: str):
    """``(key, start µs, end µs, value, fired)`` of a part file of :func:`run_epochal_columnar`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    start, end = (t.column(c).cast(pa.int64()) for c in ("window_start", "window_end"))  # timestamp[us, UTC] → µs
    yield from zip(*(c.to_pylist() for c in (t.column("key"), start, end, t.column("value"), t.column("fired"))))


def _run_epochal_job(args, flow, checkpoints: bool, read_part, interval: float = 1.0) -> dict:
    """Run ``flow`` (its sink writes ``<work>/out``) exactly-once, checkpointing every
    ``interval`` s or only at the end; its rows with their commit (the epoch's completion) and
    visibility times."""
    import epochal as ep
    from epochal.runtime.launch.spark import _local_session

    tasks = len(flow.plan().tasks)
    spark = _local_session(tasks + 1) if args.runtime == "spark" else None
    t_spark = time.time()
    result = flow.run(guarantee="exactly-once", runtime=args.runtime, spark=spark,
                      checkpoint=ep.CheckpointConfig(interval=interval if checkpoints else None,
                                                     storage="file://" + os.path.join(args.work, "ck")))
    t_end = time.time()
    completed_at = {e["epoch"]: e["wall_time"] for e in result.completed_epochs}
    rows = []
    for path in sorted(glob.glob(os.path.join(args.work, "out", "part-*"))):
        epoch = int(_EPOCH_OF_PART.search(os.path.basename(path)).group(1))
        visible = os.stat(path).st_ctime  # the commit's rename sets ctime (the mtime is the last write)
        rows += ([*row, completed_at[epoch], visible] for row in read_part(path))
    epochs = [{k: e[k] for k in ("epoch", "reason", "duration_s", "wall_time", "max_alignment_s", "max_sync_s",
                                 "max_upload_s", "bytes", "state_bytes")} for e in result.completed_epochs]
    return {"rows": rows, "spark_ready_at": t_spark, "ended_at": t_end,
            "job_duration_s": result.duration_s, "attempts": result.attempts, "records_in": result.records_in,
            "late_dropped": result.late_dropped,
            "tasks": tasks, "epochs": epochs}


# ---------------------------------------------------------------------- Spark Structured Streaming
def write_event_files(args, sentinel: bool = True) -> tuple[str, int]:
    """The events as CSV files of ``--file-events`` consecutive events (``key,t_us,value``),
    written before the query starts (not timed), oldest mtime first (the file source's
    order), then (``sentinel``, for Spark) one *sentinel* file: an event of key -1 far past the
    input, which moves Spark's watermark past every window (a file stream never ends: without
    it the last windows would never be emitted in append mode). The sentinel's window is not
    compared. Returns the directory and the number of event files (without the sentinel)."""
    d = os.path.join(args.work, "in")
    os.makedirs(d, exist_ok=True)
    n, per = args.events - args.events % args.splits, args.file_events
    base = time.time() - 10_000
    k = 0
    for k, lo in enumerate(range(0, n, per)):
        path = os.path.join(d, f"events-{k:06d}.csv")
        with open(path, "w") as f:
            f.write("".join("%d,%d,%d\n" % workload.event(g, args.keys, args.event_us, args.disorder_us)
                            for g in range(lo, min(n, lo + per))))
        os.utime(path, (base + k, base + k))
    if not sentinel:
        return d, k + 1
    sentinel_us = workload.EVENT_T0_US + n * args.event_us + args.bound_us + 3 * args.window_s * 1_000_000
    path = os.path.join(d, f"events-{k + 1:06d}.csv")
    with open(path, "w") as f:
        f.write(f"-1,{sentinel_us},0\n")
    os.utime(path, (base + k + 1, base + k + 1))
    return d, k + 1


def run_spark_ss(args, backlog: bool = False, trigger_s: float = 1.0) -> dict:
    """Structured Streaming's windows over the CSV files: ``maxFilesPerTrigger`` 4 (100k
    events) per 1 s trigger; with ``trigger_s`` (``spark-ss-250ms``: 0.25) the same offered
    rate at a shorter cadence, ``--files-per-trigger`` × ``trigger_s`` files (at least one)
    per trigger; or with ``backlog`` (``spark-ss-backlog``: capacity on the same backlog)
    ``--backlog-files-per-trigger`` (20: 500k events) per micro-batch, batches back to back
    (``processingTime`` 0)."""
    indir, files = write_event_files(args)
    per_trigger = (args.backlog_files_per_trigger if backlog
                   else max(1, round(args.files_per_trigger * trigger_s)))
    trigger = "0 seconds" if backlog else f"{round(trigger_s * 1000)} milliseconds"
    out, ck = os.path.join(args.work, "out"), os.path.join(args.work, "ck")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from epochal.runtime.launch.java import ensure_java

    ensure_java()
    t0 = time.time()
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master(f"local[{args.parallelism}]").appName("event-windows")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.parallelism))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
             .config("spark.sql.streaming.fileSink.log.compactInterval", "1000000")  # one log file per batch
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    t_spark = time.time()
    events = (spark.readStream.schema("key INT, t_us LONG, value INT")
              .option("maxFilesPerTrigger", per_trigger).csv(indir)
              .withColumn("ts", F.expr("timestamp_micros(t_us)"))
              .withWatermark("ts", f"{args.bound_us // 1000} milliseconds"))
    sums = (events.groupBy(F.window("ts", f"{args.window_s} seconds"), "key").agg(F.sum("value").alias("value"))
            .select("key", F.expr("unix_micros(window.start)").alias("start"),
                    F.expr("unix_micros(window.end)").alias("end"), "value",
                    F.expr("unix_micros(current_timestamp())").alias("fired")))
    query = (sums.writeStream.format("json").outputMode("append").option("path", out)
             .option("checkpointLocation", ck).trigger(processingTime=trigger)
             .start())
    n = args.events - args.events % args.splits
    last_end_us = _last_window_end(args, n)
    deadline = time.monotonic() + args.run_timeout
    while True:  # until a finished micro-batch ran with a watermark past the last window's end
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress = query.recentProgress
        if any(_wm_us(p) >= last_end_us for p in progress):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the watermark did not pass {last_end_us} µs within {args.run_timeout} s")
        time.sleep(0.2)
    t_end = time.time()
    query.stop()
    batches = [{"batch": p["batchId"], "start": _iso_s(p["timestamp"]),
                "trigger_s": p["durationMs"].get("triggerExecution", 0) / 1e3,
                "watermark_us": _wm_us(p), "input_rows": p["numInputRows"]} for p in progress]
    rows = []
    meta = os.path.join(out, "_spark_metadata")
    for name in sorted((n for n in os.listdir(meta) if n.isdigit()), key=int):  # not .crc files
        committed = os.stat(os.path.join(meta, name)).st_mtime
        with open(os.path.join(meta, name)) as f:
            entries = [json.loads(r) for r in f.read().splitlines()[1:] if r.strip()]
        for e in entries:
            with open(e["path"].removeprefix("file://")) as part:
                for r in part:
                    d = json.loads(r)
                    if d["key"] < 0:
                        continue  # the sentinel
                    rows.append([d["key"], d["start"], d["end"], d["value"], d["fired"] / 1e6, committed,
                                 committed, int(name)])
    spark.stop()
    return {"rows": rows, "started_at": t0, "spark_ready_at": t_spark, "ended_at": t_end, "batches": batches,
            "input_files": files}


def _last_window_end(args, n: int) -> int:
    tail = 2 * args.disorder_us // args.event_us + 10  # the highest event time is among the last events
    t_max = max(workload.event(g, args.keys, args.event_us, args.disorder_us)[1] for g in range(max(0, n - tail), n))
    w = args.window_s * 1_000_000
    return t_max - t_max % w + w


def _wm_us(progress: dict) -> int:
    wm = progress.get("eventTime", {}).get("watermark")
    return round(_iso_s(wm) * 1e6) if wm else -1


def _iso_s(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------- Bytewax
def run_bytewax(args) -> dict:
    """``--bytewax-processes`` processes of one worker each (a cluster on loopback), or one
    process with ``--parallelism`` worker threads when it is 1."""
    import multiprocessing
    import socket

    from bytewax.recovery import init_db_dir

    out, db = os.path.join(args.work, "out"), os.path.join(args.work, "recovery")
    os.makedirs(out)
    os.makedirs(db)
    init_db_dir(db, args.parallelism)
    procs = args.bytewax_processes
    ports = []
    for _ in range(procs):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    addresses = [f"127.0.0.1:{p}" for p in ports] if procs > 1 else []
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_bytewax_process, args=(vars(args), addresses, i)) for i in range(procs)]
    for c in children:
        c.start()
    for c in children:
        c.join(args.run_timeout)
        if c.exitcode != 0:
            for other in children:
                other.kill()
            raise RuntimeError(f"bytewax process {children.index(c)} exited with {c.exitcode}")
    t_end = time.time()
    rows, late = [], 0
    for path in sorted(glob.glob(os.path.join(out, "part-*.jsonl"))):
        with open(path + ".flushed") as f:
            flushed = [(int(n), float(t)) for n, t in (r.split() for r in f if r.strip())]
        with open(path) as f:
            j = 0
            for i, line in enumerate(f):
                while flushed[j][0] <= i:
                    j += 1
                k, start, end, value, fired = json.loads(line)
                rows.append([k, start, end, value, fired, flushed[j][1], flushed[j][1]])
    for path in glob.glob(os.path.join(out, "late-*")):
        with open(path) as f:
            late += int(f.read() or 0)
    return {"rows": rows, "started_at": t0, "ended_at": t_end, "late_dropped": late, "processes": procs}


def _bytewax_process(argv: dict, addresses: list, proc_id: int) -> None:
    from datetime import datetime, timedelta, timezone

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
    from bytewax.outputs import DynamicSink, FixedPartitionedSink, StatelessSinkPartition, StatefulSinkPartition
    from bytewax.recovery import RecoveryConfig
    from bytewax.testing import cluster_main

    args = argparse.Namespace(**argv)
    n = args.events - args.events % args.splits
    keys, event_us, disorder_us = args.keys, args.event_us, args.disorder_us
    out = os.path.join(args.work, "out")
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    window_us = args.window_s * 1_000_000

    class Events(StatefulSourcePartition):
        """All events in one partition, in index order (see SETTINGS: per-key watermarks)."""

        def __init__(self, resume):
            self.g = resume or 0

        def next_batch(self):
            if self.g >= n:
                raise StopIteration()
            end = min(n, self.g + 1000)
            batch = [workload.event(g, keys, event_us, disorder_us) for g in range(self.g, end)]
            self.g = end
            return batch

        def snapshot(self):
            return self.g

    class EventsSource(FixedPartitionedSource):
        def list_parts(self):
            return ["all"]

        def build_part(self, step_id, for_part, resume_state):
            return Events(resume_state)

    class FlushedPart(StatefulSinkPartition):
        """DirSink's partition (write, flush, fsync per batch; truncate to the snapshot on
        resume) that also notes (rows so far, time) after every fsync."""

        def __init__(self, path, resume):
            self.f = open(path, "a+")
            self.f.seek(resume or 0)
            self.f.truncate()
            self.n = 0
            self.flushed = open(path + ".flushed", "a")

        def write_batch(self, values):
            self.f.write("".join(v + "\n" for v in values))
            self.f.flush()
            os.fsync(self.f.fileno())
            self.n += len(values)
            self.flushed.write(f"{self.n} {time.time()}\n")
            self.flushed.flush()

        def snapshot(self):
            return self.f.tell()

        def close(self):
            self.f.close()
            self.flushed.close()

    class FlushedDirSink(FixedPartitionedSink):
        def list_parts(self):
            return [str(i) for i in range(args.parallelism)]

        def part_fn(self, item_key):
            return int(item_key)

        def build_part(self, step_id, for_part, resume_state):
            return FlushedPart(os.path.join(out, f"part-{for_part}.jsonl"), resume_state)

    class LateCount(StatelessSinkPartition):
        def __init__(self, worker):
            self.n, self.path = 0, os.path.join(out, f"late-{proc_id}-{worker}")

        def write_batch(self, items):
            self.n += len(items)
            with open(self.path, "w") as f:  # rare: late records are not expected
                f.write(str(self.n))

    class LateSink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return LateCount(worker_index)

    fixed_now = datetime(2000, 1, 1, tzinfo=timezone.utc)
    clock = EventClock(ts_getter=lambda e: epoch + timedelta(microseconds=e[1]),
                       wait_for_system_duration=timedelta(microseconds=args.bound_us),
                       now_getter=lambda: fixed_now,  # event time only: no advance with the wall clock
                       to_system_utc=lambda t: None)  # no wake-ups on the wall clock
    windower = TumblingWindower(length=timedelta(seconds=args.window_s), align_to=epoch)
    flow = Dataflow("event_windows")
    keyed = op.key_on("key", op.input("events", flow, EventsSource()), lambda e: str(e[0]))
    sums = fold_window("sum", keyed, clock, windower, lambda: 0, lambda s, e: s + e[2], lambda a, b: a + b,
                       ordered=False)
    stamped = op.map("stamp", sums.down, lambda kv: (str(int(kv[0]) % args.parallelism), json.dumps(
        [int(kv[0]), kv[1][0] * window_us, (kv[1][0] + 1) * window_us, kv[1][1], time.time()])))
    op.output("out", stamped, FlushedDirSink())
    op.output("late", sums.late, LateSink())
    from datetime import timedelta as td

    cluster_main(flow, addresses, proc_id, epoch_interval=td(seconds=1),
                 recovery_config=RecoveryConfig(os.path.join(args.work, "recovery")),
                 worker_count_per_proc=1 if addresses else args.parallelism)


ENGINES = {
    "epochal-exactly-once": lambda a: run_epochal(a, checkpoints=True),
    "epochal-no-checkpoint": lambda a: run_epochal(a, checkpoints=False),
    "epochal-columnar": run_epochal_columnar,
    "epochal-columnar-250ms": lambda a: run_epochal_columnar(a, interval=0.25),
    "spark-ss": run_spark_ss,
    "spark-ss-250ms": lambda a: run_spark_ss(a, trigger_s=0.25),
    "spark-ss-backlog": lambda a: run_spark_ss(a, backlog=True),
    "bytewax": run_bytewax,
}


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The flags that define the input and the windows (shared with event_windows.py)."""
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--splits", type=int, default=4, help="source splits (epochal; Spark reads files, Bytewax 1 "
                                                         "partition — the events are the same)")
    p.add_argument("--event-us", type=int, default=200, help="event time per event (µs): 5,000 events per "
                                                             "event-time second")
    p.add_argument("--disorder-us", type=int, default=1_000_000, help="events are at most this much out of order")
    p.add_argument("--bound-us", type=int, default=2_000_000, help="watermark: max event time seen minus this")
    p.add_argument("--window-s", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0,
                   help="epochal's checkpoint interval, s (epochal-exactly-once, epochal-columnar)")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--file-events", type=int, default=25_000, help="Spark: events per input file")
    p.add_argument("--files-per-trigger", type=int, default=4, help="Spark: maxFilesPerTrigger")
    p.add_argument("--backlog-files-per-trigger", type=int, default=20,
                   help="spark-ss-backlog: maxFilesPerTrigger (micro-batches back to back)")
    p.add_argument("--bytewax-processes", type=int, default=2,
                   help="Bytewax: processes of one worker each (1: one process, --parallelism threads)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engine", choices=sorted(ENGINES))
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--runtime", choices=("spark", "local"), default="spark", help="epochal's runtime")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    add_workload_args(p)
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    try:
        res = ENGINES[args.engine](args)
        res["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 — the exact error is the result
        text = "\n".join(ln for ln in str(exc).splitlines() if ln.strip() and not ln.lstrip().startswith("at "))
        res = {"status": "failed", "error": f"{type(exc).__name__}: {text[:1500]}",
               "traceback": traceback.format_exc()[-4000:]}
    with open(args.out, "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if res["status"] == "ok" else 1)  # skip interpreter shutdown (JVM gateways can block it)


if __name__ == "__main__":
    sys.exit(main())
