"""Processing-time windows of Arrow batches (epochal/columnar/processing_windows.py) against
the record path's processing-time windows and a plain-Python oracle, with an injected clock
(no sleeps): random batches of three keys between random clock steps (Hypothesis) go to both
operators, each woken only when its own ``next_processing_time`` is due, as a task does; the
windows fire at the same step with the same rows on both and in the oracle. Plus a restore
(a window that ended while the job was down fires at the first timer; one that fired before
the checkpoint does not fire again) and the build-time refusals."""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
import epochal.windows.operator as record_windows
from epochal.backends.heap import HeapStateBackend
from epochal.columnar import count, first, sum as asum
from epochal.columnar.processing_windows import ColumnProcessingWindowOperator
from epochal.errors import PipelineDefinitionError
from epochal.operators.base import OperatorContext
from epochal.time.units import MAX_TIME
from epochal.windows import Sliding, Tumbling
from epochal.windows.functions import ReduceCombiner
from epochal.windows.operator import PaneWindowOperator

MAXP = 8
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
ASSIGNERS = {"tumbling": lambda: Tumbling("0.01s", processing_time=True),
             "sliding": lambda: Sliding("0.01s", "0.004s", processing_time=True)}
T0 = 1_700_000_000_000_000  # µs: the injected clock's start


def _spec(assigner):
    flow = ep.Dataflow("cpw")
    (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1}]))
         .to_batches("b", SCHEMA)
         .key_by("k").window(assigner).aggregate("w", n=count(), s=asum("v")))
    return flow._nodes["w"].payload


def _ctx(backend):
    return OperatorContext("w", "w[0]", 0, 1, 0, "cpw", MAXP, keyed_backend=backend, key_groups=range(MAXP))


def columnar_op(assigner, clock, backend=None):
    op = ColumnProcessingWindowOperator(_ctx(backend or HeapStateBackend(range(MAXP))), _spec(assigner))
    op.clock = clock
    op.restore(None)
    return op


def record_op(assigner):
    op = PaneWindowOperator(_ctx(HeapStateBackend(range(MAXP))), lambda r: r["k"], assigner.spec(),
                            ReduceCombiner(lambda a, b: {"k": a["k"], "n": a["n"] + b["n"], "s": a["s"] + b["s"]}),
                            0, False, False)
    op.restore(None)
    return op


def _batch(rows):
    return pa.record_batch([pa.array(c) for c in zip(*rows)], schema=SCHEMA)


def wake(op, now) -> list:
    """What a task does at wall clock ``now``: wake the operator if its timer is due."""
    due = op.next_processing_time()
    return op.on_processing_time(now) if due is not None and now >= due else []


# a step: a batch of (key, v) rows at the clock, or the clock moving on by that many µs
rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9)), min_size=1, max_size=6)
# small steps too: a timer due a slide late shows only when the clock stops in between
ticks = st.one_of(st.integers(0, 15_000), st.integers(1, 4_000))
steps = st.lists(st.one_of(rows, ticks), min_size=1, max_size=40)


def run_both(assigner, script, monkeypatch):
    clock = [T0]
    monkeypatch.setattr(record_windows, "now_micros", lambda: clock[0])
    col, rec = columnar_op(assigner, lambda: clock[0]), record_op(assigner)
    col_out, rec_out = [], []
    for i, step in enumerate(script):
        if isinstance(step, int):
            clock[0] += step
            col_out += [(i, r["k"], round(r["window_start"].timestamp() * 1e6), r["n"], r["s"])
                        for b in wake(col, clock[0]) for r in b.to_pylist()]
            rec_out += [(i, r.key, round(r.start * 1e6), r.value["n"], r.value["s"]) for r in wake(rec, clock[0])]
        else:
            assert col.process_batch([_batch(step)]) == []
            assert rec.process_batch([{"k": k, "n": 1, "s": v} for k, v in step]) == []
    end = len(script)  # the end of input: every open window fires
    col_out += [(end, r["k"], round(r["window_start"].timestamp() * 1e6), r["n"], r["s"])
                for b in col.on_watermark(MAX_TIME) for r in b.to_pylist()]
    rec_out += [(end, r.key, round(r.start * 1e6), r.value["n"], r.value["s"]) for r in rec.on_watermark(MAX_TIME)]
    return col_out, rec_out


def oracle(assigner, script) -> list:
    """Plain Python: a batch's rows go into every window holding the clock when it came; a
    window fires at the first clock step reaching its ``end - 1`` (else at the end)."""
    spec, clock, open_, out = assigner.spec(), T0, {}, []
    for i, step in enumerate(script):
        if isinstance(step, int):
            clock += step
            for (k, start), (n, s) in sorted(open_.items()):
                if start + spec.size - 1 <= clock:
                    out.append((i, k, start, n, s))
                    del open_[(k, start)]
            continue
        for k, v in step:
            for start in spec.window_starts(clock):
                n, s = open_.get((k, start), (0, 0))
                open_[(k, start)] = (n + 1, s + v)
    return out + [(len(script), k, start, n, s) for (k, start), (n, s) in open_.items()]


@pytest.mark.parametrize("kind", sorted(ASSIGNERS))
@settings(max_examples=30, deadline=None)
@given(script=steps)
def test_processing_time_windows_fire_when_the_record_paths_do(kind, script):
    with pytest.MonkeyPatch.context() as monkeypatch:
        col, rec = run_both(ASSIGNERS[kind](), script, monkeypatch)
    assert collections.Counter(col) == collections.Counter(rec) == collections.Counter(oracle(ASSIGNERS[kind](),
                                                                                             script))


def test_a_restore_fires_what_ended_while_down_and_not_what_fired_before():
    clock = [T0 - T0 % 10_000]  # a window start
    backend = HeapStateBackend(range(MAXP), snapshot_mode="thread")
    op = columnar_op(ASSIGNERS["tumbling"](), lambda: clock[0], backend)
    op.process_batch([_batch([("a", 1), ("b", 2)])])
    clock[0] += 10_000
    assert sorted(r["k"] for b in wake(op, clock[0]) for r in b.to_pylist()) == ["a", "b"]  # the first window
    op.process_batch([_batch([("a", 5)])])  # the second window
    op.prepare_snapshot_pre_barrier(1)
    blob = backend.snapshot(1).run()
    restored = HeapStateBackend(range(MAXP), snapshot_mode="thread")
    restored.restore([blob])
    clock[0] += 60_000  # down for a while
    again = columnar_op(ASSIGNERS["tumbling"](), lambda: clock[0], restored)
    fired = [(r["k"], round(r["window_start"].timestamp() * 1e6), r["n"], r["s"])
             for b in wake(again, clock[0]) for r in b.to_pylist()]
    assert fired == [("a", T0 - T0 % 10_000 + 10_000, 1, 5)]
    assert again.on_watermark(MAX_TIME) == [] and not again.blocks


def test_processing_time_windows_refuse_late_output_lateness_and_a_ttl_at_build_time():
    flow = ep.Dataflow("cpw-refuse")
    keyed = flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1}])).to_batches("b", SCHEMA).key_by("k")
    out = keyed.window(Tumbling("1s", processing_time=True)).aggregate("w", n=count())
    with pytest.raises(PipelineDefinitionError, match="window 'w': processing-time windows have no late records"):
        out.late()
    with pytest.raises(PipelineDefinitionError, match="w2': allowed_lateness applies to event-time windows only"):
        keyed.window(Tumbling("1s", processing_time=True), allowed_lateness="1s").aggregate("w2", n=count())
    with pytest.raises(PipelineDefinitionError, match="w3': processing-time windows of Arrow batches take no ttl; "
                                                      r"use to_records\(\.\.\.\) and the record path"):
        keyed.window(Tumbling("1s", processing_time=True), ttl=ep.StateTtl(5)).aggregate("w3", n=count())
    with pytest.raises(PipelineDefinitionError, match="w4': first/last order rows by event time"):
        keyed.window(Tumbling("1s", processing_time=True)).aggregate("w4", f=first("v"))
    with pytest.raises(PipelineDefinitionError, match="w5' uses event time but its input has none"):
        keyed.window(Tumbling("1s")).aggregate("w5", n=count())
