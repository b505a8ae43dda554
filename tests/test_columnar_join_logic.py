"""The vectorized joins' operators (epochal/columnar/joins.py, temporal_join.py) driven
directly, against the record path's pure per-key join logic (epochal/joins/interval.py,
windowed.py, temporal.py) as the oracle: Hypothesis generates batches of both sides (out of order, late rows), watermark
steps and restarts from the operator's keyed state (heap and RocksDB), and the joined
pairs, the outer rows and the late rows must equal the oracle's as multisets."""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.columnar.join_build import join_operator
from epochal.columnar.joins import ColumnJoinOperator, ColumnJoinSpec
from epochal.columnar.time import ColumnTime
from epochal.joins import interval, temporal, windowed
from epochal.operators.base import OperatorContext
from epochal.time.units import MAX_TIME, MIN_TIME
from epochal.windows.assigners import PaneSpec, SessionSpec

MAXP = 16
KEYS = ("a", "b", "c", "d")
HOWS = {"inner": (False, False), "left": (True, False), "right": (False, True), "full": (True, True)}


def _ctx(backend) -> OperatorContext:
    return OperatorContext("j", "j[0]", 0, 1, 0, "job", MAXP, keyed_backend=backend, key_groups=range(MAXP))


def _backend(kind):
    return HeapStateBackend(range(MAXP), snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(range(MAXP))


#: the key columns' types (left, right): strings are matched by a scan of the other side's
#: buffer, integers and timestamps through its probe index (epochal/columnar/probe_index.py)
KEY_TYPES = {"string": (pa.string(), pa.string()), "int64": (pa.int64(), pa.int64()),
             "int32-int64": (pa.int32(), pa.int64())}


def _batch(side: int, rows: list, key_type: str = "string", deletions: bool = False) -> pa.RecordBatch:
    """Left rows ``(k, t, id)`` as columns k, t, id; right rows as key, t, id (the right key
    has another name, ``t`` and ``id`` collide with the left's). A key ``"a"``-``"d"`` of
    another type than a string is ``KEYS.index(k) * 7 - 9`` of it. ``deletions``: right rows
    get a column ``gone``, true for the rows :func:`_deletes`."""
    key = "k" if side == 0 else "key"
    type_ = KEY_TYPES[key_type][side]
    values = [r[0] if pa.types.is_string(type_) else KEYS.index(r[0]) * 7 - 9 for r in rows]
    columns = {key: pa.array(values, type_), "t": pa.array([r[1] for r in rows], pa.int64()),
               "id": pa.array([r[2] for r in rows], pa.int64())}
    if deletions and side == 1:
        columns["gone"] = pa.array([_deletes(r[2]) for r in rows], pa.bool_())
    return pa.record_batch(columns)


def _deletes(rid: int) -> bool:
    """Whether the temporal join's version ``rid`` deletes its key (one in four)."""
    return rid % 4 == 3


steps = st.lists(st.one_of(
    st.tuples(st.just("rows"), st.integers(0, 1),
              st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 60)), min_size=1, max_size=6)),
    st.tuples(st.just("watermark"), st.integers(1, 15)),
    st.tuples(st.just("restart"))), max_size=25)


class Oracle:
    """The record path's per-key logic, fed the same rows and watermarks."""

    def __init__(self, spec):
        self.spec, self.state, self.out, self.late = spec, collections.defaultdict(dict), collections.Counter(), []
        self.wm = MIN_TIME

    def add(self, side, k, t, rid):
        if t <= self.wm:
            self.late.append((side, rid))
            return
        st_ = self.state[k]
        if isinstance(self.spec, tuple):  # ("temporal", with deletions?)
            tables = st_.setdefault("t", [[], []])
            if side == 0:
                temporal.add_probe(tables, t, rid)
            else:
                temporal.add_version(tables, t, temporal.DELETED if self.spec[1] and _deletes(rid) else rid)
        elif isinstance(self.spec, interval.IntervalSpec):
            buffers = st_.setdefault("b", [[], []])
            self.out.update((left, right) for _, left, right in interval.add(self.spec, buffers, side, t, rid))
        else:
            windowed.add(self.spec, st_.setdefault("w", {}), side, t, rid)

    def advance(self, wm, outer):
        self.wm = wm
        for st_ in self.state.values():
            if "b" in st_:
                self.out.update((left, right) for _, left, right in interval.expire(self.spec, st_["b"], wm))
            if "t" in st_:
                self.out.update((probe, version) for _, probe, version in temporal.emit(st_["t"], wm, outer=outer[0]))
            if "w" in st_:
                for start in windowed.due(st_["w"], wm):
                    self.out.update((left, right) for _, left, right in
                                    windowed.fire(st_["w"], start, outer_left=outer[0], outer_right=outer[1]))


def _pairs(batches) -> collections.Counter:
    out = collections.Counter()
    for b in batches:
        d, none = b.to_pydict(), [None] * b.num_rows
        if "k" not in d:  # the left input had no rows at all: the right columns alone
            out.update(zip(none, d["id"]))
        else:  # no id_right: the right input had no rows at all
            out.update(zip(d["id"], d.get("id_right", none)))
    return out


def _operator(spec: ColumnJoinSpec, backend):
    op = join_operator(spec)(_ctx(backend), spec, 1)
    if spec.temporal:
        op.prune_from = 2  # prune at every doubling of the versions (the oracle keeps them all)
    op.bind_input_channels([0, 1])
    return op


def _run(spec: ColumnJoinSpec, oracle_spec, script, backend_kind, key_type: str = "string") -> None:
    backend = _backend(backend_kind)
    op = _operator(spec, backend)
    oracle = Oracle(oracle_spec)
    out, late, wm, next_id = [], [], 0, 0
    for step in script:
        if step[0] == "rows":
            side, rows = step[1], []
            for k, dt in step[2]:
                rows.append((k, wm + dt - 10, next_id))  # up to 10 behind the watermark: late rows
                oracle.add(side, k, wm + dt - 10, next_id)
                next_id += 1
            op.select_input(side)
            out += op.process_batch([_batch(side, rows, key_type, spec.deleted is not None)])
        elif step[0] == "watermark":
            wm += step[1]
            for channel in (0, 1):
                op.input_watermark(channel, wm, False)
            out += op.on_watermark(wm)
            oracle.advance(wm, spec.outer)
            if all(s is not None for s in op.schemas):  # (else outer rows may wait: _held)
                assert _pairs(out) == oracle.out, f"at watermark {wm}"  # what is due came out, no more
        else:  # the state written before a barrier, read by a new operator
            out += op.prepare_snapshot_pre_barrier(1)
            late += _late(op)
            op = _operator(spec, backend)
            op.restore(None)
    for channel in (0, 1):  # the end: everything fires or expires
        op.input_watermark(channel, MAX_TIME, False)
    out += op.on_watermark(MAX_TIME)
    oracle.advance(MAX_TIME, spec.outer)
    late += _late(op)
    assert _pairs(out) == oracle.out
    assert sorted(late) == sorted(oracle.late)
    for b in out:  # the output's columns: left ones, the right ones without its key, suffixed on collision
        if "k" in b.schema.names and "id_right" in b.schema.names:
            assert b.schema.names[:5] == ["k", "t", "id", "t_right", "id_right"]


def _late(op) -> list:
    found = []
    for side, port in enumerate(("late_left", "late_right")):
        found += [(side, i) for b in op.side_output[port] for i in b.column("id").to_pylist()]
        op.side_output[port].clear()
    return found


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, how=st.sampled_from(sorted(HOWS)), bounds=st.sampled_from([(-5, 3), (0, 0), (-10, -2), (2, 8)]),
       backend=st.sampled_from(["heap", "rocksdb"]))
@pytest.mark.parametrize("key_type", sorted(KEY_TYPES))
def test_interval_join_of_batches_equals_the_record_path(key_type, script, how, bounds, backend):
    outer = HOWS[how]
    spec = ColumnJoinSpec(("k", "key"), (ColumnTime("t", "us"), ColumnTime("t", "us")), outer,
                          lower=bounds[0], upper=bounds[1])
    _run(spec, interval.IntervalSpec(bounds[0], bounds[1], *outer), script, backend, key_type)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, how=st.sampled_from(sorted(HOWS)), panes=st.sampled_from([(10, 10), (12, 4), (10, 4)]),
       backend=st.sampled_from(["heap", "rocksdb"]))
def test_window_join_of_batches_equals_the_record_path(script, how, panes, backend):
    outer = HOWS[how]
    pane_spec = PaneSpec(*panes)
    spec = ColumnJoinSpec(("k", "key"), (ColumnTime("t", "us"), ColumnTime("t", "us")), outer, panes=pane_spec)
    _run(spec, pane_spec, script, backend)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, how=st.sampled_from(sorted(HOWS)), gap=st.sampled_from([1, 4, 12]),
       backend=st.sampled_from(["heap", "rocksdb"]), key_type=st.sampled_from(sorted(KEY_TYPES)))
@example(script=[("rows", 0, [("a", 12)]), ("rows", 1, [("a", 0)]), ("watermark", 1), ("watermark", 12)], how="full",
         gap=12, backend="heap", key_type="string")  # a session fires at exactly end - 1 (found by Hypothesis)
def test_session_window_join_of_batches_equals_the_record_path(script, how, gap, backend, key_type):
    spec = ColumnJoinSpec(("k", "key"), (ColumnTime("t", "us"), ColumnTime("t", "us")), HOWS[how], gap=gap)
    _run(spec, SessionSpec(gap), script, backend, key_type)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, how=st.sampled_from(["inner", "left"]), deletions=st.booleans(),
       backend=st.sampled_from(["heap", "rocksdb"]), key_type=st.sampled_from(sorted(KEY_TYPES)))
def test_temporal_join_of_batches_equals_the_record_path(script, how, deletions, backend, key_type):
    spec = ColumnJoinSpec(("k", "key"), (ColumnTime("t", "us"), ColumnTime("t", "us")), HOWS[how], temporal=True,
                          deleted="gone" if deletions else None)
    _run(spec, ("temporal", deletions), script, backend, key_type)


def test_window_output_carries_the_window_and_the_key_of_either_side():
    spec = ColumnJoinSpec(("k", "key"), (ColumnTime("t", "us"), ColumnTime("t", "us")), (True, True),
                          panes=PaneSpec(10, 10))
    op = ColumnJoinOperator(_ctx(_backend("heap")), spec, 1)
    op.bind_input_channels([0, 1])
    op.select_input(0)
    op.process_batch([_batch(0, [("a", 3, 1)])])
    op.select_input(1)
    op.process_batch([_batch(1, [("b", 5, 2), ("a", 12, 3)])])
    rows = [r for b in op.on_watermark(100) for r in b.to_pylist()]
    got = sorted(((r["k"], r["id"], r["id_right"], r["window_start"].timestamp() * 1e6,
                   r["window_end"].timestamp() * 1e6) for r in rows), key=str)
    assert got == [("a", 1, None, 0, 10), ("a", None, 3, 10, 20), ("b", None, 2, 0, 10)]


@pytest.mark.parametrize("how", ["inner", "full"])
def test_interval_pairs_come_out_when_the_second_row_arrives(how):
    spec = ColumnJoinSpec(("k", "key"), (ColumnTime("t", "us"), ColumnTime("t", "us")), HOWS[how], lower=-5, upper=5)
    op = ColumnJoinOperator(_ctx(_backend("heap")), spec, 1)
    op.bind_input_channels([0, 1])
    op.select_input(0)
    assert op.process_batch([_batch(0, [("a", 10, 1), ("a", 30, 2)])]) == []
    op.select_input(1)
    out = op.process_batch([_batch(1, [("a", 14, 3), ("a", 16, 4)])])
    assert _pairs(out) == collections.Counter({(1, 3): 1})
    assert _pairs(op.on_watermark(100)) == (collections.Counter({(2, None): 1, (None, 4): 1}) if how == "full"
                                            else collections.Counter())
