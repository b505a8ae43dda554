"""Routing a task's output records into per-channel batches (the producer side of edges)."""
from __future__ import annotations

import time

from epochal.backends.keygroups import key_group_for
from epochal.errors import OperatorError
from epochal.graph import PartitionKind
from epochal.plan import OutputGate


class _Gate:
    def __init__(self, gate: OutputGate, buffers: list[list], max_parallelism: int, task: str):
        self.gate = gate
        self.kind = gate.partitioning.kind
        self.key_fn = gate.partitioning.key_fn
        self.buffers = buffers
        self.max_parallelism = max_parallelism
        self.task = task
        self._rr = 0

    def route(self, records: list) -> None:
        kind = self.kind
        buffers = self.buffers
        if kind is PartitionKind.FORWARD:
            buffers[0].extend(records)
        elif kind is PartitionKind.HASH:
            key_fn, maxp, p = self.key_fn, self.max_parallelism, len(buffers)
            record = None
            try:
                for record in records:
                    buffers[key_group_for(key_fn(record), maxp) * p // maxp].append(record)
            except Exception as exc:
                text = repr(record)
                raise OperatorError(
                    f"{self.gate.consumer} (key_by)", self.task, text[:200], f"{type(exc).__name__}: {exc}"
                ) from exc
        elif kind is PartitionKind.REBALANCE:
            p = len(buffers)
            i = self._rr
            for record in records:
                buffers[i].append(record)
                i = (i + 1) % p
            self._rr = i
        else:  # BROADCAST
            for b in buffers:
                b.extend(records)


class Router:
    """Cuts batches of ``batch_size`` per channel, flushes partial batches after ``linger``
    and always before an event (a barrier is never inside a batch — DESIGN.md)."""

    def __init__(self, gates, channels: dict, batch_size: int, linger: float, max_parallelism: int,
                 task: str, should_stop):
        self.channels = channels  # cid -> OutputChannel
        self.batch_size = batch_size
        self.linger = linger
        self.should_stop = should_stop
        self.buffers: dict[str, list] = {cid: [] for g in gates for cid in g.channels}
        self._gates = [
            _Gate(g, [self.buffers[cid] for cid in g.channels], max_parallelism, task) for g in gates
        ]
        self._order = list(self.buffers)
        self.oldest_unsent: float | None = None
        self.records_out = 0

    def route(self, records: list) -> None:
        if not records or not self._gates:
            return
        self.records_out += len(records)
        for g in self._gates:
            g.route(records)
        size = self.batch_size
        for cid in self._order:
            buf = self.buffers[cid]
            while len(buf) >= size:
                self._send(cid, buf[:size])
                del buf[:size]
        if self.oldest_unsent is None and any(self.buffers.values()):
            self.oldest_unsent = time.monotonic()

    def _send(self, cid: str, batch: list) -> None:
        self.channels[cid].send_batch(batch, self.should_stop)

    def flush(self) -> None:
        for cid in self._order:
            buf = self.buffers[cid]
            if buf:
                self._send(cid, list(buf))
                buf.clear()
        self.oldest_unsent = None

    def flush_if_lingering(self, now: float) -> None:
        if self.oldest_unsent is not None and now - self.oldest_unsent >= self.linger:
            self.flush()

    def broadcast(self, message: tuple) -> None:
        """Flush every buffer, then send ``message`` on every channel."""
        self.flush()
        for cid in self._order:
            self.channels[cid].send_event(message)
