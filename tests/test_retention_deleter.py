"""Retention's deletes run off the coordinator's loop (epochal.runtime.driver.deleter).

The decision (``retention.plan``) is taken on the caller's thread; the deleter deletes it on
its own. A delete is held in flight by a gate in front of the file system's ``rm`` (a
threading.Event the test opens): the caller's return, the pinned epoch, the job's end
waiting — all checked while the delete is provably mid-way, not timed. The oracle is the
storage directory listed with ``os.listdir``.
"""
from __future__ import annotations

import os
import threading

from epochal.backends import retention
from epochal.backends.storage import CheckpointStorage
from epochal.runtime.driver.deleter import CheckpointDeleter


class GatedFS:
    """The storage's file system, with every ``rm`` held until :attr:`gate` is set."""

    def __init__(self, fs):
        self._fs = fs
        self.gate = threading.Event()
        self.entered = threading.Event()  # an rm is waiting at the gate
        self.rm_calls: list[list[str]] = []

    def rm(self, path, recursive=False, maxdepth=None):
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        self.rm_calls.append(list(path) if isinstance(path, list) else [path])
        return self._fs.rm(path, recursive=recursive, maxdepth=maxdepth)

    def __getattr__(self, name):
        return getattr(self._fs, name)


def _storage(tmp_path, epochs=(1, 2, 3, 4), files=5):
    s = CheckpointStorage(f"file://{tmp_path / 'ckpt'}", "job")
    for e in epochs:
        handles = [s.write_state(e, f"t-{i}.state", b"x" * 16).to_dict() for i in range(files)]
        s.write_metadata(e, {"epoch": e, "tasks": {f"t[{i}]": {"handle": h} for i, h in enumerate(handles)}})
    gated = GatedFS(s.fs)
    s.fs = gated
    return s, gated


def _chk_dirs(tmp_path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path / "ckpt" / "job") if n.startswith("chk-"))


def test_the_deletes_run_off_the_caller_in_bulk_and_the_newest_are_kept(tmp_path):
    s, fs = _storage(tmp_path)
    logs = []
    deleter = CheckpointDeleter(s, logs.append)
    deletions = retention.plan(s, 2)
    assert [e for e, _ in deletions.epochs] == [1, 2]
    assert deleter.submit(deletions)  # returns with the delete held at the gate
    assert fs.entered.wait(30), "the deleter never reached the file system"
    assert _chk_dirs(tmp_path) == ["chk-0000000001", "chk-0000000002", "chk-0000000003", "chk-0000000004"]
    assert deleter.busy_epochs == {1, 2}
    assert retention.plan(s, 2, busy=deleter.busy_epochs).epochs == ()  # a pass meanwhile skips them
    fs.gate.set()
    assert deleter.drain(30)
    assert _chk_dirs(tmp_path) == ["chk-0000000003", "chk-0000000004"]
    assert s.completed_checkpoints() == [3, 4]
    # bulk: the two _metadata in one rm, the two directories (10 state files) in another
    assert sorted(len(c) for c in fs.rm_calls) == [2, 2]
    assert deleter.busy_epochs == frozenset() and deleter.epochs_deleted == 2 and logs == []
    deleter.close()


def test_a_pinned_epoch_is_kept_until_it_is_unpinned(tmp_path):
    s, fs = _storage(tmp_path)
    fs.gate.set()
    deleter = CheckpointDeleter(s, lambda m: None)
    deleter.submit(retention.plan(s, 1, pinned={2}))  # a savepoint is being copied out of epoch 2
    assert deleter.drain(30)
    assert _chk_dirs(tmp_path) == ["chk-0000000002", "chk-0000000004"]
    deleter.submit(retention.plan(s, 1))  # the copy ended: the next pass deletes it
    assert deleter.drain(30)
    assert _chk_dirs(tmp_path) == ["chk-0000000004"]
    deleter.close()


def test_the_job_end_waits_for_deletes_in_flight_and_nothing_deletes_after_it(tmp_path):
    s, fs = _storage(tmp_path)
    deleter = CheckpointDeleter(s, lambda m: None)
    deleter.submit(retention.plan(s, 1))
    assert fs.entered.wait(30), "the delete is not in flight: the gate did not hold it"
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (deleter.close(), closed.set()))
    closer.start()
    closer.join(0.5)
    assert not closed.is_set(), "the job ended while retention's deletes were still in flight"
    assert len(_chk_dirs(tmp_path)) == 4
    fs.gate.set()
    closer.join(30)
    assert closed.is_set()
    assert _chk_dirs(tmp_path) == ["chk-0000000004"]
    assert [t for t in threading.enumerate() if t.name == "epochal-retention"] == []
    # after the end nothing is deleted: a late pass is refused, the storage stays as it is
    s.write_metadata(5, {"epoch": 5, "tasks": {}})
    assert deleter.submit(retention.plan(s, 1)) is False
    assert _chk_dirs(tmp_path) == ["chk-0000000004", "chk-0000000005"]
    deleter.close()  # idempotent


def test_shared_files_count_as_deleted_from_the_decision_on(tmp_path):
    """An acknowledgement checked after the decision but before the file is gone is
    declined (storage.shared_deleted), as when the delete ran on the loop thread."""
    s, fs = _storage(tmp_path, epochs=(1,))
    old = s.write_shared("t-0", "e0000000001-a.sst", b"old")
    s.write_metadata(2, {"epoch": 2, "tasks": {}})
    s.write_metadata(3, {"epoch": 3, "tasks": {}})
    deleter = CheckpointDeleter(s, lambda m: None)
    deleter.submit(retention.plan(s, 2))
    assert fs.entered.wait(30)
    assert s.shared_deleted(old.path)  # declined from now on ...
    assert os.path.exists(tmp_path / "ckpt" / "job" / old.path)  # ... though the file is still there
    fs.gate.set()
    assert deleter.drain(30)
    assert not os.path.exists(tmp_path / "ckpt" / "job" / old.path) and s.shared_files() == []
    deleter.close()


def test_a_failed_delete_is_logged_and_the_next_pass_deletes_it(tmp_path, monkeypatch):
    s, fs = _storage(tmp_path, epochs=(1, 2, 3))
    fs.gate.set()
    monkeypatch.setattr(retention, "DELETE_RETRY", retention.RetryPolicy(deadline=0.0))
    failing = {"left": 1}
    real_rm = fs.rm

    def rm(path, recursive=False, maxdepth=None):
        if failing["left"]:
            failing["left"] -= 1
            raise PermissionError("injected: the store refused the delete")
        return real_rm(path, recursive=recursive, maxdepth=maxdepth)
    fs.rm = rm
    logs = []
    deleter = CheckpointDeleter(s, logs.append)
    deleter.submit(retention.plan(s, 2))
    assert deleter.drain(30)
    assert failing["left"] == 0, "the injected failure did not fire"
    assert deleter.failures == 1 and any("injected" in m for m in logs)
    assert "chk-0000000001" in _chk_dirs(tmp_path)
    deleter.submit(retention.plan(s, 2, busy=deleter.busy_epochs))
    assert deleter.drain(30)
    assert _chk_dirs(tmp_path) == ["chk-0000000002", "chk-0000000003"]
    deleter.close()
