"""A fan-out of Arrow batches chained into its producer's task (epochal/plan.py, the tree
of epochal/runtime/task/chain.py): which fan-outs chain, and one that does, end to end on
the local runtime through a crash of the task, against plain-Python oracles — one branch
to a sink, the other through a keyed window (event time crosses the tree)."""
from __future__ import annotations

import collections

import pyarrow as pa
import pyarrow.compute as pc

import epochal as ep
from epochal.columnar import count
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.windows import Tumbling

from pipelines import unique_dir

N = 3000  # rows per split
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("t", pa.int64())])


def rows_of(split: int, offset: int):
    """Split ``split``'s rows from ``offset``: ids ``split * N + i``, 10 ms of event time apart."""
    return ((split * N + i, (split * N + i) % 7, i * 10) for i in range(offset, N))


def _even(batch):
    return pc.equal(pc.bit_wise_and(batch["id"], 1), 0)


def _odd(batch):
    return pc.equal(pc.bit_wise_and(batch["id"], 1), 1)


def fan_out(flow, rate: float | None = None):
    """Rows as batches with event time, then two consumers of that stream."""
    source = ep.sources.GeneratorSource(rows_of, num_splits=2, limit=N, records_per_second=rate)
    timed = (flow.source("rows", source).to_batches("batches", SCHEMA)
             .with_watermarks("time", timestamp="t", timestamp_unit="ms", max_out_of_orderness="100ms"))
    return timed.filter("even", _even), timed.filter("odd", _odd)


def test_a_fan_out_of_batches_is_chained_when_every_consumer_can_be():
    flow = ep.Dataflow("fan-out", parallelism=2)
    even, odd = fan_out(flow)
    even.select("even-columns", "id").sink("even-out", FileSink("/tmp/unused-even", format="parquet"))
    odd.sink("odd-out", FileSink("/tmp/unused-odd", format="parquet"))
    chains = {t.chain for t in flow.plan().tasks}
    assert chains == {("rows", "batches", "time", "even", "even-columns", "even-out", "odd", "odd-out")}


def test_a_fan_out_is_not_chained_with_a_keyed_consumer_or_a_watermark_generator_below_it():
    keyed = ep.Dataflow("fan-out-keyed", parallelism=2)
    source = ep.sources.GeneratorSource(rows_of, num_splits=2, limit=N)
    timed = (keyed.source("rows", source).to_batches("batches", SCHEMA)
             .with_watermarks("time", timestamp="t", timestamp_unit="ms"))
    timed.sink("all-out", FileSink("/tmp/unused-all", format="parquet"))
    timed.key_by("k").window(Tumbling(1)).aggregate("n", n=count()).sink(
        "n-out", FileSink("/tmp/unused-n", format="parquet"))
    assert {t.chain for t in keyed.plan().tasks} == {("rows", "batches", "time"), ("all-out",), ("n", "n-out")}

    generating = ep.Dataflow("fan-out-generating", parallelism=2)
    batches = generating.source("rows", ep.sources.GeneratorSource(rows_of, num_splits=2, limit=N)).to_batches(
        "batches", SCHEMA)
    batches.sink("all-out", FileSink("/tmp/unused-all", format="parquet"))
    batches.filter("even", _even).with_watermarks("time", timestamp="t", timestamp_unit="ms").sink(
        "even-out", FileSink("/tmp/unused-even", format="parquet"))
    assert {t.chain for t in generating.plan().tasks} == {("rows", "batches"), ("all-out",),
                                                          ("even", "time", "even-out")}


def test_a_chained_fan_out_is_exactly_once_through_a_crash_of_its_task(tmp_path):
    flow = ep.Dataflow("fan-out-crash", parallelism=2)
    even, odd = fan_out(flow, rate=3000.0)  # 1 s of input per split: several checkpoints before the crash
    even_out, odd_out = unique_dir(tmp_path, "even"), unique_dir(tmp_path, "odd")
    even.select("even-columns", "id").sink("even-out", FileSink(even_out, format="parquet"))
    windows = odd.key_by("k").window(Tumbling(1)).aggregate("n", n=count())
    windows.sink("odd-out", FileSink(odd_out, format="parquet"))
    assert ("rows", "batches", "time", "even", "even-columns", "even-out", "odd") in {t.chain for t in flow.plan().tasks}
    result = flow.run(runtime="local", faults=[CrashAtRecord("even", subtask=0, record=6, how="exit", after_epoch=1)],
                      checkpoint=ep.CheckpointConfig(interval=0.05,
                                                     storage="file://" + unique_dir(tmp_path, "ck")))
    assert result.attempts == 2, result.failures  # the crash fired mid-run
    assert all("injected" in f or "disconnected without finishing" in f for f in result.failures), result.failures

    rows = [r for s in range(2) for r in rows_of(s, 0)]
    assert collections.Counter(r["id"] for r in read_committed(even_out, format="parquet")) == \
        collections.Counter(i for i, _, _ in rows if i % 2 == 0)
    expected = collections.Counter()
    for i, k, t in rows:
        if i % 2:
            expected[(k, t // 1000)] += 1
    got = collections.Counter()
    for r in read_committed(odd_out, format="parquet"):
        got[(r["k"], r["window_start"].timestamp() // 1)] += r["n"]
    assert got == expected
