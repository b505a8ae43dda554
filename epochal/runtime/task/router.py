"""Routing a task's output records into per-channel batches (the producer side of edges).

The contract consumers and the epoch protocol rely on (tests/test_router.py checks it
against a record-by-record reference):

* **Targets.** Each record goes to the channel(s) its output gate's partitioning picks —
  FORWARD: the gate's one channel; HASH: the channel of consumer subtask
  ``key_group_for(key_fn(record)) * p // max_parallelism`` (the subtask owning the key
  group, :func:`~epochal.backends.keygroups.subtask_for_key_group`); REBALANCE:
  round-robin that continues across batches — the n-th record a gate routes in this
  attempt (counting from 0) goes to channel ``n mod p``, so at any time the channels'
  counts differ by at most one; BROADCAST: every channel of the gate.
* **Order.** Per channel, records are sent in the order the task emitted them (FIFO).
* **Batches.** After every :meth:`Router.route`, each channel's buffer is cut into
  batches of exactly ``batch_size`` while it holds that many; the remainder is sent as a
  partial batch by :meth:`Router.flush` or by :meth:`Router.flush_if_lingering` once
  ``linger`` passed since ``oldest_unsent`` (set by the route that left records waiting
  while none were, cleared by every flush); the task loop calls it on every step.
  :meth:`Router.broadcast` flushes before it sends its event, so a barrier (or end of
  stream) is never inside a batch and never overtakes a record: events and data share
  each channel's FIFO connection.
* **Flow control.** Every data batch goes through ``OutputChannel.send_batch``, which
  takes one credit per batch and blocks (calling ``should_stop``) while there is none.
  ``should_stop`` raises to cancel, or returns True when the task has urgent work that
  must not wait for credit (an unaligned barrier to forward): the blocked batch and every
  later one of the same ``route`` / ``flush`` call are then sent without credit, so the
  task soon returns to its loop, where it forwards the barrier behind them.
  ``broadcast(..., force=True)`` flushes without credit too. Either way the receiver holds
  at most one input batch's output beyond its credits.

Routing works per batch, never per record where the partitioning allows it: REBALANCE
gives each channel one strided slice of the batch, FORWARD and BROADCAST one ``extend``
(a BROADCAST gate keeps one buffer for all its channels and pickles each batch once for
all of them); only HASH looks at every record (its key): the batch's keys go to a
:class:`~epochal.backends.keygroups.KeyGroupAssigner` at once, then each record is appended
through a key group → channel table. The result is the same as routing record by record
(a key that fails fails before any record of the batch is buffered).
"""
from __future__ import annotations

import time

from epochal.backends.keygroups import KeyGroupAssigner
from epochal.columnar.keys import rows
from epochal.errors import OperatorError
from epochal.graph import PartitionKind
from epochal.plan import OutputGate
from epochal.runtime.transport.channels import encode_batch


class _Gate:
    """Puts the records of one output gate into its buffers.

    ``buffers[j]`` is channel ``j``'s buffer, except for BROADCAST: one buffer that all
    the gate's channels send from.
    """

    def __init__(self, gate: OutputGate, buffers: list[list], max_parallelism: int, task: str):
        self.gate = gate
        self.kind = gate.partitioning.kind
        self.key_fn = gate.partitioning.key_fn
        self.buffers = buffers
        self.max_parallelism = max_parallelism
        self.task = task
        self._rr = 0  # REBALANCE: channel of the next record
        self.columnar = gate.columnar
        if self.kind is PartitionKind.HASH:  # key group -> channel (subtask_for_key_group's formula)
            p = len(buffers)
            self._channel_of = [kg * p // max_parallelism for kg in range(max_parallelism)]
            self._appends = [b.append for b in buffers]
            self._key_groups = KeyGroupAssigner(max_parallelism)
            if self.columnar:  # whole Arrow batches: key groups per distinct key (epochal.columnar.keys)
                import pyarrow as pa

                from epochal.columnar.keys import KeyGroups

                self._groups = KeyGroups(self.key_fn.column, max_parallelism)
                self._channel_array = pa.array(self._channel_of, pa.int32())

    def route(self, records: list) -> None:
        kind = self.kind
        buffers = self.buffers
        if kind is PartitionKind.HASH:
            if self.columnar:
                self._route_batches(records)
            else:
                self._route_by_key(records)
        elif kind is PartitionKind.REBALANCE and len(buffers) > 1:
            p, rr = len(buffers), self._rr
            for j, buf in enumerate(buffers):  # record i goes to channel (rr + i) % p
                buf.extend(records[(j - rr) % p::p])
            self._rr = (rr + len(records)) % p
        else:  # FORWARD, BROADCAST (one shared buffer), REBALANCE over one channel
            buffers[0].extend(records)

    def _route_batches(self, batches: list) -> None:
        """Split each Arrow batch by channel: one hash per distinct key, one ``take`` and one
        ``filter`` per channel that gets rows (:mod:`epochal.columnar.keys`)."""
        from epochal.columnar.keys import split_by_channel

        n = len(self.buffers)
        for batch in batches:
            try:
                channels = self._channel_array.take(self._groups.of(batch)) if n > 1 else None
            except Exception as exc:
                raise OperatorError(f"{self.gate.consumer} (key_by)", self.task,
                                    f"<RecordBatch of {batch.num_rows} rows>", f"{type(exc).__name__}: {exc}") from exc
            for channel, part in split_by_channel(batch, channels, n):
                self.buffers[channel].append(part)

    def _route_by_key(self, records: list) -> None:
        key_fn = self.key_fn
        try:
            kgs = self._key_groups.assign_all([key_fn(record) for record in records])
        except Exception as exc:
            raise self._key_error(records, exc) from exc
        if len(self.buffers) == 1:  # every key goes to subtask 0; keys are still checked
            self.buffers[0].extend(records)
            return
        appends, channel_of = self._appends, self._channel_of
        for record, kg in zip(records, kgs):
            appends[channel_of[kg]](record)

    def _key_error(self, records: list, exc: Exception) -> OperatorError:
        """The error naming the first record of ``records`` whose key fails (``exc``, raised
        for the batch, if none fails on its own)."""
        key_fn, assign = self.key_fn, self._key_groups.assign
        culprit = records[0] if records else None
        for record in records:
            try:
                assign(key_fn(record))
            except Exception as err:
                culprit, exc = record, err
                break
        return OperatorError(f"{self.gate.consumer} (key_by)", self.task, repr(culprit)[:200],
                             f"{type(exc).__name__}: {exc}")


class Router:
    """Cuts batches of ``batch_size`` per channel, flushes partial batches after ``linger``
    and always before an event (a barrier is never inside a batch — DESIGN.md). See the
    module docstring for the full contract."""

    def __init__(self, gates, channels: dict, batch_size: int, linger: float, max_parallelism: int,
                 task: str, should_stop):
        self.channels = channels  # cid -> OutputChannel
        self.batch_size = batch_size
        self.linger = linger
        self.should_stop = should_stop
        # outlets: (buffer, the channels it is sent on) — one per channel, one per BROADCAST gate
        self._outlets: list[tuple[list, tuple]] = []
        self._gates = []  # of the chain's main output
        self._side: dict[tuple[str, str], list[_Gate]] = {}  # (producer, port) -> gates
        for g in gates:
            outs = tuple(channels[cid] for cid in g.channels)
            if g.partitioning.kind is PartitionKind.BROADCAST:
                buffers = [[]]
                self._outlets.append((buffers[0], outs))
            else:
                buffers = [[] for _ in outs]
                self._outlets.extend((b, (out,)) for b, out in zip(buffers, outs))
            gate = _Gate(g, buffers, max_parallelism, task)
            if g.port == "main":
                self._gates.append(gate)
            else:
                self._side.setdefault((g.producer, g.port), []).append(gate)
        self._buffers = [buf for buf, _ in self._outlets]
        # Arrow batches are large already: every one is sent as its own frame (no linger)
        columnar = {id(b) for g in self._gates + [g for gs in self._side.values() for g in gs] if g.columnar
                    for b in g.buffers}
        self._sizes = [1 if id(buf) in columnar else batch_size for buf, _ in self._outlets]
        self._order = [cid for g in gates for cid in g.channels]
        self.oldest_unsent: float | None = None
        self.records_out = 0
        self._urgent = False  # should_stop asked to stop waiting for credit in this call

    def route(self, records: list) -> None:
        """Route the chain's main output."""
        if not records or not self._gates:
            return
        self._route(self._gates, records)

    def route_side(self, producer: str, port: str, records: list) -> bool:
        """Route records of ``producer``'s side output ``port``; ``False`` (nothing routed)
        when no edge reads that output."""
        gates = self._side.get((producer, port))
        if not gates:
            return False
        if records:
            self._route(gates, records)
        return True

    def _route(self, gates: list, records: list) -> None:
        self.records_out += rows(records)
        for g in gates:
            g.route(records)
        try:
            for (buf, outs), size in zip(self._outlets, self._sizes):
                full = len(buf) - len(buf) % size
                if full:
                    for start in range(0, full, size):
                        self._send(outs, buf[start:start + size])
                    del buf[:full]
        finally:
            self._urgent = False
        if self.oldest_unsent is None and any(self._buffers):
            self.oldest_unsent = time.monotonic()

    def _blocked(self) -> bool:
        """``should_stop`` while a send waits for credit; once it reported urgent work, the
        rest of this call stops waiting."""
        if not self._urgent and self.should_stop():
            self._urgent = True
        return self._urgent

    def _send(self, outs: tuple, batch: list, force: bool = False) -> None:
        force = force or self._urgent
        if len(outs) == 1:
            if force:
                outs[0].send_now(batch)
            else:
                outs[0].send_batch(batch, self._blocked)
            return
        frame = encode_batch(batch)
        for out in outs:
            if force or self._urgent:
                out.send_now(batch, frame)
            else:
                out.send_batch(batch, self._blocked, frame)

    def flush(self, force: bool = False) -> None:
        """Send every buffered record (``force``: without waiting for credit)."""
        try:
            for buf, outs in self._outlets:
                if buf:
                    self._send(outs, buf.copy(), force)
                    buf.clear()
        finally:
            self._urgent = False
        self.oldest_unsent = None

    def flush_if_lingering(self, now: float) -> None:
        if self.oldest_unsent is not None and now - self.oldest_unsent >= self.linger:
            self.flush()

    def broadcast(self, message: tuple, force: bool = False) -> None:
        """Flush every buffer, then send ``message`` on every channel. ``force``: the flush
        does not wait for credit (an unaligned barrier overtakes back-pressure)."""
        self.flush(force)
        for cid in self._order:
            self.channels[cid].send_event(message)
