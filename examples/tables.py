"""Exactly-once into lakehouse tables: a word count written to a Delta table and to an Iceberg
table, then read back from the Delta table by a second job.

Job 1 counts words (a running count per word in keyed state) and writes every update to a
Delta table (``DeltaSink``: one Delta commit per epoch and subtask, with an application
transaction) and to an Iceberg table (``IcebergSink``: one fast-append snapshot per epoch
and subtask, the epoch in its summary; SQL catalog on sqlite). Half-way through, an injected
fault kills the sink task between a checkpoint's completion and its commit (``--no-crash``
to skip it): the next attempt commits the completed epoch from the checkpoint, once. Job 2
reads the Delta table with ``DeltaSource`` and keeps the highest count per word. Both tables
and job 2's result are checked against a plain-Python count.

    python examples/tables.py [--no-crash] [--runtime spark|local] [--lines 4000]
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import tempfile
import time

import pyarrow as pa

import epochal as ep
from epochal.sinks import DeltaSink, FileSink, IcebergSink, read_committed
from epochal.sources import DeltaSource
from epochal.testing import CrashDuringCommit

WORDS = "delta iceberg parquet snapshot epoch commit barrier table version manifest".split()
SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])


def line(split: int, i: int) -> str:
    """Line ``i`` of ``split``: 1-6 words, a pure function of its position (so replayable)."""
    rng = random.Random(split * 1_000_003 + i)
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


def lines(split: int, offset: int):
    i = offset
    while True:
        yield line(split, i)
        i += 1


class WordCount(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"), choices=["spark", "local"])
    parser.add_argument("--no-crash", action="store_true")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="epochal-tables-")
    delta_table = os.path.join(work, "counts-delta")
    catalog = {"type": "sql", "uri": f"sqlite:///{work}/catalog.db", "warehouse": f"file://{work}/warehouse"}
    per_split = args.lines // 2

    # Job 1: words -> running count -> a Delta table and an Iceberg table
    # --8<-- [start:graph]
    flow = ep.Dataflow("table-wordcount", parallelism=2)
    counts = (flow.source("lines", ep.sources.GeneratorSource(lines, num_splits=2, limit=per_split,
                                                              records_per_second=2 * per_split))
                  .flat_map("split", str.split)
                  .key_by(lambda w: w)
                  .process("count", WordCount()))
    counts.sink("delta", DeltaSink(delta_table, schema=SCHEMA))  # created on the driver when missing
    counts.sink("iceberg", IcebergSink(catalog, "demo.counts", schema=SCHEMA))
    # --8<-- [end:graph]
    faults = [] if args.no_crash else [CrashDuringCommit("delta", subtask=0, epoch=2, how="exit", after_epoch=1)]
    t0 = time.monotonic()
    result = flow.run(checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/ckpt-1"),
                      runtime=args.runtime, faults=faults)
    print(f"job 1 wrote both tables in {time.monotonic() - t0:.1f} s, {result.attempts} attempt(s)")
    for failure in result.failures:
        print(f"  recovered from: {failure.splitlines()[0]}")

    # The oracle: a plain-Python running count of the same lines
    text = [line(s, i) for s in range(2) for i in range(per_split)]
    words = collections.Counter(w for line in text for w in line.split())
    expected = collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))

    # Read both tables with their own libraries (never through epochal)
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    delta_rows = ds.dataset(DeltaTable(delta_table).file_uris(), format="parquet").to_table().to_pylist()
    iceberg_rows = load_catalog("default", **catalog).load_table("demo.counts").scan().to_arrow().to_pylist()
    for name, rows in (("Delta", delta_rows), ("Iceberg", iceberg_rows)):
        got = collections.Counter((r["word"], r["n"]) for r in rows)
        print(f"  {name} table: {len(rows)} rows; equals a failure-free count: {'yes' if got == expected else 'NO'}")
        if got != expected:
            raise SystemExit(f"exactly-once violated in the {name} table")

    # Job 2: the Delta table as a source, in another job
    out = os.path.join(work, "final")
    reader = ep.Dataflow("table-reader", parallelism=2)
    (reader.source("rows", DeltaSource(delta_table, splits=2))
           .key_by(lambda r: r["word"])
           .reduce("max", lambda a, b: a if a["n"] >= b["n"] else b)
           .sink("out", FileSink(out)))
    reader.run(checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/ckpt-2"), runtime=args.runtime)
    final = {}
    for r in read_committed(out):
        final[r["word"]] = max(final.get(r["word"], 0), r["n"])
    print(f"job 2 read the Delta table back: final counts {'equal' if final == dict(words) else 'DIFFER FROM'} "
          f"the plain-Python count ({sum(final.values())} words)")
    if final != dict(words):
        raise SystemExit("the Delta source read something else than the table holds")
    print(f"  tables under {work}")


if __name__ == "__main__":
    main()
