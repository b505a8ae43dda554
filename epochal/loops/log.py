"""The Loop Head's in-transit log: records that crossed the phantom channel of one epoch.

Memory is bounded in records and in bytes: every appended batch is pickled at once (the
log is persisted anyway, so that pickle is not extra work: the in-memory rest goes into
the checkpoint as those bytes), and once ``memory_records`` records or ``memory_bytes``
bytes are held, the in-memory part goes to a local spill file and is cleared. When the
epoch's barrier has come back, the log goes into the head's snapshot
(:meth:`InTransitLog.persist`): each spilled chunk becomes its own state file of the
checkpoint (copied one chunk at a time, so an upload never holds more than one chunk in
memory) and the in-memory rest travels inline in the task's state file.
:func:`replay` reads it back in the original order on restore (seed 004 §4.1.3.1).

A chunk (a spilled file, a state file of the checkpoint) is a sequence of pickled record
lists back to back; the descriptor's ``inline_frames`` are pickled record lists too
(``inline``, a plain record list, is what logs written before byte budgets hold).
"""
from __future__ import annotations

import io
import os
import pickle
import tempfile

from epochal import serde

#: default in-memory bound of one log, in bytes of pickled records (ChannelConfig.log_memory_bytes)
DEFAULT_MEMORY_BYTES = 64 << 20


class InTransitLog:
    """An append-only record log, bounded in memory, spilling to a temporary file.

    Chunk boundaries follow ``memory_records`` exactly (a batch that crosses it is cut), or
    fall where ``memory_bytes`` is reached.
    """

    def __init__(self, memory_records: int = 100_000, memory_bytes: int = DEFAULT_MEMORY_BYTES):
        if memory_records < 1:
            raise ValueError(f"InTransitLog: memory_records must be >= 1, got {memory_records!r}")
        if memory_bytes < 1:
            raise ValueError(f"InTransitLog: memory_bytes must be >= 1, got {memory_bytes!r}")
        self.memory_records = memory_records
        self.memory_bytes = memory_bytes
        self._mem: list[bytes] = []  # pickled record lists
        self._mem_records = 0
        self._mem_bytes = 0
        self._spill = None  # open temp file of pickled record lists
        self._chunks: list[int] = []  # bytes of each spilled chunk, in order
        self.count = 0
        self.bytes = 0  # pickled bytes appended, in memory and spilled

    def __len__(self) -> int:
        return self.count

    @property
    def spilled_chunks(self) -> int:
        return len(self._chunks)

    @property
    def memory_held(self) -> int:
        """Bytes of pickled records held in memory now (at most about ``memory_bytes``)."""
        return self._mem_bytes

    def append(self, records: list) -> None:
        while records:
            part = records[: self.memory_records - self._mem_records]
            records = records[len(part):]
            blob = serde.dumps(list(part))
            self._mem.append(blob)
            self._mem_records += len(part)
            self._mem_bytes += len(blob)
            self.count += len(part)
            self.bytes += len(blob)
            if self._mem_records >= self.memory_records or self._mem_bytes >= self.memory_bytes:
                self._spill_memory()

    def _spill_memory(self) -> None:
        if self._spill is None:
            fd, path = tempfile.mkstemp(prefix="epochal-loop-log-")
            self._spill = os.fdopen(fd, "w+b")
            os.unlink(path)  # the open file lives until close(); nothing is left behind
        for blob in self._mem:
            self._spill.write(blob)
        self._chunks.append(self._mem_bytes)
        self._mem, self._mem_records, self._mem_bytes = [], 0, 0

    def _spilled(self):
        """The raw bytes of each spilled chunk, in order (one chunk in memory at a time)."""
        if self._spill is None:
            return
        self._spill.flush()
        self._spill.seek(0)
        try:
            for size in self._chunks:
                yield self._spill.read(size)
        finally:
            self._spill.seek(0, os.SEEK_END)

    def chunks(self):
        """Every record in append order, as lists (spilled ones first, then memory)."""
        for raw in self._spilled():
            yield from _lists(raw)
        for blob in self._mem:
            yield pickle.loads(blob)

    def persist(self, storage, epoch: int, base_name: str) -> dict:
        """Write spilled chunks as state files of ``epoch``; return the log's descriptor."""
        segments, size = [], 0
        for k, raw in enumerate(self._spilled()):
            handle = storage.write_state(epoch, f"{base_name}.log{k}", raw)
            segments.append(handle.to_dict())
            size += len(raw)
        inline = list(self._mem)
        size += sum(len(b) for b in inline)
        return {"count": self.count, "segments": segments, "inline_frames": inline, "bytes": size}

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        self._mem = []


def _lists(raw: bytes):
    """The record lists pickled back to back in ``raw``."""
    stream = io.BytesIO(raw)
    while stream.tell() < len(raw):
        yield pickle.load(stream)


def replay(descriptors: list[dict], storage):
    """Yield the logged records of ``descriptors`` as batches, in log order."""
    from epochal.backends.storage import StateHandle

    for desc in descriptors:
        for seg in desc.get("segments", ()):
            yield from _lists(storage.read_state(StateHandle(**seg)))
        if desc.get("inline"):  # a log written before byte budgets
            yield desc["inline"]
        for blob in desc.get("inline_frames", ()):
            yield pickle.loads(blob)
