"""Incremental snapshots of the columnar joins' buffers (epochal/columnar/segments.py, issue
31), the operator driven directly: what a checkpoint hands the backend is the rows added in
its epoch (decoded from what the backend received), and a restore — after epochs of
expiries, fired windows, outer rows held, matched flags flipped, compactions — rebuilds
exactly the live buffer of a plain-Python model of the join; old-layout (``"<op>/rows"``)
snapshots keep restoring."""
from __future__ import annotations

import collections
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.columnar import segments
from epochal.columnar.joins import MATCHED, WSTART, ColumnJoinOperator, ColumnJoinSpec
from epochal.columnar.segments import decoded
from epochal.columnar.time import ColumnTime
from epochal.joins import interval
from epochal.operators.base import OperatorContext
from epochal.time.units import MAX_TIME, MIN_TIME
from epochal.windows.assigners import PaneSpec
from test_columnar_join_logic import HOWS, MAXP, Oracle, _batch, _ctx, _pairs

KEYS = tuple("abcdefghij")
TIMES = (ColumnTime("t", "us"), ColumnTime("t", "us"))


def _recording(kind):
    """A backend that also records every put (state, kg, key, value)."""
    base = HeapStateBackend if kind == "heap" else RocksDBStateBackend

    class Recording(base):  # type: ignore[misc, valid-type]
        def put(self, state, kg, key, value):
            self.puts.append((state, kg, key, value))
            super().put(state, kg, key, value)

    backend = Recording(range(MAXP), snapshot_mode="thread") if kind == "heap" else Recording(range(MAXP))
    backend.puts = []
    return backend


def _operator(backend, spec) -> ColumnJoinOperator:
    op = ColumnJoinOperator(_ctx(backend), spec, 1)
    op.bind_input_channels([0, 1])
    return op


class Live:
    """A plain-Python model of what the join buffers hold: rows ``[id, key, t, matched]``
    (interval) or ``[id, key, window start]`` (window) per side."""

    def __init__(self, spec: ColumnJoinSpec):
        self.spec, self.rows, self.seen, self.wm = spec, ([], []), [False, False], MIN_TIME

    def add(self, side, k, t, rid):
        self.seen[side] = True
        if t <= self.wm:
            return
        spec = self.spec
        if spec.windowed:
            p = spec.windows
            start = t - (t - p.offset) % p.slide
            while start > t - p.size:
                self.rows[side].append([rid, k, start])
                start -= p.slide
            return
        matched = False
        for row in self.rows[1 - side]:
            lt, rt = (t, row[2]) if side == 0 else (row[2], t)
            if row[1] == k and lt + spec.lower <= rt <= lt + spec.upper:
                matched = True
                if spec.outer[1 - side]:
                    row[3] = True
        self.rows[side].append([rid, k, t, matched])

    def advance(self, wm):
        self.wm = wm
        for side in (0, 1):
            if self.spec.outer[side] and not self.seen[1 - side] and wm < MAX_TIME:
                continue  # held: the other input's columns are not known yet
            self.rows[side][:] = [r for r in self.rows[side] if self._expiry(side, r) > wm]

    def _expiry(self, side, row) -> int:
        if self.spec.windowed:
            return row[2] + self.spec.windows.size - 1
        return row[2] + self.spec.upper if side == 0 else row[2] - self.spec.lower

    def live(self) -> collections.Counter:
        return collections.Counter((side, r[0], r[2] if self.spec.windowed else r[3])
                                   for side in (0, 1) for r in self.rows[side])


def _buffered(op: ColumnJoinOperator) -> collections.Counter:
    """The operator's buffers as ``(side, id, matched | window start)``."""
    out: collections.Counter = collections.Counter()
    for side, table in enumerate(op.buffers):
        if table is not None and table.num_rows:
            extra = table.column(WSTART if op.spec.windowed else MATCHED).to_pylist()
            out.update(zip([side] * table.num_rows, table.column("id").to_pylist(), extra))
    return out


def _stored_rows(backend, state="j/seg") -> int:
    return sum(decoded(v).num_rows for kg in range(MAXP) for _, v in backend.value_items(state, kg))


class Driver:
    """Feeds the operator and the models the same steps; restarts from the backend."""

    def __init__(self, spec, oracle_spec, backend):
        self.spec, self.backend = spec, backend
        self.op = _operator(backend, spec)
        self.model, self.oracle = Live(spec), Oracle(oracle_spec)
        self.out, self.wm, self.next_id = [], 0, 0

    def rows(self, side, rows):
        batch = []
        for k, t in rows:
            batch.append((k, t, self.next_id))
            self.model.add(side, k, t, self.next_id)
            self.oracle.add(side, k, t, self.next_id)
            self.next_id += 1
        self.op.select_input(side)
        self.out += self.op.process_batch([_batch(side, batch)])

    def watermark(self, wm):
        self.wm = wm
        for channel in (0, 1):
            self.op.input_watermark(channel, wm, False)
        self.out += self.op.on_watermark(wm)
        self.model.advance(wm)
        self.oracle.advance(wm, self.spec.outer)

    def snapshot(self):
        self.out += self.op.prepare_snapshot_pre_barrier(1)

    def restart(self):
        assert _buffered(self.op) == self.model.live()
        self.snapshot()
        self.op = _operator(self.backend, self.spec)
        self.op.restore(None)
        assert _buffered(self.op) == self.model.live(), "the restored buffer is not the live one"

    def finish(self):
        self.watermark(MAX_TIME)
        assert _pairs(self.out) == self.oracle.out


steps = st.lists(st.one_of(
    st.tuples(st.just("rows"), st.integers(0, 1),
              st.lists(st.tuples(st.sampled_from(KEYS[:5]), st.integers(0, 40)), min_size=1, max_size=8)),
    st.tuples(st.just("watermark"), st.integers(1, 12)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restart"))), max_size=40)


def _play(driver: Driver, script) -> None:
    for step in script:
        if step[0] == "rows":
            driver.rows(step[1], [(k, driver.wm + dt - 10) for k, dt in step[2]])
        elif step[0] == "watermark":
            driver.watermark(driver.wm + step[1])
        else:
            getattr(driver, step[0])()
    driver.restart()
    driver.finish()


@pytest.mark.parametrize("kind", ["interval", "window"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, how=st.sampled_from(sorted(HOWS)), bounds=st.sampled_from([(-5, 3), (-10, -2), (2, 8), (-30, 30)]),
       panes=st.sampled_from([(10, 10), (12, 4)]), max_segments=st.sampled_from([1, 2, 16]),
       backend=st.sampled_from(["heap", "rocksdb"]))
def test_a_restore_at_any_point_rebuilds_the_live_buffer(kind, script, how, bounds, panes, max_segments, backend):
    """Random batches, watermarks, snapshots and restarts (compaction forced often with
    ``max_segments`` 2): each restored buffer equals the model's live rows (ids, matched flags,
    windows), and the joined output of the whole run equals the record path's oracle."""
    window = panes if kind == "window" else None
    outer = HOWS[how]
    if window is None:
        spec = ColumnJoinSpec(("k", "key"), TIMES, outer, lower=bounds[0], upper=bounds[1])
        oracle_spec = interval.IntervalSpec(bounds[0], bounds[1], *outer)
    else:
        oracle_spec = PaneSpec(*window)
        spec = ColumnJoinSpec(("k", "key"), TIMES, outer, panes=oracle_spec)
    saved, segments.MAX_SEGMENTS = segments.MAX_SEGMENTS, max_segments
    try:
        _play(Driver(spec, oracle_spec, _recording(backend)), script)
    finally:
        segments.MAX_SEGMENTS = saved


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_checkpoint_writes_the_rows_added_in_its_epoch_not_the_buffer(backend):
    """A join whose state only grows (nothing expires): each checkpoint's segments hold the
    epoch's 200 new rows (decoded from what the backend received), never an older row again."""
    spec = ColumnJoinSpec(("k", "key"), TIMES, (False, False), lower=-10**9, upper=10**9)
    driver = Driver(spec, interval.IntervalSpec(-10**9, 10**9), _recording(backend))
    rng = random.Random(7)
    put_bytes, seen_keys = [], set()
    for epoch in range(10):
        for side in (0, 1):
            driver.rows(side, [(rng.choice(KEYS), 100 * epoch + rng.randrange(100)) for _ in range(100)])
        driver.watermark(100 * epoch)
        driver.backend.puts.clear()
        driver.snapshot()
        segs = [(kg, key, v) for state, kg, key, v in driver.backend.puts if state == "j/seg"]
        assert sum(decoded(v).num_rows for *_, v in segs) == 200
        assert not seen_keys & {(kg, key) for kg, key, _ in segs}, "a segment was written again"
        seen_keys |= {(kg, key) for kg, key, _ in segs}
        assert not [p for p in driver.backend.puts if p[0] in ("j/rows", "j/mask")]
        put_bytes.append(sum(len(v) for *_, v in segs))
    assert max(put_bytes) < 1.5 * min(put_bytes), put_bytes  # flat, while the buffer grew 10x
    assert _stored_rows(driver.backend) == 2000
    driver.restart()
    driver.finish()


def test_a_row_matched_after_it_was_written_does_not_come_out_unmatched_after_a_restore():
    """Left outer: the left row is written unmatched, matches in the next epoch (its
    segment's mask records it), the job restarts: its expiry emits nothing."""
    spec = ColumnJoinSpec(("k", "key"), TIMES, (True, False), lower=0, upper=10)
    driver = Driver(spec, interval.IntervalSpec(0, 10, True, False), _recording("heap"))
    driver.rows(0, [("a", 5), ("b", 5)])
    driver.rows(1, [("z", 1)])  # the right input's columns are known: no row is held
    driver.snapshot()
    driver.rows(1, [("a", 8)])
    assert _pairs(driver.out) == collections.Counter({(0, 3): 1})
    driver.snapshot()
    assert [p[2] for p in driver.backend.puts if p[0] == "j/mask"] == [(0, 0)]
    driver.restart()
    driver.out.clear()
    driver.watermark(100)
    assert _pairs(driver.out) == collections.Counter({(1, None): 1})  # b only: a had matched


def test_held_outer_rows_and_fired_windows_restore_as_they_were():
    """A full outer window join: the left rows' windows are due while the right input has
    sent nothing (held), then the right input arrives, windows fire, a restart in between."""
    panes = PaneSpec(10, 10)
    spec = ColumnJoinSpec(("k", "key"), TIMES, (True, True), panes=panes)
    driver = Driver(spec, panes, _recording("rocksdb"))
    driver.rows(0, [("a", 3), ("b", 14), ("c", 25)])
    driver.snapshot()
    driver.watermark(30)  # every window is due, but held
    driver.restart()
    assert sum(driver.model.live().values()) == 3
    driver.rows(1, [("a", 33), ("c", 35)])
    driver.watermark(31)  # the held windows fire now
    assert sum(driver.model.live().values()) == 2
    driver.restart()
    driver.finish()


def test_compaction_bounds_the_segments_and_rewrites_mostly_dropped_ones():
    """One key, one left row per epoch, 40 epochs: never more than MAX_SEGMENTS + 1 segments;
    then most rows expire: what is stored shrinks to at most twice the live rows."""
    spec = ColumnJoinSpec(("k", "key"), TIMES, (False, False), lower=-1000, upper=1000)
    driver = Driver(spec, interval.IntervalSpec(-1000, 1000), _recording("heap"))
    (kg,) = {int(k) for k in driver.op.groups[0].of(_batch(0, [("a", 0, 0)]))}
    for epoch in range(40):
        driver.rows(0, [("a", 10 * epoch + 5)])
        driver.watermark(10 * epoch)
        driver.snapshot()
        count = len(driver.backend.value_items("j/seg", kg))
        assert count <= segments.MAX_SEGMENTS + 1
        assert _stored_rows(driver.backend) == epoch + 1
    assert driver.op.store.seq > 40  # compactions ran (each takes a sequence number)
    driver.watermark(10 * 31 + 1005)  # rows at t <= 315 expire: 32 of 40
    driver.snapshot()
    assert _stored_rows(driver.backend) <= 2 * sum(driver.model.live().values()) == 16
    driver.restart()
    driver.finish()


def _old_layout(op: ColumnJoinOperator, state: str = "j/rows", as_tables: bool = False) -> None:
    """Write ``op``'s buffers as the code before issue 31 did: per key group ``(left, right)``,
    each side's rows (hidden columns and ids included) as IPC bytes (``as_tables``: as tables,
    the layout before that); the new layout's entries are removed."""
    backend = op.backend
    for name in ("j/seg", "j/mask", "j/schema"):
        for kg in range(MAXP):
            for key, _ in backend.value_items(name, kg):
                backend.delete(name, kg, key)
    sides = []
    for table in op.buffers:
        sides.append(None if table is None else table.drop_columns([segments.SEG, segments.POS]))
    for kg in range(MAXP):
        entry = []
        for table in sides:
            if table is None:
                entry.append(None)
                continue
            rows = table.filter(pc.equal(table.column("\x00kg"), kg))
            entry.append(rows if as_tables else segments.encoded(rows))
        if any(t is not None and (t if as_tables else decoded(t)).num_rows for t in entry):
            backend.put(state, kg, kg, tuple(entry))


@pytest.mark.parametrize("as_tables", [False, True])
def test_an_old_layout_snapshot_restores_and_is_rewritten_as_segments(as_tables):
    spec = ColumnJoinSpec(("k", "key"), TIMES, (True, True), lower=-5, upper=5)
    driver = Driver(spec, interval.IntervalSpec(-5, 5, True, True), _recording("heap"))
    rng = random.Random(3)
    for step in range(6):
        for side in (0, 1):
            driver.rows(side, [(rng.choice(KEYS), driver.wm + rng.randrange(1, 15)) for _ in range(10)])
        driver.watermark(driver.wm + 3)
    _old_layout(driver.op, as_tables=as_tables)
    driver.op = _operator(driver.backend, spec)
    driver.op.restore(None)
    assert _buffered(driver.op) == driver.model.live()
    driver.rows(0, [("a", driver.wm + 2)])
    driver.snapshot()  # writes every restored row as segments, deletes the old entries
    assert not [kg for kg in range(MAXP) if driver.backend.value_items("j/rows", kg)]
    driver.restart()
    driver.watermark(driver.wm + 4)
    driver.restart()
    driver.finish()


def _old_operator_class():
    """ColumnJoinOperator as of main before issue 31 (from git, as the benchmark loads it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import join_snapshots

    try:
        return join_snapshots.old_operator_class()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the commit before issue 31 is not in this checkout")


def test_a_snapshot_written_by_the_previous_code_restores(tmp_path):
    """The previous operator's own snapshot (not a rebuilt one): run it, snapshot, restore
    with the new operator, go on; the output of the whole run equals the oracle's."""
    old = _old_operator_class()
    spec = ColumnJoinSpec(("k", "key"), TIMES, (True, False), lower=-8, upper=2)
    driver = Driver(spec, interval.IntervalSpec(-8, 2, True, False), _recording("rocksdb"))
    driver.op = old(_ctx(driver.backend), spec, 1)
    driver.op.bind_input_channels([0, 1])
    rng = random.Random(5)
    for step in range(5):
        for side in (0, 1):
            driver.rows(side, [(rng.choice(KEYS), driver.wm + rng.randrange(1, 20)) for _ in range(8)])
        driver.watermark(driver.wm + 4)
    driver.snapshot()
    assert [kg for kg in range(MAXP) if driver.backend.value_items("j/rows", kg)]
    driver.op = _operator(driver.backend, spec)
    driver.op.restore(None)
    assert _buffered(driver.op) == driver.model.live()
    driver.restart()
    driver.finish()


@pytest.mark.parametrize("max_segments", [1, 3])
def test_compactions_of_many_key_groups_with_partly_dropped_segments_restore_the_live_buffer(max_segments):
    """Rows live about five epochs, every key group compacts often (``max_segments``), its
    merged segments then lose rows and gain matches; restarts every 7 epochs rebuild the
    model's live buffer and the whole run's output equals the oracle's."""
    spec = ColumnJoinSpec(("k", "key"), TIMES, (True, True), lower=-25, upper=25)
    driver = Driver(spec, interval.IntervalSpec(-25, 25, True, True), _recording("heap"))
    rng = random.Random(max_segments)
    saved, segments.MAX_SEGMENTS = segments.MAX_SEGMENTS, max_segments
    try:
        compactions = 0
        for epoch in range(1, 36):
            for side in (0, 1):
                driver.rows(side, [(rng.choice(KEYS), 10 * epoch + rng.randrange(10)) for _ in range(12)])
            driver.watermark(10 * epoch - 20)
            seq = driver.op.store.seq
            driver.snapshot()
            compactions += driver.op.store.seq - seq - 1
            if epoch % 7 == 0:
                driver.restart()
        assert compactions > 10
        driver.restart()
        driver.finish()
    finally:
        segments.MAX_SEGMENTS = saved


def test_segments_restore_by_key_group_into_two_subtasks():
    """Rescale 1 → 2: each new subtask reads the segments and masks of its own key groups;
    together they hold the live buffer."""
    spec = ColumnJoinSpec(("k", "key"), TIMES, (True, False), lower=-25, upper=25)
    driver = Driver(spec, interval.IntervalSpec(-25, 25, True, False), _recording("rocksdb"))
    rng = random.Random(11)
    for epoch in range(1, 12):
        for side in (0, 1):
            driver.rows(side, [(rng.choice(KEYS), 10 * epoch + rng.randrange(10)) for _ in range(12)])
        driver.watermark(10 * epoch - 20)
        driver.snapshot()
    restored: collections.Counter = collections.Counter()
    for kgs in (range(0, MAXP // 2), range(MAXP // 2, MAXP)):
        ctx = OperatorContext("j", "j[0]", 0, 2, 0, "job", MAXP, keyed_backend=driver.backend, key_groups=kgs)
        op = ColumnJoinOperator(ctx, spec, 1)
        op.restore(None)
        for table in op.buffers:
            assert table is None or set(table.column("\x00kg").to_pylist()) <= set(kgs)
        restored += _buffered(op)
    assert restored == driver.model.live() and sum(restored.values()) > 50
