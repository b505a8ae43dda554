"""A FIFO of received messages bounded in bytes: beyond the budget, frames wait on disk.

A loop's feedback channel cannot use credit-based flow control (the Loop Tail must never
block, or the cycle of credits could deadlock — :mod:`epochal.loops`), so what queues in
front of a slow Loop Head used to grow without bound in memory. A :class:`SpillQueue`
keeps messages in memory up to ``memory_bytes`` (counted as the bytes of their frames)
and writes every further frame, as received, to an unlinked temporary file; they are
decoded again when the task reaches them. Order is kept: once a frame went to disk, every
later one does too until the disk part is drained, so memory always holds the *oldest*
messages. The file is truncated each time it drains, so it holds at most what is queued.

Used by one reader thread (:meth:`put`) and the task thread (everything else); every
method takes the queue's own lock. Behaves as the ``collections.deque`` the input gate uses
for its other channels: ``append`` (no budget), ``appendleft``, ``popleft``, ``len``,
truth value and iteration (oldest first; spilled messages are decoded on the fly).
"""
from __future__ import annotations

import collections
import os
import struct
import tempfile
import threading
from typing import Callable

from epochal import serde

__all__ = ["SpillQueue"]

_LEN = struct.Struct("!Q")


class SpillQueue:
    """Messages in memory up to ``memory_bytes`` of frames, the rest on disk (module docstring).

    Args:
        memory_bytes: frame bytes held in memory at most (one frame more while it is put).
        decode: frame bytes → message, for frames read back from disk.
    """

    def __init__(self, memory_bytes: int, decode: Callable[[bytes], object]):
        if memory_bytes < 1:
            raise ValueError(f"SpillQueue: memory_bytes must be >= 1, got {memory_bytes!r}")
        self.memory_bytes = memory_bytes
        self._decode = decode
        self._lock = threading.Lock()
        self._mem: collections.deque = collections.deque()  # (message, frame bytes)
        self._mem_bytes = 0
        self._fd: int | None = None
        self._read = 0  # file offset of the oldest spilled frame
        self._write = 0  # file offset where the next spilled frame goes
        self._on_disk = 0  # spilled frames not read back yet
        #: frames that went to disk (cumulative), and the most frame bytes held in memory
        self.spilled = 0
        self.peak_memory_bytes = 0
        self._closed = False

    # ------------------------------------------------------------------ reader side
    def put(self, message, frame) -> bool:
        """Queue ``message`` received as ``frame`` (its bytes); returns True if it went to
        disk (then only ``frame`` is kept)."""
        size = len(frame)
        with self._lock:
            if self._closed:  # the task ended: nothing reads this queue any more
                return False
            if self._on_disk or (self._mem and self._mem_bytes + size > self.memory_bytes):
                self._spill(frame)
                return True
            self._mem.append((message, size))
            self._mem_bytes += size
            self.peak_memory_bytes = max(self.peak_memory_bytes, self._mem_bytes)
            return False

    def _spill(self, frame) -> None:
        if self._fd is None:
            fd, path = tempfile.mkstemp(prefix="epochal-feedback-")
            os.unlink(path)  # lives while open; nothing is left behind
            self._fd = fd
        data = _LEN.pack(len(frame)) + bytes(frame)
        written = 0
        while written < len(data):
            written += os.pwrite(self._fd, data[written:], self._write + written)
        self._write += len(data)
        self._on_disk += 1
        self.spilled += 1

    # ------------------------------------------------------------------ task side
    def append(self, message) -> None:
        """Queue a message outside the budget (a marker the gate adds itself)."""
        with self._lock:
            if self._closed:
                return
            if self._on_disk:
                self._spill(serde.dumps(message))
            else:
                self._mem.append((message, 0))

    def appendleft(self, message) -> None:
        with self._lock:
            self._mem.appendleft((message, 0))

    def popleft(self):
        with self._lock:
            if self._mem:
                message, size = self._mem.popleft()
                self._mem_bytes -= size
                return message
            if not self._on_disk:
                raise IndexError("pop from an empty SpillQueue")
            frame, self._read = self._frame_at(self._read)
            self._on_disk -= 1
            if not self._on_disk:  # drained: start the file over
                os.ftruncate(self._fd, 0)
                self._read = self._write = 0
        return self._decode(frame)

    def _frame_at(self, offset: int) -> tuple[bytes, int]:
        (n,) = _LEN.unpack(os.pread(self._fd, _LEN.size, offset))
        start = offset + _LEN.size
        chunks, got = [], 0
        while got < n:
            chunk = os.pread(self._fd, n - got, start + got)
            if not chunk:
                raise EOFError(f"SpillQueue: spill file ended inside a frame at offset {offset}")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), start + n

    def __len__(self) -> int:
        return len(self._mem) + self._on_disk

    def __bool__(self) -> bool:
        return bool(self._mem) or self._on_disk > 0

    def __iter__(self):
        """Messages oldest first (a snapshot of the queue; spilled ones decoded on the fly)."""
        with self._lock:
            held = [m for m, _ in self._mem]
            offset, count = self._read, self._on_disk
            frames = []
            for _ in range(count):
                frame, offset = self._frame_at(offset)
                frames.append(frame)
        yield from held
        for frame in frames:
            yield self._decode(frame)

    @property
    def memory_held(self) -> int:
        """Frame bytes of the messages held in memory now."""
        return self._mem_bytes

    @property
    def on_disk(self) -> int:
        """Frames waiting on disk now."""
        return self._on_disk

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._mem.clear()
            self._mem_bytes = self._on_disk = 0
