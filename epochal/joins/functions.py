"""The joins as keyed two-input functions (:class:`~epochal.coprocess.KeyedCoProcessFunction`)
over the pure per-key logic of :mod:`~epochal.joins.interval`, :mod:`~epochal.joins.windowed`
and :mod:`~epochal.joins.temporal`.

Each keeps one keyed value per key (its buffers; checkpointed, restored and rescaled by key
group like any keyed state) and event-time timers at the times the watermark decides
something: a row expires, a window fires, probes are due — at the operator's watermark
(the minimum over both inputs). A row at or behind the event time of *its own input*
(:attr:`~epochal.coprocess.CoContext.input_watermark_us`, never behind the combined one)
is late: it goes to the ``"late"`` side output as ``("left" | "right", value)`` and takes
no part in the join. That is safe because the combined watermark never passes either
input's: whatever a late-free row could still meet is still buffered (an interval row
expires only once the combined watermark passes its expiry; a window fires at ``end - 1``,
after each of its rows' times; probes wait for the combined watermark). And it makes
lateness depend on one input's channels only, not on how the two inputs interleave. State
of a key is cleared when its buffers are empty.

Outputs are ``fn(left, right)`` (``(left, right)`` by default; ``None`` for the missing
side of an outer row) at the times the pure modules give them.
"""
from __future__ import annotations

from typing import Callable

from epochal.coprocess.functions import KeyedCoProcessFunction
from epochal.joins import interval, temporal, windowed
from epochal.time.units import now_micros

__all__ = ["IntervalJoinFunction", "TemporalJoinFunction", "WindowJoinFunction", "pair"]

_SIDE = ("left", "right")


def pair(left, right) -> tuple:
    """The default join output: ``(left, right)``."""
    return (left, right)


class _JoinFunction(KeyedCoProcessFunction):
    side_outputs = ("late",)
    stamps_output = True

    def __init__(self, fn: Callable = pair):
        self.fn = fn

    def open(self, ctx) -> None:
        self.ctx = ctx
        self.state = ctx.value_state("rows")

    def _on_time(self, side: int, value) -> bool:
        ctx = self.ctx
        if ctx.timestamp_us <= ctx.input_watermark_us:
            ctx.output("late", (_SIDE[side], value))
            return False
        return True

    def _timer(self, t_us: int) -> None:
        self.ctx.timers.register_event_time(t_us / 1_000_000)

    def _out(self, rows: list) -> list:
        fn = self.fn
        return [(t, fn(left, right)) for t, left, right in rows]

    def process1(self, key, value):
        return self._add(0, value) if self._on_time(0, value) else None

    def process2(self, key, value):
        return self._add(1, value) if self._on_time(1, value) else None

    def _save(self, held, empty: bool) -> None:
        if empty:
            self.state.clear()
        else:
            self.state.update(held)


class IntervalJoinFunction(_JoinFunction):
    """:mod:`epochal.joins.interval` with ``spec``."""

    def __init__(self, spec: interval.IntervalSpec, fn: Callable = pair):
        super().__init__(fn)
        self.spec = spec

    def _add(self, side: int, value):
        buffers = self.state.value() or [[], []]
        t = self.ctx.timestamp_us
        out = interval.add(self.spec, buffers, side, t, value)
        self.state.update(buffers)
        self._timer(interval.expiry(self.spec, side, t))
        return self._out(out)

    def on_timer(self, key, timestamp, domain):
        buffers = self.state.value()
        if buffers is None:
            return None
        out = interval.expire(self.spec, buffers, self.ctx.timestamp_us)
        self._save(buffers, not buffers[0] and not buffers[1])
        return self._out(out)


class WindowJoinFunction(_JoinFunction):
    """:mod:`epochal.joins.windowed` with ``spec`` (a ``PaneSpec`` or ``SessionSpec``)."""

    def __init__(self, spec, outer_left: bool, outer_right: bool, fn: Callable = pair):
        super().__init__(fn)
        self.spec, self.outer_left, self.outer_right = spec, outer_left, outer_right

    def _add(self, side: int, value):
        windows = self.state.value() or {}
        for end in windowed.add(self.spec, windows, side, self.ctx.timestamp_us, value):
            self._timer(end - 1)
        self.state.update(windows)
        return None

    def on_timer(self, key, timestamp, domain):
        windows = self.state.value()
        if not windows:
            return None
        out = []
        for start in windowed.due(windows, self.ctx.timestamp_us):
            out += windowed.fire(windows, start, outer_left=self.outer_left, outer_right=self.outer_right)
        self._save(windows, not windows)
        return self._out(out)


class TemporalJoinFunction(_JoinFunction):
    """:mod:`epochal.joins.temporal`: input 1 probes, input 2 the changelog's versions
    (``is_delete(row)`` true: the key was deleted).

    ``ttl``: ``(time, ttl_us)`` — a key's table expires after ``ttl_us`` without a new
    version (:mod:`epochal.joins.temporal`, "TTL"): in event time a timer at the newest
    version's ``t + ttl`` drops it; in processing time each version stamps the key's state
    with the wall clock and a processing-time timer ``ttl`` later drops the table if no
    version came since. Either way the key's state goes once no probe is pending."""

    def __init__(self, outer: bool, is_delete: Callable | None = None, fn: Callable = pair,
                 ttl: tuple | None = None):
        super().__init__(fn)
        self.outer, self.is_delete = outer, is_delete
        self.ttl = ttl

    def open(self, ctx) -> None:
        super().open(ctx)
        time, ttl_us = self.ttl or (None, None)
        self._event_ttl = ttl_us if time == "event" else None
        self._wall_ttl = ttl_us if time == "processing" else None
        self._wall = now_micros  # looked up here: a test may substitute the clock
        # the reader judges the versions' arrival stamp (event-time expiry runs before any cut)
        ctx.record_table_ttl("rows", tuple(self.ttl) + ("write",) if time == "processing" else None)

    def _add(self, side: int, value):
        state = self.state.value() or [[], []]
        t = self.ctx.timestamp_us
        if side == 0:
            temporal.add_probe(state, t, value)
        else:
            deleted = self.is_delete is not None and self.is_delete(value)
            temporal.add_version(state, t, temporal.DELETED if deleted else value)
            if self._event_ttl is not None:
                self._timer(t + self._event_ttl)
            elif self._wall_ttl is not None:
                now = self._wall()
                temporal.touch(state, now)
                self.ctx.timers.register_processing_time((now + self._wall_ttl) / 1_000_000)
        self.state.update(state)
        self._timer(t)
        return None

    def on_timer(self, key, timestamp, domain):
        state = self.state.value()
        if state is None:
            return None
        if self._wall_ttl is not None:
            now = self._wall()
            if state[1] and (len(state) < 3 or state[2] is None):  # restored before the ttl existed:
                temporal.touch(state, now)  # its versions live one ttl from now (as ttl added to state)
                self.ctx.timers.register_processing_time((now + self._wall_ttl) / 1_000_000)
            temporal.expire_table(state, self._wall_ttl, now)
        out = [] if domain != "event" else temporal.emit(state, self.ctx.timestamp_us, outer=self.outer,
                                                         ttl_us=self._event_ttl)
        versions = state[1]
        gone = not state[0] and (not versions or (len(versions) == 1 and versions[0][1] is temporal.DELETED))
        self._save(state, gone)
        return self._out(out)
