"""Heap snapshots serialized in a forked child (epochal.backends.forked): the state is the
one at the barrier however the task mutates it afterwards, the task does not wait for the
serialization, failures name their cause and leave nothing behind, and the published file
is checksummed and restorable by both backends."""
from __future__ import annotations

import os
import threading

import pytest

from epochal.backends.formats import is_forked_descriptor as is_descriptor
from epochal.backends.forked import fork_available
from epochal.backends.heap import HeapStateBackend
from epochal.backends.keygroups import key_group_for, key_group_range
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.backends.storage import CheckpointStorage, StateHandle
from epochal.errors import CheckpointStorageError, ConfigError

pytestmark = pytest.mark.skipif(not fork_available(), reason="fork snapshots need Linux")

ALL = range(0, 128)


@pytest.fixture
def storage(tmp_path):
    return CheckpointStorage("file://" + str(tmp_path / "ckpt"), "job")


def kg(key):
    return key_group_for(key, 128)


def fill(b, n=300):
    for i in range(n):
        b.put("op/v", kg(i), i, [i, str(i)])
        b.map_put("op/m", kg(i), i, "x", {"n": i})


def snapshot_files(b):
    """Files in the backend's working directory besides its lock file."""
    return [n for n in os.listdir(b._workdir.path) if n != ".lock"]


def content(b):
    return sorted((kind, s, g, k, repr(v)) for kind, s, g, k, v in b.entries())


class WaitForFile:
    """Pickles only once ``path`` exists: holds the forked child mid-serialization until
    the test (the parent) creates the file — a condition, not a sleep."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        while not os.path.exists(self.path):
            os.sched_yield()
        return (str, ("released",))


class Unpicklable:
    def __reduce__(self):
        raise TypeError("Unpicklable objects cannot be pickled")


def test_auto_is_the_default_on_linux_and_modes_are_validated(tmp_path):
    assert HeapStateBackend(ALL).snapshot_mode == "auto"
    with pytest.raises(ConfigError, match="snapshot_mode.*'sometimes'"):
        HeapStateBackend(ALL, snapshot_mode="sometimes")


def test_auto_pickles_small_state_on_a_thread_and_forks_once_it_is_large(storage):
    """A fork has a fixed cost; below ``fork_min_bytes`` auto mode uses the thread."""
    b = HeapStateBackend(ALL, fork_min_bytes=20_000)
    b.put("op/small", 0, -1, "x")
    b.snapshot(1).run(storage, "t")
    assert b.last_snapshot_mode == "thread"
    fill(b, 1000)  # well above 20 kB
    expected = content(b)
    job = b.snapshot(2)
    assert b.last_snapshot_mode == "thread"  # decided by the previous (small) snapshot
    job.run(storage, "t")
    desc = b.snapshot(3).run(storage, "t")
    assert b.last_snapshot_mode == "fork" and is_descriptor(desc)
    restored = HeapStateBackend(ALL, fork_min_bytes=20_000)
    restored.restore_from([desc], storage)
    assert content(restored) == expected
    restored.snapshot(4).release()
    assert restored.last_snapshot_mode == "fork"  # a large restored state forks at once


def test_snapshot_is_the_state_at_the_barrier_and_is_published_with_checksum(storage):
    b = HeapStateBackend(ALL, snapshot_mode="fork")
    fill(b)
    expected = content(b)
    job = b.snapshot(3)
    for i in range(300):  # the child must not see any of this
        b.get("op/v", kg(i), i).append("after")
        b.put("op/v", kg(i + 1000), i + 1000, "new")
        b.map_delete("op/m", kg(i), i, "x")
    desc = job.run(storage, "store-0")
    assert is_descriptor(desc) and desc["handle"]["path"] == "chk-0000000003/store-0.keyed"
    assert desc["uploaded_bytes"] == desc["state_bytes"] == desc["handle"]["size"] > 0
    storage.read_state(StateHandle.from_dict(desc["handle"]))  # size and sha256 verified
    for backend in (HeapStateBackend(ALL), RocksDBStateBackend(ALL)):
        backend.restore_from([desc], storage)
        assert content(backend) == expected
        backend.close()
    assert b.pending_snapshots == 0 and snapshot_files(b) == []


def test_task_thread_does_not_wait_for_the_serialization(storage, tmp_path):
    gate = str(tmp_path / "gate")
    b = HeapStateBackend(ALL, snapshot_mode="fork")
    fill(b)
    b.put("op/v", kg("held"), "held", WaitForFile(gate))
    job = b.snapshot(1)  # returns while the child is stuck pickling WaitForFile
    b.put("op/v", kg(0), 0, "changed after the barrier")
    result = {}
    uploader = threading.Thread(target=lambda: result.setdefault("desc", job.run(storage, "t")))
    uploader.start()
    uploader.join(0.2)
    assert uploader.is_alive(), "the upload finished although the child could not have"
    open(gate, "w").close()
    uploader.join(60)
    restored = HeapStateBackend(ALL)
    restored.restore_from([result["desc"]], storage)
    assert restored.get("op/v", kg(0), 0) == [0, "0"]
    assert restored.get("op/v", kg("held"), "held") == "released"


def test_a_child_that_cannot_pickle_reports_why_and_leaves_no_file(storage):
    b = HeapStateBackend(ALL, snapshot_mode="fork")
    fill(b, 10)
    b.put("op/v", kg("bad"), "bad", Unpicklable())
    job = b.snapshot(2)
    with pytest.raises(CheckpointStorageError, match="epoch 2 failed: TypeError: Unpicklable objects cannot"):
        job.run(storage, "t")
    assert snapshot_files(b) == [] and b.pending_snapshots == 0
    assert storage.all_epochs() == [] or not os.listdir(storage.epoch_dir(2))


def test_release_kills_a_running_child_and_close_removes_the_directory(tmp_path):
    b = HeapStateBackend(ALL, snapshot_mode="fork")
    b.put("op/v", 0, "held", WaitForFile(str(tmp_path / "never")))
    job = b.snapshot(1)
    (snap,) = b._forked
    pid = snap.pid
    job.release()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped: no zombie left
    assert snapshot_files(b) == [] and b.pending_snapshots == 0
    directory = b._workdir.path
    b.snapshot(2)  # pending at close: close cancels it
    b.close()
    assert not os.path.exists(directory)


def test_rescaled_restore_keeps_only_owned_key_groups(storage):
    src = HeapStateBackend(ALL, snapshot_mode="fork")
    fill(src)
    desc = src.snapshot(1).run(storage, "t")
    parts = []
    for i in range(3):
        r = HeapStateBackend(key_group_range(i, 3, 128))
        r.restore_from([desc], storage)
        assert all(g in r.key_groups for _k, _s, g, _key, _v in r.entries())
        parts.extend(content(r))
    assert sorted(parts) == content(src)


def test_a_corrupted_published_file_is_detected_on_restore(storage):
    b = HeapStateBackend(ALL, snapshot_mode="fork")
    fill(b)
    desc = b.snapshot(1).run(storage, "t")
    path = os.path.join(storage.root, desc["handle"]["path"])
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    with pytest.raises(CheckpointStorageError, match="corrupt: sha256 mismatch"):
        HeapStateBackend(ALL).restore_from([desc], storage)


def test_move_state_file_to_remote_storage_streams_the_file(tmp_path):
    memory = CheckpointStorage("memory://forked-test", "job")
    b = HeapStateBackend(ALL, snapshot_mode="fork")
    fill(b)
    expected = content(b)
    desc = b.snapshot(4).run(memory, "t")
    restored = HeapStateBackend(ALL)
    restored.restore_from([desc], memory)
    assert content(restored) == expected
    assert snapshot_files(b) == []
