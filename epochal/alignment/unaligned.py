"""Unaligned checkpoints and the aligned-timeout switch, as pure bookkeeping.

Under back-pressure an aligned barrier (seed 004 Alg. 6) waits behind every record queued
before it, so a checkpoint takes as long as the queues take to drain. An *unaligned*
snapshot (Flink's unaligned checkpoints) does not wait: it is taken as soon as barrier n
*arrives* at one of the task's input queues, and the records that precede barrier n but
were not processed yet become part of the snapshot as **channel state** — the in-flight
messages of a Chandy-Lamport snapshot, exactly what a loop head logs on its feedback edge
(seed 004 Alg. 7). The cut is the same as an aligned one; only its representation differs.

A barrier is seen twice by a task:

* **arrived** — the channel's reader appended barrier n to the channel's input queue,
  behind whatever data is queued; the task is told at once (a priority notice);
* **reached** — the task took barrier n from the queue in FIFO order (the only view
  :class:`~epochal.alignment.handlers.AlignedBarrierHandler` has).

The snapshot of an unaligned epoch n reflects every record processed so far — all of them
precede barrier n on their channel. Its channel state is, per input channel:

* barrier n already arrived: the data queued before it (``capture``: copied now);
* barrier n not arrived yet (``record``): every record the task processes from the channel
  until barrier n arrives, then the data still queued before barrier n (a later
  ``capture`` of that channel alone).

Nothing is blocked meanwhile: captured and recorded records are processed as usual — they
are in the channel state only for a restore, which processes the channel state first
(seed 004 §4.1.3.1, as loop logs). The barrier is forwarded right after the snapshot, marked
unaligned, so downstream tasks take it with priority too.

With ``aligned_timeout`` an epoch starts aligned (channels block as their barrier is
reached) and switches to unaligned once its first barrier arrived longer ago than the
timeout — alignment taking too long, or the barrier waiting behind queued data. The switch
snapshots at once: reached channels have nothing in flight, arrived-not-reached channels
are captured, the others recorded; every channel is unblocked. A barrier that arrives
flagged unaligned (its upstream already switched) is taken unaligned at once.

The task loop (see :mod:`epochal.runtime.task.task`)::

    for channel, barrier in gate.take_arrivals():          # priority, before any data
        apply(handler.on_barrier_arrived(channel, barrier))
    channel, msg = gate.poll(handler.blocked_channels)     # FIFO
    if msg is a barrier: apply(handler.on_barrier(channel, barrier))
    apply(handler.on_tick())                               # the aligned timeout

``apply`` declines ``aborted_epochs``; on ``snapshot_epoch`` it snapshots, forwards the
barrier (flagged with ``unaligned``) and, with a ``channel_state`` plan, copies the queued
prefix of each ``capture`` channel into the epoch's channel state and records the
``record`` channels; a result with only a ``channel_state`` captures that channel for an
epoch snapshotted earlier. The epoch's upload waits until every channel's barrier arrived.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from epochal.alignment.handlers import BarrierHandler, BarrierOutcome, Clock, HandlerResult, ProtocolError
from epochal.epochs.barrier import Barrier

__all__ = ["ChannelStatePlan", "UnalignedBarrierHandler"]


@dataclass(frozen=True)
class ChannelStatePlan:
    """What epoch ``epoch``'s channel state needs now: copy the data queued before barrier
    ``epoch`` on the ``capture`` channels; record the ``record`` channels until their
    barrier arrives."""

    epoch: int
    capture: frozenset[int] = frozenset()
    record: frozenset[int] = frozenset()


@dataclass
class _Aligning:
    epoch: int
    first_arrival: float
    arrived: set[int]
    reached: set[int]
    flagged: bool = False  # a barrier of it arrived flagged unaligned: switch at the next event


class UnalignedBarrierHandler(BarrierHandler):
    """Exactly-once: unaligned snapshots (``aligned_timeout=None``) or aligned ones that
    switch to unaligned after ``aligned_timeout`` seconds (see the module docstring).

    Invariants (tested by scripted events and Hypothesis, tests/test_unaligned.py):

    * every epoch is snapshotted at most once, in increasing order;
    * an unaligned snapshot's channel state plus the records processed before it are
      exactly the records before barrier n on every channel;
    * a channel is blocked only while an aligned epoch waits for its barrier elsewhere;
    * an epoch whose barrier a channel skipped (a newer barrier arrived first) is aborted.

    At most one epoch aligns at a time; a newer barrier arriving on a channel that already
    delivered the aligning epoch's barrier waits (``_early``) until that epoch is done.
    Several unaligned epochs may record channel state at once.
    """

    def __init__(self, num_channels: int, clock: Clock = time.monotonic, aligned_timeout: float | None = None):
        super().__init__(num_channels, clock)
        if aligned_timeout is not None and aligned_timeout < 0:
            raise ValueError(f"aligned_timeout must be >= 0 or None, got {aligned_timeout!r}")
        self.aligned_timeout = aligned_timeout
        self._last_arrived = [0] * num_channels
        self._aligning: _Aligning | None = None
        self._early: dict[int, dict[int, tuple[float, bool]]] = {}  # epoch -> channel -> (arrived at, flagged)
        self._waiting: dict[int, set[int]] = {}  # unaligned epoch -> channels whose barrier has not arrived
        #: how the last snapshot was taken: "aligned", "unaligned" or "timed-out"
        self.last_snapshot_kind: str | None = None

    # -- queries ------------------------------------------------------------------------
    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset(self._aligning.reached) if self._aligning is not None else frozenset()

    @property
    def pending_epoch(self) -> int | None:
        return self._aligning.epoch if self._aligning is not None else None

    @property
    def switch_pending(self) -> bool:
        """An epoch is aligning and switches to unaligned at its timeout (:meth:`on_tick`):
        the task should tick often meanwhile, e.g. between slices of a large batch."""
        return self._aligning is not None and self.aligned_timeout is not None and not self._aligning.flagged

    @property
    def switch_due(self) -> bool:
        """The aligning epoch's timeout has passed (or a flagged barrier of it arrived):
        the next :meth:`on_tick` switches it. For a task blocked elsewhere (waiting for
        credit) to know it must come back to its loop."""
        al = self._aligning
        if al is None or self.aligned_timeout is None:
            return False
        return al.flagged or self._clock() - al.first_arrival >= self.aligned_timeout

    @property
    def recording_epochs(self) -> tuple[int, ...]:
        """Unaligned epochs snapshotted whose barrier has not arrived on every channel."""
        return tuple(sorted(self._waiting))

    # -- events -------------------------------------------------------------------------
    def on_barrier_arrived(self, channel: int, barrier: Barrier, unaligned: bool = False) -> HandlerResult:
        """Barrier ``barrier.epoch`` was appended to input ``channel``'s queue (before the
        task reached it). ``unaligned``: the barrier was flagged unaligned upstream.

        Notices come in each channel's FIFO order; one for a barrier the task already
        reached (and so handled as arrived then) is ignored.

        Raises:
            ProtocolError: channel out of range.
        """
        if not 0 <= channel < self.num_channels:
            raise ProtocolError(f"{type(self).__name__}: channel {channel} out of range for a task with "
                                f"{self.num_channels} input channel(s)")
        epoch = barrier.epoch
        if epoch <= self._last_arrived[channel]:  # reached before this notice came: handled then
            return HandlerResult(outcome=BarrierOutcome.IGNORED_STALE)
        self._last_arrived[channel] = epoch
        return self._done(self._arrive(channel, epoch, unaligned, self._clock()))

    def on_tick(self) -> HandlerResult:
        """Time passed: switch the aligning epoch to unaligned once its first barrier
        arrived ``aligned_timeout`` seconds ago."""
        al = self._aligning
        if al is None or self.aligned_timeout is None:
            return _NOTHING
        now = self._clock()
        if not al.flagged and now - al.first_arrival < self.aligned_timeout:
            return _NOTHING
        return self._done(self._switch(now, (), BarrierOutcome.TIMED_OUT))

    def abort_epoch(self, epoch: int) -> HandlerResult:
        """As :meth:`BarrierHandler.abort_epoch`; also stops recording an unaligned epoch."""
        if self._waiting.pop(epoch, None) is not None:
            self._abandoned.add(epoch)
            return HandlerResult(aborted_epochs=(epoch,), outcome=BarrierOutcome.ABORTED)
        self._early.pop(epoch, None)
        return super().abort_epoch(epoch)

    # -- BarrierHandler (barriers reached in FIFO order) ----------------------------------
    def on_barrier(self, channel: int, barrier: Barrier) -> HandlerResult:
        """Barrier ``barrier.epoch`` was reached in FIFO order on ``channel``. A barrier
        reached without its arrival notice having been seen arrives now first (then the
        data queued before it is empty: it was all processed)."""
        if 0 <= channel < self.num_channels and self._last_arrived[channel] < barrier.epoch:
            arrival = self.on_barrier_arrived(channel, barrier)
            if arrival.snapshot_epoch is not None or arrival.channel_state is not None:
                self._last_epoch_on[channel] = barrier.epoch  # reached too (base FIFO check)
                return arrival
            reached = super().on_barrier(channel, barrier)
            if not arrival.aborted_epochs:
                return reached
            return HandlerResult(snapshot_epoch=reached.snapshot_epoch, outcome=reached.outcome,
                                 aborted_epochs=tuple(sorted({*arrival.aborted_epochs, *reached.aborted_epochs})))
        return super().on_barrier(channel, barrier)

    def _on_barrier(self, channel: int, epoch: int) -> tuple[HandlerResult, float | None]:
        aborted: tuple[int, ...] = ()
        al = self._aligning
        if al is None or epoch != al.epoch:  # settled, or snapshotted unaligned on its arrival
            return HandlerResult(aborted_epochs=aborted, outcome=BarrierOutcome.IGNORED_STALE), None
        al.reached.add(channel)
        if len(al.reached) < self.num_channels:
            outcome = BarrierOutcome.STARTED_ALIGNMENT if len(al.reached) == 1 else BarrierOutcome.ALIGNING
            return HandlerResult(aborted_epochs=aborted, outcome=outcome), None
        now = self._clock()
        self.last_snapshot_kind = "aligned"
        later: list[int] = []
        self._begin_next(epoch, later)  # an epoch that arrived behind this one aligns now
        result = HandlerResult(snapshot_epoch=epoch, aborted_epochs=(*aborted, *later), outcome=BarrierOutcome.SNAPSHOT)
        return result, now - al.first_arrival

    def _abort(self, epoch: int) -> HandlerResult:
        if self._aligning is not None and self._aligning.epoch == epoch:
            later: list[int] = []
            self._begin_next(epoch, later)
            return HandlerResult(aborted_epochs=(epoch, *later), outcome=BarrierOutcome.ABORTED)
        return HandlerResult(outcome=BarrierOutcome.NOT_PENDING)

    # -- internals ----------------------------------------------------------------------
    def _arrive(self, channel: int, epoch: int, flagged: bool, now: float) -> HandlerResult:
        aborted, captured = [], None
        for m in sorted(self._waiting):  # unaligned epochs recording this channel
            waiting = self._waiting[m]
            if channel not in waiting:
                continue
            if m == epoch:
                waiting.discard(channel)
                captured = m
            elif m < epoch:  # the channel skipped m: its channel state can never be complete
                aborted.append(m)
                waiting.clear()
        for m in [m for m, w in self._waiting.items() if not w]:
            del self._waiting[m]
        if captured is not None:
            return HandlerResult(aborted_epochs=tuple(aborted), outcome=BarrierOutcome.CAPTURED,
                                 channel_state=ChannelStatePlan(captured, capture=frozenset({channel})))
        al = self._aligning
        if al is not None:
            if epoch < al.epoch:
                return HandlerResult(aborted_epochs=tuple(aborted), outcome=BarrierOutcome.IGNORED_STALE)
            if epoch == al.epoch:
                al.arrived.add(channel)
                if flagged:
                    return self._switch(now, tuple(aborted), BarrierOutcome.SNAPSHOT)
                return HandlerResult(aborted_epochs=tuple(aborted), outcome=BarrierOutcome.ARRIVED)
            if channel in al.arrived:  # a newer epoch behind the aligning one: it waits its turn
                self._early.setdefault(epoch, {})[channel] = (now, flagged)
                return HandlerResult(aborted_epochs=tuple(aborted), outcome=BarrierOutcome.ARRIVED)
            aborted.append(al.epoch)  # the channel skipped the aligning epoch
            self._aligning = None
        if self._is_settled(epoch) or epoch in aborted:
            return HandlerResult(aborted_epochs=tuple(aborted), outcome=BarrierOutcome.IGNORED_STALE)
        self._early.setdefault(epoch, {})[channel] = (now, flagged)
        self._begin_next(epoch - 1, aborted)
        if self._aligning is None:
            return HandlerResult(aborted_epochs=tuple(aborted), outcome=BarrierOutcome.IGNORED_STALE)
        if self.aligned_timeout is None or self._aligning.flagged:
            return self._switch(now, tuple(aborted), BarrierOutcome.SNAPSHOT)
        outcome = BarrierOutcome.SUPERSEDED if aborted else BarrierOutcome.STARTED_ALIGNMENT
        return HandlerResult(aborted_epochs=tuple(aborted), outcome=outcome)

    def _begin_next(self, after: int, aborted: list[int]) -> None:
        """Start aligning the oldest epoch above ``after`` whose barrier has arrived somewhere
        (``_early``). An epoch that some channel already went past (it delivered a newer
        barrier but not this one) can never align: it is appended to ``aborted`` and the next
        one is tried."""
        self._aligning = None
        for epoch in sorted(e for e in self._early if e <= after):
            del self._early[epoch]
        while self._early:
            epoch = min(self._early)
            arrivals = self._early.pop(epoch)
            if any(self._last_arrived[c] > epoch and c not in arrivals for c in range(self.num_channels)):
                aborted.append(epoch)  # skipped by a channel
                continue
            first = min(t for t, _ in arrivals.values())
            self._aligning = _Aligning(epoch, first, set(arrivals), set(), any(f for _, f in arrivals.values()))
            return

    def _switch(self, now: float, aborted: tuple[int, ...], outcome: BarrierOutcome) -> HandlerResult:
        """Snapshot the aligning epoch unaligned now (see the module docstring)."""
        al = self._aligning
        self._aligning = None
        everyone = frozenset(range(self.num_channels))
        capture = frozenset(al.arrived - al.reached)
        record = everyone - al.arrived
        if record:
            self._waiting[al.epoch] = set(record)
        self.last_snapshot_kind = "timed-out" if outcome is BarrierOutcome.TIMED_OUT else "unaligned"
        self._last_alignment_duration = max(0.0, now - al.first_arrival)
        later: list[int] = []
        self._begin_next(al.epoch, later)  # an epoch that arrived behind this one aligns now
        return HandlerResult(snapshot_epoch=al.epoch, aborted_epochs=(*aborted, *later), outcome=outcome,
                             unaligned=True, channel_state=ChannelStatePlan(al.epoch, capture, record))

    def _done(self, result: HandlerResult) -> HandlerResult:
        """Bookkeeping shared with :meth:`BarrierHandler.on_barrier` (latest snapshot,
        abandoned epochs) for results produced outside it."""
        self._record(result, self._last_alignment_duration if result.snapshot_epoch is not None else None)
        return result


_NOTHING = HandlerResult(outcome=BarrierOutcome.NOTHING)
