"""Working directories of task processes are reclaimed after their owner dies, however it
dies, and never while it (or a child it forked) lives (epochal.backends.workdir)."""
from __future__ import annotations

import os
import subprocess
import sys

from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.backends.workdir import make_workdir, sweep

OWNER = """
import os, sys
from epochal.backends.workdir import make_workdir
w = make_workdir("test", sys.argv[1])
open(os.path.join(w.path, "data"), "w").write("x")
print(w.path, flush=True)
if sys.argv[2] == "crash":
    os._exit(3)          # no close(), no clean-up: like a killed task
sys.stdin.read()         # alive until the test closes stdin
"""


def owner(parent, how):
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(parent), how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_the_directory_of_a_crashed_owner_is_swept_by_the_next_one(tmp_path):
    proc, path = owner(tmp_path, "crash")
    assert proc.wait() == 3 and os.path.exists(os.path.join(path, "data"))
    mine = make_workdir("test", str(tmp_path))
    assert not os.path.exists(path) and os.path.isdir(mine.path)
    mine.remove()
    mine.remove()  # idempotent
    assert os.listdir(tmp_path) == []


def test_a_live_owners_directory_is_never_swept(tmp_path):
    proc, path = owner(tmp_path, "live")
    try:
        assert sweep(str(tmp_path)) == []
        mine = make_workdir("test", str(tmp_path))
        assert os.path.exists(os.path.join(path, "data"))
        assert sweep(str(tmp_path)) == []  # nor our own, locked by this process
        assert os.path.isdir(mine.path)
    finally:
        proc.stdin.close()
        proc.wait()
    assert sweep(str(tmp_path)) == [path]  # it exited without removing: now it goes
    mine.remove()


def test_directories_without_a_lock_file_are_left_alone(tmp_path):
    foreign = tmp_path / "epochal-old-format"
    foreign.mkdir()
    (tmp_path / "unrelated").mkdir()
    assert sweep(str(tmp_path)) == []
    assert foreign.exists()


def test_rocksdb_backend_lives_in_a_reclaimable_workdir(tmp_path):
    b = RocksDBStateBackend(range(0, 128), path=str(tmp_path))
    b.put("op/s", 1, "k", 1)
    assert sweep(str(tmp_path)) == [] and os.path.isdir(b.directory)
    b.close()
    assert os.listdir(tmp_path) == []
