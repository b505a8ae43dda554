"""RocksDBStateBackend: checkpoint-based asynchronous snapshots (seed 004 §4.5.1, Table 4.1),
and the behaviour it shares with HeapStateBackend (portable snapshots, rescaling).

The heap backend's own tests construct ``HeapStateBackend`` directly, so the key
properties are restated here, parametrized over both backends and over restore targets.
"""
import copy
import os
import queue
import random
import threading
import time
from contextlib import ExitStack

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import AccessType, Options, Rdict

from epochal.backends import HeapStateBackend, SnapshotJobState, key_group_for, key_group_range
from epochal.backends.base import decode_snapshot
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.errors import CheckpointStorageError, EpochalError

ALL = range(0, 128)
S, M = "count/sum", "window/items"
KINDS = {"heap": HeapStateBackend, "rocksdb": RocksDBStateBackend}


def kg(key):
    return key_group_for(key, 128)


def state_of(backend):
    """Deep copy of a backend's content: {(kind, state, key): value}."""
    return {(kind, st_, key): copy.deepcopy(v) for kind, st_, _kg, key, v in backend.entries()}


@pytest.fixture
def make():
    """``make(kind, key_groups=ALL)`` → a backend, closed at teardown."""
    with ExitStack() as stack:
        def factory(kind, key_groups=ALL, **kw):
            b = KINDS[kind](key_groups, **kw)
            stack.callback(b.close)
            return b

        yield factory


@pytest.fixture(params=sorted(KINDS))
def kind(request):
    return request.param


def restored_states(make, blobs, key_groups=ALL):
    """The state restored from ``blobs`` by every backend kind; asserts they agree."""
    states = []
    for k in sorted(KINDS):
        b = make(k, key_groups)
        b.restore(blobs)
        states.append(state_of(b))
    assert states[0] == states[1], "heap and rocksdb restored different states"
    return states[0]


def fill(b, n=50):
    for i in range(n):
        k = f"k{i}"
        b.put(S, kg(k), k, i)
        b.put("lists/v", kg(k), k, [i, [i]])
        b.map_put(M, kg(k), k, "a", {"n": i})
        b.map_put(M, kg(k), k, "b", i)


def mutate_everything(b):
    """Every kind of write; values mutated in place are put back (both backends' contract)."""
    b.put(S, kg("k1"), "k1", 1000)
    b.put(S, kg("new"), "new", 1)
    b.delete(S, kg("k2"), "k2")
    lst = b.get("lists/v", kg("k4"), "k4")
    lst[1].append("deep")
    b.put("lists/v", kg("k4"), "k4", lst)
    b.map_put(M, kg("k5"), "k5", "c", 3)
    b.map_put(M, kg("k6"), "k6", "a", {"n": -1})
    b.map_delete(M, kg("k7"), "k7", "b")
    b.map_clear(M, kg("k8"), "k8")
    d = b.map_get(M, kg("k9"), "k9", "a")
    d["n"] = "mut"
    b.map_put(M, kg("k9"), "k9", "a", d)
    b.map_put(M, kg("new"), "new", "z", [1])
    for i in range(11, 50):
        b.delete(S, kg(f"k{i}"), f"k{i}")
        b.map_clear(M, kg(f"k{i}"), f"k{i}")


# ---------------------------------------------------------------------------- basics
def test_value_and_map_state_crud(make, kind):
    b = make(kind)
    assert b.get(S, kg("x"), "x") is None and b.get(S, kg("x"), "x", 0) == 0
    assert not b.contains(S, kg("x"), "x") and b.map_items(M, kg("x"), "x") == []
    b.put(S, kg("x"), "x", 1)
    assert b.contains(S, kg("x"), "x") and b.get(S, kg("x"), "x") == 1
    b.delete(S, kg("x"), "x")
    b.delete(S, kg("x"), "x")  # idempotent
    assert not b.contains(S, kg("x"), "x")
    b.map_put(M, kg("x"), "x", "m1", 1)
    b.map_put(M, kg("x"), "x", "m2", 2)
    b.map_put(M, kg("xy"), "xy", "m1", 3)  # "x" is a prefix of "xy": maps stay apart
    assert b.map_get(M, kg("x"), "x", "m1") == 1 and b.map_get(M, kg("x"), "x", "zz", -1) == -1
    assert sorted(b.map_items(M, kg("x"), "x")) == [("m1", 1), ("m2", 2)]
    assert b.map_contains(M, kg("x"), "x", "m2") and not b.contains(M, kg("x"), "x")
    b.map_delete(M, kg("x"), "x", "m2")
    b.map_delete(M, kg("x"), "x", "m2")
    assert b.map_items(M, kg("x"), "x") == [("m1", 1)]
    b.map_clear(M, kg("x"), "x")
    b.map_clear(M, kg("x"), "x")
    assert b.map_items(M, kg("x"), "x") == [] and not b.map_contains(M, kg("x"), "x", "m1")
    assert b.map_items(M, kg("xy"), "xy") == [("m1", 3)]
    b.map_clear(M, kg("xy"), "xy")
    assert list(b.entries()) == []


def test_keys_equal_as_dict_keys_are_one_key(make, kind):
    b = make(kind)
    b.put(S, kg(1), 1, "int")
    b.put(S, kg(True), True, "bool")  # 1 == True == 1.0: one key, as in a dict
    assert b.get(S, kg(1.0), 1.0) == "bool"
    b.put(S, kg("1"), "1", "str")  # "1" is another key
    b.map_put(M, kg((1, "a")), (1, "a"), 2, "x")
    assert b.map_get(M, kg((True, "a")), (True, "a"), 2.0) == "x"
    assert len(state_of(b)) == 3


def test_rocksdb_get_returns_fresh_objects_never_the_stored_state(make):
    b = make("rocksdb")
    b.put("l", kg("a"), "a", [1])
    b.map_put(M, kg("a"), "a", "x", [1])
    job = b.snapshot(1)
    b.get("l", kg("a"), "a").append(2)  # not put back: nothing changes
    b.map_get(M, kg("a"), "a", "x").append(2)
    for _mk, v in b.map_items(M, kg("a"), "a"):
        v.append(3)
    assert b.get("l", kg("a"), "a") == [1] and b.map_get(M, kg("a"), "a", "x") == [1]
    expected = {("value", "l", "a"): [1], ("map", M, "a"): {"x": [1]}}
    assert restored_states(make, [job.run()]) == expected


def test_rocksdb_snapshot_keeps_key_types_and_rejects_unsupported_keys(make):
    b = make("rocksdb")
    b.put(S, kg(2.0), 2.0, "f")
    b.map_put(M, kg(b"k"), b"k", (1, None), "t")
    h = make("heap")
    h.restore([b.snapshot(1).run()])
    ((_, _, _, key, _),) = [e for e in h.entries() if e[0] == "value"]
    assert type(key) is float
    assert h.map_items(M, kg(b"k"), b"k") == [((1, None), "t")]
    with pytest.raises(TypeError, match="RocksDBStateBackend: map key of type list"):
        b.map_put(M, kg("a"), "a", [1], 1)
    with pytest.raises(TypeError, match="key of type object"):
        b.put(S, 0, object(), 1)


def test_rocksdb_lays_keys_out_by_key_group(make):
    b = make("rocksdb")
    for i in range(300):
        b.put(S, kg(i), i, i)
        b.map_put(M, kg(i), i, "m", i)
    groups = [g for _k, _s, g, _key, _v in b.entries()]
    assert groups == sorted(groups) and len(set(groups)) > 100


# ------------------------------------------------------------- snapshots & restore
def test_snapshot_roundtrip_into_both_backends(make, kind):
    b = make(kind)
    fill(b)
    expected = state_of(b)
    assert restored_states(make, [b.snapshot(1).run()]) == expected
    assert restored_states(make, [make(kind).snapshot(1).run()]) == {}


def test_blob_reflects_state_at_snapshot_despite_later_mutation(make, kind):
    b = make(kind)
    fill(b)
    expected = state_of(b)
    job = b.snapshot(1)  # sync part only; run() happens after the mutations
    mutate_everything(b)
    after = state_of(b)
    assert after != expected
    assert restored_states(make, [job.run()]) == expected
    assert state_of(b) == after


def test_two_overlapping_pending_snapshots_are_both_exact(make, kind):
    b = make(kind)
    fill(b)
    exp1 = state_of(b)
    job1 = b.snapshot(1)
    mutate_everything(b)
    exp2 = state_of(b)
    job2 = b.snapshot(2)
    fill(b, 60)
    blob2 = job2.run()  # finish out of order
    b.put(S, kg("k0"), "k0", "between")
    blob1 = job1.run()
    assert restored_states(make, [blob1]) == exp1
    assert restored_states(make, [blob2]) == exp2
    assert restored_states(make, [b.snapshot(3).run()])[("value", S, "k0")] == "between"


def test_rocksdb_run_and_release_delete_the_checkpoint_directory(make):
    b = make("rocksdb")
    fill(b)
    ran, released = b.snapshot(1), b.snapshot(2)
    chk = sorted(d for d in os.listdir(b.directory) if d.startswith("chk-"))
    assert chk == ["chk-1-0", "chk-2-1"] and b.pending_snapshots == 2
    ran.run()
    released.release()
    released.release()  # idempotent
    assert b.pending_snapshots == 0
    assert not [d for d in os.listdir(b.directory) if d.startswith("chk-")]
    assert ran.state is SnapshotJobState.DONE and released.state is SnapshotJobState.RELEASED
    with pytest.raises(EpochalError, match="epoch 2 cannot run: it is released"):
        released.run()


@pytest.mark.parametrize("src", sorted(KINDS))
@pytest.mark.parametrize("dst", sorted(KINDS))
def test_restore_keeps_only_owned_key_groups_and_rescales_2_to_3(make, src, dst):
    sources = [make(src, key_group_range(i, 2, 128)) for i in range(2)]
    model = {}
    for i in range(500):
        k = f"user{i}"
        g = kg(k)
        owner = sources[0] if g in sources[0].key_groups else sources[1]
        owner.put(S, g, k, i)
        owner.map_put(M, g, k, "m", [i])
        model[k] = i
    blobs = [b.snapshot(5).run() for b in sources]
    union, maps = {}, {}
    for i in range(3):
        r = make(dst, key_group_range(i, 3, 128))
        r.restore(blobs)
        for kind_, _s, g, key, v in r.entries():
            assert g in r.key_groups and kg(key) == g
            (union if kind_ == "value" else maps)[key] = v
    assert union == model and maps == {k: {"m": [i]} for k, i in model.items()}


def test_cross_backend_roundtrip_heap_to_rocksdb_and_back(make):
    heap = make("heap")
    fill(heap)
    heap.put(S, kg(3.5), 3.5, {"nested": (1, [2])})
    expected = state_of(heap)
    rocks = make("rocksdb")
    rocks.restore([heap.snapshot(1).run()])
    assert state_of(rocks) == expected
    back = make("heap")
    back.restore([rocks.snapshot(2).run()])
    assert state_of(back) == expected


def test_rocksdb_blob_is_sectioned_by_key_group(make):
    b = make("rocksdb")
    b.put(S, 3, "a", 1)
    b.map_put(M, 100, "b", "m", 2)
    blob = b.snapshot(1).run()
    assert [g for g, _ in decode_snapshot(blob, range(0, 64))] == [3]
    assert list(decode_snapshot(blob)) == [
        (3, ({S: {"a": 1}}, {})),
        (100, ({}, {M: {"b": {"m": 2}}})),
    ]


@pytest.mark.parametrize(
    "blob", [b"", b"XXXX\x00\x01\x00\x00\x00\x00", b"EPKS\x00\x63\x00\x00\x00\x00"]
)
def test_rocksdb_restore_rejects_foreign_bytes(make, blob):
    with pytest.raises(CheckpointStorageError):
        make("rocksdb").restore([blob])


def test_rocksdb_restore_of_many_entries_spans_several_write_batches(make):
    heap = make("heap")
    for i in range(25_000):
        heap.put(S, i % 128, i, i)
        heap.map_put(M, i % 128, i % 7, i, -i)
    rocks = make("rocksdb", range(0, 64))
    rocks.restore([heap.snapshot(1).run()])
    assert rocks.get(S, 5, 5) == 5 and rocks.get(S, 70, 70) is None
    assert sum(1 for e in rocks.entries() if e[0] == "value") == sum(
        1 for i in range(25_000) if i % 128 < 64)


# ----------------------------------------------------- incremental-snapshot hooks
def test_checkpoint_files_lists_immutable_sst_files_of_a_readable_checkpoint(make):
    b = make("rocksdb")
    fill(b)
    d1, ssts1 = b.checkpoint_files(1)
    assert ssts1 and all(os.path.isfile(os.path.join(d1, f)) for f in ssts1)
    b.put(S, kg("late"), "late", 1)
    d2, ssts2 = b.checkpoint_files(2)
    assert set(ssts2) - set(ssts1)  # the new epoch's writes are in new files only
    ro = Rdict(d1, Options(raw_mode=True), access_type=AccessType.read_only(False))
    try:
        assert len([k for k in ro.keys() if not k.startswith(b"\xff\xff")]) == 200
    finally:
        ro.close()
    b.discard_checkpoint(d1)
    b.discard_checkpoint(d1)
    assert not os.path.exists(d1) and os.path.exists(d2) and b.pending_snapshots == 1


# --------------------------------------------------------------------- lifecycle
def test_close_removes_the_working_directory(tmp_path):
    default = RocksDBStateBackend(ALL)
    parent = tmp_path / "local"
    given_path = RocksDBStateBackend(ALL, path=str(parent))
    for b in (default, given_path):
        fill(b)
        b.snapshot(1)  # a pending checkpoint goes too
        assert os.path.isdir(b.directory)
        b.close()
        b.close()  # idempotent
        assert not os.path.exists(b.directory)
    assert os.path.dirname(given_path.directory) == str(parent) and os.listdir(parent) == []


# ------------------------------------------------------------ concurrency & model
def test_writer_thread_runs_while_uploader_serializes(make, kind):
    b = make(kind)
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
    deadline = time.monotonic() + 1.5
    epoch = 0
    while time.monotonic() < deadline or epoch < 10:
        for _ in range(1000):
            k = rng.choice(keys)
            g = kg(k)
            op = rng.random()
            if op < 0.3:
                lst = b.get("l", g, k) or []
                b.put("l", g, k, (lst + [len(lst)])[-20:])
            elif op < 0.45:
                b.delete("l", g, k)
            elif op < 0.8:
                b.map_put(M, g, k, rng.randrange(10), {"v": rng.random()})
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
        assert restored_states(make, [results[e]]) == exp, f"epoch {e}"


KEYS = st.sampled_from([0, 1, True, 1.0, 2, -5, 2**70, 0.5, "a", "1", "", b"a", None, (1, "a"), ()])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.integers()),
        st.tuples(st.just("append"), KEYS, st.integers()),
        st.tuples(st.just("delete"), KEYS, st.none()),
        st.tuples(st.just("map_put"), KEYS, KEYS),
        st.tuples(st.just("map_delete"), KEYS, KEYS),
        st.tuples(st.just("map_clear"), KEYS, st.none()),
        st.tuples(st.just("snapshot"), st.none(), st.none()),
        st.tuples(st.just("run"), st.integers(0, 5), st.none()),
        st.tuples(st.just("release"), st.integers(0, 5), st.none()),
    ),
    max_size=50,
)


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=150, deadline=None)
@given(ops=ops)
def test_ops_match_a_dict_model_and_every_snapshot_its_barrier(kind, ops):
    with ExitStack() as stack:
        def make_(k, key_groups=ALL):
            b = KINDS[k](key_groups)
            stack.callback(b.close)
            return b

        b = make_(kind)
        values, maps = {}, {}  # the model
        pending = []  # (expected, job)
        epoch = 0
        for op, key, arg in ops:
            g = None if op in ("snapshot", "run", "release") else kg(key)
            if op == "put":
                b.put("l", g, key, [arg])
                values[key] = [arg]
            elif op == "append":
                lst = b.get("l", g, key)
                assert lst == values.get(key)
                if lst is not None:
                    b.put("l", g, key, lst + [arg])
                    values[key] = values[key] + [arg]
            elif op == "delete":
                b.delete("l", g, key)
                values.pop(key, None)
            elif op == "map_put":
                b.map_put(M, g, key, arg, [arg])
                maps.setdefault(key, {})[arg] = [arg]
            elif op == "map_delete":
                b.map_delete(M, g, key, arg)
                if arg in maps.get(key, {}):
                    del maps[key][arg]
                    if not maps[key]:
                        del maps[key]
            elif op == "map_clear":
                b.map_clear(M, g, key)
                maps.pop(key, None)
            elif op == "snapshot":
                epoch += 1
                pending.append((state_of(b), b.snapshot(epoch)))
            elif pending:
                expected, job = pending.pop(key % len(pending))
                if op == "run":
                    assert restored_states(make_, [job.run()]) == expected
                else:
                    job.release()
            if g is not None:
                assert b.contains("l", g, key) == (key in values)
                assert dict(b.map_items(M, g, key)) == maps.get(key, {})
        model = {("value", "l", k): v for k, v in values.items()}
        model.update({("map", M, k): inner for k, inner in maps.items()})
        assert state_of(b) == model
        for expected, job in pending:
            assert restored_states(make_, [job.run()]) == expected
        assert b.pending_snapshots == 0


# ------------------------------------------------------------------ measurement
@pytest.mark.slow
@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_sync_part_is_short_compared_to_the_async_part(make, n):
    b = make("rocksdb")
    for i in range(n):
        b.put(S, i % 128, i, (i, str(i)))
    t0 = time.perf_counter()
    job = b.snapshot(1)
    t_sync = time.perf_counter() - t0
    t0 = time.perf_counter()
    job.run()
    t_async = time.perf_counter() - t0
    print(f"n={n}: sync {t_sync * 1000:.1f} ms, async run {t_async * 1000:.1f} ms")
    assert t_sync < t_async, (t_sync, t_async)
