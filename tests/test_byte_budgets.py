"""Byte budgets: what a task holds in memory is bounded in bytes, not only in records or
batches — in-transit and channel-state logs spill beyond ``log_memory_bytes``, loop
feedback queues beyond ``feedback_memory_bytes``, and frames are cut by bytes at the sender
(``batch_bytes``, ``max_frame_bytes``) with an error naming the operator when one record
alone is too big."""
from __future__ import annotations

import pickle

from epochal.loops.log import InTransitLog, replay


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
