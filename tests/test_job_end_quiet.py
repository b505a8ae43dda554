"""Nothing of a job writes after its end (the campaign's seed 9004: something still wrote into
a history's checkpoint storage after the job's handle returned).

A savepoint copy runs on its own thread (epochal.runtime.driver.savepoints) and, once started,
finishes even if the attempt fails meanwhile: it writes the savepoint and records it in the
job's storage (``_savepoints/``). The job's end — :meth:`SavepointTracker.close`, called by the
driver before it releases the job's lease — must therefore wait for copies in flight, or a
cancelled job's ``wait()`` returns while its copy still writes (into a storage the next run of
the job may already hold). The copy is held in flight by a named pipe standing in for the
checkpoint's state file: reading it blocks until the test writes the file's bytes into it, so
the copy is mid-way for as long as the test decides (no timing involved). A pipe cannot be
seeked, so the released copy then fails naming the file (abandoned, no savepoint marker): the
job's end waits for a copy that fails as for one that succeeds.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

from epochal.backends.storage import CheckpointStorage
from epochal.errors import SavepointError
from epochal.runtime.driver.savepoints import SavepointRequest, SavepointTracker
from epochal.runtime.task.snapshots import encode_task_state


def _tree(root) -> dict:
    """Every path under ``root`` with its size: the storage as a plain listing (the oracle)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files + dirs:
            p = os.path.join(d, name)
            out[os.path.relpath(p, root)] = os.lstat(p).st_size
    return out


def test_the_job_end_waits_for_a_savepoint_copy_in_flight(tmp_path):
    s = CheckpointStorage(f"file://{tmp_path / 'ckpt'}", "job")
    data = encode_task_state({"t": 3}, None, None)
    h = s.write_state(3, "t-0.state", data)
    meta = {"epoch": 3, "job": "job", "generation": 1, "plan": {}, "max_parallelism": 128,
            "tasks": {"t[0]": {"handle": h.to_dict(), "chain": ["t"], "subtask": 0, "parallelism": 1, "shared": []}}}
    s.write_metadata(3, meta)
    state_file = os.path.join(tmp_path, "ckpt", "job", h.path)
    os.unlink(state_file)
    os.mkfifo(state_file)  # the copy's read of the state file blocks here until the test writes it

    tracker = SavepointTracker(s, lambda m: None)
    events = []
    tracker.attach(events.append)
    req = SavepointRequest(str(tmp_path / "sp"), stop=False)
    tracker.add(req)
    tracker.on_trigger(3)
    tracker.on_complete(3, meta)  # the copy thread starts and blocks on the pipe
    assert tracker.busy, "the copy is not in flight: the fault (a held read) did not fire"
    tracker.attempt_ended("task t[0] failed")  # the attempt fails mid-copy; the user cancels the job

    closed = threading.Event()
    closer = threading.Thread(target=lambda: (tracker.close("job 'job' is not running"), closed.set()))
    closer.start()
    closer.join(0.5)
    # the job's end must not pass while its copy can still write
    assert not closed.is_set(), "the job ended while its savepoint copy was still in flight"
    assert tracker.busy and not req.done
    with open(state_file, "wb") as pipe:  # let the copy go on: this open returns once the copy's read has opened the pipe
        try:
            pipe.write(data)
        except BrokenPipeError:  # the copy's seek of the pipe failed (and closed it) before this write: released either way
            pass
    closer.join(30)
    assert closed.is_set()
    assert not tracker.busy and [t for t in threading.enumerate() if t.name == "epochal-savepoint-3"] == []
    assert req.done  # the copy ended and resolved its request before the job's end returned
    with pytest.raises(SavepointError, match="t-0.state"):
        req.wait(0)
    after = _tree(tmp_path)
    assert "sp/_savepoint" not in after and not any(p.startswith("ckpt/job/_savepoints/") for p in after)
    assert _tree(tmp_path) == after  # nothing of the job writes any more
    assert events[-1] == ("savepoint_done", 3)


def test_close_with_no_copy_returns_at_once_and_is_idempotent(tmp_path):
    tracker = SavepointTracker(CheckpointStorage(f"file://{tmp_path}", "job"), lambda m: None)
    req = SavepointRequest(None, stop=True)
    tracker.add(req)
    tracker.close("job 'job' is not running")
    tracker.close("job 'job' is not running")
    with pytest.raises(SavepointError, match="not running"):
        req.wait(0)


def test_the_job_end_waits_for_the_answers_of_requested_savepoints(tmp_path):
    """A savepoint requested through the storage (``epochal savepoint trigger``) is answered by
    a thread of the request watcher: the job's end (tracker closed, then the watcher) returns
    only once that answer is written, so it never lands in the storage after the end."""
    from epochal.runtime.driver import requests

    s = CheckpointStorage(f"file://{tmp_path / 'ckpt'}", "job")
    tracker = SavepointTracker(s, lambda m: None)
    tracker.attach(lambda event: None)

    def take(url, stop, drain):
        req = SavepointRequest(url, stop, drain)
        tracker.add(req)
        return req

    watcher = requests.RequestWatcher(s, take, 0.02, "job").start()
    rid = requests.submit(s, None, stop=False)
    deadline = time.monotonic() + 30
    while not requests.taken(s, rid) and time.monotonic() < deadline:  # the watcher's poll, observed
        time.sleep(0.01)
    assert requests.taken(s, rid), "the watcher never took the request: the case did not arise"
    serving = []
    while not serving and time.monotonic() < deadline:  # the claim is written just before its thread starts
        serving = [t for t in threading.enumerate() if t.name == f"epochal-request-{rid}"]
        time.sleep(0.005)
    assert serving, "no thread waits to answer the request"

    tracker.close("job 'job' is not running")  # the driver's end, in its order
    watcher.close()
    assert [t for t in serving if t.is_alive()] == [], "the request's answer was still being written after the end"
    answer = s.read_document(f"{requests.DIR}/{rid}.done.json")
    assert answer is not None and "not running" in answer["error"]
    after = _tree(tmp_path)
    watcher.close()  # idempotent
    assert _tree(tmp_path) == after  # nothing of the job writes any more



def test_a_cancel_right_after_start_is_not_lost(tmp_path):
    """``cancel()`` before the attempt's coordinator exists (right after ``start``) used to
    be dropped: the job ran on to its end and wrote checkpoints into its storage long after
    the caller had cancelled it (the campaign's seed 9004: a second launch that was not
    refused, cancelled at once, then checkpointed on after the history ended). Now the
    attempt fails as soon as it exists, ``wait()`` raises "cancelled", and the storage stays
    still afterwards."""
    import epochal as ep
    from epochal.sinks import FileSink
    from pipelines import lines_from, unique_dir

    out, root = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "ckpt")
    flow = ep.Dataflow("cancelled", parallelism=1)
    (flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=2, limit=200, records_per_second=40.0))
        .map("pair", lambda line: (line, 1)).sink("out", FileSink(out)))  # 5 s of input: it ends on its own later
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + root))
    handle.cancel()
    with pytest.raises(ep.JobFailedError, match="cancelled"):
        handle.wait(60)
    after = _tree(root)
    assert not any(p.startswith("cancelled/_lease") for p in after), "the cancelled job still holds its lease"
    time.sleep(0.5)  # an observation window, not a protocol step: a straggler would write within it
    assert _tree(root) == after, "something wrote into the job's storage after its end"


def test_the_campaign_s_second_launch_after_the_job_ended_is_not_a_finding_and_leaves_nothing_running(tmp_path):
    """The harness (tests/campaign.py): a second launch drawn when the first job has already
    ended (a loop reads its input at once) is rightly not refused — the lease was released.
    It used to be reported as an error, the launched job cancelled and never waited for (it
    wrote into the history's directory after the history: seed 9004). Now the action did
    not land, and the launched job has ended before the action returns."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import campaign

    history = campaign.History(1, "file", "exactly-once", 1, [], n_lines=80)
    runner = campaign._Runner(history, str(tmp_path), {})
    try:
        runner.start()
        runner._wait_end()
        assert not runner.handle.running
        landed = runner._second_launch(None, None)  # raised "was not refused" before the fix
        assert landed is False
        root = runner.storage.removeprefix("file://")
        after = _tree(root)
        assert not any(p.endswith("_lease") for p in after), "a launched job still holds the storage's lease"
        time.sleep(0.5)  # an observation window, not a protocol step: a straggler would write within it
        assert _tree(root) == after, "something wrote into the history's storage after the action"
    finally:
        runner.close()
