"""The coordinator's sends to its tasks, off its loop thread: encoded once, written by a few senders.

Every control message the coordinator sends (``trigger``, ``complete``, ``abort``,
``finish``, ``start``, ``cancel``, ...) goes through one :class:`Fanout`. The loop thread
encodes a message once — a broadcast to 10,000 tasks is one frame, not 10,000 encodes —
and queues it; ``SHARDS`` sender threads write it, each to the connections of its share of
the tasks. On its connection every message still goes out on the task's own authenticated
(and, on a cluster, TLS) connection — the frame is the plaintext, each connection encrypts
it under its own session — so nothing about the connections' security changes; only the
thread that writes does. What a task's connection carries keeps the coordinator's order:
a task always belongs to the same sender, and a sender writes its queue in order.

Why: on the loop thread, a ``sendall`` per task (a TLS record, ~0.15 ms on a loaded
machine) made a broadcast to 1,000 tasks cost ~0.2 s and the trigger of an epoch as much,
while acknowledgements waited (``benchmarks/scale.py``); and one peer whose socket buffer
filled would have stopped the coordinator. A sender blocked by such a peer now delays only
its own share of the tasks.

A failed write is reported to the coordinator as the task's connection lost
(``on_lost(task, conn, exc)``, put on its inbox: the loop decides, as for a read that
failed). :meth:`Fanout.close` (the attempt's end, before the connections close) lets every
queued message go out first, within a deadline.
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading
import time

__all__ = ["Fanout", "SHARDS"]

#: sender threads per coordinator: parallel writes (the socket calls release the GIL) and
#: a stuck peer holds up only its share; few enough to cost nothing at ten tasks
SHARDS = 4

_STOP = object()


class Fanout:
    """Queued, ordered sends per task on ``SHARDS`` sender threads (module docstring).

    Args:
        on_lost: ``on_lost(task, conn, exc)`` when a write to ``conn`` failed (any thread).
        encode: ``encode(conn, message) -> bytes``, the frame payload ``conn`` expects.
    """

    def __init__(self, on_lost, encode, shards: int = SHARDS):
        self._on_lost = on_lost
        self._encode = encode
        self._queues = [queue.SimpleQueue() for _ in range(shards)]
        self._shard_of: dict[str, int] = {}
        self._next = itertools.cycle(range(shards))
        self._lock = threading.Lock()
        #: (targets, seconds) of recent broadcasts to two tasks or more: queued → last frame
        #: written (the driver's share of a fan-out; benchmarks/scale.py reads it)
        self.fanouts: collections.deque = collections.deque(maxlen=1000)
        self._threads = [threading.Thread(target=self._run, args=(q,), name=f"epochal-coordinator-send-{i}",
                                          daemon=True) for i, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()

    def _shard(self, task: str) -> int:
        shard = self._shard_of.get(task)
        if shard is None:
            shard = self._shard_of[task] = next(self._next)  # round robin: shares stay even
        return shard

    # ------------------------------------------------------ coordinator's thread
    def send(self, task: str, conn, message) -> None:
        """Queue ``message`` for ``task`` on ``conn`` (returns at once)."""
        self.broadcast([(task, conn)], message)

    def broadcast(self, targets: list, message) -> None:
        """Queue ``message`` for every ``(task, conn)`` of ``targets``: encoded once (per
        codec), one queue entry per sender (returns at once)."""
        if not targets:
            return
        frames: dict[int, bytes] = {}
        shares: dict[int, list] = {}
        for task, conn in targets:
            codec = id(getattr(conn, "codec", None))
            if codec not in frames:
                try:
                    frames[codec] = self._encode(conn, message)
                except Exception as exc:  # a message the connection cannot carry: as a failed send
                    frames[codec] = exc
            shares.setdefault(self._shard(task), []).append((task, conn, frames[codec]))
        timing = [time.monotonic(), len(shares), len(targets)] if len(targets) > 1 else None
        for shard, share in shares.items():
            self._queues[shard].put((share, timing))

    def close(self, timeout: float = 10.0) -> bool:
        """Let the queued messages go out (each sender ends after its queue), within
        ``timeout`` seconds in all; whether every sender ended. Idempotent."""
        for q in self._queues:
            q.put(_STOP)
        deadline = time.monotonic() + timeout
        for t in self._threads:  # a sender stuck on a peer that stopped reading is left to the conns' close
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # -------------------------------------------------------------- sender threads
    def _run(self, q: queue.SimpleQueue) -> None:
        while True:
            item = q.get()
            if item is _STOP:
                return
            share, timing = item
            for task, conn, frame in share:
                try:
                    if isinstance(frame, Exception):
                        raise frame
                    conn.send_bytes(frame)
                except Exception as exc:
                    self._on_lost(task, conn, exc)
            if timing is not None:
                with self._lock:
                    timing[1] -= 1
                    if not timing[1]:  # the last sender of this broadcast
                        self.fanouts.append((timing[2], time.monotonic() - timing[0]))
