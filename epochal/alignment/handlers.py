"""Per-task barrier handlers: when may a task with several inputs snapshot epoch n?

Two interchangeable policies behind one base class, with the same metrics (seed 004):

* :class:`AlignedBarrierHandler` -- exactly-once epoch alignment (Alg. 6, §3.4.4.2): a
  channel that delivered barrier n is blocked until barrier n arrived on every channel.
* :class:`BarrierTracker` -- at-least-once "relaxed" mode (§4.5.4): count, never block.

Handlers are pure: no threads, no I/O, and time only through the injected ``clock`` (used
for metrics). The task loop owns the channels, reads only channels that are not blocked,
and acts on each :class:`HandlerResult`::

    result = handler.on_barrier(channel, barrier)
    for epoch in result.aborted_epochs:
        decline(epoch)                         # tell the coordinator
    if result.snapshot_epoch is not None:
        snapshot(result.snapshot_epoch)        # now, before reading any further input
        forward(Barrier(result.snapshot_epoch, barrier.timestamp))

Which handler a task gets is decided only by :func:`epochal.alignment.factory.components_for`.
"""
from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple, Union

from epochal.epochs.barrier import Barrier
from epochal.errors import EpochalError

Clock = Callable[[], float]


class ProtocolError(EpochalError):
    """The barrier stream broke an assumption of the protocol: a blocked channel was read,
    or a channel delivered barriers out of increasing epoch order (FIFO violated). Always a
    bug in the task loop or the transport, never in user code."""


class BarrierOutcome(enum.Enum):
    """What one :meth:`BarrierHandler.on_barrier` / :meth:`~BarrierHandler.abort_epoch` did."""

    STARTED_ALIGNMENT = "started-alignment"  # aligned: first barrier of an epoch; channel blocked
    ALIGNING = "aligning"  # aligned: a further barrier of the pending epoch; channel blocked
    TRACKING = "tracking"  # tracker: barrier counted, epoch not yet seen on every channel
    SNAPSHOT = "snapshot"  # barrier seen on every channel: snapshot_epoch must be taken now
    IGNORED_STALE = "ignored-stale"  # epoch already snapshotted, abandoned or older than pending
    SUPERSEDED = "superseded"  # aligned: a newer barrier abandoned the pending epoch
    ABORTED = "aborted"  # abort_epoch released the pending epoch
    NOT_PENDING = "not-pending"  # abort_epoch for an epoch not in progress here; remembered
    # unaligned (epochal.alignment.unaligned): events of barriers *arriving* at input queues
    ARRIVED = "arrived"  # barrier arrived; its epoch aligns (or waits for the aligning one)
    CAPTURED = "captured"  # barrier of an unaligned epoch arrived: capture its channel's queued prefix
    TIMED_OUT = "timed-out"  # alignment exceeded aligned_timeout: snapshot unaligned now
    NOTHING = "nothing"  # a tick with nothing due


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerResult:
    """The task's instructions after one handler event.

    Attributes:
        snapshot_epoch: snapshot this epoch NOW (before reading more input), then forward
            its barrier downstream; ``None`` if nothing is due.
        aborted_epochs: epochs this handler gave up (superseded, subsumed or aborted), in
            increasing order; the task declines them to the coordinator (declining an epoch
            the coordinator already aborted is a no-op there).
        outcome: what happened, for logging and tests.
        unaligned: the snapshot is unaligned (forward its barrier flagged unaligned).
        channel_state: for an unaligned epoch, which channels' in-flight records to capture
            now and which to record until their barrier arrives
            (:class:`~epochal.alignment.unaligned.ChannelStatePlan`).
    """

    snapshot_epoch: int | None = None
    aborted_epochs: tuple[int, ...] = ()
    outcome: BarrierOutcome
    unaligned: bool = False
    channel_state: object = None


_STALE = HandlerResult(outcome=BarrierOutcome.IGNORED_STALE)
_NOT_PENDING = HandlerResult(outcome=BarrierOutcome.NOT_PENDING)


class BarrierHandler(ABC):
    """Decides, per task, when barrier n has been seen "enough" to snapshot epoch n.

    Contract shared by both policies (the base owns it; subclasses only decide):

    * channels are ``0 .. num_channels-1``; a source task has ``num_channels == 0`` and
      never calls :meth:`on_barrier` (its barriers are injected, seed Alg. 5);
    * each channel is FIFO and delivers barriers in strictly increasing epoch order,
      otherwise :class:`ProtocolError`; reading a blocked channel is a :class:`ProtocolError`;
    * each epoch is snapshotted at most once, only after its barrier arrived on every
      channel, and snapshots happen in increasing epoch order;
    * barriers for epochs already snapshotted or abandoned are ignored (``IGNORED_STALE``).

    Metrics: :attr:`last_alignment_duration` (clock seconds from the first barrier of an
    epoch to its snapshot) and :attr:`latest_snapshotted_epoch`.
    """

    def __init__(self, num_channels: int, clock: Clock = time.monotonic):
        if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels < 0:
            raise ValueError(f"{type(self).__name__}: num_channels must be an int >= 0, got {num_channels!r}")
        self.num_channels = num_channels
        self._clock = clock
        self._last_epoch_on = [0] * num_channels  # highest barrier epoch seen per channel
        self._latest_snapshotted: int | None = None
        self._last_alignment_duration: float | None = None
        self._abandoned: set[int] = set()  # aborted/superseded epochs above the latest snapshot

    # -- events -------------------------------------------------------------------------
    def on_barrier(self, channel: int, barrier: Barrier) -> HandlerResult:
        """Barrier ``barrier.epoch`` was read from input ``channel``.

        Raises:
            ProtocolError: channel out of range, channel blocked, or non-increasing epochs
                on the channel.
        """
        if not 0 <= channel < self.num_channels:
            raise ProtocolError(f"{type(self).__name__}: channel {channel} out of range for a "
                                f"task with {self.num_channels} input channel(s)")
        epoch = barrier.epoch
        if self.is_blocked(channel):
            raise ProtocolError(
                f"{type(self).__name__}: barrier {epoch} read from channel {channel}, which is "
                f"blocked aligning epoch {self.pending_epoch}; the task loop must only read "
                f"unblocked channels (seed 004 Alg. 6: 'Upon rcvd on c in Enabled')")
        if epoch <= self._last_epoch_on[channel]:
            raise ProtocolError(
                f"{type(self).__name__}: channel {channel} delivered barrier {epoch} after barrier "
                f"{self._last_epoch_on[channel]}; channels must be FIFO with increasing epochs")
        self._last_epoch_on[channel] = epoch
        if self._is_settled(epoch):
            return _STALE
        result, duration = self._on_barrier(channel, epoch)
        self._record(result, duration)
        return result

    def abort_epoch(self, epoch: int) -> HandlerResult:
        """The coordinator aborted ``epoch`` (e.g. timeout): stop waiting for it, release any
        channel blocked for it, and ignore its later barriers.

        Returns ``ABORTED`` (with ``aborted_epochs == (epoch,)``) if the epoch was in
        progress here, otherwise ``NOT_PENDING``.
        """
        if self._is_settled(epoch):
            return _NOT_PENDING
        result = self._abort(epoch)
        self._abandoned.add(epoch)
        self._record(result, None)
        return result

    # -- queries ------------------------------------------------------------------------
    def is_blocked(self, channel: int) -> bool:
        """Whether the task must not read ``channel`` now."""
        return channel in self.blocked_channels

    @property
    @abstractmethod
    def blocked_channels(self) -> frozenset[int]:
        """Channels the task must not read now."""

    @property
    @abstractmethod
    def pending_epoch(self) -> int | None:
        """The epoch whose barriers are being collected (the oldest, if several); else None."""

    @property
    def last_alignment_duration(self) -> float | None:
        """Clock seconds from the first barrier of the last snapshotted epoch to its snapshot."""
        return self._last_alignment_duration

    @property
    def latest_snapshotted_epoch(self) -> int | None:
        """The newest epoch this handler has told the task to snapshot."""
        return self._latest_snapshotted

    # -- for subclasses -----------------------------------------------------------------
    @abstractmethod
    def _on_barrier(self, channel: int, epoch: int) -> tuple[HandlerResult, float | None]:
        """Decide on a checked, non-stale barrier; return (result, alignment duration)."""

    @abstractmethod
    def _abort(self, epoch: int) -> HandlerResult:
        """Forget ``epoch`` (not yet settled); ``ABORTED`` if it was in progress."""

    def _is_settled(self, epoch: int) -> bool:
        return epoch <= (self._latest_snapshotted or 0) or epoch in self._abandoned

    def _record(self, result: HandlerResult, duration: float | None) -> None:
        self._abandoned.update(result.aborted_epochs)
        if result.snapshot_epoch is not None:
            self._latest_snapshotted = result.snapshot_epoch
            self._last_alignment_duration = duration
            self._abandoned = {e for e in self._abandoned if e > result.snapshot_epoch}


# -- exactly-once: alignment as tiny state objects (seed 004 Alg. 6) ----------------------
class _Step(NamedTuple):
    state: "AlignmentState"
    result: HandlerResult
    alignment_duration: float | None = None


@dataclass(frozen=True)
class WaitingForFirstBarrier:
    """No epoch in progress; every channel is enabled. ``after`` is the newest epoch this
    task already aligned or abandoned: barriers at or below it are stale."""

    after: int = 0
    blocked: ClassVar[frozenset[int]] = frozenset()
    pending_epoch: ClassVar[None] = None

    def on_barrier(self, channel: int, epoch: int, num_channels: int, clock: Clock) -> _Step:
        if epoch <= self.after:
            return _Step(self, _STALE)
        return _begin(epoch, channel, num_channels, clock(), BarrierOutcome.STARTED_ALIGNMENT)

    def abort(self, epoch: int) -> _Step:
        return _Step(self, _NOT_PENDING)


@dataclass(frozen=True)
class CollectingBarriers:
    """Aligning ``epoch``: the channels in ``arrived`` delivered its barrier and are
    blocked (removed from Enabled, Alg. 6 line 9) since clock time ``started_at``."""

    epoch: int
    arrived: frozenset[int]
    started_at: float

    @property
    def blocked(self) -> frozenset[int]:
        return self.arrived

    @property
    def pending_epoch(self) -> int:
        return self.epoch

    def on_barrier(self, channel: int, epoch: int, num_channels: int, clock: Clock) -> _Step:
        if epoch < self.epoch:  # e.g. aborted upstream and overtaken on another channel
            return _Step(self, _STALE)
        if epoch > self.epoch:  # channel skipped our epoch: it can never complete here
            return _begin(epoch, channel, num_channels, clock(), BarrierOutcome.SUPERSEDED,
                          aborted=(self.epoch,))
        collecting = CollectingBarriers(self.epoch, self.arrived | {channel}, self.started_at)
        if len(collecting.arrived) < num_channels:
            return _Step(collecting, HandlerResult(outcome=BarrierOutcome.ALIGNING))
        return collecting._trigger(clock(), aborted=())

    def abort(self, epoch: int) -> _Step:
        if epoch != self.epoch:
            return _Step(self, _NOT_PENDING)
        return _Step(WaitingForFirstBarrier(after=epoch),
                     HandlerResult(aborted_epochs=(epoch,), outcome=BarrierOutcome.ABORTED))

    def _trigger(self, now: float, aborted: tuple[int, ...]) -> _Step:
        """All channels delivered barrier n: snapshot, forward, re-enable all (lines 10-13)."""
        result = HandlerResult(snapshot_epoch=self.epoch, aborted_epochs=aborted,
                               outcome=BarrierOutcome.SNAPSHOT)
        return _Step(WaitingForFirstBarrier(after=self.epoch), result, now - self.started_at)


AlignmentState = Union[WaitingForFirstBarrier, CollectingBarriers]


def _begin(epoch: int, channel: int, num_channels: int, now: float, outcome: BarrierOutcome,
           aborted: tuple[int, ...] = ()) -> _Step:
    collecting = CollectingBarriers(epoch, frozenset({channel}), now)
    if num_channels == 1:
        return collecting._trigger(now, aborted)
    return _Step(collecting, HandlerResult(aborted_epochs=aborted, outcome=outcome))


class AlignedBarrierHandler(BarrierHandler):
    """Exactly-once: epoch alignment (seed 004 Alg. 6, §3.4.4.2; Flink's
    ``SingleCheckpointBarrierHandler``).

    The first barrier n blocks its channel; each further barrier n blocks its channel; when
    barrier n arrived on every channel the task snapshots n and all channels are enabled
    again. So the snapshot of n reflects exactly the records before barrier n on every
    channel (an epoch cut). A barrier m > n on an enabled channel means that channel skipped
    n (aborted upstream): n is abandoned (``SUPERSEDED``) and alignment of m begins.
    At most one epoch is in progress at a time.
    """

    def __init__(self, num_channels: int, clock: Clock = time.monotonic):
        super().__init__(num_channels, clock)
        self._state: AlignmentState = WaitingForFirstBarrier()

    @property
    def blocked_channels(self) -> frozenset[int]:
        return self._state.blocked

    @property
    def pending_epoch(self) -> int | None:
        return self._state.pending_epoch

    def _on_barrier(self, channel: int, epoch: int) -> tuple[HandlerResult, float | None]:
        self._state, result, duration = self._state.on_barrier(channel, epoch, self.num_channels, self._clock)
        return result, duration

    def _abort(self, epoch: int) -> HandlerResult:
        self._state, result, _ = self._state.abort(epoch)
        return result


# -- at-least-once: counting without blocking (seed 004 §4.5.4) ---------------------------
@dataclass
class _Tally:
    arrived: set[int]
    started_at: float


class BarrierTracker(BarrierHandler):
    """At-least-once: the "relaxed" mode of seed 004 §4.5.4 (Flink's
    ``CheckpointBarrierTracker``). Never blocks: every channel stays enabled.

    Barriers are counted per epoch; once epoch n has been seen on every channel the task
    snapshots n, and every older epoch still incomplete is dropped (reported in
    ``aborted_epochs``: subsumed by n). Several epochs may be in progress at once.

    What it cannot guarantee: an epoch cut. Records that follow barrier n on a fast channel
    are processed before the snapshot of n, so the snapshot E' satisfies E^n ⊆ E' but may
    contain effects of epoch n+1; after recovery from n those records are replayed and their
    effects happen twice (duplicates). Exactly-once output needs
    :class:`AlignedBarrierHandler` and transactional sinks.

    What it assumes: FIFO channels on which barriers arrive in strictly increasing epoch
    order (checked: :class:`ProtocolError`). Hence when n is complete, an older epoch that is
    still incomplete was skipped by some channel and can never complete.
    """

    def __init__(self, num_channels: int, clock: Clock = time.monotonic):
        super().__init__(num_channels, clock)
        self._pending: dict[int, _Tally] = {}

    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset()

    @property
    def pending_epoch(self) -> int | None:
        return min(self._pending, default=None)

    @property
    def pending_epochs(self) -> tuple[int, ...]:
        """Every epoch whose barriers are being counted, oldest first."""
        return tuple(sorted(self._pending))

    def _on_barrier(self, channel: int, epoch: int) -> tuple[HandlerResult, float | None]:
        now = self._clock()
        tally = self._pending.setdefault(epoch, _Tally(set(), now))
        tally.arrived.add(channel)
        if len(tally.arrived) < self.num_channels:
            return HandlerResult(outcome=BarrierOutcome.TRACKING), None
        subsumed = tuple(sorted(e for e in self._pending if e < epoch))
        for e in (*subsumed, epoch):
            del self._pending[e]
        result = HandlerResult(snapshot_epoch=epoch, aborted_epochs=subsumed,
                               outcome=BarrierOutcome.SNAPSHOT)
        return result, now - tally.started_at

    def _abort(self, epoch: int) -> HandlerResult:
        if self._pending.pop(epoch, None) is None:
            return _NOT_PENDING
        return HandlerResult(aborted_epochs=(epoch,), outcome=BarrierOutcome.ABORTED)
