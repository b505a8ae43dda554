"""Session windows of Arrow batches (epochal/columnar/sessions.py) against the record path's
session windows and a plain-Python oracle, without processes: random out-of-order rows of
three keys in random batches, with random watermarks between them (late rows included), go
to both operators (Hypothesis). Without lateness the firings are the same multiset on both
and the oracle's, and the late rows the same rows; with lateness the late rows are the same,
and every final session's last firing holds the oracle's values (the columnar path fires a
late-extended session again once per batch, the record path once per row) — with one row per
batch the firings are the same multiset. Plus a restore rescaled to two subtasks, and the
build-time refusals."""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.sessions import ColumnSessionOperator
from epochal.errors import PipelineDefinitionError
from epochal.operators.base import OperatorContext
from epochal.windows import Session
from epochal.windows.functions import ReduceCombiner
from epochal.windows.operator import SessionWindowOperator

MAXP = 8
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.int64())])
GAP = 5_000  # µs
LATENESS = 7_000  # µs


def _spec(lateness):
    flow = ep.Dataflow("cs")
    (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0}]))
         .to_batches("b", SCHEMA)
         .with_watermarks("wm", timestamp="ts", timestamp_unit="us")
         .key_by("k").window(Session(f"{GAP / 1e6}s"), allowed_lateness=f"{lateness // 1000}ms")
         .aggregate("w", n=count(), s=asum("v")))
    return flow._nodes["w"].payload


def _ctx(backend, key_groups=range(MAXP), index=0, parallelism=1):
    return OperatorContext("w", f"w[{index}]", index, parallelism, 0, "cs", MAXP, keyed_backend=backend,
                           key_groups=key_groups)


def columnar_op(lateness, backend=None, key_groups=range(MAXP)):
    op = ColumnSessionOperator(_ctx(backend or HeapStateBackend(key_groups), key_groups), _spec(lateness))
    op.restore(None)
    return op


def record_op(lateness):
    op = SessionWindowOperator(_ctx(HeapStateBackend(range(MAXP))), lambda r: r["k"], Session(GAP / 1e6).spec(),
                               ReduceCombiner(lambda a, b: {"k": a["k"], "n": a["n"] + b["n"], "s": a["s"] + b["s"]}),
                               lateness, True, False)
    op.restore(None)
    return op


def columnar_firings(batches) -> list:
    return [(r["k"], round(r["window_start"].timestamp() * 1e6), round(r["window_end"].timestamp() * 1e6),
             r["n"], r["s"]) for b in batches for r in b.to_pylist()]


def record_firings(results) -> list:
    return [(r.key, round(r.start * 1e6), round(r.end * 1e6), r.value["n"], r.value["s"]) for r in results]


def _batch(step):
    return pa.record_batch([pa.array(c) for c in zip(*step)], schema=SCHEMA)


# a step: a batch of (key, v, ts) rows, or a watermark (an int)
# times on a 1 ms grid (GAP is 5 of it), so sessions often touch exactly (``start == end``)
# and watermarks often sit on an ``end - 1`` or just past it
times = st.integers(0, 60).map(lambda t: t * 1_000)
rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9), times), min_size=1, max_size=8)
marks = st.tuples(st.integers(0, 70), st.sampled_from([-1, 0, 1])).map(lambda m: m[0] * 1_000 + m[1])
steps = st.lists(st.one_of(rows, marks), min_size=1, max_size=25)


def run_both(lateness, script):
    col, rec = columnar_op(lateness), record_op(lateness)
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
            col_out += col.process_batch([_batch(step)])
            rec_out += rec.process_batch([(ts, {"k": k, "n": 1, "s": v}) for k, v, ts in step])
        col_late += [(r["k"], r["v"], r["ts"]) for b in col.side_output["late"] for r in b.to_pylist()]
        rec_late += [(r["k"], r["s"], ts) for ts, r in rec.side_output["late"]]
        col.side_output["late"].clear()
        rec.side_output["late"].clear()
    end = 10 ** 9  # the end of input: every session fires
    col_out += col.on_watermark(end)
    rec_out += rec.on_watermark(end)
    return columnar_firings(col_out), record_firings(rec_out), col_late, rec_late


def oracle(lateness, script):
    """Plain Python, row by row in arrival order: ``(firings, late rows, final sessions)``.
    A key's sessions are ``[start, end, rows, sum, pending]`` lists; a row's interval
    ``[t, t + GAP]`` swallows every session it overlaps or touches, transitively; if the
    result ends by ``watermark + 1 - lateness`` the row is late and nothing changes. A
    session past the watermark fires at once (a late firing), else when the watermark
    passes ``end - 1``; it is forgotten once ``end - 1 + lateness <= watermark``."""
    sessions, fired, late, final, mark = collections.defaultdict(list), [], [], {}, -1

    def advance(w):
        for k, ss in sessions.items():
            for s in ss:
                if s[4] and s[1] - 1 <= w:
                    fired.append((k, s[0], s[1], s[2], s[3]))
                    s[4] = False
            for s in ss:
                if s[1] - 1 + lateness <= w:
                    final[(k, s[0], s[1])] = (s[2], s[3])
            sessions[k] = [s for s in ss if s[1] - 1 + lateness > w]

    for step in script:
        if isinstance(step, int):
            if step > mark:
                mark = step
                advance(mark)
            continue
        for k, v, ts in step:
            lo, hi, n, total, swallowed = ts, ts + GAP, 1, v, []
            grew = True
            while grew:
                grew = False
                for s in sessions[k]:
                    if s not in swallowed and s[0] <= hi and s[1] >= lo:
                        swallowed.append(s)
                        lo, hi, grew = min(lo, s[0]), max(hi, s[1]), True
            if hi - 1 + lateness <= mark:
                late.append((k, v, ts))
                continue
            n += sum(s[2] for s in swallowed)
            total += sum(s[3] for s in swallowed)
            sessions[k] = [s for s in sessions[k] if s not in swallowed] + [[lo, hi, n, total, True]]
            if hi - 1 <= mark:
                fired.append((k, lo, hi, n, total))
                sessions[k][-1][4] = False
    advance(10 ** 9)
    return fired, late, final


@settings(max_examples=40, deadline=None)
@given(script=steps)
@example(script=[20_000, [("a", 1, 13_000), ("a", 2, 16_000)]])  # the first is late only because it came first
@example(script=[[("a", 1, 0), ("a", 2, 12_000)], [("a", 3, 6_000)]])  # a row bridging two sessions
def test_sessions_equal_the_record_paths_and_the_oracles(script):
    col, rec, col_late, rec_late = run_both(0, script)
    expected, late, _ = oracle(0, script)
    assert sorted(col_late) == sorted(rec_late) == sorted(late)
    assert collections.Counter(col) == collections.Counter(rec) == collections.Counter(expected)


def final_firings(firings, final) -> dict:
    """(key, start, end) of each final session → the values of its last firing."""
    out = {}
    for k, s, e, n, total in firings:
        if (k, s, e) in final:
            out[(k, s, e)] = (n, total)
    return out


@settings(max_examples=40, deadline=None)
@given(script=steps)
@example(script=[[("a", 1, 5_000)], 12_000, [("a", 2, 9_000)], 30_000, [("a", 3, 9_500)]])  # late firing, late
def test_with_lateness_late_rows_and_final_sessions_equal_the_record_paths(script):
    col, rec, col_late, rec_late = run_both(LATENESS, script)
    expected, late, final = oracle(LATENESS, script)
    assert sorted(col_late) == sorted(rec_late) == sorted(late)
    assert final_firings(col, final) == final_firings(rec, final) == final
    assert collections.Counter(rec) == collections.Counter(expected)


@settings(max_examples=25, deadline=None)
@given(script=steps)
def test_with_lateness_and_one_row_per_batch_the_firings_are_the_record_paths(script):
    single = []
    for step in script:
        single += [step] if isinstance(step, int) else [[r] for r in step]
    col, rec, _, _ = run_both(LATENESS, single)
    expected, _, _ = oracle(LATENESS, single)
    assert collections.Counter(col) == collections.Counter(rec) == collections.Counter(expected)


def test_a_late_row_extends_a_fired_session_and_it_fires_again():
    op = columnar_op(LATENESS)
    assert op.process_batch([_batch([("a", 1, 1_000), ("a", 2, 4_000)])]) == []
    assert columnar_firings(op.on_watermark(9_000)) == [("a", 1_000, 9_000, 2, 3)]  # end - 1 = 8 999 passed
    assert columnar_firings(op.process_batch([_batch([("a", 5, 500)])])) == [("a", 500, 9_000, 3, 8)]
    op.on_watermark(15_999)  # 8 999 + 7 000: expired and deleted
    assert not op.blocks
    assert op.process_batch([_batch([("a", 7, 600)])]) == [] and op.side_output["late"][0].num_rows == 1


def test_a_restore_rescaled_to_two_subtasks_goes_on_as_one_would():
    """Sessions open at a checkpoint, restored into two subtasks of half the key groups each,
    merge with the rows after it as one operator's would; a session that fired before the
    checkpoint does not fire again."""
    first = [("a", 1, 1_000), ("b", 2, 2_000), ("c", 3, 3_000), ("d", 4, 20_000), ("e", 5, 21_000)]
    after = [("a", 10, 12_000), ("b", 20, 30_000), ("d", 40, 23_000), ("e", 50, 40_000), ("f", 60, 41_000)]
    whole = columnar_op(0)
    out = whole.process_batch([_batch(first)]) + whole.on_watermark(10_000)
    before = columnar_firings(out)
    assert sorted(before) == [("a", 1_000, 6_000, 1, 1), ("b", 2_000, 7_000, 1, 2), ("c", 3_000, 8_000, 1, 3)]
    backend = HeapStateBackend(range(MAXP), snapshot_mode="thread")
    reference = columnar_op(0, backend)
    reference.process_batch([_batch(first)])
    reference.on_watermark(10_000)
    blob = backend.snapshot(1).run()
    halves = []
    for kgs in (range(0, MAXP // 2), range(MAXP // 2, MAXP)):
        b = HeapStateBackend(kgs, snapshot_mode="thread")
        b.restore([blob])
        halves.append(columnar_op(0, b, kgs))
    rescaled = []
    for op in halves:
        mine = [r for r in after if op.groups.of_values([r[0]])[0] in op.ctx.key_groups]
        if mine:
            rescaled += op.process_batch([_batch(mine)])
        rescaled += op.on_watermark(10 ** 9)
    expected = whole.process_batch([_batch(after)]) + whole.on_watermark(10 ** 9)
    assert sorted(columnar_firings(rescaled)) == sorted(columnar_firings(expected))
    assert ("d", 20_000, 28_000, 2, 44) in columnar_firings(rescaled)  # merged across the restore
    assert not any(f[0] in "abc" and f[1] < 4_000 for f in columnar_firings(rescaled))  # fired before: not again


def test_session_windows_refuse_a_ttl_and_local_at_build_time():
    flow = ep.Dataflow("cs-refuse")
    keyed = (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0}])).to_batches("b", SCHEMA)
             .with_watermarks("wm", timestamp="ts", timestamp_unit="us").key_by("k"))
    with pytest.raises(PipelineDefinitionError, match=r"window 'w': session windows of Arrow batches take no ttl; "
                                                      r"use to_records\(\.\.\.\) and the record path"):
        keyed.window(Session("1s"), ttl=ep.StateTtl(5, time="event")).aggregate("w", n=count())
    with pytest.raises(PipelineDefinitionError, match=r"window 'w2': local=True is for Tumbling and Sliding"):
        keyed.window(Session("1s")).aggregate("w2", n=count(), local=True)
