"""Window assigners: which windows a timestamp belongs to. Pure arithmetic on µs.

Tumbling and sliding windows share one scheme, *panes* (slices): the time axis is cut into
panes of ``gcd(size, slide)``; a record is added to exactly one pane's accumulator, and a
window ``[start, start + size)`` is the combination of its ``size / pane`` panes when it
fires. So a record is never copied into every sliding window it belongs to — one
accumulator update per record, one combination per window firing. Tumbling windows are the
case ``slide == size`` (one pane per window). Session windows merge instead
(:mod:`epochal.windows.operator`).

    >>> s = Sliding("10s", "5s").spec()
    >>> [w / 1e6 for w in s.window_starts(12_000_000)]      # windows holding t = 12 s
    [10.0, 5.0]
    >>> s.pane_of(12_000_000) / 1e6, s.pane / 1e6
    (10.0, 5.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.time.units import duration_micros

__all__ = ["PaneSpec", "Session", "SessionSpec", "Sliding", "Tumbling"]


def _duration(value, what: str, *, positive: bool = True) -> int:
    try:
        return duration_micros(value, what, positive=positive)
    except ConfigError as exc:
        raise PipelineDefinitionError(str(exc)) from None


@dataclass(frozen=True)
class PaneSpec:
    """Windows of ``size`` every ``slide`` (µs), aligned to ``offset``, cut into panes."""

    size: int
    slide: int
    offset: int = 0
    processing_time: bool = False

    @property
    def pane(self) -> int:
        return math.gcd(self.size, self.slide)

    def pane_of(self, ts: int) -> int:
        """Start of the pane holding ``ts``."""
        return ts - (ts - self.offset) % self.pane

    def last_start(self, ts: int) -> int:
        """Start of the latest window holding ``ts``."""
        return ts - (ts - self.offset) % self.slide

    def first_start(self, ts: int) -> int:
        """Start of the earliest window holding ``ts``."""
        last = self.last_start(ts)
        return last - ((self.size - (ts - last) - 1) // self.slide) * self.slide

    def window_starts(self, ts: int) -> list[int]:
        """Starts of every window holding ``ts``, latest first."""
        return list(range(self.last_start(ts), self.first_start(ts) - 1, -self.slide))

    def panes(self, start: int) -> range:
        """Pane starts making up the window starting at ``start``."""
        return range(start, start + self.size, self.pane)

    def panes_sharing_cleanup(self, last_start: int) -> range:
        """Panes whose latest window starts at ``last_start`` (they expire together)."""
        return range(last_start, last_start + self.slide, self.pane)


@dataclass(frozen=True)
class SessionSpec:
    """Sessions closed by ``gap`` (µs) of inactivity, per key."""

    gap: int
    processing_time: bool = False


class Tumbling:
    """Fixed, non-overlapping windows ``[k·size + offset, (k+1)·size + offset)``.

    Args:
        size: a duration (seconds or ``"10s"``).
        offset: shifts the window boundaries (e.g. ``"15min"`` for hours starting at :15).
        processing_time: assign records by the wall clock when they are processed and fire
            by it — results then depend on when records arrive and are not reproducible
            (a restored job may put a record in another window); event time is the default.
    """

    def __init__(self, size, offset=0, *, processing_time: bool = False):
        self.size = _duration(size, "Tumbling: size")
        self.offset = _duration(offset, "Tumbling: offset", positive=False)
        if self.offset >= self.size:
            raise PipelineDefinitionError(f"Tumbling: offset ({offset!r}) must be smaller than the size ({size!r})")
        self.processing_time = bool(processing_time)

    def spec(self) -> PaneSpec:
        return PaneSpec(self.size, self.size, self.offset, self.processing_time)

    def __repr__(self):
        return f"Tumbling({self.size / 1e6:g}s)"


class Sliding:
    """Windows of ``size`` starting every ``slide`` (each record is in ``size / slide``
    windows when ``slide`` divides ``size``). ``offset`` and ``processing_time`` as for
    :class:`Tumbling`."""

    def __init__(self, size, slide, offset=0, *, processing_time: bool = False):
        self.size = _duration(size, "Sliding: size")
        self.slide = _duration(slide, "Sliding: slide")
        if self.slide > self.size:
            raise PipelineDefinitionError(
                f"Sliding: the slide ({slide!r}) is larger than the size ({size!r}): records between two windows "
                "would belong to none; use a slide <= size (or Tumbling when they are equal)")
        self.offset = _duration(offset, "Sliding: offset", positive=False)
        if self.offset >= self.slide:
            raise PipelineDefinitionError(f"Sliding: offset ({offset!r}) must be smaller than the slide ({slide!r})")
        self.processing_time = bool(processing_time)

    def spec(self) -> PaneSpec:
        return PaneSpec(self.size, self.slide, self.offset, self.processing_time)

    def __repr__(self):
        return f"Sliding({self.size / 1e6:g}s, {self.slide / 1e6:g}s)"


class Session:
    """Per-key sessions: a record at ``t`` opens ``[t, t + gap)``; windows that overlap or
    touch merge. Event time only."""

    processing_time = False

    def __init__(self, gap):
        self.gap = _duration(gap, "Session: gap")

    def spec(self) -> SessionSpec:
        return SessionSpec(self.gap)

    def __repr__(self):
        return f"Session({self.gap / 1e6:g}s)"
