"""Columnar windows with a per-batch partial aggregate before the shuffle
(``window(...).aggregate(..., local=True)``): the same fired windows as a plain-Python
oracle through a crash (tumbling and sliding, both backends), fewer rows crossing to the
window than the input has, late partial rows on ``.late()``, and the build-time errors."""
from __future__ import annotations

import collections

import cloudpickle
import pyarrow as pa
import pytest

import epochal as ep
from epochal.columnar import count, max as amax, mean, sum as asum
from epochal.errors import PipelineDefinitionError
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.ttl import StateTtl
from epochal.windows import Sliding, Tumbling

from pipelines import unique_dir

# the same out-of-order events as the columnar event-time tests
import test_columnar_time
from test_columnar_time import PER_SPLIT, SCHEMA, SPLITS, batches, event

# tasks unpickle `batches`: by value, also when this file runs alone (conftest registers only
# the modules it collected)
cloudpickle.register_pickle_by_value(test_columnar_time)


def oracle(assigner) -> dict:
    """Plain Python: ``{(key, window start µs): (count, sum, max, mean)}``."""
    spec, out = assigner.spec(), collections.defaultdict(list)
    for k, t, v in (event(s, i) for s in range(SPLITS) for i in range(PER_SPLIT)):
        for start in spec.window_starts(round(t * 1_000_000)):
            out[(k, start)].append(v)
    return {kw: (len(vs), sum(vs), max(vs), sum(vs) / len(vs)) for kw, vs in out.items()}


def windows(name, out, assigner, *, rate=None):
    flow = ep.Dataflow(name, parallelism=2)
    fired = (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA,
                                                          records_per_second=rate))
             .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
             .key_by("k").window(assigner).aggregate("win", local=True, n=count(), total=asum("v"), top=amax("v"),
                                                     avg=mean("v")))
    fired.sink("out", FileSink(out, format="parquet"))
    fired.late().sink("late", FileSink(out + "-late", format="parquet"))
    return flow


@pytest.mark.parametrize("assigner,backend", [(Tumbling("2s"), "heap"), (Sliding("3s", "1s"), "rocksdb")],
                         ids=["tumbling-heap", "sliding-rocksdb"])
def test_local_partials_give_the_oracles_windows_through_a_crash(tmp_path, assigner, backend):
    out = unique_dir(tmp_path, "out")
    fault = CrashAtRecord("win", subtask=1, record=20, how="exit", after_epoch=2)
    result = windows("cwin-local", out, assigner, rate=10.0).run(  # ~1.5 s of input: the fault waits for epochs
        runtime="local", backend=backend, faults=[fault],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures  # the crash fired mid-run
    rows = read_committed(out, format="parquet")
    got = collections.Counter((r["k"], round(r["window_start"].timestamp() * 1_000_000)) for r in rows)
    assert max(got.values()) == 1  # every window fired once for its key
    expected = oracle(assigner)
    assert {(r["k"], round(r["window_start"].timestamp() * 1_000_000)):
            (r["n"], r["total"], r["top"], pytest.approx(r["avg"])) for r in rows} == expected
    assert read_committed(out + "-late", format="parquet") == []


def test_fewer_rows_cross_to_the_window_than_the_input_has(tmp_path):
    out = unique_dir(tmp_path, "out")
    result = windows("cwin-local-rows", out, Tumbling("2s")).run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.5, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.records_in == SPLITS * PER_SPLIT
    crossed = sum(m["records_in"] for task, m in result.task_metrics.items() if task.startswith("win["))
    # one partial row per (key, pane) of each batch: 60 batches of 100 rows, 7 keys, 2 s panes
    # (a batch spans 1-4 s of event time): under a fifth of the rows; without local=True all 6,000
    assert 0 < crossed < SPLITS * PER_SPLIT / 5


def test_late_rows_come_out_as_late_partials(tmp_path):
    """One split in order, then a batch 100 s behind it (as in test_columnar_time): its rows
    are certainly late, and reach .late() as one partial row per (key, pane) of the batch,
    with the pane's newest time."""
    def split(s, offset):
        ordered = [pa.record_batch({"k": ["a"] * 50, "ts": [200.0 + i * 0.1 for i in range(b, b + 50)],
                                    "v": [1] * 50}, schema=SCHEMA) for b in range(0, 500, 50)]
        behind = pa.record_batch({"k": ["b", "b", "c"], "ts": [10.0, 11.5, 10.2], "v": [5, 6, 7]}, schema=SCHEMA)
        return iter((ordered + [behind])[offset:])

    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("cwin-local-late", parallelism=1)
    fired = (flow.source("ev", ep.sources.GeneratorSource(split, schema=SCHEMA))
             .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
             .key_by("k").window(Tumbling("10s")).aggregate("win", local=True, n=count(), total=asum("v")))
    fired.sink("out", FileSink(out, format="parquet"))
    fired.late().sink("late", FileSink(out + "-late", format="parquet"))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    expected = collections.Counter()
    for i in range(500):
        expected[("a", int((200.0 + i * 0.1) // 10 * 10 * 1_000_000))] += 1
    got = {(r["k"], round(r["window_start"].timestamp() * 1_000_000)): r["n"] for r in read_committed(out, format="parquet")}
    assert got == dict(expected)
    late = sorted((r["k"], r["ts"], r["n"], r["total"]) for r in read_committed(out + "-late", format="parquet"))
    assert late == [("b", 11.5, 2, 11), ("c", 10.2, 1, 7)]


def test_local_windows_refuse_what_they_cannot_do():
    flow = ep.Dataflow("cwin-local-bad")
    keyed = (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=1, schema=SCHEMA))
             .with_watermarks("wm", timestamp="ts").key_by("k"))
    with pytest.raises(PipelineDefinitionError, match="local=True with a ttl"):
        keyed.window(Tumbling("1s"), ttl=StateTtl("10s", time="event")).aggregate("w1", local=True, n=count())
    with pytest.raises(PipelineDefinitionError, match="event-time column 'ts'"):
        keyed.window(Tumbling("1s")).aggregate("w2", local=True, ts=amax("v"))
    with pytest.raises(PipelineDefinitionError, match="local must be True or False"):
        keyed.window(Tumbling("1s")).aggregate("w3", local="yes", n=count())


def test_keyed_by_the_column_its_watermark_reads(tmp_path):
    """``key_by("ts")`` where ``ts`` is also the event time (windows per timestamp): the
    partial rows carry one ``ts`` column, key and time at once (the pane's newest time of a
    key that is a timestamp is that timestamp). Was a run-time KeyError in ``win.local``
    ('Field "ts" exists 2 times in schema') on every attempt."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("cwin-local-ts", parallelism=2)
    (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA))
         .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
         .key_by("ts").window(Tumbling("2s")).aggregate("win", local=True, n=count(), total=asum("v"), top=amax("ts"))
         .sink("out", FileSink(out, format="parquet")))
    flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=0),
             checkpoint=ep.CheckpointConfig(interval=0.5, storage="file://" + unique_dir(tmp_path, "c")))
    spec, expected = Tumbling("2s").spec(), collections.defaultdict(lambda: [0, 0])
    for _, t, v in (event(s, i) for s in range(SPLITS) for i in range(PER_SPLIT)):
        (start,) = spec.window_starts(round(t * 1_000_000))
        expected[(t, start)][0] += 1
        expected[(t, start)][1] += v
    rows = read_committed(out, format="parquet")
    assert {(r["ts"], round(r["window_start"].timestamp() * 1_000_000)): [r["n"], r["total"]] for r in rows} == \
        dict(expected)
    assert all(r["top"] == r["ts"] for r in rows) and len(rows) == len(expected)
