"""HeapStateBackend: copy-on-write asynchronous snapshots (seed 004 §4.5.1, seed 001)."""
import copy
import queue
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.backends import HeapStateBackend, SnapshotJobState, key_group_for, key_group_range
from epochal.backends.base import decode_snapshot
from epochal.errors import CheckpointStorageError, EpochalError

ALL = range(0, 128)
S, M = "count/sum", "window/items"


@pytest.fixture(params=["thread", "blocking", "fork", "auto"])
def backend(request):
    return HeapStateBackend(ALL, snapshot_mode=request.param)


def kg(key):
    return key_group_for(key, 128)


def state_of(backend):
    """Deep snapshot of a backend's content: {(kind, state, key): value}."""
    return {(kind, st_, key): copy.deepcopy(v) for kind, st_, _kg, key, v in backend.entries()}


def restored(blobs, key_groups=ALL):
    b = HeapStateBackend(key_groups)
    b.restore(blobs)
    return b


def fill(b, n=50):
    for i in range(n):
        k = f"k{i}"
        b.put(S, kg(k), k, i)
        b.put("lists/v", kg(k), k, [i, [i]])
        b.map_put(M, kg(k), k, "a", {"n": i})
        b.map_put(M, kg(k), k, "b", i)


# ---------------------------------------------------------------------------- basics
def test_value_and_map_state_crud(backend):
    b = backend
    assert b.get(S, kg("x"), "x") is None and b.get(S, kg("x"), "x", 0) == 0
    b.put(S, kg("x"), "x", 1)
    assert b.contains(S, kg("x"), "x") and b.get(S, kg("x"), "x") == 1
    b.delete(S, kg("x"), "x")
    b.delete(S, kg("x"), "x")  # idempotent
    assert not b.contains(S, kg("x"), "x")
    b.map_put(M, kg("x"), "x", "m1", 1)
    b.map_put(M, kg("x"), "x", "m2", 2)
    assert b.map_get(M, kg("x"), "x", "m1") == 1 and b.map_get(M, kg("x"), "x", "zz", -1) == -1
    assert sorted(b.map_items(M, kg("x"), "x")) == [("m1", 1), ("m2", 2)]
    assert b.map_contains(M, kg("x"), "x", "m2")
    b.map_delete(M, kg("x"), "x", "m2")
    b.map_delete(M, kg("x"), "x", "m2")
    assert b.map_items(M, kg("x"), "x") == [("m1", 1)]
    b.map_clear(M, kg("x"), "x")
    b.map_clear(M, kg("x"), "x")
    assert b.map_items(M, kg("x"), "x") == [] and not b.map_contains(M, kg("x"), "x", "m1")
    assert list(b.entries()) == []


def test_snapshot_roundtrip(backend):
    fill(backend)
    expected = state_of(backend)
    blob = backend.snapshot(1).run()
    assert state_of(restored([blob])) == expected


def test_empty_snapshot_roundtrip(backend):
    assert state_of(restored([backend.snapshot(1).run()])) == {}


# --------------------------------------------------- isolation from later mutation
def mutate_everything(b):
    b.put(S, kg("k1"), "k1", 1000)                     # overwrite
    b.put(S, kg("new"), "new", 1)                      # insert
    b.delete(S, kg("k2"), "k2")                        # delete
    b.get("lists/v", kg("k3"), "k3").append("x")       # in-place mutation via get ...
    lst = b.get("lists/v", kg("k4"), "k4")
    lst[1].append("deep")                              # ... nested
    b.put("lists/v", kg("k4"), "k4", lst)              # ... then put back
    b.map_put(M, kg("k5"), "k5", "c", 3)               # map insert
    b.map_put(M, kg("k6"), "k6", "a", {"n": -1})       # map overwrite
    b.map_delete(M, kg("k7"), "k7", "b")               # map delete
    b.map_clear(M, kg("k8"), "k8")                     # map clear
    b.map_get(M, kg("k9"), "k9", "a")["n"] = "mut"     # in-place mutation of a map value
    for _mk, v in b.map_items(M, kg("k10"), "k10"):
        if isinstance(v, dict):
            v["n"] = "mut-items"
    b.map_put(M, kg("new"), "new", "z", [1])
    for i in range(11, 50):                            # and delete the rest entirely
        b.delete(S, kg(f"k{i}"), f"k{i}")
        b.map_clear(M, kg(f"k{i}"), f"k{i}")


def test_blob_reflects_state_at_snapshot_despite_later_mutation(backend):
    fill(backend)
    expected = state_of(backend)
    job = backend.snapshot(1)
    mutate_everything(backend)
    after = state_of(backend)
    assert after != expected
    assert state_of(restored([job.run()])) == expected
    assert state_of(backend) == after  # live state kept every mutation


def test_mutations_are_visible_in_live_state():
    b = HeapStateBackend(ALL)
    b.put("l", kg("a"), "a", [1])
    b.map_put(M, kg("a"), "a", "x", [1])
    job = b.snapshot(1)
    b.get("l", kg("a"), "a").append(2)
    assert b.get("l", kg("a"), "a") == [1, 2]  # copied once, then the copy is kept
    b.map_get(M, kg("a"), "a", "x").append(2)
    assert b.map_get(M, kg("a"), "a", "x") == [1, 2]
    assert state_of(restored([job.run()])) == {("value", "l", "a"): [1], ("map", M, "a"): {"x": [1]}}


def test_two_overlapping_pending_snapshots_are_both_exact(backend):
    fill(backend)
    exp1 = state_of(backend)
    job1 = backend.snapshot(1)
    mutate_everything(backend)
    exp2 = state_of(backend)
    job2 = backend.snapshot(2)
    fill(backend, 60)
    backend.get("lists/v", kg("k0"), "k0").append("after-2")
    exp3 = state_of(backend)
    blob2 = job2.run()  # finish out of order
    backend.put(S, kg("k0"), "k0", "between")
    blob1 = job1.run()
    assert state_of(restored([blob1])) == exp1
    assert state_of(restored([blob2])) == exp2
    assert state_of(restored([backend.snapshot(3).run()])) != exp3  # "between" written
    assert exp3[("value", "lists/v", "k0")][-1] == "after-2"


def test_release_frees_the_snapshot_and_later_reads_stop_copying():
    b = HeapStateBackend(ALL)
    b.put("l", kg("a"), "a", [1])
    job = b.snapshot(1)
    assert b.pending_snapshots == 1
    job.release()
    job.release()  # idempotent
    assert job.state is SnapshotJobState.RELEASED and b.pending_snapshots == 0
    with pytest.raises(EpochalError, match="epoch 1 cannot run: it is released"):
        job.run()
    first = b.get("l", kg("a"), "a")
    assert b.get("l", kg("a"), "a") is first  # no snapshot pending: no copies


def test_run_is_single_shot_and_frees_on_completion():
    b = HeapStateBackend(ALL)
    job = b.snapshot(7)
    job.run()
    assert job.state is SnapshotJobState.DONE and b.pending_snapshots == 0
    with pytest.raises(EpochalError, match="already|cannot run"):
        job.run()


def test_sync_part_is_cheap_compared_to_blocking_baseline():
    # fork mode: its sync part is a fork(), whose cost depends on the whole process's size
    # (this pytest process), so it is shown non-blocking by a condition instead, in
    # test_forked_snapshots.py::test_task_thread_does_not_wait_for_the_serialization
    cow, blocking = HeapStateBackend(ALL, snapshot_mode="thread"), HeapStateBackend(ALL, snapshot_mode="blocking")
    for b in (cow, blocking):
        for i in range(200_000):
            b.put(S, i % 128, i, (i, str(i)))
    t0 = time.perf_counter()
    job = cow.snapshot(1)
    t_cow = time.perf_counter() - t0
    t0 = time.perf_counter()
    blocking.snapshot(1)
    t_blocking = time.perf_counter() - t0
    assert t_cow < t_blocking / 10, (t_cow, t_blocking)
    job.release()


# ------------------------------------------------------------------------- restore
def test_restore_keeps_only_owned_key_groups_and_supports_rescaling():
    src = [HeapStateBackend(key_group_range(i, 2, 128)) for i in range(2)]
    model = {}
    for i in range(500):
        k = f"user{i}"
        g = kg(k)
        owner = src[0] if g in src[0].key_groups else src[1]
        owner.put(S, g, k, i)
        owner.map_put(M, g, k, "m", i)
        model[k] = i
    blobs = [b.snapshot(5).run() for b in src]
    union = {}
    for i in range(3):  # rescale 2 -> 3
        r = restored(blobs, key_group_range(i, 3, 128))
        for kind, _s, g, key, v in r.entries():
            assert g in r.key_groups and kg(key) == g
            if kind == "value":
                union[key] = v
    assert union == model


def test_decode_skips_foreign_key_groups_without_unpickling():
    b = HeapStateBackend(ALL)
    b.put(S, 3, "a", 1)
    b.put(S, 100, "b", 2)
    blob = b.snapshot(1).run()
    assert [g for g, _ in decode_snapshot(blob, range(0, 64))] == [3]
    assert [g for g, _ in decode_snapshot(blob)] == [3, 100]


@pytest.mark.parametrize("blob", [b"", b"XXXX\x00\x01\x00\x00\x00\x00", b"EPKS\x00\x63\x00\x00\x00\x00"])
def test_restore_rejects_foreign_bytes(blob):
    with pytest.raises(CheckpointStorageError):
        restored([blob])


def test_restore_rejects_truncated_blob():
    b = HeapStateBackend(ALL)
    fill(b)
    blob = b.snapshot(1).run()
    with pytest.raises(CheckpointStorageError, match="truncated"):
        restored([blob[: len(blob) // 2]])


# ------------------------------------------------------------ concurrency & model
def test_stress_uploader_thread_runs_jobs_while_task_thread_writes():
    b = HeapStateBackend(ALL)
    rng = random.Random(7)
    jobs: queue.Queue = queue.Queue()
    results: dict[int, bytes] = {}

    def uploader():
        while (item := jobs.get()) is not None:
            epoch, job = item
            results[epoch] = job.run()

    t = threading.Thread(target=uploader)
    t.start()
    expected = {}
    keys = [f"k{i}" for i in range(300)]
    deadline = time.monotonic() + 3.0
    epoch = 0
    while time.monotonic() < deadline or epoch < 20:
        for _ in range(2000):
            k = rng.choice(keys)
            g = kg(k)
            op = rng.random()
            if op < 0.3:
                lst = b.get("l", g, k)
                if lst is None:
                    b.put("l", g, k, [0])
                else:
                    lst.append(len(lst))
                    if len(lst) > 20:
                        lst.clear()
                    b.put("l", g, k, lst)
            elif op < 0.45:
                b.delete("l", g, k)
            elif op < 0.75:
                b.map_put(M, g, k, rng.randrange(10), {"v": rng.random()})
            elif op < 0.85:
                d = b.map_get(M, g, k, rng.randrange(10))
                if d is not None:
                    d["v"] = -1
            elif op < 0.9:
                b.map_clear(M, g, k)
            else:
                b.put(S, g, k, b.get(S, g, k, 0) + 1)
        epoch += 1
        expected[epoch] = state_of(b)
        jobs.put((epoch, b.snapshot(epoch)))
    jobs.put(None)
    t.join()
    assert b.pending_snapshots == 0
    for e, exp in expected.items():
        assert state_of(restored([results[e]])) == exp, f"epoch {e}"


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 6), st.integers()),
        st.tuples(st.just("append"), st.integers(0, 6), st.integers()),
        st.tuples(st.just("delete"), st.integers(0, 6), st.none()),
        st.tuples(st.just("map_put"), st.integers(0, 6), st.integers(0, 3)),
        st.tuples(st.just("map_mutate"), st.integers(0, 6), st.integers(0, 3)),
        st.tuples(st.just("map_delete"), st.integers(0, 6), st.integers(0, 3)),
        st.tuples(st.just("map_clear"), st.integers(0, 6), st.none()),
        st.tuples(st.just("snapshot"), st.none(), st.none()),
        st.tuples(st.just("run"), st.integers(0, 5), st.none()),
        st.tuples(st.just("release"), st.integers(0, 5), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, mode=st.sampled_from(HeapStateBackend.MODES))
def test_every_snapshot_equals_the_state_at_its_barrier(ops, mode):
    b = HeapStateBackend(ALL, snapshot_mode=mode)
    pending = []  # (expected, job)
    epoch = 0
    for op, key, arg in ops:
        g = (key or 0) % 4  # few key groups: buckets are shared between keys
        if op == "put":
            b.put("l", g, key, [arg])
        elif op == "append":
            lst = b.get("l", g, key)
            if lst is not None:
                lst.append(arg)
        elif op == "delete":
            b.delete("l", g, key)
        elif op == "map_put":
            b.map_put(M, g, key, arg, [arg])
        elif op == "map_mutate":
            v = b.map_get(M, g, key, arg)
            if v is not None:
                v.append("m")
        elif op == "map_delete":
            b.map_delete(M, g, key, arg)
        elif op == "map_clear":
            b.map_clear(M, g, key)
        elif op == "snapshot":
            epoch += 1
            pending.append((state_of(b), b.snapshot(epoch)))
        elif pending:
            expected, job = pending.pop(key % len(pending))
            if op == "run":
                assert state_of(restored([job.run()])) == expected
            else:
                job.release()
    for expected, job in pending:
        assert state_of(restored([job.run()])) == expected
    assert b.pending_snapshots == 0


def test_release_while_running_frees_once_after_run_returns():
    from epochal.backends.base import SnapshotJob

    freed = []
    job = None

    def produce():
        job.release()  # e.g. the coordinator aborts the epoch mid-upload
        assert freed == []  # the pinned state is still being read
        return b"bytes"

    job = SnapshotJob(4, produce, lambda: freed.append(1))
    assert job.run() == b"bytes"
    job.release()
    assert freed == [1] and job.state is SnapshotJobState.RELEASED


def test_failed_run_still_frees_pinned_state():
    from epochal.backends.base import SnapshotJob

    freed = []

    def produce():
        raise MemoryError("boom")

    job = SnapshotJob(4, produce, lambda: freed.append(1))
    with pytest.raises(MemoryError):
        job.run()
    assert freed == [1] and job.state is SnapshotJobState.FAILED
