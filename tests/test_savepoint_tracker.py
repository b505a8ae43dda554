"""The savepoint bookkeeping as scripted events (epochal.runtime.driver.savepoints), retention of
pinned epochs (epochal.backends.retention), and the savepoint layout (epochal.state.savepoint)
on storage without any job."""
from __future__ import annotations

import json
import threading
import uuid

import pytest

from epochal.backends.storage import CheckpointStorage
from epochal.errors import CheckpointStorageError, SavepointError
from epochal.runtime.driver.savepoints import SavepointRequest, SavepointTracker
from epochal.runtime.task.snapshots import encode_task_state
from epochal.state import open_checkpoint, write_savepoint
from epochal.state.savepoint import import_checkpoint, list_recorded


def storage(tmp_path=None, job="job"):
    return CheckpointStorage(f"memory://sp-{uuid.uuid4().hex[:8]}" if tmp_path is None else f"file://{tmp_path}", job)


def complete(s, epoch, shared=()):
    """A completed checkpoint with one task state file and ``shared`` shared files."""
    h = s.write_state(epoch, "t-0.state", encode_task_state({"t": epoch}, None, None))
    files = [s.write_shared("t-0", name, name.encode()).to_dict() for name in shared]
    meta = {"epoch": epoch, "job": s.job, "generation": 4, "plan": {}, "max_parallelism": 128,
            "tasks": {"t[0]": {"handle": h.to_dict(), "chain": ["t"], "subtask": 0, "parallelism": 1,
                               "shared": files}}}
    s.write_metadata(epoch, meta)
    return meta


class Tracker:
    """A tracker whose copies run synchronously to the end (the test waits for them)."""

    def __init__(self, s):
        self.events = []
        self.t = SavepointTracker(s, lambda m: None)
        self.t.attach(self.events.append)

    def copy_done(self):
        for th in [t for t in threading.enumerate() if t.name.startswith("epochal-savepoint-")]:
            th.join(10)


def test_a_request_is_served_by_the_next_trigger_and_written_after_completion(tmp_path):
    s = storage(tmp_path / "ckpt")
    tr = Tracker(s)
    req = SavepointRequest(str(tmp_path / "sp"), stop=False)
    tr.t.add(req)
    assert tr.events == [("savepoint",)] and tr.t.has_waiting and req.epoch is None
    tr.t.on_trigger(3)
    assert req.epoch == 3 and not tr.t.has_waiting and tr.t.stop_epoch is None
    meta = complete(s, 3, ["e0000000002-a.sst"])
    tr.t.on_complete(3, meta)
    tr.copy_done()
    assert req.wait(0) == str(tmp_path / "sp") and tr.events[-1] == ("savepoint_done", 3)
    assert tr.t.pinned == frozenset() and [w["epoch"] for w in tr.t.written] == [3]
    assert [r["url"] for r in list_recorded(s)] == [str(tmp_path / "sp")]
    sp = open_checkpoint(str(tmp_path / "sp"))
    assert sp.kind == "savepoint" and sp.meta == meta and {h.path for h in sp.handles()} == {
        "chk-0000000003/t-0.state", "shared/t-0/e0000000002-a.sst"}


def test_an_aborted_epoch_fails_its_requests_and_lets_a_stopping_job_run_on():
    tr = Tracker(storage())
    req = SavepointRequest(None, stop=True)
    tr.t.add(req)
    tr.t.on_trigger(5)
    assert tr.t.stop_epoch == 5
    tr.t.on_abort(5, "timeout", final=False)
    assert tr.t.stop_epoch is None
    with pytest.raises(SavepointError, match="epoch 5 of the savepoint was aborted: timeout"):
        req.wait(0)


def test_an_aborted_final_epoch_keeps_its_requests_for_the_retry():
    tr = Tracker(storage())
    req = SavepointRequest(None, stop=True)
    tr.t.add(req)
    tr.t.on_trigger(7)
    tr.t.on_abort(7, "declined", final=True)
    assert not req.done and req.epoch is None and tr.t.has_waiting and tr.t.stop_epoch is None
    tr.t.on_trigger(8)
    assert req.epoch == 8 and tr.t.stop_epoch == 8


def test_a_failed_attempt_fails_waiting_and_bound_requests_and_a_closed_job_refuses_new_ones():
    tr = Tracker(storage())
    waiting, bound = SavepointRequest(None, stop=False), SavepointRequest(None, stop=True)
    tr.t.add(bound)
    tr.t.on_trigger(2)
    tr.t.add(waiting)
    tr.t.attempt_ended("task x[0] crashed\ntraceback")
    with pytest.raises(SavepointError, match=r"job failed \(task x\[0\] crashed\).*so it did not stop"):
        bound.wait(0)
    with pytest.raises(SavepointError, match="job failed"):
        waiting.wait(0)
    assert tr.t.stop_epoch is None
    tr.t.close("job 'j' is not running")
    late = SavepointRequest(None, stop=False)
    tr.t.add(late)
    with pytest.raises(SavepointError, match="not running"):
        late.wait(0)
    with pytest.raises(TimeoutError, match="waiting for an epoch"):
        SavepointRequest(None, stop=False).wait(0.01)


def test_a_failing_copy_fails_the_request_and_a_stop_resumes_triggering(tmp_path):
    s = storage(tmp_path / "ckpt")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    tr = Tracker(s)
    req = SavepointRequest(str(tmp_path / "taken"), stop=True)
    tr.t.add(req)
    tr.t.on_trigger(1)
    tr.t.on_complete(1, complete(s, 1))
    tr.copy_done()
    with pytest.raises(SavepointError, match="is not empty"):
        req.wait(0)
    assert tr.t.stop_epoch is None and tr.t.stop_ready() is None and tr.t.pinned == frozenset()


def test_retention_keeps_pinned_checkpoints_and_their_shared_files():
    s = storage()
    complete(s, 1, ["e0000000001-a.sst"])
    complete(s, 2, ["e0000000002-b.sst"])
    complete(s, 3, ["e0000000003-c.sst"])
    assert s.retain(1, pinned={1}) == [2]
    assert s.completed_checkpoints() == [1, 3]
    assert s.shared_files() == ["shared/t-0/e0000000001-a.sst", "shared/t-0/e0000000003-c.sst"]
    assert s.retain(1) == [1] and s.shared_files() == ["shared/t-0/e0000000003-c.sst"]


def test_savepoints_refuse_non_empty_targets_and_import_claims_a_higher_generation(tmp_path):
    s = storage(tmp_path / "ckpt")
    meta = complete(s, 6, ["e0000000005-x.sst"])
    chk = open_checkpoint(f"file://{tmp_path}/ckpt/job/chk-0000000006")
    marker = write_savepoint(chk, str(tmp_path / "sp"))
    assert marker["epoch"] == 6 and marker["bytes"] == sum(h.size for h in chk.handles())
    assert json.loads((tmp_path / "sp" / "_savepoint").read_text())["source"] == chk.location
    with pytest.raises(CheckpointStorageError, match="is not empty"):
        write_savepoint(chk, str(tmp_path / "sp"))
    target = CheckpointStorage(f"file://{tmp_path}/new", "job2")
    assert import_checkpoint(open_checkpoint(str(tmp_path / "sp")), target) == marker["bytes"]
    assert target.completed_checkpoints() == [6] and target.read_metadata(6) == meta
    assert target.next_generation() == 6  # the old job's was 4; the import claimed 5


def test_a_drain_marks_its_trigger_fails_the_attempt_on_abort_and_stops_when_its_copy_fails(tmp_path):
    """Drain bookkeeping: only the stop epoch's trigger says "drain"; an abort of it reports
    that the attempt must fail (and a FINAL epoch's does not: it is retried); a failed copy
    still makes the stop ready, with the request failed naming the drained checkpoint."""
    s = storage(tmp_path / "ckpt")
    tr = Tracker(s)
    plain = SavepointRequest(None, stop=False, drain=True)
    assert plain.drain is False  # only a stop drains
    req = SavepointRequest(str(tmp_path / "sp"), stop=True, drain=True)
    tr.t.add(req)
    tr.t.on_trigger(4)
    assert tr.t.stop_epoch == tr.t.drain_epoch == 4
    assert tr.t.trigger(4, 1.5) == ("trigger", 4, 1.5, "drain") and tr.t.trigger(5, 1.5) == ("trigger", 5, 1.5)
    assert tr.t.on_abort(4, "declined", final=False) is True
    assert tr.t.stop_epoch is None and tr.t.drain_epoch is None
    with pytest.raises(SavepointError, match=r"ended event time \(drain\)"):
        req.wait(0)

    final = SavepointRequest(None, stop=True, drain=True)  # a FINAL epoch's abort: retried, not failed
    tr.t.add(final)
    tr.t.on_trigger(6)
    assert tr.t.on_abort(6, "declined", final=True) is False and not final.done

    again = SavepointRequest(str(tmp_path / "taken"), stop=True, drain=True)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("not empty")  # the copy fails: the target is not empty
    tr.t._waiting.clear()
    tr.t.add(again)
    tr.t.on_trigger(7)
    tr.t.on_complete(7, complete(s, 7))
    tr.copy_done()
    ready = tr.t.stop_ready()
    assert ready is again and again.error is not None
    assert "the job drained and stops all the same" in again.error and "chk-0000000007" in again.error
