"""Byte budgets: what a task holds in memory is bounded in bytes, not only in records or
batches — in-transit and channel-state logs spill beyond ``log_memory_bytes``, loop
feedback queues beyond ``feedback_memory_bytes``, and frames are cut by bytes at the sender
(``batch_bytes``, ``max_frame_bytes``) with an error naming the operator when one record
alone is too big."""
from __future__ import annotations

import collections
import os
import pickle
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.loops.log import InTransitLog, replay
from epochal.runtime.transport import wire
from epochal.runtime.transport.channels import END, InputGate, OutputChannel
from epochal.runtime.transport.frames import BatchSizer, RecordTooLarge, Unencodable, encode_within
from epochal.runtime.transport.spill import SpillQueue
from epochal.testing import CrashAtRecord

from pipelines import collatz, collatz_golden, output, unique_dir


class MemoryStorage:
    def __init__(self):
        self.files = {}

    def write_state(self, epoch, name, blob):
        self.files[name] = bytes(blob)
        return type("H", (), {"to_dict": lambda h: {"path": name, "size": len(blob), "sha256": ""}})()

    def read_state(self, handle):
        return self.files[handle.path]


def test_in_transit_log_is_bounded_in_bytes_and_replays_in_order():
    """Records of 1 KB in batches of 7 through a log of 20 KB: it never holds more than the
    budget plus one batch, spills the rest, and persist + replay give back every record in
    order (spilled chunks as state files, the rest inline)."""
    log = InTransitLog(memory_bytes=20_000)
    records = [f"{i:06d}" + "x" * 1000 for i in range(700)]
    peak = 0
    for start in range(0, len(records), 7):
        log.append(records[start:start + 7])
        peak = max(peak, log.memory_held)
    assert peak <= 20_000 + 8 * 1100, peak
    assert log.spilled_chunks >= 30 and len(log) == 700 and log.bytes > 700_000
    assert [r for chunk in log.chunks() for r in chunk] == records
    storage = MemoryStorage()
    desc = pickle.loads(pickle.dumps(log.persist(storage, 3, "t.state")))
    assert len(desc["segments"]) == log.spilled_chunks
    assert max(len(b) for b in storage.files.values()) <= 20_000 + 8 * 1100
    assert [r for batch in replay([desc], storage) for r in batch] == records
    log.close()


def test_a_log_written_before_byte_budgets_still_replays():
    storage = MemoryStorage()
    storage.files["old.log0"] = pickle.dumps([1, 2, 3])
    old = {"count": 5, "segments": [{"path": "old.log0", "size": 0, "sha256": ""}], "inline": [4, 5], "bytes": 0}
    assert [r for batch in replay([old], storage) for r in batch] == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------ feedback queues spill
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.one_of(st.integers(1, 3000), st.just("pop"), st.just("left")), max_size=80),
       budget=st.integers(1, 5000))
def test_spill_queue_is_fifo_and_holds_at_most_its_budget_plus_one_frame(ops, budget):
    """Messages of random sizes put, popped and put back in random order: the queue behaves
    as a deque (the reference), and its memory never holds more than the budget plus one
    frame, whatever went to disk."""
    q, ref, n = SpillQueue(budget, pickle.loads), collections.deque(), 0
    try:
        for op in ops:
            if op == "pop":
                if ref:
                    assert q.popleft() == ref.popleft()
                else:
                    with pytest.raises(IndexError):
                        q.popleft()
            elif op == "left":
                if ref:
                    msg = q.popleft()
                    q.appendleft(msg)
            else:
                msg = ("B", n, "x" * op)
                n += 1
                q.put(msg, pickle.dumps(msg))
                ref.append(msg)
            assert len(q) == len(ref) and bool(q) == bool(ref)
            assert q.memory_held <= budget + 3100
        assert list(q) == list(ref)
        while ref:
            assert q.popleft() == ref.popleft()
    finally:
        q.close()


def test_spill_queue_spills_beyond_its_budget_and_truncates_its_file_when_drained():
    q = SpillQueue(10_000, pickle.loads)
    frames = [pickle.dumps(("B", i, b"y" * 1000)) for i in range(100)]
    for f in frames:
        q.put(pickle.loads(f), f)
    assert q.spilled > 80 and q.on_disk == q.spilled and q.memory_held <= 10_000
    assert os.fstat(q._fd).st_size > 80_000
    assert [q.popleft()[1] for _ in range(100)] == list(range(100))
    assert os.fstat(q._fd).st_size == 0 and not q
    q.close()


# ------------------------------------------------------------------ frames cut by bytes
def test_encode_within_splits_a_batch_until_every_frame_fits():
    records = [("k", "v" * 100) for _ in range(1000)]
    parts = encode_within(records, 10_000, pickle.dumps)
    assert [r for part, _ in parts for r in part] == records
    assert all(len(frame) <= 10_000 and frame == pickle.dumps(part) for part, frame in parts)
    assert len(encode_within(records, 1 << 30, pickle.dumps)) == 1  # within the limit: one encode


def test_encode_within_slices_an_arrow_batch_by_rows():
    from epochal.runtime.transport.channels import encode_batch

    batch = pa.record_batch({"s": ["z" * 1000] * 500})
    parts = encode_within([batch], 60_000, encode_batch)
    assert len(parts) > 8 and all(len(f) <= 60_000 for _, f in parts)
    assert pa.Table.from_batches([b for part, _ in parts for b in part]).equals(pa.Table.from_batches([batch]))


def test_encode_within_names_the_record_that_is_too_large_or_unencodable():
    with pytest.raises(RecordTooLarge) as too_large:
        encode_within(["a", "b" * 50_000, "c"], 10_000, pickle.dumps)
    assert too_large.value.record == "b" * 50_000 and too_large.value.size > 50_000
    lock = threading.Lock()
    with pytest.raises(Unencodable, match="cannot pickle '_thread.lock'") as bad:
        encode_within(["a", lock, "c"], 10_000, pickle.dumps)
    assert bad.value.record is lock


def test_batch_sizer_keeps_batches_near_batch_bytes():
    s = BatchSizer(batch_size=512, batch_bytes=64_000)
    s.observe_frames(encode_within([b"%04d" % i * 250 for i in range(512)], 1 << 30, pickle.dumps))
    assert 50 <= s.size <= 64
    s.observe(records=100, nbytes=100)
    assert s.size > 64


def test_a_feedback_channel_keeps_its_budget_in_memory_and_the_rest_on_disk():
    """An input gate's unbounded (loop feedback) channel over a real connection: 100 frames
    of 1 KB against a 10 KB budget, nothing consumed — most wait on disk, memory holds the
    budget; then every message comes out in order."""
    cid = "more>loop.1:0>0"
    cv = threading.Condition()
    gate = InputGate((cid,), 8, cv, unbounded=frozenset({0}), unbounded_memory_bytes=10_000)
    key = os.urandom(32)
    server = wire.Server(key, gate.attach)
    out = OutputChannel(cid, wire.connect(server.address, key, {"channel": cid}), cv)
    try:
        for i in range(100):
            out.send_batch([("r", i, "z" * 1000)], lambda: False)
        out.send_event((END,))
        deadline = time.monotonic() + 30
        with cv:
            while len(gate.queues[0]) < 101 and time.monotonic() < deadline:
                cv.wait(0.05)
        queue = gate.queues[0]
        assert len(queue) == 101 and queue.spilled >= 85 and queue.memory_held <= 10_000, \
            (len(queue), queue.spilled, queue.memory_held)
        got = [gate.poll(frozenset()) for _ in range(101)]
        assert [msg[1][0][1] for _, msg in got[:100]] == list(range(100)) and got[100][1] == (END,)
        assert gate.spilled_frames == queue.spilled and not queue
    finally:
        out.close()
        gate.close()
        server.close()


def test_a_loop_whose_feedback_spills_to_disk_is_exactly_once(tmp_path):
    """Collatz through a loop whose feedback channels keep 1 byte in memory (every frame
    queued behind another waits on disk), with a crash: the output equals plain Python's."""
    out = unique_dir(tmp_path, "out")
    result = collatz("spill", out, n=400, rate=None).run(
        runtime="local", channels=ep.ChannelConfig(feedback_memory_bytes=1, batch_size=16),
        faults=[CrashAtRecord("step", subtask=0, record=300, how="exit")],
        checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    assert output(out) == collatz_golden(400)
    assert sum(m.get("feedback_spilled_frames", 0) for m in result.task_metrics.values()) > 0
