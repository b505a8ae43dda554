"""One keyed word count per engine, run in its own process by ``benchmarks/peers.py``.

    python benchmarks/peer_runners.py ENGINE --lines N --splits 4 --parallelism 2 --work DIR --out RESULT.json

Every engine counts the words of the same lines — ``line(split, i)`` for every split and
``i < lines / splits``, a copy of ``tests/pipelines.py`` ``line`` (tests/test_bench_cli.py
checks the copy) — with a 1 s checkpoint / trigger interval, writes its running counts to
a sink, and reports ``seconds`` (engine start → all input processed and the sink closed)
plus whether the final count per word equals a plain-Python count.

This module imports only the standard library at the top: each engine imports its own
package inside its function, so the PyFlink runner works in a separate virtualenv
(apache-flink, through apache-beam, pins cloudpickle~=2.2.1; epochal needs cloudpickle>=3).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import time
import traceback

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
LINES_PER_FILE = 10_000   # Spark file-source input: files of this many lines ...
FILES_PER_TRIGGER = 2     # ... at most this many files per micro-batch


def line(split: int, i: int) -> str:
    """Line ``i`` of split ``split``: 1–6 words — a deliberate copy of ``workload.line``: the
    engines pickle it from this script (``__main__``) into their own workers, which cannot
    import ``workload`` (PyFlink's run in another virtualenv). tests/test_bench_cli.py
    checks both copies against tests/pipelines.py."""
    x = (split * 1_000_003 + i * 7919 + 12345) * 1103515245 % (1 << 31)
    k = 1 + x % 6
    return " ".join(WORDS[(x >> (3 + j)) % len(WORDS)] for j in range(k))


def expected_counts(lines: int, splits: int) -> dict[str, int]:
    c = collections.Counter()
    for s in range(splits):
        for i in range(lines // splits):
            c.update(line(s, i).split())
    return dict(c)


def final_counts(pairs) -> dict[str, int]:
    """Running (word, count) updates → the last (largest) count per word."""
    out: dict[str, int] = {}
    for w, n in pairs:
        out[w] = max(out.get(w, 0), int(n))
    return out


# ---------------------------------------------------------------------- epochal
def run_epochal(args) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import epochal as ep
    from epochal.runtime.launch.spark import _local_session
    from epochal.sinks import FileSink, read_committed

    class WordCount(ep.KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.value_state("count", default=0)

        def process(self, word, value):
            n = self.count.value() + 1
            self.count.update(n)
            yield [word, n]

    def lines_from(split, offset):
        i = offset
        while True:
            yield line(split, i)
            i += 1

    out = os.path.join(args.work, "out")
    events = []
    t0 = time.monotonic()
    spark = _local_session(2 * args.parallelism + 1)
    flow = ep.Dataflow("peers-wordcount", parallelism=args.parallelism)
    (flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=args.splits,
                                                     limit=args.lines // args.splits))
         .flat_map("split", str.split)
         .key_by(lambda w: w)
         .process("count", WordCount())
         .sink("out", FileSink(out, format="jsonl")))
    result = flow.run(guarantee="exactly-once", runtime="spark", spark=spark,
                      metrics=ep.MetricsConfig(interval=0.5, listener=events.append, status=False),
                      checkpoint=ep.CheckpointConfig(interval=1.0, storage="file://" + os.path.join(args.work, "ck")))
    seconds = time.monotonic() - t0
    rates = [e["records_in_per_s"] for e in events if e["state"] == "running" and e["records_in_per_s"] > 0]
    return {"seconds": seconds, "counts": final_counts(read_committed(out)),
            "completed_epochs": len(result.completed_epochs), "tasks": len(flow.plan().tasks),
            "steady_lines_per_s": steady_rate(rates), "rate_samples": len(rates),
            "steady_source": "median of the sources' lines/s over the job's progress events (0.5 s apart)"}


def steady_rate(samples: list[float]) -> float | None:
    """The median of an engine's own per-interval throughput samples, leaving out the first
    and the last (start-up and end): a steady-state rate, not a whole-process time."""
    inner = sorted(samples[1:-1]) if len(samples) > 3 else sorted(samples)
    return inner[len(inner) // 2] if inner else None


def run_epochal_columnar(args) -> dict:
    """The same word count on the columnar path: the lines as Arrow batches
    (``ArrowFileSource`` over the same files Spark reads) → ``map_batches`` (split with
    ``pyarrow.compute``) → ``key_by("word")`` → vectorized ``count()`` → jsonl FileSink of
    the per-epoch updates. Its steady rate is the median of the sources' lines/s in the
    job's progress events (every 0.2 s)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    import epochal as ep
    from epochal.columnar import ArrowFileSource, count
    from epochal.runtime.launch.spark import _local_session
    from epochal.sinks import FileSink, read_committed

    indir = write_input_files(args)
    out = os.path.join(args.work, "out")
    events = []

    def words(batch):
        return pa.record_batch([pc.list_flatten(pc.utf8_split_whitespace(batch.column(0)))], names=["word"])

    t0 = time.monotonic()
    spark = _local_session(2 * args.parallelism + 1)
    flow = ep.Dataflow("peers-wordcount-columnar", parallelism=args.parallelism)
    (flow.source("lines", ArrowFileSource(indir, pattern="*.txt", block_bytes=1 << 20))
         .map_batches("split", words)
         .key_by("word").aggregate("count", n=count())
         .sink("out", FileSink(out, format="jsonl")))
    result = flow.run(guarantee="exactly-once", runtime="spark", spark=spark,
                      metrics=ep.MetricsConfig(interval=0.2, listener=events.append, status=False),
                      checkpoint=ep.CheckpointConfig(interval=1.0, storage="file://" + os.path.join(args.work, "ck")))
    seconds = time.monotonic() - t0
    rates = [e["records_in_per_s"] for e in events if e["state"] == "running" and e["records_in_per_s"] > 0]
    return {"seconds": seconds, "counts": final_counts((r["word"], r["n"]) for r in read_committed(out)),
            "completed_epochs": len(result.completed_epochs), "tasks": len(flow.plan().tasks),
            "steady_lines_per_s": steady_rate(rates), "rate_samples": len(rates),
            "steady_source": "median of the sources' lines/s over the job's progress events (0.2 s apart)"}


# ---------------------------------------------------------------------- Spark Structured Streaming
def write_input_files(args) -> str:
    """The input lines, written upfront (not timed) as text files of LINES_PER_FILE lines."""
    d = os.path.join(args.work, "in")
    os.makedirs(d, exist_ok=True)
    rows = [line(s, i) for s in range(args.splits) for i in range(args.lines // args.splits)]
    for k in range(0, len(rows), LINES_PER_FILE):
        with open(os.path.join(d, f"lines-{k // LINES_PER_FILE:05d}.txt"), "w") as f:
            f.write("\n".join(rows[k:k + LINES_PER_FILE]) + "\n")
    return d


def _spark(args, extra: dict | None = None):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(f"local[{args.parallelism}]").appName("peers")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.parallelism))
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1"))
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_spark_ss(args, python_udf: bool) -> dict:
    indir = write_input_files(args)
    t0 = time.monotonic()
    spark = _spark(args)
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    lines = spark.readStream.option("maxFilesPerTrigger", FILES_PER_TRIGGER).text(indir)
    if python_udf:
        split = F.udf(lambda s: s.split(), ArrayType(StringType()))
        words = lines.select(F.explode(split("value")).alias("word"))
    else:
        words = lines.select(F.explode(F.split("value", " ")).alias("word"))
    query = (words.groupBy("word").count().writeStream.outputMode("update").format("memory")
             .queryName("counts").option("checkpointLocation", os.path.join(args.work, "ck"))
             .trigger(processingTime="1 second").start())
    query.processAllAvailable()
    seconds = time.monotonic() - t0
    progress = list(query.recentProgress)
    batches = len(progress)
    rates = [p["processedRowsPerSecond"] for p in progress if p.get("numInputRows")]
    query.stop()
    counts = final_counts((r["word"], r["count"]) for r in spark.sql("select word, count from counts").collect())
    spark.stop()
    return {"seconds": seconds, "counts": counts, "micro_batches": batches,
            "steady_lines_per_s": steady_rate(rates), "rate_samples": len(rates),
            "steady_source": "median of processedRowsPerSecond over the micro-batches with input"}


def line_sql(splits: int) -> str:
    """``line(value % splits, value div splits)`` as a Spark SQL expression over the rate source's ``value``."""
    a = f"pmod((value % {splits}) * 1000003 + (value div {splits}) * 7919 + 12345, 2147483648)"
    x = f"pmod({a} * 1103515245, 2147483648)"  # (a mod m)·b mod m == a·b mod m: no 64-bit overflow
    words = "array(" + ",".join(f"'{w}'" for w in WORDS) + ")"
    return (f"array_join(slice(transform(sequence(0, 5), j -> element_at({words}, "
            f"cast(pmod(shiftright({x}, 3 + j), {len(WORDS)}) + 1 as int))), 1, cast(1 + pmod({x}, 6) as int)), ' ')")


def run_spark_continuous(args, python_udf: bool) -> dict:
    """Continuous trigger (1 s epochs) on the stateless part only: rate source → line → words.

    Continuous processing has no aggregation, so this is lines → words (split + explode)
    into a memory sink, at an offered rate (the rate source is the only bundled source that
    supports continuous mode). The line is built from the rate source's ``value`` with SQL
    expressions (the same formula as ``line``); ``python_udf`` splits with a Python UDF.
    """
    # continuous needs a task slot per partition (+ one for queries on the memory sink)
    spark = _spark(args, {"spark.master": f"local[{args.parallelism + 2}]", "spark.driver.memory": "2g"})
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    text = (spark.readStream.format("rate").option("rowsPerSecond", args.continuous_rate)
            .option("numPartitions", args.parallelism).load().select(F.expr(line_sql(args.splits)).alias("value")))
    split = F.udf(lambda s: s.split(), ArrayType(StringType())) if python_udf else (lambda c: F.split(c, " "))

    def start(words):
        return (words.writeStream.format("memory").queryName("words")
                .option("checkpointLocation", os.path.join(args.work, "ck"))
                .trigger(continuous="1 second").start())

    res = {}
    try:  # the real stateless half of the word count: one row per word
        query = start(text.select(F.explode(split(F.col("value"))).alias("word")).select(F.lit(1).alias("n")))
    except Exception as exc:  # noqa: BLE001 — continuous mode rejects Generate (explode): keep the text
        res["explode_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        with open(args.out + ".partial", "w") as f:  # survives a hang of the fallback
            json.dump(res, f)
        # fall back to one row per line holding its word array (no explode)
        query = start(text.select(F.size(split(F.col("value"))).alias("n")))
    time.sleep(args.continuous_seconds)
    try:
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        lines, words = spark.sql("select count(*), coalesce(sum(n), 0) from words").collect()[0]
    except Exception as exc:  # noqa: BLE001 — keep why the real workload could not run next to why the fallback failed
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
        raise RuntimeError("; ".join(filter(None, [res.get("explode_error"),
                                                   f"fallback without explode: {type(exc).__name__}: {first}"])))
    # the result is written before stop(): stopping a continuous query can hang (the process exits anyway)
    return {**res, "seconds": args.continuous_seconds, "sink_rows": lines, "words": words,
            "words_per_s": words / args.continuous_seconds,
            "offered_lines_per_s": args.continuous_rate, "no_counts": "stateless: no per-word count to verify"}


# ---------------------------------------------------------------------- PyFlink
def run_pyflink(args) -> dict:
    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.common.serialization import Encoder
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.file_system import FileSink
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource

    splits, per_split = args.splits, args.lines // args.splits
    out = os.path.join(args.work, "out")
    t0 = time.monotonic()
    conf = Configuration()
    conf.set_string("python.executable", sys.executable)  # Flink's Python workers otherwise run `python` from PATH
    conf.set_string("restart-strategy.type", "none")  # with checkpointing the default retries forever
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(args.parallelism)
    env.enable_checkpointing(1000, CheckpointingMode.EXACTLY_ONCE)
    n = splits * per_split
    lines = env.from_source(NumberSequenceSource(0, n - 1), WatermarkStrategy.no_watermarks(), "numbers") \
        .map(lambda k: line(k % splits, k // splits), output_type=Types.STRING())
    counts = (lines.flat_map(lambda s: [(w, 1) for w in s.split()],
                             output_type=Types.TUPLE([Types.STRING(), Types.INT()]))
              .key_by(lambda p: p[0], key_type=Types.STRING())
              .reduce(lambda a, b: (a[0], a[1] + b[1])))
    counts.map(lambda p: f"{p[0]} {p[1]}", output_type=Types.STRING()) \
        .sink_to(FileSink.for_row_format(out, Encoder.simple_string_encoder()).build())
    env.execute("peers-wordcount")
    seconds = time.monotonic() - t0
    pairs = []
    for f in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(f) and not os.path.basename(f).startswith("."):  # in-progress files are hidden
            with open(f) as fh:
                pairs += [r.split() for r in fh if r.strip()]
    return {"seconds": seconds, "counts": final_counts(pairs)}


# ---------------------------------------------------------------------- Bytewax
def run_bytewax(args) -> dict:
    from datetime import timedelta
    from pathlib import Path

    import bytewax.operators as op
    from bytewax.connectors.files import DirSink
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import cluster_main

    per_split = args.lines // args.splits

    class Lines(StatefulSourcePartition):
        def __init__(self, split, resume):
            self.split, self.i = split, resume or 0

        def next_batch(self):
            if self.i >= per_split:
                raise StopIteration()
            end = min(per_split, self.i + 1000)
            batch = [line(self.split, j) for j in range(self.i, end)]
            self.i = end
            return batch

        def snapshot(self):
            return self.i

    class LinesSource(FixedPartitionedSource):
        def list_parts(self):
            return [str(s) for s in range(args.splits)]

        def build_part(self, step_id, for_part, resume_state):
            return Lines(int(for_part), resume_state)

    def count(state, _word):
        n = (state or 0) + 1
        return n, n

    out, db = Path(args.work) / "out", Path(args.work) / "recovery"
    out.mkdir(parents=True)
    db.mkdir(parents=True)
    init_db_dir(db, args.parallelism)
    t0 = time.monotonic()
    flow = Dataflow("peers_wordcount")
    words = op.flat_map("split", op.input("lines", flow, LinesSource()), str.split)
    counts = op.stateful_map("count", op.key_on("key", words, lambda w: w), count)
    op.output("out", op.map("fmt", counts, lambda kv: (kv[0], f"{kv[0]} {kv[1]}")),
              DirSink(out, file_count=args.parallelism))
    cluster_main(flow, [], 0, epoch_interval=timedelta(seconds=1),
                 recovery_config=RecoveryConfig(str(db)), worker_count_per_proc=args.parallelism)
    seconds = time.monotonic() - t0
    pairs = []
    for f in out.iterdir():
        pairs += [r.split() for r in f.read_text().splitlines() if r.strip()]
    return {"seconds": seconds, "counts": final_counts(pairs)}


ENGINES = {
    "epochal": run_epochal,
    "epochal-columnar": run_epochal_columnar,
    "spark-ss-builtin": lambda a: run_spark_ss(a, python_udf=False),
    "spark-ss-python-udf": lambda a: run_spark_ss(a, python_udf=True),
    "spark-continuous-builtin": lambda a: run_spark_continuous(a, python_udf=False),
    "spark-continuous-python-udf": lambda a: run_spark_continuous(a, python_udf=True),
    "pyflink": run_pyflink,
    "bytewax": run_bytewax,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engine", choices=sorted(ENGINES))
    p.add_argument("--lines", type=int, required=True)
    p.add_argument("--splits", type=int, default=4)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--continuous-seconds", type=float, default=15.0)
    p.add_argument("--continuous-rate", type=int, default=5_000, help="offered lines/s of the rate source")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    try:
        res = ENGINES[args.engine](args)
        if "counts" in res:
            counts = res.pop("counts")
            expected = expected_counts(args.lines, args.splits)
            res["counts_verified"] = counts == expected
            if counts != expected:
                res["counts_mismatch"] = {w: [counts.get(w), expected.get(w)] for w in set(counts) | set(expected)
                                          if counts.get(w) != expected.get(w)}
        res["lines"] = (args.lines // args.splits) * args.splits
        if "seconds" in res and "words" not in res:
            res["lines_per_s"] = res["lines"] / res["seconds"]
        res["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 — the exact error is the result
        # the message without JVM stack frames (Py4J errors carry the whole Java trace)
        text = "\n".join(ln for ln in str(exc).splitlines() if ln.strip() and not ln.lstrip().startswith("at "))
        res = {"status": "failed", "error": f"{type(exc).__name__}: {text[:1500]}",
               "traceback": traceback.format_exc()[-4000:]}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter shutdown: JVM gateways and continuous queries can block it for minutes
    os._exit(0 if res["status"] == "ok" else 1)


if __name__ == "__main__":
    sys.exit(main())
