"""Selections (``arg_max``, ``last`` by event time, ``top_k``, ``count_distinct``) and a
user aggregation over Arrow batches (``aggregate_batches``) in running jobs, against
plain-Python oracles through a crash: columnar windows (tumbling and sliding, with and
without the partial aggregate before the shuffle, both backends) and keyed aggregates; and
the build-time errors of what they need."""
from __future__ import annotations

import collections
import random

import cloudpickle
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import epochal as ep
from epochal.columnar import (ColumnAggregateFunction, aggregate, aggregate_batches, approx_count_distinct, arg_max,
                              count, count_distinct, first, last, top_k)
from epochal.errors import PipelineDefinitionError
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.windows import Sliding, Tumbling

from pipelines import unique_dir

import test_columnar_time
from test_columnar_time import KEYS, PER_SPLIT, SCHEMA, SPLITS, batches, event

cloudpickle.register_pickle_by_value(test_columnar_time)


class Range:
    """(lowest, highest) of ``v`` per key: a user aggregation over Arrow batches."""

    acc_type = pa.struct([("lo", pa.int64()), ("hi", pa.int64())])

    def add(self, batch):
        m = pc.min_max(batch["v"]).as_py()
        return {"lo": m["min"], "hi": m["max"]}

    def merge(self, a, b):
        return {"lo": min(a["lo"], b["lo"]), "hi": max(a["hi"], b["hi"])}

    def result(self, acc):
        return acc["hi"] - acc["lo"]



def aggs():
    # arg_max("v", "ts"): the highest v, ties to the earliest time; last("v"): by the stream's event time
    return dict(n=count(), best=arg_max("v", "ts"), latest=last("v"), top=top_k("v", 3), d=count_distinct("v"),
                span=aggregate_batches(Range(), "v"), approx=approx_count_distinct("v"))


def summary(rows) -> tuple:
    """Plain Python: the values of :func:`aggs` over ``(t, v)`` rows."""
    vs = [v for _, v in rows]
    best, newest = max(vs), max(t for t, _ in rows)
    return (len(rows), min(t for t, v in rows if v == best), min(v for t, v in rows if t == newest),
            sorted(vs, reverse=True)[:3], len(set(vs)), max(vs) - min(vs), len(set(vs)))


# the windows' input: two splits (one per source subtask) on one clock, out of order by < 0.5 s
W_SPLITS, W_ROWS, W_PER_SPLIT = 2, 100, 2000


def w_event(split: int, i: int) -> tuple:
    g = i * W_SPLITS + split
    return f"k{g % KEYS}", i * 0.005 - random.Random(g).random() * 0.5, g % 10


def w_batches(split: int, offset: int):
    for start in range(offset * W_ROWS, W_PER_SPLIT, W_ROWS):
        rows = [w_event(split, i) for i in range(start, min(W_PER_SPLIT, start + W_ROWS))]
        yield pa.record_batch([pa.array(c) for c in zip(*rows)], schema=SCHEMA)


def window_oracle(assigner) -> dict:
    spec, out = assigner.spec(), collections.defaultdict(list)
    for k, t, v in (w_event(s, i) for s in range(W_SPLITS) for i in range(W_PER_SPLIT)):
        for start in spec.window_starts(round(t * 1_000_000)):
            out[(k, start)].append((t, v))
    return {kw: summary(rows) for kw, rows in out.items()}


def windows(name, out, assigner, local):
    flow = ep.Dataflow(name, parallelism=2)
    fired = (flow.source("ev", ep.sources.GeneratorSource(w_batches, num_splits=W_SPLITS, schema=SCHEMA,
                                                          records_per_second=15.0))
             .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
             .key_by("k").window(assigner).aggregate("win", local=local, **aggs()))
    fired.sink("out", FileSink(out, format="parquet"))
    fired.late().sink("late", FileSink(out + "-late", format="parquet"))
    return flow


def _row(r) -> tuple:
    # approx: the estimate of at most ten values 0..9 is exact (fixed hashes: never flaky)
    return (r["n"], r["best"], r["latest"], r["top"], r["d"], r["span"], r["approx"])


@pytest.mark.parametrize("assigner,backend,local", [(Tumbling("2s"), "heap", False),
                                                    (Sliding("3s", "1s"), "rocksdb", True)],
                         ids=["tumbling-heap", "sliding-rocksdb-local"])
def test_windows_of_selections_equal_the_oracle_through_a_crash(tmp_path, assigner, backend, local):
    out = unique_dir(tmp_path, "out")
    fault = CrashAtRecord("win", subtask=1, record=20, how="exit", after_epoch=2)
    result = windows("cwin-select", out, assigner, local).run(
        runtime="local", backend=backend, faults=[fault],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures  # the crash fired mid-run
    rows = read_committed(out, format="parquet")
    got = collections.Counter((r["k"], round(r["window_start"].timestamp() * 1_000_000)) for r in rows)
    assert max(got.values()) == 1  # every window fired once for its key
    assert {(r["k"], round(r["window_start"].timestamp() * 1_000_000)): _row(r) for r in rows} == \
        window_oracle(assigner)
    assert read_committed(out + "-late", format="parquet") == []


def test_keyed_selections_are_exactly_once_through_a_crash(tmp_path):
    """Each emission of a key is its values over a prefix of its rows (``n`` orders them):
    no emission twice, and the last one is the oracle's over every row."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("cagg-select", parallelism=2)
    (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA, records_per_second=10.0))
        .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
        .key_by("k").aggregate("agg", **aggs())
        .sink("out", FileSink(out, format="parquet")))
    fault = CrashAtRecord("agg.local", subtask=0, record=10, how="exit", after_epoch=2)  # every batch passes it
    result = flow.run(runtime="local", faults=[fault],
                      checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    rows = read_committed(out, format="parquet")
    emitted = collections.Counter((r["k"], r["n"]) for r in rows)
    assert max(emitted.values()) == 1, [e for e, n in emitted.items() if n > 1][:5]
    final = {}
    for r in rows:
        if r["n"] > final.get(r["k"], (0,))[0]:
            final[r["k"]] = _row(r)
    by_key = collections.defaultdict(list)
    for k, t, v in (event(s, i) for s in range(SPLITS) for i in range(PER_SPLIT)):
        by_key[k].append((t, v))
    assert final == {k: summary(rs) for k, rs in by_key.items()}


# ------------------------------------------------------------------ build-time errors
class PerKey(ColumnAggregateFunction):
    def create(self):
        return 0

    def add(self, acc, values):
        return acc + len(values)

    def merge(self, a, b):
        return a + b


def _events(flow, timed=True):
    stream = flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA))
    return stream.with_watermarks("wm", timestamp="ts") if timed else stream


def test_first_without_event_time_and_per_key_functions_in_windows_fail_at_build_time():
    with pytest.raises(PipelineDefinitionError, match=r"aggregate 'agg': first/last: needs one event-time "
                                                      r"column; found none .*with_watermarks"):
        _events(ep.Dataflow("e1"), timed=False).key_by("k").aggregate("agg", f=first("v"))
    with pytest.raises(PipelineDefinitionError, match=r"window 'win': n= is a ColumnAggregateFunction .*"
                                                      r"aggregate_batches\(fn, columns\)"):
        _events(ep.Dataflow("e2")).key_by("k").window(Tumbling("1s")).aggregate("win", n=aggregate("v", PerKey()))
