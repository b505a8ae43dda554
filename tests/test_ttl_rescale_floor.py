"""Issue 46, suspected finding: event-time TTL restored after a rescale from cuts whose old
subtasks recorded different watermarks (unaligned or at-least-once cuts: a subtask's
channel state still holds the watermarks its neighbour had already seen).

Each key group's TTL record carries the clock of the subtask that owned it at the cut. A
restored task owning key groups of several old subtasks used to start every key group from
the *highest* of those clocks. Before the first watermark after the restore, an entry that
was alive at its own subtask's cut therefore read as expired. The replayed channel state
of that subtask is processed at its own clock in a failure-free run, so it would have found
the entry alive: the restored run's output differs. Now each key group starts from its own
clock. Checked without processes against a plain-Python model, on both backends.
"""
from __future__ import annotations

import pytest

from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.time.units import MIN_TIME
from epochal.ttl import StateTtl
from epochal.ttl.registry import TtlRegistry
from epochal.ttl.state import TtlValueState

S = 1_000_000  # µs
TTL_S = 10
OLD = (range(0, 4), range(4, 8))  # the key groups of old subtasks A and B
CUT = (20 * S, 40 * S)  # their watermarks at the cut: A is behind (its channel state holds the rest)
UPDATED = {1: 15 * S, 2: 5 * S, 5: 25 * S, 6: 35 * S}  # key (= key group) -> event time of its update


class Cur:
    def __init__(self):
        self.key, self.kg, self.ts = None, -1, None


def backend(kind: str, key_groups: range):
    return HeapStateBackend(key_groups, snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(key_groups)


def registry(b, key_groups, cur, watermark):
    config = StateTtl(TTL_S, time="event")
    reg = TtlRegistry(b, "op", key_groups, cur, watermark, True)
    reg.declare("v", "op/v", "value", config)
    return reg, TtlValueState(b, "op/v", cur, None, config, reg)


def old_subtask(kind: str, i: int) -> bytes:
    """Old subtask ``i``: updates its keys at their event times, reaches its cut watermark
    and snapshots."""
    b, cur, wm = backend(kind, OLD[i]), Cur(), {"t": MIN_TIME}
    reg, value = registry(b, OLD[i], cur, lambda: wm["t"])
    for key, ts in UPDATED.items():
        if key in OLD[i]:
            cur.key, cur.kg, cur.ts = key, key, ts
            value.update(key)
    wm["t"] = CUT[i]
    reg.snapshot()
    blob = b.snapshot(1).run()
    b.close()
    return blob


def model_alive() -> set:
    """Plain Python: the keys alive at their own subtask's cut clock."""
    return {k for k, ts in UPDATED.items() for i in (0, 1) if k in OLD[i] and ts + TTL_S * S > CUT[i]}


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_a_rescale_keeps_each_key_groups_own_clock_until_the_watermark_passes_it(kind):
    """Restore A's and B's key groups into one task (a rescale 2 -> 1), no watermark yet:
    exactly the keys alive at their own subtask's cut read alive (key 1, stamped at 15 s,
    is alive at A's 20 s although B's clock is 40 s) — also through a checkpoint taken
    before any watermark and restored again, and after a sweep. Once the watermark passes
    a key's life it is expired everywhere."""
    blobs = [old_subtask(kind, 0), old_subtask(kind, 1)]
    assert model_alive() == {1, 6}
    everything = range(0, 8)
    for round_ in range(2):  # round 1: restored from the new task's own checkpoint
        b, cur, wm = backend(kind, everything), Cur(), {"t": MIN_TIME}
        b.restore(blobs)
        reg, value = registry(b, everything, cur, lambda: wm["t"])
        reg.after_batch(10_000)  # a sweep before any watermark deletes nothing alive
        alive = set()
        for key in UPDATED:
            cur.key, cur.kg, cur.ts = key, key, None
            if value.value() is not None:
                alive.add(key)
        assert alive == model_alive(), f"round {round_}: alive {sorted(alive)}, model {sorted(model_alive())}"
        reg.snapshot()
        blobs = [b.snapshot(2 + round_).run()]
        b.close()
    b, cur, wm = backend(kind, everything), Cur(), {"t": 26 * S}  # past key 1's life (15 + 10)
    b.restore(blobs)
    reg, value = registry(b, everything, cur, lambda: wm["t"])
    cur.key, cur.kg = 1, 1
    assert value.value() is None
    cur.key, cur.kg = 6, 6
    assert value.value() == 6  # B's clock (40 s) still floors key 6's group: 35 + 10 > 40
    b.close()


# ------------------------------------------------------------------ columnar aggregates


def _columnar():
    import test_columnar_event_ttl as cet

    return cet


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_a_columnar_aggregate_rescaled_keeps_each_key_groups_own_clock(kind):
    """The same for ``aggregate(..., ttl=StateTtl(30 s, time="event"))``: old subtask A (key
    groups 0-7, watermark 20 s at the cut) holds keys a1, a2 last seen at 10 s (deadline
    40 s: alive at A's cut); B (8-15, 50 s) holds b1 seen at 5 s (expired at B's cut). One
    restored task, no watermark yet: rows of a1 and a2 at 45 s merge into their
    accumulators — as A's own replayed channel state would have found them — (before: both
    restarted, under B's 50 s), b1's row restarts it; also after a checkpoint taken before
    any watermark, restored again."""
    from epochal.backends.heap import HeapStateBackend as Heap
    from epochal.backends.rocksdb import RocksDBStateBackend as Rocks
    from epochal.operators.base import OperatorContext
    from epochal.columnar.operators import KeyedAggregateOperator

    cet = _columnar()
    halves = (range(0, 8), range(8, 16))

    def make(key_groups):
        b = Heap(key_groups, snapshot_mode="thread") if kind == "heap" else Rocks(key_groups)
        ctx = OperatorContext("agg", "agg[0]", 0, 1, 0, "job", cet.MAXP, keyed_backend=b, key_groups=key_groups)
        return b, KeyedAggregateOperator(ctx, cet._spec())

    probe_b, probe = make(range(16))
    probe.restore(None)
    of = probe.state.groups.of_values
    names = [f"k{i}" for i in range(200)]
    groups = dict(zip(names, of(names)))
    probe_b.close()
    a1, a2 = [k for k in names if groups[k] in halves[0]][:2]
    b1 = next(k for k in names if groups[k] in halves[1])
    blobs = []
    for half, cut, rows in ((halves[0], 20, [(a1, 1, 10.0), (a2, 1, 10.0)]), (halves[1], 50, [(b1, 1, 5.0)])):
        b, op = make(half)
        op.restore(None)
        op.on_watermark(0)
        op.process_batch([cet._batch(rows)])
        op.prepare_snapshot_pre_barrier(1)
        op.on_watermark(int(cut * 1e6))
        op.snapshot(2)
        blobs.append(b.snapshot(2).run())
        b.close()
    b, op = make(range(16))
    b.restore(blobs)
    op.restore(None)
    op.process_batch([cet._batch([(a1, 5, 45.0), (b1, 3, 55.0)])])
    assert cet._emitted(op.prepare_snapshot_pre_barrier(3)) == {a1: (2, 6), b1: (1, 3)}
    op.snapshot(3)
    again = b.snapshot(3).run()
    b.close()
    b, op = make(range(16))
    b.restore([again])
    op.restore(None)
    op.process_batch([cet._batch([(a2, 7, 45.0)])])
    assert cet._emitted(op.prepare_snapshot_pre_barrier(4)) == {a2: (2, 8)}
    b.close()
