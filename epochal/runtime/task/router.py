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
* **Bytes.** A batch is also cut early when it would encode to more than about
  ``batch_bytes`` (each outlet learns its bytes per record from the frames it sent,
  :class:`~epochal.runtime.transport.frames.BatchSizer`), and no frame exceeds
  ``max_frame_bytes``: a batch that encodes to more is split before it is sent
  (:func:`~epochal.runtime.transport.frames.encode_within`). A record that cannot be encoded,
  or encodes to more than ``max_frame_bytes`` alone, raises a :class:`~epochal.errors.DataError`
  naming the operator that produced it and the edge — retrying cannot help, so the job fails
  at once. With ``dead_letters=True`` on that operator, a record that cannot be encoded goes
  to its ``dead_letters()`` output instead (as its ``repr``, since the record itself cannot
  travel) and the job goes on.
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
from epochal.errors import DataError, OperatorError
from epochal.graph import PartitionKind
from epochal.operators.base import DeadLetter
from epochal.plan import OutputGate
from epochal.runtime.transport.channels import edge_name, encode_batch
from epochal.runtime.transport.frames import BatchSizer, RecordTooLarge, Unencodable, encode_within


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
                 task: str, should_stop, batch_bytes: int = 4 << 20, max_frame_bytes: int = 64 << 20):
        self.channels = channels  # cid -> OutputChannel
        self.batch_size = batch_size
        self.max_frame_bytes = max_frame_bytes
        self.task = task
        #: the largest frame sent so far (bytes), for the task's metrics
        self.largest_frame = 0
        #: records that could not be encoded and went to dead letters
        self.unencodable = 0
        self.linger = linger
        self.should_stop = should_stop
        # outlets: (buffer, the channels it is sent on) — one per channel, one per BROADCAST gate
        self._outlets: list[tuple[list, tuple]] = []
        self._sources: list[tuple[str, str]] = []  # per outlet: (producing operator, a channel id)
        self._gates = []  # of the chain's main output
        self._main: dict[str, list[_Gate]] = {}  # producer -> its main gates (several in a chained fan-out)
        self._side: dict[tuple[str, str], list[_Gate]] = {}  # (producer, port) -> gates
        for g in gates:
            outs = tuple(channels[cid] for cid in g.channels)
            if g.partitioning.kind is PartitionKind.BROADCAST:
                buffers = [[]]
                self._outlets.append((buffers[0], outs))
                self._sources.append((g.producer, g.channels[0]))
            else:
                buffers = [[] for _ in outs]
                self._outlets.extend((b, (out,)) for b, out in zip(buffers, outs))
                self._sources.extend((g.producer, cid) for cid in g.channels)
            gate = _Gate(g, buffers, max_parallelism, task)
            if g.port == "main":
                self._gates.append(gate)
                self._main.setdefault(g.producer, []).append(gate)
            else:
                self._side.setdefault((g.producer, g.port), []).append(gate)
        self._buffers = [buf for buf, _ in self._outlets]
        # Arrow batches are large already: every one is sent as its own frame (no linger)
        columnar = {id(b) for g in self._gates + [g for gs in self._side.values() for g in gs] if g.columnar
                    for b in g.buffers}
        self._sizers = [None if id(buf) in columnar else BatchSizer(batch_size, batch_bytes)
                        for buf, _ in self._outlets]
        self._order = [cid for g in gates for cid in g.channels]
        self.oldest_unsent: float | None = None
        self.records_out = 0
        self._urgent = False  # should_stop asked to stop waiting for credit in this call

    def route(self, records: list) -> None:
        """Route the chain's main output."""
        if not records or not self._gates:
            return
        self._route(self._gates, records)

    def main_producers(self) -> set[str]:
        """The operators whose main output leaves the task on channels."""
        return set(self._main)

    def route_from(self, producer: str, records: list) -> None:
        """Route ``producer``'s main output (a task whose chain is a tree has several)."""
        if records and producer in self._main:
            self._route(self._main[producer], records)

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
            for k, (buf, _outs) in enumerate(self._outlets):
                sizer = self._sizers[k]
                size = 1 if sizer is None else sizer.size
                while len(buf) >= size:
                    self._send(k, buf[:size])
                    del buf[:size]
                    size = 1 if sizer is None else sizer.size
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

    def _send(self, k: int, batch: list, force: bool = False) -> None:
        """Send ``batch`` from outlet ``k``: encoded once, in frames within ``max_frame_bytes``."""
        outs = self._outlets[k][1]
        for part, frame in self._frames(k, batch):
            for out in outs:
                if force or self._urgent:
                    out.send_now(part, frame)
                else:
                    out.send_batch(part, self._blocked, frame)

    def _frames(self, k: int, batch: list) -> list:
        """``[(records, frame)]`` of ``batch`` (see the module docstring, "Bytes")."""
        while True:
            try:
                parts = encode_within(batch, self.max_frame_bytes, encode_batch)
                break
            except Unencodable as exc:
                batch = self._dead_letter(k, batch, exc)
                if not batch:
                    return []
            except RecordTooLarge as exc:
                producer, cid = self._sources[k]
                raise DataError(
                    f"task {self.task}: operator {producer!r} emitted a record that encodes to {exc.size} bytes, "
                    f"more than channels.max_frame_bytes={exc.limit}, on the edge {edge_name(cid)}: "
                    f"{repr(exc.record)[:200]} — split it into smaller records, or raise channels.max_frame_bytes "
                    "(at most 1 GiB)") from None
        if self._sizers[k] is not None:
            self._sizers[k].observe_frames(parts)
        self.largest_frame = max(self.largest_frame, max(len(f) for _, f in parts))
        return parts

    def _dead_letter(self, k: int, batch: list, exc: Unencodable) -> list:
        """``exc.record`` cannot be encoded: raise the error naming its operator, or — the
        operator has dead letters — put a :class:`DeadLetter` of its ``repr`` in them and
        return the batch without it."""
        producer, cid = self._sources[k]
        error = f"{type(exc.cause).__name__}: {exc.cause}"
        gates = self._side.get((producer, "dead_letters"))
        if not gates:
            raise DataError(
                f"task {self.task}: operator {producer!r} emitted a record that cannot be encoded for the edge "
                f"{edge_name(cid)}: {error}; the record: {repr(exc.record)[:200]} — return plain data (or give its "
                f"class a __reduce__), or build {producer!r} with dead_letters=True to set such records aside"
            ) from exc.cause
        letter = DeadLetter(producer, f"cannot be encoded: {error}", repr(exc.record)[:1000])
        for g in gates:  # buffered only: sent with the side output's next batch, before any barrier
            g.route([letter])
        self.records_out += 1
        self.unencodable += 1
        if self.oldest_unsent is None:
            self.oldest_unsent = time.monotonic()
        i = next(i for i, r in enumerate(batch) if r is exc.record)
        return batch[:i] + batch[i + 1:]

    def flush(self, force: bool = False) -> None:
        """Send every buffered record (``force``: without waiting for credit), including
        dead letters that sending put in other buffers."""
        try:
            while any(self._buffers):
                for k, (buf, _) in enumerate(self._outlets):
                    if buf:
                        batch = buf.copy()
                        buf.clear()
                        self._send(k, batch, force)
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
