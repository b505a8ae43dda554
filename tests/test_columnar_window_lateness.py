"""Allowed lateness on columnar windows against the record path's windows, without
processes: random out-of-order rows in random batches and watermarks (Hypothesis) go to
both operators; the late rows are the same, every (key, window) fires on both, its last
firing holds the same values, and with one row per batch the firings are the same
multiset (the record path fires again per late row, the columnar path per late batch).
A plain-Python oracle checks the record path's final values too; plus a scripted late
firing and a restore that fires a late-updated window again."""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.windows import ColumnWindowOperator
from epochal.errors import PipelineDefinitionError
from epochal.operators.base import OperatorContext
from epochal.windows import Sliding, Tumbling
from epochal.windows.functions import ReduceCombiner
from epochal.windows.operator import PaneWindowOperator

MAXP = 8
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.int64())])
ASSIGNERS = {"tumbling": Tumbling("0.01s"), "sliding": Sliding("0.01s", "0.005s"),  # 10 ms, every 5 ms
             # a slide that does not divide the size: a pane is in 2 or 3 windows (the columnar path
             # fired only size // slide of them: windows went missing)
             "sliding-uneven": Sliding("0.01s", "0.004s")}
LATENESS = 7_000  # µs


def _spec(assigner, lateness=LATENESS):
    flow = ep.Dataflow("cw-late")
    (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0}]))
         .to_batches("b", SCHEMA)
         .with_watermarks("wm", timestamp="ts", timestamp_unit="us")
         .key_by("k").window(assigner, allowed_lateness=f"{lateness // 1000}ms")
         .aggregate("w", n=count(), s=asum("v")))
    return flow._nodes["w"].payload


def _ctx(backend):
    return OperatorContext("w", "w[0]", 0, 1, 0, "cw-late", MAXP, keyed_backend=backend, key_groups=range(MAXP))


def columnar_op(assigner, backend=None):
    op = ColumnWindowOperator(_ctx(backend or HeapStateBackend(range(MAXP))), _spec(assigner))
    op.restore(None)
    return op


def record_op(assigner):
    op = PaneWindowOperator(_ctx(HeapStateBackend(range(MAXP))), lambda r: r["k"], assigner.spec(),
                            ReduceCombiner(lambda a, b: {"k": a["k"], "n": a["n"] + b["n"], "s": a["s"] + b["s"]}),
                            LATENESS, True, False)
    op.restore(None)
    return op


def columnar_firings(batches) -> list:
    return [(r["k"], round(r["window_start"].timestamp() * 1e6), r["n"], r["s"]) for b in batches
            for r in b.to_pylist()]


def record_firings(results) -> list:
    return [(r.key, round(r.start * 1e6), r.value["n"], r.value["s"]) for r in results]


# a step: a batch of (key, v, ts) rows, or a watermark (an int)
rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9), st.integers(0, 60_000)),
                min_size=1, max_size=6)
steps = st.lists(st.one_of(rows, st.integers(0, 70_000)), min_size=1, max_size=25)


def run_both(assigner, script):
    col, rec = columnar_op(assigner), record_op(assigner)
    col_out, rec_out, col_late, rec_late = [], [], [], []
    mark = -1
    for step in script:
        if isinstance(step, int):
            if step <= mark:  # the runtime hands an operator rising watermarks only
                continue
            mark = step
            col_out += col.on_watermark(step)
            rec_out += rec.on_watermark(step)
        else:
            batch = pa.record_batch([pa.array(c) for c in zip(*step)], schema=SCHEMA)
            col_out += col.process_batch([batch])
            rec_out += rec.process_batch([(ts, {"k": k, "n": 1, "s": v}) for k, v, ts in step])
        col_late += [(r["k"], r["v"], r["ts"]) for b in col.side_output["late"] for r in b.to_pylist()]
        rec_late += [(ts, r["k"], r["s"]) for ts, r in rec.side_output["late"]]
        col.side_output["late"].clear()
        rec.side_output["late"].clear()
    end = 10 ** 9  # the end of input: every window fires
    col_out += col.on_watermark(end)
    rec_out += rec.on_watermark(end)
    return columnar_firings(col_out), record_firings(rec_out), col_late, [(k, s, ts) for ts, k, s in rec_late]


def last_firings(firings) -> dict:
    """(key, start) → the values of its last firing (the one with the most rows)."""
    out = {}
    for k, start, n, s in firings:
        if n >= out.get((k, start), (0, 0))[0]:
            out[(k, start)] = (n, s)
    return out


def oracle(assigner, script) -> tuple[dict, list]:
    """Plain Python: ``({(key, start): (rows, sum)}, late rows)`` — a row counts in each of
    its windows that had not expired (``end - 1 + lateness > watermark``) when it came; a
    row none of whose windows is left is late."""
    spec, out, late, mark = assigner.spec(), collections.defaultdict(lambda: [0, 0]), [], -1
    for step in script:
        if isinstance(step, int):
            mark = max(mark, step)
            continue
        for k, v, ts in step:
            alive = [s for s in spec.window_starts(ts) if s + spec.size - 1 + LATENESS > mark]
            if not alive:
                late.append((k, v, ts))
            for start in alive:
                out[(k, start)][0] += 1
                out[(k, start)][1] += v
    return {kw: tuple(nv) for kw, nv in out.items()}, late


@pytest.mark.parametrize("kind", sorted(ASSIGNERS))
@settings(max_examples=25, deadline=None)
@given(script=steps)
@example(script=[[("a", 1, 5_000)], 30_000, [("a", 2, 9_000)], 40_000, [("a", 3, 9_500)]])  # late firing, then late
def test_late_rows_and_late_firings_equal_the_record_paths(kind, script):
    assigner = ASSIGNERS[kind]
    col, rec, col_late, rec_late = run_both(assigner, script)
    expected, late = oracle(assigner, script)
    assert sorted(col_late) == sorted(rec_late) == sorted(late)
    assert last_firings(col) == last_firings(rec) == expected
    assert set((k, s) for k, s, _, _ in col) == set((k, s) for k, s, _, _ in rec)


@pytest.mark.parametrize("kind", sorted(ASSIGNERS))
@settings(max_examples=15, deadline=None)
@given(script=steps)
def test_with_one_row_per_batch_the_firings_are_the_record_paths(kind, script):
    single = []
    for step in script:
        single += [step] if isinstance(step, int) else [[r] for r in step]
    col, rec, _, _ = run_both(ASSIGNERS[kind], single)
    assert collections.Counter(col) == collections.Counter(rec)


def test_a_late_row_fires_its_window_again_and_a_row_past_the_lateness_is_late():
    op = columnar_op(Tumbling("0.01s"))
    first = [("a", 1, 2_000), ("a", 2, 3_000)]
    assert op.process_batch([pa.record_batch([pa.array(c) for c in zip(*first)], schema=SCHEMA)]) == []
    assert columnar_firings(op.on_watermark(10_000)) == [("a", 0, 2, 3)]  # end - 1 = 9 999 passed
    late = pa.record_batch([pa.array(["a"]), pa.array([5]), pa.array([4_000])], schema=SCHEMA)
    assert columnar_firings(op.process_batch([late])) == [("a", 0, 3, 8)]  # within 7 ms: fires again, updated
    assert op.side_output["late"] == []
    op.on_watermark(16_999)  # 9 999 + 7 000: the window expired
    assert op.process_batch([late]) == [] and op.side_output["late"][0].num_rows == 1
    op.on_watermark(20_000)  # the next window end: the expired panes are deleted with it
    assert not op.blocks


def test_a_restored_window_fires_again_when_rows_of_it_are_replayed():
    """The checkpoint holds the fired window; rows replayed after the restore (they came
    after the checkpoint, late) fire it again, updated, at the first watermark — the
    restored ``fired`` says it fired before."""
    backend = HeapStateBackend(range(MAXP), snapshot_mode="thread")
    op = columnar_op(Tumbling("0.01s"), backend)
    op.process_batch([pa.record_batch([pa.array(["a"]), pa.array([1]), pa.array([2_000])], schema=SCHEMA)])
    assert columnar_firings(op.on_watermark(12_000)) == [("a", 0, 1, 1)]
    op.prepare_snapshot_pre_barrier(1)
    blob = backend.snapshot(1).run()
    restored_backend = HeapStateBackend(range(MAXP), snapshot_mode="thread")
    restored_backend.restore([blob])
    again = ColumnWindowOperator(_ctx(restored_backend), _spec(Tumbling("0.01s")))
    again.restore(None)
    replayed = pa.record_batch([pa.array(["a"]), pa.array([4]), pa.array([3_000])], schema=SCHEMA)
    assert again.process_batch([replayed]) == []  # no watermark yet: buffered
    assert columnar_firings(again.on_watermark(12_000)) == [("a", 0, 2, 5)]


def test_lateness_with_a_ttl_is_refused_at_build_time():
    flow = ep.Dataflow("cw-late-ttl")
    keyed = (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0}])).to_batches("b", SCHEMA)
             .with_watermarks("wm", timestamp="ts", timestamp_unit="us").key_by("k"))
    with pytest.raises(PipelineDefinitionError, match=r"window 'w': allowed_lateness with a ttl is not supported"):
        keyed.window(Tumbling("1s"), allowed_lateness="1s", ttl=ep.StateTtl(5, time="event")).aggregate(
            "w", n=count())
