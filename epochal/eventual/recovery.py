"""Recovery of a CEC operator from its output queue (seed 003 §II.B "Constructing an EC",
"Extent of an EC"; §III the recovery path).

:func:`construct` builds the eventual checkpoint ``W = {(w_i, t_i): t_i <= tc}`` exactly as
the seed says:

1. ``tc`` is the time of the newest durable record and ``N`` its count of open windows (every
   record carries both; a torn frame was already discarded by the log's reader, so ``tc`` and
   ``N`` are those of the newest *whole* frame — one input tuple's records are one frame);
2. read the log backwards until ``N`` distinct windows' footprints are found: the first
   footprint met for a window is its latest; a window whose ``R`` is met first closed before
   ``tc`` and is skipped ("its R tuple will be encountered prior to any checkpoints for that
   window and therefore it will be excluded from the EC");
3. ``T = min t_i``, the extent's start (``T = tc`` when no window was open at ``tc``).

Then the operator is restored (:meth:`~epochal.eventual.operator_state.EventualWindows.restore`)
and upstream replays the input *after* ``T``. :class:`ReplayFilter` is the per-window rule
("window w_i ignores tuples with timestamps t < t_i"), made exact with positions
(:class:`~epochal.eventual.records.Position`: timestamp plus sequence number, so equal
timestamps are not ambiguous). A footprint at ``t_i`` holds the tuple at ``t_i`` (a Gopen's
state is "the state of the window after taking into account the tuple that opened it"), so:

* window ``w_i`` of the EC takes a replayed tuple at ``p`` iff ``p > t_i``;
* any other window takes it iff ``p > tc``: a tuple at or before ``tc`` belonged only to
  windows that were open at ``tc`` (in the EC) or had closed by ``tc`` (their ``R`` is
  already in the log and must not be produced again).

Once the input passes ``tc`` every window is in the state of the failure-free run, and the
operator's records are the ones that run would have appended (Gcheck choices aside).

Pure: frames in, an :class:`EventualCheckpoint` out.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from epochal.errors import CheckpointStorageError
from epochal.eventual.records import Footprint, Position, Record, Result

__all__ = ["EventualCheckpoint", "ReplayFilter", "construct"]


@dataclass(frozen=True)
class EventualCheckpoint:
    """What recovery found.

    Attributes:
        tc: the time of the newest durable record (``None``: the log is empty — start over).
        n: the number of windows open at ``tc`` (= ``len(footprints)``).
        footprints: window → its latest footprint before ``tc``.
        T: the oldest footprint's time (``tc`` when ``n == 0``); replay the input after it.
        extent: records read backwards to find the footprints (the seed's extent).
        frames: frames read.
    """

    tc: Position | None
    n: int
    footprints: dict[Hashable, Footprint] = field(default_factory=dict)
    T: Position | None = None
    extent: int = 0
    frames: int = 0


def construct(frames_backward: Iterable[Sequence[Record]], where: str = "output log") -> EventualCheckpoint:
    """Build the eventual checkpoint from the durable frames, newest first (e.g.
    :meth:`~epochal.eventual.log.OutputLog.frames_backward`). Reads no further back than the
    oldest footprint it needs. Idempotent: the log is not changed.

    Raises:
        CheckpointStorageError: the log ends before ``N`` footprints were found (it was
            truncated past the extent, or segments are missing); ``where`` names the log.
    """
    tc = n = None
    closed: set = set()
    found: dict[Hashable, Footprint] = {}
    extent = frames = 0
    for frame in frames_backward:
        frames += 1
        for record in reversed(frame):
            if tc is None:
                tc, n = record.t, record.n
                if n == 0:
                    return EventualCheckpoint(tc, 0, {}, tc, 1, 1)
            extent += 1
            if isinstance(record, Result):
                closed.add(record.window)
            elif record.window not in closed and record.window not in found:
                found[record.window] = record
                if len(found) == n:
                    return EventualCheckpoint(tc, n, found, min(f.t for f in found.values()), extent, frames)
    if tc is None:
        return EventualCheckpoint(None, 0)
    raise CheckpointStorageError(
        f"{where}: the eventual checkpoint at {tuple(tc)} needs footprints of {n} open windows but the log "
        f"holds only {len(found)} ({extent} records read back to its start): it was truncated past the "
        "extent or segments are missing")


class ReplayFilter:
    """Which replayed tuples each window takes after a restore from ``ec`` (module docstring):
    an EC window iff the tuple is after its footprint, any other window iff it is after ``tc``.
    """

    __slots__ = ("tc", "_after")

    def __init__(self, ec: EventualCheckpoint):
        if ec.tc is None:
            raise ValueError("ReplayFilter: nothing to filter after an empty log")
        self.tc = ec.tc
        self._after = {w: fp.t for w, fp in ec.footprints.items()}

    def accepts(self, window: Hashable, t: Position) -> bool:
        """True iff ``window`` must take the replayed tuple at ``t`` into account."""
        return t > self._after.get(window, self.tc)
