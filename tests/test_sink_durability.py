"""The asynchronous durability step of two-phase-commit sinks (seed 004 §4.5.1).

At the barrier the task thread only seals the epoch's transaction; flushing, fsyncing and
closing its files runs on the task's uploader thread, and the epoch is acknowledged only
after that. These tests show, with conditions rather than timings:

* the task thread keeps writing records and takes the next barrier while a durability step
  is stuck (a file system whose ``close`` blocks, and a real pipeline whose step waits for
  the next epoch's records to reach the disk);
* the uploader acknowledges an epoch only after its job returned, and declines it when the
  job raises;
* a lost transaction (an I/O error inside the step) is never acknowledged by a later job,
  and fails the writer at its next barrier;
* end to end, a crash or an error during the step keeps the output equal to the golden run.
"""
from __future__ import annotations

import errno
import posixpath
import queue
import re
import threading
import time
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

import epochal as ep
from epochal.alignment.factory import SinkMode
from epochal.backends.storage import CheckpointStorage
from epochal.runtime.task.snapshots import PendingUpload, Uploader
from epochal.sinks import (
    FileSink,
    LogSink,
    SinkContext,
    TransactionState,
    read_committed,
)
from epochal.sinks.base import SinkCommitError
from epochal.sinks.files import FileSinkWriter
from epochal.sources.log import read_committed_log
from epochal.testing import CrashDuringDurability, FaultInjector

from pipelines import canon, output, unique_dir, wordcount, wordcount_oracle

TX = SinkMode.TRANSACTIONAL
WAIT = 30.0  # generous bound on waiting for an event that must happen (never a pass condition)


def ctx(gen: int = 0, mode: SinkMode = TX) -> SinkContext:
    return SinkContext("out", subtask=0, parallelism=1, job="job", generation=gen, mode=mode)


# ------------------------------------------------------------------ a file system whose close blocks


class _GatedFile(MemoryFile):
    def close(self):
        if not getattr(self, "gated", False):  # once (garbage collection closes files again)
            self.gated = True
            GatedMemoryFS.closing.put(threading.current_thread())
            if not GatedMemoryFS.release.wait(WAIT):
                GatedMemoryFS.timed_out = True
        super().close()


class GatedMemoryFS(MemoryFileSystem):
    """memory:// whose file ``close`` (an object store's upload) blocks until released."""

    protocol = "gatedmem"
    store: dict = {}
    pseudo_dirs = [""]
    closing: queue.Queue = queue.Queue()
    release = threading.Event()
    timed_out = False

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        if "w" in mode:
            f.__class__ = _GatedFile
        return f


fsspec.register_implementation("gatedmem", GatedMemoryFS, clobber=True)


def test_task_thread_keeps_writing_while_a_durability_step_is_stuck():
    GatedMemoryFS.release.clear()
    url = f"gatedmem://out-{uuid.uuid4().hex}"
    w = FileSink(url).create_writer(ctx())
    w.restore(None)
    for i in range(3):
        w.write({"epoch": 1, "i": i})
    w.snapshot(1)  # the seal: returns without closing the part file
    job = w.durability_job(1)
    assert GatedMemoryFS.closing.empty(), "the seal must not close (upload) the part file"
    uploader = threading.Thread(target=job, name="uploader")
    uploader.start()
    assert GatedMemoryFS.closing.get(timeout=WAIT) is uploader  # the step is inside close()
    # While the step is stuck, the task thread writes the next epoch and takes its barrier.
    for i in range(3):
        w.write({"epoch": 2, "i": i})
    w.snapshot(2)
    job2 = w.durability_job(2)
    assert uploader.is_alive() and GatedMemoryFS.closing.empty()
    assert read_committed(url) == []
    GatedMemoryFS.release.set()
    uploader.join(WAIT)
    assert not uploader.is_alive() and not GatedMemoryFS.timed_out
    job2()  # the uploader's next job (closes epoch 2's file)
    w.notify_epoch_complete(2)
    assert read_committed(url) == [{"epoch": e, "i": i} for e in (1, 2) for i in range(3)]


# ------------------------------------------------------------------ the base: lost transactions


def _sink_losing(url: str, epochs: set[int]):
    """A FileSink writer whose durability step of ``epochs`` truncates its files and raises EIO."""
    w = FileSink(url).create_writer(ctx())
    pre_commit = w.pre_commit

    def sealing(txn):
        step = pre_commit(txn)
        if txn.epoch not in epochs:
            return step

        def failing():
            step()
            for staged, _ in txn.files:
                with w._fs.open(w._join(staged), "wb"):
                    pass
            raise OSError(errno.EIO, f"injected fsync failure in epoch {txn.epoch}")
        return failing

    w.pre_commit = sealing
    return w


def test_a_lost_transaction_blocks_every_later_epoch(tmp_path):
    url = str(tmp_path / "out")
    w = _sink_losing(url, {2})
    w.restore(None)
    w.write({"e": 1})
    s1 = w.snapshot(1)
    w.durability_job(1)()
    w.write({"e": 2})
    w.snapshot(2)
    job2 = w.durability_job(2)
    w.write({"e": 3})
    w.snapshot(3)  # barrier 3 arrives before the uploader ran epoch 2's job
    job3 = w.durability_job(3)
    with pytest.raises(OSError, match="injected fsync failure"):
        job2()  # epoch 2 is declined
    with pytest.raises(SinkCommitError, match="epoch 3 cannot be made durable: the durability step of epoch 2"):
        job3()  # epoch 3 must not be acknowledged on top of the lost transaction
    w.write({"e": 4})  # records keep flowing until the next barrier...
    with pytest.raises(SinkCommitError, match="records are lost, so the task must restart"):
        w.snapshot(4)  # ...which fails the writer: the task restarts
    assert [t.state for t in w._pending] == [TransactionState.PRE_COMMITTED, TransactionState.FAILED,
                                             TransactionState.SEALED]
    w2 = FileSink(url).create_writer(ctx(1))
    w2.restore(s1)  # the latest completed checkpoint; epochs 2.. are replayed
    for e in (2, 3, 4):
        w2.write({"e": e})
    w2.snapshot(4)
    w2.durability_job(4)()
    w2.notify_epoch_complete(4)
    assert read_committed(url) == [{"e": e} for e in (1, 2, 3, 4)]


def test_a_job_runs_each_step_once_and_none_when_nothing_is_left(tmp_path):
    w = FileSink(str(tmp_path / "out")).create_writer(ctx())
    w.restore(None)
    w.snapshot(1)
    assert w.durability_job(1) is None  # empty epoch: the seal had nothing to make durable
    w.write({"a": 1})
    w.snapshot(2)
    job = w.durability_job(2)
    job()
    job()  # harmless: the step ran already
    assert w._pending[-1].state is TransactionState.PRE_COMMITTED and w._pending[-1].step is None
    w.write({"a": 2})
    w.snapshot(3)
    assert [t.epoch for t in w._pending] == [1, 2, 3]  # none notified yet
    w.notify_epoch_complete(3)  # a caller that never ran job 3: the commit makes it durable first
    assert read_committed(str(tmp_path / "out")) == [{"a": 1}, {"a": 2}]


# ------------------------------------------------------------------ the uploader


def test_uploader_acks_only_after_the_job_and_declines_when_it_raises():
    sent: queue.Queue = queue.Queue()
    started, release = threading.Event(), threading.Event()
    order = []

    def slow_job():
        started.set()
        assert release.wait(WAIT)
        order.append("job done")

    def failing_job():
        raise OSError(errno.EIO, "disk on fire")

    storage = CheckpointStorage(f"memory://ckpt-{uuid.uuid4().hex}", "job")
    up = Uploader("t[0]", storage, sent.put, FaultInjector([], ("out",), 0, 0))
    try:
        up.submit(PendingUpload(1, {"out": "state-1"}, None, None, before_ack=[("out", slow_job)]))
        assert started.wait(WAIT)
        assert sent.empty()  # the job is still running: nothing was acknowledged
        release.set()
        ack = sent.get(timeout=WAIT)
        assert ack[0] == "ack" and ack[1] == 1 and order == ["job done"]
        assert ack[2]["metrics"]["durable_s"] >= 0
        up.submit(PendingUpload(2, {"out": "state-2"}, None, None, before_ack=[("out", failing_job)]))
        up.submit(PendingUpload(3, {"out": "state-3"}, None, None))
        decline = sent.get(timeout=WAIT)
        assert decline[:3] == ("decline", 2, "t[0]")
        assert "asynchronous snapshot part of operator 'out' failed: OSError" in decline[3] and "disk on fire" in decline[3]
        assert sent.get(timeout=WAIT)[:2] == ("ack", 3)  # the task keeps running
    finally:
        release.set()
        up.close()


# ------------------------------------------------------------------ end to end

CHANNELS = ep.ChannelConfig(batch_size=32, linger="2ms")


def _run(flow, tmp_path, faults=(), **ckpt):
    cfg = ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "ckpt"), **{"interval": 0.05, **ckpt})
    return flow.run(guarantee="exactly-once", checkpoint=cfg, restart=ep.RestartStrategy(max_attempts=3, delay=0),
                    channels=CHANNELS, runtime="local", faults=list(faults))


@pytest.fixture(scope="module")
def golden_wordcount():
    """The committed output of ``wordcount("wc", ...)``, computed in plain Python (no engine
    run: tests/test_recovery.py checks that a failure-free run equals it)."""
    return wordcount_oracle(4000)


def test_process_crash_during_durability_equals_golden(tmp_path, golden_wordcount):
    out = unique_dir(tmp_path, "out")
    faults = [CrashDuringDurability("out", subtask=1, epoch=3, how="exit")]
    result = _run(wordcount("wc", out), tmp_path, faults)
    assert result.attempts == 2 and result.restored_from[1] is not None, result.failures
    assert output(out) == golden_wordcount


def test_failed_async_part_declines_the_epoch_and_the_job_continues(tmp_path, golden_wordcount):
    out = unique_dir(tmp_path, "out")
    faults = [CrashDuringDurability("out", subtask=0, epoch=3, how="raise")]
    result = _run(wordcount("wc", out), tmp_path, faults, tolerable_failures=1)
    assert result.attempts == 1, result.failures
    declined = [a for a in result.aborted_epochs if a["reason"] == "declined"]
    assert len(declined) == 1, result.aborted_epochs
    assert "asynchronous snapshot part of operator 'out' failed: InjectedFault" in declined[0]["detail"]
    assert declined[0]["epoch"] not in [c["epoch"] for c in result.completed_epochs]
    # the declined epoch's sealed transaction was made durable by the next epoch's job and
    # committed with it: nothing lost, nothing twice
    assert output(out) == golden_wordcount


class LosingFileSink(FileSink):
    """A FileSink whose durability step of one epoch in generation 0 loses its data (the
    staged files are truncated, as after a failed writeback) and raises EIO."""

    def __init__(self, path: str, epoch: int):
        super().__init__(path)
        self.epoch = epoch

    def create_writer(self, ctx):
        return _LosingWriter(self, ctx)


class _LosingWriter(FileSinkWriter):
    def __init__(self, sink, ctx):
        super().__init__(sink, ctx)
        self.lose = sink.epoch if ctx.generation == 0 else None

    def pre_commit(self, txn):
        step = super().pre_commit(txn)
        if step is None or self.lose is None or txn.epoch < self.lose:
            return step
        self.lose = None
        files, fs, join = list(txn.files), self._fs, self._join

        def failing():
            step()
            for staged, _ in files:
                with fs.open(join(staged), "wb"):
                    pass
            raise OSError(errno.EIO, f"injected fsync failure in epoch {txn.epoch}")
        return failing


def _numbers(split: int, offset: int):
    i = offset
    while True:
        yield {"split": split, "i": i}
        i += 1


def _numbers_flow(name: str, sink, n: int = 3000, rate: float = 6000.0) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=1)
    flow.source("numbers", ep.sources.GeneratorSource(_numbers, num_splits=1, limit=n, records_per_second=rate)) \
        .map("id", lambda r: r).sink("out", sink)
    return flow


GOLDEN_NUMBERS = canon({"split": 0, "i": i} for i in range(3000))


@pytest.mark.parametrize("tolerable", [0, 2])
def test_io_error_inside_the_step_declines_and_restarts_with_golden_output(tmp_path, tolerable):
    out = unique_dir(tmp_path, "out")
    result = _run(_numbers_flow("lose", LosingFileSink(out, epoch=2)), tmp_path, tolerable_failures=tolerable)
    declined = [a for a in result.aborted_epochs if a["reason"] == "declined"]
    assert any("injected fsync failure" in a["detail"] for a in declined) or any(
        "injected fsync failure" in f for f in result.failures), (result.failures, result.aborted_epochs)
    # the transaction's records are lost, so the attempt cannot go on: it restarts from the
    # latest completed epoch (at the declined epoch, or at the sink's next barrier)
    assert result.attempts == 2, result.failures
    assert tolerable == 0 or "records are lost, so the task must restart" in result.failures[0], result.failures
    assert output(out) == GOLDEN_NUMBERS


class FlowingFileSink(FileSink):
    """A FileSink whose first durability step (generation 0) waits until the NEXT epoch's
    staged file holds at least ``min_bytes``: it can only finish if the task thread keeps
    writing records while the step runs. Gives up after ``timeout`` s by raising."""

    def __init__(self, path: str, min_bytes: int = 16384, timeout: float = 30.0):
        super().__init__(path)
        self.min_bytes, self.timeout = min_bytes, timeout

    def create_writer(self, ctx):
        return _FlowingWriter(self, ctx)


class _FlowingWriter(FileSinkWriter):
    def __init__(self, sink, ctx):
        super().__init__(sink, ctx)
        self.gate = ctx.generation == 0
        self.min_bytes, self.timeout = sink.min_bytes, sink.timeout

    def pre_commit(self, txn):
        step = super().pre_commit(txn)
        if step is None or not self.gate:
            return step
        self.gate = False
        fs, staging, epoch = self._fs, self._join("_staging"), txn.epoch

        def wait_for_the_next_epoch():
            deadline = time.monotonic() + self.timeout
            while not _later_epoch_bytes(fs, staging, epoch) >= self.min_bytes:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no records of an epoch after {epoch} reached the disk while the "
                                       "durability step ran: the task thread is blocked")
                time.sleep(0.01)
            step()
        return wait_for_the_next_epoch


def _later_epoch_bytes(fs, staging: str, epoch: int) -> int:
    fs.invalidate_cache(staging)
    total = 0
    for info in fs.ls(staging, detail=True):
        m = re.match(r"part-[0-9a-f]{8}-e(\d{10})-", posixpath.basename(info["name"]))
        if m and int(m.group(1)) > epoch:
            total += info["size"]
    return total


def test_records_flow_while_the_durability_step_runs_end_to_end(tmp_path):
    out = unique_dir(tmp_path, "out")
    result = _run(_numbers_flow("flow", FlowingFileSink(out)), tmp_path, interval=0.1)
    assert result.attempts == 1, result.failures  # the step finished: records kept flowing meanwhile
    assert not result.aborted_epochs, result.aborted_epochs
    assert output(out) == GOLDEN_NUMBERS


# ------------------------------------------------------------------ LogSink end to end


def test_logsink_crash_during_durability_equals_golden(tmp_path):
    root = unique_dir(tmp_path, "log")
    sink = LogSink(root, "t", partitions=2, key_fn=lambda r: r["i"])
    result = _run(_numbers_flow("logdur", sink), tmp_path,
                  [CrashDuringDurability("out", epoch=3, how="exit")])
    assert result.attempts == 2 and result.restored_from[1] is not None, result.failures
    got = canon(r for records in read_committed_log(root, "t").values() for r in records)
    assert got == GOLDEN_NUMBERS
