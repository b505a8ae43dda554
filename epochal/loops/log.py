"""The Loop Head's in-transit log: records that crossed the phantom channel of one epoch.

Memory is bounded: once ``memory_records`` records are held, the in-memory part is
pickled to a local spill file and cleared. When the epoch's barrier has come back, the
log goes into the head's snapshot (:meth:`InTransitLog.persist`): each spilled chunk
becomes its own state file of the checkpoint (written one chunk at a time, so an upload
never holds more than one chunk in memory) and the in-memory rest travels inline in the
task's state file. :func:`replay` reads it back in the original order on restore
(seed 004 §4.1.3.1).
"""
from __future__ import annotations

import os
import pickle
import tempfile

from epochal import serde


class InTransitLog:
    """An append-only record log, bounded in memory, spilling to a temporary file."""

    def __init__(self, memory_records: int = 100_000):
        if memory_records < 1:
            raise ValueError(f"InTransitLog: memory_records must be >= 1, got {memory_records!r}")
        self.memory_records = memory_records
        self._mem: list = []
        self._spill = None  # open temp file of pickled chunks
        self._chunks = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def spilled_chunks(self) -> int:
        return self._chunks

    def append(self, records: list) -> None:
        self._mem.extend(records)
        self.count += len(records)
        while len(self._mem) >= self.memory_records:
            self._spill_chunk(self._mem[: self.memory_records])
            del self._mem[: self.memory_records]

    def _spill_chunk(self, chunk: list) -> None:
        if self._spill is None:
            fd, path = tempfile.mkstemp(prefix="epochal-loop-log-")
            self._spill = os.fdopen(fd, "w+b")
            os.unlink(path)  # the open file lives until close(); nothing is left behind
        serde.dump(chunk, self._spill)
        self._chunks += 1

    def chunks(self):
        """Every record in append order, as lists (spilled chunks first, then memory)."""
        if self._spill is not None:
            self._spill.flush()
            self._spill.seek(0)
            for _ in range(self._chunks):
                yield pickle.load(self._spill)
            self._spill.seek(0, os.SEEK_END)
        if self._mem:
            yield list(self._mem)

    def persist(self, storage, epoch: int, base_name: str) -> dict:
        """Write spilled chunks as state files of ``epoch``; return the log's descriptor."""
        segments, size = [], 0
        if self._spill is not None:
            self._spill.flush()
            self._spill.seek(0)
            for k in range(self._chunks):
                blob = serde.dumps(pickle.load(self._spill))
                handle = storage.write_state(epoch, f"{base_name}.log{k}", blob)
                segments.append(handle.to_dict())
                size += len(blob)
        inline = list(self._mem)
        if inline:
            size += len(serde.dumps(inline))
        return {"count": self.count, "segments": segments, "inline": inline, "bytes": size}

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        self._mem = []


def replay(descriptors: list[dict], storage):
    """Yield the logged records of ``descriptors`` as batches, in log order."""
    from epochal.backends.storage import StateHandle

    for desc in descriptors:
        for seg in desc.get("segments", ()):
            yield pickle.loads(storage.read_state(StateHandle(**seg)))
        if desc.get("inline"):
            yield desc["inline"]
