"""A keyed window aggregation that checkpoints its windows one at a time (seed 003 §III: the
operator's state; the foreground and background paths).

State (§III): "(a) the set of all currently open windows; (b) the state of each window ...
accumulated state so far; and two timestamps τ1 and τ2, τ1 corresponding to the input tuple
that created the window and τ2 corresponding to the last checkpoint (Gopen or Gcheck)
produced for the window; and (c) an ordering of all open windows by their τ2 timestamp".
Every footprint is taken at ``tnow``, which never decreases, so ordering by τ2 is ordering by
when a window was last checkpointed: an insertion-ordered dict where a Gcheck moves its window
to the end — O(1) per open, checkpoint and close.

Pure and single-threaded, like the seed's operator ("All processing is performed in the main
thread of the operator"): scripted calls in, records out. The caller's loop::

    for key, value, position in source:              # positions strictly increasing
        log.append(op.on_tuple(key, value, position))   # foreground: Gopen, R (one frame)
        log.append(op.background())                     # background: Gchecks within the budget
    log.append(op.end_of_input())
    log.flush()

Each call's records are one frame of the log (:mod:`epochal.eventual.log`) and must be
appended before the next call: a footprint holds the window's accumulator object itself.

Windows: ``Tumbling(size)``, ``Sliding(size, slide)`` or ``Session(gap)`` over integer
timestamps, per key; a window is ``(key, start)`` and covers ``[start, start + size)`` (a
session: ``[first tuple, last tuple + gap)``, growing). Closing (``closing=``):

* ``"key"`` — Borealis's grouped aggregate: a window closes when a tuple *of its key* arrives
  at or past its end. Rare keys keep their windows open: the seed's slow windows.
* ``"time"`` — event time: any tuple at or past a window's end closes it.

A window's result is ``aggregate.result(acc)`` and every open window closes at
:meth:`EventualWindows.end_of_input`. Recovery (:mod:`epochal.eventual.recovery`) builds a
fresh operator with :meth:`EventualWindows.restore`.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from epochal.errors import EpochalError, PipelineDefinitionError
from epochal.eventual.extent import CheckpointScheduler
from epochal.eventual.records import Footprint, Kind, Position, Record, Result
from epochal.eventual.recovery import EventualCheckpoint, ReplayFilter

__all__ = ["EventualWindows", "ReplayMismatch", "Session", "Sliding", "SumCount", "Tumbling"]


class ReplayMismatch(EpochalError):
    """The input replayed after a recovery is not the input the log was written from: a
    tuple at or before the recovered time ``tc`` closed or opened a window (it cannot, when
    the source replays the same tuples at the same positions), or positions did not increase.
    The source's replay is broken; continuing would duplicate or lose results."""


@dataclass(frozen=True, slots=True)
class Tumbling:
    """Windows ``[k*size, (k+1)*size)``."""

    size: int

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0:
            raise PipelineDefinitionError(f"Tumbling(size={self.size!r}): size must be a positive int")

    def starts(self, ts: int) -> list[int]:
        """Starts of the windows holding timestamp ``ts``."""
        return [ts - ts % self.size]

    def end(self, start: int) -> int:
        return start + self.size


@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows ``[k*slide, k*slide + size)``; ``size`` a multiple of ``slide``."""

    size: int
    slide: int

    def __post_init__(self):
        for name in ("size", "slide"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise PipelineDefinitionError(f"Sliding(size={self.size!r}, slide={self.slide!r}): "
                                              f"{name} must be a positive int")
        if self.size % self.slide:
            raise PipelineDefinitionError(f"Sliding(size={self.size}, slide={self.slide}): size must be a "
                                          "multiple of slide")

    def starts(self, ts: int) -> list[int]:
        last = ts - ts % self.slide
        return list(range(last - self.size + self.slide, last + 1, self.slide))

    def end(self, start: int) -> int:
        return start + self.size


@dataclass(frozen=True, slots=True)
class Session:
    """Per key, a session of tuples each less than ``gap`` after the previous one: the window
    ``(key, start)`` starts at its first tuple and ends at ``last tuple + gap``. The input is in
    timestamp order, so sessions never merge. Its footprints' state is ``(accumulator, end)``:
    a restored session knows when it would close."""

    gap: int

    def __post_init__(self):
        if isinstance(self.gap, bool) or not isinstance(self.gap, int) or self.gap <= 0:
            raise PipelineDefinitionError(f"Session(gap={self.gap!r}): gap must be a positive int")


class SumCount:
    """``(sum, count)`` of the values: the accumulator is an immutable tuple."""

    zero = (0, 0)

    @staticmethod
    def add(acc: tuple, value) -> tuple:
        return (acc[0] + value, acc[1] + 1)

    @staticmethod
    def result(acc: tuple) -> tuple:
        return acc


class _Window:
    __slots__ = ("key", "start", "end", "acc", "opened", "tau2")

    def __init__(self, key, start, end, acc, opened: Position, tau2: Position):
        self.key, self.start, self.end, self.acc, self.opened, self.tau2 = key, start, end, acc, opened, tau2


class EventualWindows:
    """Keyed windows with continuous eventual checkpoints (see the module docstring).

    Args:
        windows: :class:`Tumbling`, :class:`Sliding` or :class:`Session`.
        aggregate: an object with ``zero``, ``add(acc, value) -> acc`` and ``result(acc)``
            (e.g. :class:`SumCount`); ``add`` returns the new accumulator.
        closing: ``"key"`` or ``"time"``.
        scheduler: chooses the background path's Gchecks (:mod:`epochal.eventual.extent`);
            ``None``: :meth:`background` checkpoints nothing (explicit :meth:`checkpoint` only).
        clock: measures the background path's work for the scheduler's budget.

    Metrics: :attr:`ignored` (replayed tuples a window ignored), :attr:`footprints`.
    """

    def __init__(self, windows, aggregate, *, closing: str = "key", scheduler: CheckpointScheduler | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if closing not in ("key", "time"):
            raise PipelineDefinitionError(f"EventualWindows: closing must be 'key' or 'time', got {closing!r}")
        self.windows, self.aggregate, self.closing = windows, aggregate, closing
        self._session = windows.gap if isinstance(windows, Session) else None
        self.scheduler, self._clock = scheduler, clock
        self._open: OrderedDict[Hashable, _Window] = OrderedDict()  # τ2 order, oldest first
        self._by_key: dict[Hashable, list[_Window]] = {}
        self._by_end: list = []  # closing == "time": (end, tiebreak, window id)
        self._tiebreak = itertools.count()
        self._tnow: Position | None = None
        self._filter: ReplayFilter | None = None
        # background(): nothing is due before this input timestamp (the oldest footprint's
        # max_extent; the oldest only moves later) nor affordable before this scheduler clock
        self._quiet_ts: float = float("-inf")
        self._quiet_clock: float = float("-inf")
        self.ignored = 0
        self.footprints = 0

    # -- state --------------------------------------------------------------------------
    @property
    def tnow(self) -> Position | None:
        """Position of the last tuple processed."""
        return self._tnow

    @property
    def n(self) -> int:
        """Number of open windows."""
        return len(self._open)

    def open_windows(self) -> dict[Hashable, tuple[Any, Position, Position]]:
        """``window → (accumulator, τ1, τ2)``, oldest τ2 first (a copy, for tests and metrics)."""
        return {wid: (w.acc, w.opened, w.tau2) for wid, w in self._open.items()}

    def extent_start(self) -> Position | None:
        """T as the operator knows it: the oldest τ2 of an open window (``tnow`` when none is
        open). After :meth:`~epochal.eventual.log.OutputLog.flush` it is the T recovery would
        find, and the log may be truncated behind it."""
        if not self._open:
            return self._tnow
        return next(iter(self._open.values())).tau2

    def metrics(self) -> dict[str, float]:
        """Gauges and counters for the metrics layer (which turns counters into rates):
        ``open_windows``; ``extent_lag`` (``tnow`` − T in event time, 0 with nothing open or
        before any input); ``footprints`` and ``ignored`` (counters); the scheduler's
        ``checkpoint_seconds`` and ``overdrafts`` when there is one."""
        start = self.extent_start()
        out = {"open_windows": len(self._open), "footprints": self.footprints, "ignored": self.ignored,
               "extent_lag": 0 if start is None else self._tnow.ts - start.ts}
        if self.scheduler is not None:
            out["checkpoint_seconds"] = self.scheduler.spent
            out["overdrafts"] = self.scheduler.overdrafts
        return out

    def _by_footprint(self) -> Iterator[tuple[Hashable, _Window]]:
        """Open windows oldest τ2 first — the order the background path considers them in."""
        return iter(self._open.items())

    @property
    def replaying(self) -> bool:
        """True while the input replayed after a restore has not passed the recovered ``tc``."""
        return self._filter is not None

    # -- foreground ---------------------------------------------------------------------
    def on_tuple(self, key: Hashable, value, t: Position) -> list[Record]:
        """The foreground path for one input tuple at position ``t``: close the windows it ends
        (``R``), open the windows it starts (``Gopen``, state after this tuple), update the
        others. All records carry ``t`` and the count of open windows after the tuple.

        Raises:
            ReplayMismatch: ``t`` is not after the previous tuple, or a replayed tuple at or
                before the recovered ``tc`` would emit a record.
        """
        if self._tnow is not None and not t > self._tnow:
            raise ReplayMismatch(f"EventualWindows: input position {tuple(t)} after {tuple(self._tnow)} "
                                 "(positions must increase)")
        self._tnow = t
        replay = self._filter
        if replay is not None and t > replay.tc:
            self._filter = replay = None
        closed = [(w.key, w.start) for w in self._closed_by(key, t.ts)]
        results = []
        for wid in closed:
            w = self._remove(wid)
            results.append((wid, self.aggregate.result(w.acc)))
        opened = []
        for start in self._starts(key, t.ts):
            wid = (key, start)
            if replay is not None and not replay.accepts(wid, t):
                self.ignored += 1
                continue
            w = self._open.get(wid)
            if w is not None:
                w.acc = self.aggregate.add(w.acc, value)
                if self._session is not None:
                    self._extend(wid, w, t.ts + self._session)
                continue
            end = t.ts + self._session if self._session is not None else self.windows.end(start)
            w = _Window(key, start, end, self.aggregate.add(self.aggregate.zero, value), t, t)
            self._insert(wid, w)
            opened.append((wid, self._state(w)))
        if replay is not None and (results or opened):
            raise ReplayMismatch(f"EventualWindows: the replayed tuple at {tuple(t)} (not after the recovered "
                                 f"tc {tuple(replay.tc)}) closed {len(results)} and opened {len(opened)} windows: "
                                 "the source did not replay the input the log was written from")
        n = len(self._open)
        records: list[Record] = [Result(wid, value, t, n) for wid, value in results]
        records += [Footprint(Kind.OPEN, wid, acc, t, n, t) for wid, acc in opened]
        self.footprints += len(opened)
        return records

    def end_of_input(self) -> list[Result]:
        """Close every open window (its ``R`` at ``tnow``), in order of window end.

        Raises:
            ReplayMismatch: the input ended before the recovered ``tc`` (it was shorter when
                replayed than when the log was written).
        """
        if self._filter is not None and self._tnow < self._filter.tc:
            raise ReplayMismatch(f"EventualWindows: the replayed input ended at {tuple(self._tnow)}, before the "
                                 f"recovered tc {tuple(self._filter.tc)}: the source did not replay the input the "
                                 "log was written from")
        wids = sorted(self._open, key=lambda wid: (self._open[wid].end, self._open[wid].tau2))
        results = [(wid, self.aggregate.result(self._remove(wid).acc)) for wid in wids]
        self._by_end.clear()
        return [Result(wid, value, self._tnow, 0) for wid, value in results]

    def _starts(self, key: Hashable, ts: int) -> list:
        """Starts of the windows the tuple at ``ts`` of ``key`` belongs to (after closing)."""
        if self._session is None:
            return self.windows.starts(ts)
        current = self._by_key.get(key)
        return [current[0].start] if current else [ts]

    def _state(self, w: _Window):
        """What a footprint holds of ``w`` (a session's end too)."""
        return w.acc if self._session is None else (w.acc, w.end)

    def _extend(self, wid: Hashable, w: _Window, end: int) -> None:
        if end > w.end:
            w.end = end
            if self.closing == "time":
                heapq.heappush(self._by_end, (end, next(self._tiebreak), wid))

    def _closed_by(self, key: Hashable, ts: int) -> list[_Window]:
        if self.closing == "key":
            return sorted((w for w in self._by_key.get(key, ()) if w.end <= ts), key=lambda w: w.start)
        closed = []
        while self._by_end and self._by_end[0][0] <= ts:
            end, _, wid = heapq.heappop(self._by_end)
            w = self._open.get(wid)
            if w is not None and w.end == end:  # else a session's end that grew since: stale
                closed.append(w)
        return closed

    def _insert(self, wid: Hashable, w: _Window) -> None:
        self._open[wid] = w
        self._by_key.setdefault(w.key, []).append(w)
        if self.closing == "time":
            heapq.heappush(self._by_end, (w.end, next(self._tiebreak), wid))

    def _remove(self, wid: Hashable) -> _Window:
        w = self._open.pop(wid)
        same = self._by_key[w.key]
        same.remove(w)
        if not same:
            del self._by_key[w.key]
        return w

    # -- background ---------------------------------------------------------------------
    def checkpoint(self, windows: Iterable[Hashable]) -> list[Footprint]:
        """Gcheck the given open windows at ``tnow`` (their τ2 becomes ``tnow``). Windows
        already footprinted at ``tnow`` are skipped, and nothing is checkpointed while
        :attr:`replaying` (a window's state may then be ahead of ``tnow``, and the log already
        holds records up to the recovered ``tc``). Idempotent at one ``tnow``.

        Raises:
            KeyError: a window that is not open.
        """
        if self._filter is not None or self._tnow is None:
            return []
        n, now, records = len(self._open), self._tnow, []
        for wid in list(windows):
            w = self._open[wid]
            if w.tau2 == now:
                continue
            records.append(Footprint(Kind.CHECK, wid, self._state(w), now, n, w.opened))
            w.tau2 = now
            self._open.move_to_end(wid)
        self.footprints += len(records)
        return records

    def background(self) -> list[Footprint]:
        """The background path: the scheduler's choice of Gchecks, oldest τ2 first, charged
        to its budget with the time they took by the clock. Called after every tuple, so a
        pass that finds nothing due and nothing affordable remembers until when that holds
        (the oldest footprint's due time — it only moves later — and the clock time the
        budget next grants a Gcheck) and the calls before then return at once."""
        t, s = self._tnow, self.scheduler
        if t is not None and t.ts < self._quiet_ts and s.now() < self._quiet_clock:
            return []  # what the checks below would answer, for one clock read
        if s is None or self._filter is not None or t is None or not self._open:
            return []
        oldest = next(iter(self._open.values())).tau2.ts
        if oldest >= t.ts:
            return []  # every footprint is current
        due = float("inf") if s.policy.max_extent is None else oldest + s.policy.max_extent
        if t.ts < due and s.allowance() < max(s.cost(), 1e-9):
            self._quiet_ts, self._quiet_clock = due, s.affordable_at()
            return []  # nothing due, nothing affordable: what choose() would answer, without the scan
        started = self._clock()
        chosen = self.scheduler.choose(((wid, w.tau2.ts) for wid, w in self._by_footprint()), self._tnow.ts)
        records = self.checkpoint(chosen)
        self.scheduler.charge(max(0.0, self._clock() - started), len(records))
        return records

    # -- recovery -----------------------------------------------------------------------
    def restore(self, ec: EventualCheckpoint) -> None:
        """Load the eventual checkpoint ``ec`` into this fresh operator: every window of the EC
        with its footprint's state, τ1 and τ2; ``tnow`` at ``T``. Feed it the input replayed
        from ``T`` (positions after ``T``): each window ignores what its footprint already holds
        (:class:`~epochal.eventual.recovery.ReplayFilter`) until the input passes ``tc``.

        Raises:
            ValueError: the operator has already processed input.
        """
        if self._open or self._tnow is not None:
            raise ValueError("EventualWindows.restore: only a fresh operator can be restored")
        if ec.tc is None:
            return  # an empty log: start from the beginning
        for fp in sorted(ec.footprints.values(), key=lambda f: f.t):
            key, start = fp.window
            acc, end = fp.state if self._session is not None else (fp.state, self.windows.end(start))
            self._insert(fp.window, _Window(key, start, end, acc, fp.opened, fp.t))
        self._tnow = ec.T
        self._filter = ReplayFilter(ec)
