"""Keyed timers (epochal.time.timers) on both backends: order, idempotence, deletion,
snapshot/restore across backends, rescaling, and bounded memory on RocksDB."""
from __future__ import annotations

import gc
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.backends.heap import HeapStateBackend
from epochal.backends.keygroups import key_group_for, key_group_range
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.time.timers import EVENT_TIME, IndexedTimerQueue, ScanTimerQueue, TimerService, make_queue

MAXP = 16
BACKENDS = {"heap": lambda kgs: HeapStateBackend(kgs, snapshot_mode="thread"), "rocksdb": RocksDBStateBackend}


class Current:
    key = None
    kg = -1
    ts = None


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    b = BACKENDS[request.param](range(MAXP))
    yield b
    b.close()


def _service(backend, kgs=range(MAXP)):
    cur = Current()
    return TimerService(backend, "op", cur, kgs), cur


def _at(cur, key):
    cur.key, cur.kg = key, key_group_for(key, MAXP)


def test_queue_kind_follows_the_backend(backend):
    q = make_queue(backend, "op/$t", range(MAXP))
    assert isinstance(q, ScanTimerQueue if backend.ordered_map_keys else IndexedTimerQueue)


def test_fires_in_time_order_once_and_respects_deletes(backend):
    svc, cur = _service(backend)
    for key, t in [("a", 5), ("b", 3), ("a", 3), ("c", 9), ("a", 5)]:  # ("a", 5) twice: one timer
        _at(cur, key)
        svc.register_event_time(t)
    _at(cur, "c")
    svc.delete_event_time(9)
    svc.delete_event_time(99)  # not registered: no-op
    fired = []
    svc.advance_watermark(4_000_000, lambda k, kg, ts, d: fired.append((ts, k, d)))
    assert sorted(fired) == [(3_000_000, "a", EVENT_TIME), (3_000_000, "b", EVENT_TIME)]
    svc.advance_watermark(100_000_000, lambda k, kg, ts, d: fired.append((ts, k, d)))
    assert fired[2:] == [(5_000_000, "a", EVENT_TIME)]
    svc.advance_watermark(200_000_000, lambda *a: fired.append(a))
    assert len(fired) == 3


def test_a_callback_may_register_and_delete_timers_due_in_the_same_advance(backend):
    svc, cur = _service(backend)
    for key in ("x", "y"):
        _at(cur, key)
        svc.register_event_time(1)
    fired = []

    def fire(key, kg, ts, domain):
        fired.append((key, ts))
        cur.key, cur.kg = key, kg
        if ts == 1_000_000:
            svc.register_event_time(2)  # due in this advance too
            other = "y" if key == "x" else "x"
            _at(cur, other)
            svc.delete_event_time(1)  # the other key's timer at 1 does not fire any more

    svc.advance_watermark(5_000_000, fire)
    assert len([f for f in fired if f[1] == 1_000_000]) == 1
    assert [f[1] for f in fired].count(2_000_000) == 1


ops = st.lists(st.tuples(st.sampled_from(["add", "del", "advance"]), st.integers(0, 12), st.integers(0, 40)),
               max_size=80)


@settings(max_examples=60, deadline=None)
@given(script=ops, kind=st.sampled_from(sorted(BACKENDS)))
def test_queue_equals_a_model(script, kind):
    """Random adds / deletes / advances fire exactly what a plain set model fires."""
    b = BACKENDS[kind](range(MAXP))
    try:
        q = make_queue(b, "op/$t", range(MAXP))
        model: set = set()
        wm = -1
        for op, key, t in script:
            kg = key_group_for(key, MAXP)
            if op == "add":
                q.add(kg, t, key)
                model.add((t, key))
            elif op == "del":
                q.remove(kg, t, key)
                model.discard((t, key))
            else:
                wm = max(wm, t)
                got = [(ts, k) for ts, _kg, k in q.pop_due(wm)]
                due = sorted(x for x in model if x[0] <= wm)
                assert sorted(got) == due and [g[0] for g in got] == sorted(g[0] for g in got)
                model -= set(due)
        rest = [(ts, k) for ts, _kg, k in q.pop_due(1 << 40)]
        assert sorted(rest) == sorted(model)
    finally:
        b.close()


@pytest.mark.parametrize("src,dst", [("heap", "rocksdb"), ("rocksdb", "heap")])
def test_timers_survive_snapshot_restore_across_backends_and_rescaling(src, dst):
    """Timers are keyed state: restored by the other backend into 3 subtasks, each fires
    exactly the timers of its key groups."""
    b = BACKENDS[src](range(MAXP))
    svc, cur = _service(b)
    keys = [f"k{i}" for i in range(40)]
    for i, key in enumerate(keys):
        _at(cur, key)
        svc.register_event_time(i)
        svc.register_processing_time(1000 + i)
    blob = b.snapshot(1).run()
    b.close()
    fired = []
    for s in range(3):
        kgs = key_group_range(s, 3, MAXP)
        r = BACKENDS[dst](kgs)
        r.restore([blob])
        svc2, _ = _service(r, kgs)
        svc2.advance_watermark(1 << 40, lambda k, kg, ts, d: fired.append((k, ts, d, kg in kgs)))
        svc2.fire_processing_time(1 << 40, lambda k, kg, ts, d: fired.append((k, ts, d, kg in kgs)))
        r.close()
    assert all(f[3] for f in fired)
    assert sorted((k, ts, d) for k, ts, d, _ in fired) == sorted(
        [(k, i * 1_000_000, "event") for i, k in enumerate(keys)]
        + [(k, (1000 + i) * 1_000_000, "processing") for i, k in enumerate(keys)])


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_million_event_time_timers_on_rocksdb_keep_memory_bounded():
    """RocksDB keeps timers on disk: the queue holds one timestamp per key group in memory,
    so registering a million timers grows the process by far less than holding them would
    (a heap index of 1M (ts, kg) tuples alone takes > 100 MB), and they fire in order."""
    kgs = range(128)
    b = RocksDBStateBackend(kgs)
    try:
        q = make_queue(b, "op/$timers.event", kgs)
        gc.collect()
        before = _rss_mb()
        n = 1_000_000
        for i in range(n):
            key = i % 50_000
            q.add(key % 128, (i * 7919) % n, key)  # a permutation of 0..n-1
        grown = _rss_mb() - before
        assert q.heads <= 128
        assert grown < 80, f"process grew by {grown:.0f} MB for {n} timers"
        last, count = -1, 0
        for ts, _kg, _key in q.pop_due(n // 50):
            assert ts >= last
            last, count = ts, count + 1
        assert count == n // 50 + 1
    finally:
        b.close()
