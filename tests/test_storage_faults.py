"""Storage faults survived without losing data (issue 23), against plain-Python oracles.

Checkpoints go to a loopback S3 server that fails on purpose (``tests/s3faults.py``):
errors and ``503 SlowDown`` throttling beyond what the S3 clients retry by themselves,
the storage down for a while, a ``_metadata`` that cannot be written for several epochs;
and to a small tmpfs that fills up during a checkpoint. In every case the committed
output equals the plain-Python word count, the job is never restarted for the fault
(``attempts == 1``), and the test asserts its fault fired.

The S3 clients' own retries are turned down (``AWS_MAX_ATTEMPTS=2``; s3fs still retries
``SlowDown`` five times) so that the injected faults outlast them and reach epochal's retry
layer (:mod:`epochal.backends.retry`), which is what these tests are about.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import time

import pytest

import epochal as ep
from epochal.backends.storage import CheckpointStorage

from pipelines import output, unique_dir, wordcount, wordcount_oracle

pytest_plugins = ["s3faults"]


@pytest.fixture
def s3(faulty_s3_env, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    return faulty_s3_env


@contextlib.contextmanager
def running(handle):
    """``handle``'s job, cancelled (and waited for) if the test leaves early: no stray tasks."""
    try:
        yield handle
    finally:
        if handle.running:
            handle.cancel()
            with contextlib.suppress(Exception):
                handle.wait(60)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_s3_errors_and_throttling_are_retried_without_a_restart(s3, tmp_path):
    """500s on every ``_metadata`` write and on the generation file, ``SlowDown`` on task
    state uploads — more in a row than botocore and s3fs retry — are waited out."""
    out = unique_dir(tmp_path, "out")
    faults = s3.faults
    faults.fail(3, match="/_generation")       # the driver, before anything starts
    faults.fail(8, match="/_metadata", method="PUT")  # the coordinator completing an epoch
    faults.throttle(12, match=".state", method="PUT")  # the tasks' uploaders
    result = wordcount("s3-flaky", out, n_lines=1200, rate=150.0).run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=s3.fresh_url("flaky"),
                                                      inline_state=0))  # state in files: uploads to throttle
    assert faults.pending == 0, "not every injected fault fired"
    assert faults.injected["fail"] == 11 and faults.injected["throttle"] == 12
    assert result.attempts == 1, result.failures
    assert not result.aborted_epochs, result.aborted_epochs  # waited out, not declined
    assert output(out) == wordcount_oracle(1200)


def test_metadata_that_cannot_be_written_declines_the_epoch_and_the_job_runs_on(s3, tmp_path):
    """With a short ``storage_retry``, ``_metadata`` writes that keep failing decline their
    epochs after every task acknowledged them; ``tolerable_failures`` lets the job run on,
    and later checkpoints complete once the storage answers again."""
    out = unique_dir(tmp_path, "out")
    s3.faults.fail(30, match="/_metadata", method="PUT")
    result = wordcount("s3-declined", out, n_lines=1200, rate=100.0).run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=s3.fresh_url("declined"),
                                                        storage_retry=0.5, tolerable_failures=100))
    assert s3.faults.pending == 0
    declined = [a for a in result.aborted_epochs if "could not write the checkpoint's _metadata" in a["detail"]]
    assert declined and all(a["reason"] == "declined" for a in declined), result.aborted_epochs
    assert result.attempts == 1, result.failures
    assert max(e["epoch"] for e in result.completed_epochs) > max(a["epoch"] for a in declined)
    assert output(out) == wordcount_oracle(1200)


def _outage(s3, tmp_path, seconds: float, name: str):
    out = unique_dir(tmp_path, "out")
    handle = wordcount(name, out, n_lines=1200, rate=300.0 / (seconds + 8)).start(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=s3.fresh_url(name),
                                                        timeout=seconds + 30))
    with running(handle):
        _wait(lambda: handle.completed_epochs, 60, "a first checkpoint")
        s3.faults.outage(seconds)
        down_until = time.time() + seconds
        _wait(lambda: not s3.faults.down, seconds + 5, "the end of the outage")
        result = handle.wait(seconds + 120)
    assert s3.faults.injected["outage"] > 0
    assert result.attempts == 1, result.failures
    assert any(e["wall_time"] > down_until for e in result.completed_epochs)  # checkpoints after it
    assert output(out) == wordcount_oracle(1200)
    return result


@pytest.mark.slow  # opt-in (-m slow): keeps the default suite under 30 minutes
def test_a_storage_outage_is_waited_out(s3, tmp_path):
    """Every S3 request answered ``503 ServiceUnavailable`` for 8 s in the middle of a run."""
    _outage(s3, tmp_path, 8.0, "s3-outage")


@pytest.mark.slow
def test_a_thirty_second_storage_outage_is_waited_out(s3, tmp_path):
    _outage(s3, tmp_path, 30.0, "s3-outage-30")


# ------------------------------------------------------------------ a full disk
@contextlib.contextmanager
def small_tmpfs(size: str):
    """A tmpfs of ``size`` mounted on a fresh directory (root only), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = tempfile.mkdtemp(prefix="epochal-full-disk-")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        os.rmdir(where)
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)
        os.rmdir(where)


def _fill(directory: str) -> str:
    """Write a file that takes every free byte of ``directory``'s file system."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 16, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return path


def test_a_full_disk_during_checkpoints_declines_them_and_the_job_runs_on(tmp_path):
    """Checkpoint storage on a 4 MB tmpfs that a file fills up while the job runs: the
    checkpoints of that time fail with ENOSPC (no retry: it is permanent) and are
    declined, nothing half-written is left, the job runs on; once space is freed,
    checkpoints complete again and the output equals the oracle."""
    with small_tmpfs("4m") as disk:
        out = unique_dir(tmp_path, "out")
        events = []
        handle = wordcount("full-disk", out, n_lines=1200, rate=50.0).start(
            runtime="local", metrics=ep.MetricsConfig(interval=0.1, listener=events.append, log=False),
            checkpoint=ep.CheckpointConfig(interval=0.1, storage=f"file://{disk}/ckpt", tolerable_failures=1000))
        with running(handle):
            _wait(lambda: handle.completed_epochs, 60, "a first checkpoint")
            filler = _fill(disk)
            _wait(lambda: events and events[-1]["checkpoints"]["aborted"] >= 3, 60,
                  "checkpoints failing on a full disk")
            os.unlink(filler)
            freed = time.time()
            result = handle.wait(120)
        full = [a for a in result.aborted_epochs if "No space left on device" in a["detail"]]
        assert len(full) >= 3, result.aborted_epochs
        assert result.attempts == 1, result.failures
        assert any(e["wall_time"] > freed for e in result.completed_epochs)
        assert output(out) == wordcount_oracle(1200)
        leftovers = [os.path.join(d, f) for d, _, files in os.walk(disk) for f in files if f.endswith(".tmp")]
        assert not leftovers, leftovers  # a failed write leaves no temporary file
        storage = CheckpointStorage(f"file://{disk}/ckpt", "full-disk")
        latest = storage.latest_restorable()  # every file of the retained checkpoints is intact
        assert latest is not None and latest[0] == result.completed_epochs[-1]["epoch"]
