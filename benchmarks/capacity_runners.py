"""Capacity on a backlog: one engine counts the words of the first k files of a directory,
for several k in one process (``benchmarks/peers.py`` runs it, one engine at a time).

    python benchmarks/capacity_runners.py ENGINE --input DIR --files 2 4 40 --work DIR --out RESULT.json

The first ``--files`` entry is a warm-up run (Spark's JIT and Python workers, epochal's
task processes; reported, not used); each later entry is a timed run over the first k
files, which already exist when the run starts (a backlog). Every run builds its query /
dataflow anew in the same process and session and is timed from its start until all input
is processed and the output written; its final count per word is compared with the plain
Python count of those files (``workload.zipf_files``). ``peers.py`` divides the words
between two timed runs by the time between them: the engine's marginal rate, fixed costs
cancelled.

Words are split on one space, the semantics of Spark's ``split(value, ' ')``: Arrow's
``split_pattern(lines, " ")`` in every Arrow-based engine (epochal columnar, the
single-process ceiling, Spark's ``mapInArrow``), ``str.split(" ")`` in the Python ones.

This module imports only the standard library at the top (each engine imports its own
packages), like ``peer_runners.py``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import traceback


def subset(args, k: int) -> str:
    """A directory of hard links to the first ``k`` input files (what one run reads)."""
    d = tempfile.mkdtemp(prefix=f"in{k}-", dir=args.work)
    for name in args.doc["files"][:k]:
        os.link(os.path.join(args.input, name), os.path.join(d, name))  # fsspec lists symlinks as links
    return d


def expected(args, k: int) -> dict:
    c = collections.Counter()
    for counts in args.doc["counts"][:k]:
        c.update(counts)
    return dict(c)


def final_counts(pairs) -> dict:
    """Running or per-epoch (word, count) updates → the last (largest) count per word."""
    out: dict = {}
    for w, n in pairs:
        n = int(n)
        if n > out.get(w, 0):
            out[w] = n
    return out


def cpu_seconds() -> float:
    """CPU seconds of this process and every descendant (Spark JVM, Python workers, task
    processes) that is still running or was waited for."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness

    return harness.tree_cpu_seconds() or 0.0


# ---------------------------------------------------------------------- epochal
def arrow_words(batch):
    """Lines → words on one space (Spark's ``split(value, ' ')``), in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa.record_batch([pc.list_flatten(pc.split_pattern(batch.column(0), " "))], names=["word"])


def epochal_columnar(args):
    import epochal as ep
    from epochal.columnar import ArrowFileSource, count
    from epochal.runtime.launch.spark import _local_session
    from epochal.sinks import FileSink, read_committed

    spark = _local_session(2 * args.parallelism + 1)

    def run(k: int) -> dict:
        out, ck = tempfile.mkdtemp(dir=args.work), tempfile.mkdtemp(dir=args.work)
        flow = ep.Dataflow("capacity-columnar", parallelism=args.parallelism)
        (flow.source("lines", ArrowFileSource(subset(args, k), pattern="*.txt", block_bytes=1 << 20))
             .map_batches("split", arrow_words)
             .key_by("word").aggregate("count", n=count())
             .sink("out", FileSink(out, format="parquet")))
        t0 = time.monotonic()
        result = flow.run(guarantee="exactly-once", runtime="spark", spark=spark,
                          checkpoint=ep.CheckpointConfig(interval=1.0, storage="file://" + ck),
                          metrics=ep.MetricsConfig(status=False))
        seconds = time.monotonic() - t0
        counts = final_counts((r["word"], r["n"]) for r in read_committed(out, format="parquet"))
        return {"seconds": seconds, "counts": counts, "epochs": len(result.completed_epochs),
                "lines": result.records_in}
    return run


def epochal_records(args):
    import epochal as ep
    from epochal.runtime.launch.spark import _local_session
    from epochal.sinks import FileSink, read_committed

    spark = _local_session(2 * args.parallelism + 1)

    def run(k: int) -> dict:
        out, ck = tempfile.mkdtemp(dir=args.work), tempfile.mkdtemp(dir=args.work)
        flow = ep.Dataflow("capacity-records", parallelism=args.parallelism)
        (flow.source("lines", ep.sources.DirectorySource(subset(args, k), pattern="*.txt"))
             .flat_map("split", lambda s: s.split(" "))
             .map("one", lambda w: (w, 1))
             .key_by(lambda p: p[0])
             .reduce("count", lambda a, b: (a[0], a[1] + b[1]))
             .sink("out", FileSink(out, format="jsonl")))
        t0 = time.monotonic()
        result = flow.run(guarantee="exactly-once", runtime="spark", spark=spark,
                          checkpoint=ep.CheckpointConfig(interval=1.0, storage="file://" + ck),
                          metrics=ep.MetricsConfig(status=False))
        seconds = time.monotonic() - t0
        return {"seconds": seconds, "counts": final_counts(read_committed(out)),
                "epochs": len(result.completed_epochs), "lines": result.records_in}
    return run


def arrow_ceiling(args):
    """The columnar word count's work without the engine, in this one process: the same
    file reader (``ArrowFileSource``'s, 1 MiB blocks), the same split, Arrow ``group_by``
    over about a million words at a time (as the aggregate's local pre-aggregation does),
    and the partial counts combined into a running table."""
    import pyarrow as pa

    from epochal.columnar import ArrowFileSource

    def run(k: int) -> dict:
        source = ArrowFileSource(subset(args, k), pattern="*.txt", block_bytes=1 << 20)
        t0 = time.monotonic()
        reader = source.create_reader(source.splits(), None)
        pending, rows, total = [], 0, None

        def flush():
            nonlocal pending, rows, total
            table = pa.Table.from_batches(pending).group_by("word", use_threads=False).aggregate(
                [([], "count_all")]).rename_columns(["word", "n"])
            if total is not None:
                table = pa.concat_tables([total, table]).group_by("word", use_threads=False).aggregate(
                    [("n", "sum")]).rename_columns(["word", "n"])
            total, pending, rows = table, [], 0

        lines = 0
        while True:
            poll = reader.poll(1)
            for batch in poll.records:
                lines += batch.num_rows
                words = arrow_words(batch)
                pending.append(words)
                rows += words.num_rows
                if rows >= 1 << 20:
                    flush()
            if poll.finished:
                break
        if pending:
            flush()
        reader.close()
        seconds = time.monotonic() - t0
        d = total.to_pydict()
        return {"seconds": seconds, "counts": dict(zip(d["word"], d["n"])), "lines": lines}
    return run


# ---------------------------------------------------------------------- Spark Structured Streaming
def spark_session(args):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{args.parallelism}]").appName("capacity")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.parallelism))
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", "3g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def arrow_split_partitions(batches):
    """``mapInArrow``: every Arrow batch of lines → a batch of its words (one space)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        yield pa.record_batch([pc.list_flatten(pc.split_pattern(batch.column(0), " "))], names=["word"])


def spark_ss(args, split: str):
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    spark = spark_session(args)
    python_split = F.udf(lambda s: s.split(" "), ArrayType(StringType()))
    runs = iter(range(1_000_000))

    def run(k: int) -> dict:
        name = f"counts{next(runs)}"
        lines = spark.readStream.option("maxFilesPerTrigger", args.files_per_trigger).text(subset(args, k))
        if split == "builtin":
            words = lines.select(F.explode(F.split("value", " ")).alias("word"))
        elif split == "arrow-udf":
            words = lines.mapInArrow(arrow_split_partitions, "word string")
        else:
            words = lines.select(F.explode(python_split("value")).alias("word"))
        t0 = time.monotonic()
        query = (words.groupBy("word").count().writeStream.outputMode("update").format("memory").queryName(name)
                 .option("checkpointLocation", tempfile.mkdtemp(dir=args.work)).trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.monotonic() - t0
        batches = [p for p in query.recentProgress if p.get("numInputRows")]
        counts = final_counts((r[0], r[1]) for r in spark.sql(f"select word, count from {name}").collect())
        spark.sql(f"drop table if exists {name}")
        return {"seconds": seconds, "counts": counts, "micro_batches": len(batches),
                "lines": sum(p["numInputRows"] for p in batches)}
    return run


# ---------------------------------------------------------------------- Bytewax
def bytewax(args):
    import bytewax.operators as op
    from bytewax.connectors.files import DirSink, DirSource
    from bytewax.dataflow import Dataflow
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import cluster_main
    from datetime import timedelta
    from pathlib import Path

    def count(state, _word):
        n = (state or 0) + 1
        return n, n

    def run(k: int) -> dict:
        out, db = Path(tempfile.mkdtemp(dir=args.work)), Path(tempfile.mkdtemp(dir=args.work))
        init_db_dir(db, args.parallelism)
        flow = Dataflow("capacity_wordcount")
        lines = op.input("lines", flow, DirSource(Path(subset(args, k)), glob_pat="*.txt"))
        words = op.flat_map("split", lines, lambda s: s.split(" "))
        counts = op.stateful_map("count", op.key_on("key", words, lambda w: w), count)
        op.output("out", op.map("fmt", counts, lambda kv: (kv[0], f"{kv[0]} {kv[1]}")),
                  DirSink(out, file_count=args.parallelism))
        t0 = time.monotonic()
        cluster_main(flow, [], 0, epoch_interval=timedelta(seconds=1), recovery_config=RecoveryConfig(str(db)),
                     worker_count_per_proc=args.parallelism)
        seconds = time.monotonic() - t0
        pairs = []
        for f in out.iterdir():
            pairs += [r.split(" ") for r in f.read_text().splitlines() if r.strip()]
        return {"seconds": seconds, "counts": final_counts(pairs)}
    return run


ENGINES = {
    "epochal-columnar": epochal_columnar,
    "epochal": epochal_records,
    "arrow-ceiling": arrow_ceiling,
    "spark-ss-builtin": lambda a: spark_ss(a, "builtin"),
    "spark-ss-arrow-udf": lambda a: spark_ss(a, "arrow-udf"),
    "spark-ss-python-udf": lambda a: spark_ss(a, "python-udf"),
    "bytewax": bytewax,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engine", choices=sorted(ENGINES))
    p.add_argument("--input", required=True, help="a directory written by workload.zipf_files")
    p.add_argument("--files", type=int, nargs="+", required=True,
                   help="warm-up file count, then the file counts of the timed runs")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--no-warm-up", action="store_true", help="the first --files entry is timed too")
    p.add_argument("--files-per-trigger", type=int, default=8, help="Spark: maxFilesPerTrigger")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    with open(os.path.join(args.input, "_zipf.json")) as f:
        args.doc = json.load(f)
    res = {"engine": args.engine, "runs": []}
    try:
        run = ENGINES[args.engine](args)
        for i, k in enumerate(args.files):
            cpu0, load = cpu_seconds(), os.getloadavg()[0]
            r = run(k)
            counts = r.pop("counts")
            want = expected(args, k)
            r.update(files=k, words=sum(args.doc["words"][:k]), warm_up=i == 0 and not args.no_warm_up, counts_verified=counts == want,
                     cpu_s=cpu_seconds() - cpu0, loadavg_1m_before=load)
            if counts != want:
                bad = [w for w in set(counts) | set(want) if counts.get(w) != want.get(w)]
                r["counts_mismatch"] = {w: [counts.get(w), want.get(w)] for w in bad[:20]}
                r["counts_mismatched_words"] = len(bad)
            res["runs"].append(r)
            with open(args.out + ".partial", "w") as f:  # survives a timeout of a later run
                json.dump(res, f)
        res["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 — the exact error is the result
        text = "\n".join(ln for ln in str(exc).splitlines() if ln.strip() and not ln.lstrip().startswith("at "))
        res.update(status="failed", error=f"{type(exc).__name__}: {text[:1500]}",
                   traceback=traceback.format_exc()[-4000:])
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if res["status"] == "ok" else 1)  # JVM gateways can block interpreter shutdown


if __name__ == "__main__":
    sys.exit(main())
