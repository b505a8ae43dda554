"""The keyed window operators: windows are keyed state, firings are timers.

State of a key (all in the task's keyed backend, so it is snapshotted asynchronously,
restored by either backend and rescaled by key group like any keyed state):

* ``<op>/panes`` — map state: pane start (µs) → accumulator (:mod:`epochal.windows.assigners`);
  sessions: ``<op>/sessions`` — session start → ``(end, accumulator)``;
* timers (:mod:`epochal.time.timers`): ``$timers.fire`` at each window's ``end - 1 µs``,
  ``$timers.cleanup`` when its state may go (``end - 1 + allowed_lateness``);
* with ``ttl=``: the key's last activity and its expiry timer (:mod:`epochal.windows.ttl`:
  a key inactive for ttl loses its pending windows).

Event time, per record ``(ts, value)`` of key ``k`` and the operator's watermark ``wm``:

1. If every window holding ``ts`` expired (``end - 1 + allowed_lateness <= wm``), the record
   is *late*: it goes to the ``"late"`` side output unchanged (``WindowOutput.late()``) and
   touches no state.
2. Otherwise it is added to its pane (or merged into its session). A new pane registers
   the fire timers of its windows that have not fired and its cleanup timer.
3. Windows holding ``ts`` that already fired (``end - 1 <= wm``) but have not expired fire
   again at once with the record included (a late firing: an updated result).

When the watermark advances, fire timers ``<= wm`` emit their windows (in time order), then
cleanup timers ``<= wm`` delete the panes no unexpired window needs. Processing-time windows
do the same on the wall clock (no lateness; records are never late); the end of a bounded
input fires the ones still open.

Restores: timers and panes come back with the keyed state; the watermark is regenerated
(:mod:`epochal.time.watermarks`), and a window fires when it passes again — a firing whose
output belonged to an epoch that did not complete is repeated, one that completed is not
(its timer was deleted in that epoch's state): exactly once in the committed output.
"""
from __future__ import annotations

import copy

from epochal.operators.keyed import _KeyedOperator
from epochal.query.readers import register
from epochal.time.timers import make_queue
from epochal.time.units import MAX_TIME, MIN_TIME, now_micros
from epochal.windows.assigners import PaneSpec, SessionSpec
from epochal.windows.functions import Combiner, Window, WindowResult
from epochal.windows.ttl import window_ttl
from epochal.windows.queries import PaneWindowsReader, SessionWindowsReader

__all__ = ["PaneWindowOperator", "SessionWindowOperator", "create_window_operator"]

_MISSING = object()


class _WindowOperator(_KeyedOperator):
    """Shared by pane and session windows: timers, late records, emitting results.

    ``timed``: input records are ``(ts, value)``; ``timed_out``: results are too.
    """

    def __init__(self, ctx, key_fn, combiner: Combiner, lateness: int, processing_time: bool,
                 timed: bool, timed_out: bool, ttl=None):
        super().__init__(ctx, key_fn, timed)
        self.combiner = combiner
        self.lateness = lateness
        self.processing_time = processing_time
        self.timed_out = timed_out
        backend, name = ctx.keyed_backend, ctx.operator
        self.backend = backend
        self.fire_q = make_queue(backend, f"{name}/$timers.fire", ctx.key_groups)
        self.clean_q = make_queue(backend, f"{name}/$timers.cleanup", ctx.key_groups)
        self.watermark = MIN_TIME
        if not processing_time:
            self.side_output = {"late": []}
        self.ttl = window_ttl(ctx, self.current, ttl, lambda: self.watermark, timed, self._drop_key)

    # -- records -------------------------------------------------------------------------
    def process_batch(self, records: list) -> list:
        out: list = []
        cur = self.current
        record = None
        now = now_micros() if self.processing_time else None
        try:
            for record in records:
                if self.timed:
                    ts, value = record
                else:
                    ts, value = None, record
                if now is not None:
                    ts = now
                    self.watermark = max(self.watermark, now - 1)
                elif ts is None:
                    raise TypeError("the record has no event time (it was emitted by a processing-time timer); "
                                    "event-time windows need a timestamp on every record")
                self._set_key(value)
                self._add(cur.kg, cur.key, ts, value, record, out)
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out

    def _late(self, record) -> None:
        self.side_output["late"].append(record)

    # -- time ----------------------------------------------------------------------------
    def on_watermark(self, watermark: int) -> list:
        if self.processing_time:  # only the end of input: open processing-time windows fire
            return self._advance(MAX_TIME) if watermark >= MAX_TIME else []
        out = self._advance(watermark)
        if self.ttl is not None and self.ttl.event:
            self.ttl.advance(watermark)
        return out

    def next_processing_time(self) -> int | None:
        heads = [h[0] for h in (self.fire_q.peek(), self.clean_q.peek()) if h is not None] \
            if self.processing_time else []
        if self.ttl is not None and self.ttl.processing:
            heads += [t for t in (self.ttl.next_time(),) if t is not None]
        return min(heads) if heads else None

    def on_processing_time(self, now: int) -> list:
        out = self._advance(now) if self.processing_time else []
        if self.ttl is not None and self.ttl.processing:
            self.ttl.advance(now)
        return out

    def snapshot(self, epoch: int):
        """Writes the TTL record of the key groups (:mod:`epochal.ttl.registry`) when the
        operator has a ttl; the windows themselves are keyed state."""
        if self.ttl is not None:
            self.ttl.snapshot()
        return None

    def _live(self, kg, key, end: int) -> bool:
        """The window of ``key`` ending at ``end`` may fire: the key has not expired by
        then (:mod:`epochal.windows.ttl`); an expired key's contents are dropped here."""
        if self.ttl is None:
            return True
        on_timer_clock = self.processing_time or self.ttl.event  # else: wall ttl, event windows
        return self.ttl.live_at(kg, key, end - 1 if on_timer_clock else None)

    def _advance(self, watermark: int) -> list:
        self.watermark = max(self.watermark, watermark)
        out: list = []
        cur = self.current
        for ts, kg, key in self.fire_q.pop_due(watermark):
            cur.key, cur.kg = key, kg
            try:
                self._fire(kg, key, ts + 1, out)
            except Exception as exc:
                raise self.fail(f"window of key {key!r} ending at {(ts + 1) / 1e6}", exc) from exc
        for ts, kg, key in self.clean_q.pop_due(watermark):
            cur.key, cur.kg = key, kg
            self._cleanup(kg, key, ts + 1 - self.lateness)
        return out

    def _emit(self, out: list, key, start: int, end: int, acc) -> None:
        window = Window(start / 1e6, end / 1e6)
        for value in self.combiner.results(key, window, acc):
            result = WindowResult(key, window.start, window.end, value)
            out.append((end - 1, result) if self.timed_out else result)

    # -- for subclasses ------------------------------------------------------------------
    def _add(self, kg, key, ts, value, record, out) -> None:
        raise NotImplementedError

    def _fire(self, kg, key, end: int, out: list) -> None:
        raise NotImplementedError

    def _cleanup(self, kg, key, end: int) -> None:
        raise NotImplementedError

    def _drop_key(self, kg, key) -> None:
        """Delete every window of ``key`` and their timers (its ttl expired)."""
        raise NotImplementedError


class PaneWindowOperator(_WindowOperator):
    """Tumbling and sliding windows over panes (see :mod:`epochal.windows.assigners`)."""

    def __init__(self, ctx, key_fn, spec: PaneSpec, combiner, lateness, timed, timed_out, ttl=None, queryable=False):
        super().__init__(ctx, key_fn, combiner, lateness, spec.processing_time, timed, timed_out, ttl)
        self.spec = spec
        self.panes = f"{ctx.operator}/panes"
        if queryable:  # state "windows" (epochal.windows.queries)
            register(ctx.extras, f"{ctx.operator}/windows",
                     PaneWindowsReader(self.panes, spec, combiner, lateness, lambda: self.watermark))

    def _add(self, kg, key, ts, value, record, out) -> None:
        spec, wm, backend = self.spec, self.watermark, self.backend
        size, lateness = spec.size, self.lateness
        last = spec.last_start(ts)
        if last + size - 1 + lateness <= wm:  # every window holding ts expired
            self._late(record)
            return
        if self.ttl is not None:
            self.ttl.touch(kg, key, ts)
        pane = spec.pane_of(ts)
        acc = backend.map_get(self.panes, kg, key, pane, _MISSING)
        empty = acc is _MISSING
        backend.map_put(self.panes, kg, key, pane, self.combiner.add(None if empty else acc, value, empty))
        first = spec.first_start(ts)
        if empty:
            for start in range(last, first - 1, -spec.slide):
                if start + size - 1 > wm:
                    self.fire_q.add(kg, start + size - 1, key)
            self.clean_q.add(kg, last + size - 1 + lateness, key)
        if first + size - 1 <= wm:  # windows that fired already fire again, updated
            for start in range(first, last + 1, spec.slide):
                end = start + size
                if end - 1 <= wm < end - 1 + lateness:
                    self._fire(kg, key, end, out)

    def _fire(self, kg, key, end: int, out: list) -> None:
        if not self._live(kg, key, end):
            return
        start = end - self.spec.size
        acc, n = _MISSING, 0
        for pane in self.spec.panes(start):
            part = self.backend.map_get(self.panes, kg, key, pane, _MISSING)
            if part is _MISSING:
                continue
            n += 1
            if acc is _MISSING:
                acc = part
            else:
                if n == 2 and self.spec.pane != self.spec.size:
                    acc = copy.copy(acc)  # merge may modify its first argument: not the stored pane
                acc = self.combiner.merge(acc, part)
        if acc is not _MISSING:
            self._emit(out, key, start, end, acc)

    def _cleanup(self, kg, key, end: int) -> None:
        for pane in self.spec.panes_sharing_cleanup(end - self.spec.size):
            self.backend.map_delete(self.panes, kg, key, pane)

    def _drop_key(self, kg, key) -> None:
        spec, lateness = self.spec, self.lateness
        for pane, _acc in self.backend.map_items(self.panes, kg, key):
            last = spec.last_start(pane)
            for start in range(last, spec.first_start(pane) - 1, -spec.slide):
                self.fire_q.remove(kg, start + spec.size - 1, key)
            self.clean_q.remove(kg, last + spec.size - 1 + lateness, key)
        self.backend.map_clear(self.panes, kg, key)


class SessionWindowOperator(_WindowOperator):
    """Merging session windows of one ``gap`` (Flink's ``EventTimeSessionWindows``)."""

    def __init__(self, ctx, key_fn, spec: SessionSpec, combiner, lateness, timed, timed_out, ttl=None,
                 queryable=False):
        super().__init__(ctx, key_fn, combiner, lateness, False, timed, timed_out, ttl)
        self.gap = spec.gap
        self.sessions = f"{ctx.operator}/sessions"
        if queryable:  # state "windows" (epochal.windows.queries)
            register(ctx.extras, f"{ctx.operator}/windows",
                     SessionWindowsReader(self.sessions, combiner, lateness, lambda: self.watermark))

    def _add(self, kg, key, ts, value, record, out) -> None:
        backend, wm, lateness = self.backend, self.watermark, self.lateness
        if self.ttl is not None:
            self.ttl.live_at(kg, key, None)  # an expired key's old sessions go before merging
        start, end = ts, ts + self.gap
        merged = []
        for s, (e, acc) in sorted(backend.map_items(self.sessions, kg, key)):
            if s <= end and e >= start:  # overlapping or touching sessions merge
                merged.append((s, e, acc))
                start, end = min(start, s), max(end, e)
        if end - 1 + lateness <= wm:  # the session it would join (or open) expired
            self._late(record)
            return
        if self.ttl is not None:
            self.ttl.touch(kg, key, ts)
        combiner, acc = self.combiner, _MISSING
        for s, e, part in merged:
            acc = part if acc is _MISSING else combiner.merge(acc, part)
            backend.map_delete(self.sessions, kg, key, s)
            self.fire_q.remove(kg, e - 1, key)
            self.clean_q.remove(kg, e - 1 + lateness, key)
        empty = acc is _MISSING
        acc = combiner.add(None if empty else acc, value, empty)
        backend.map_put(self.sessions, kg, key, start, (end, acc))
        self.clean_q.add(kg, end - 1 + lateness, key)
        if end - 1 > wm:
            self.fire_q.add(kg, end - 1, key)
        else:  # a late record extended a session that fired: fire it again, updated
            self._emit(out, key, start, end, acc)

    def _fire(self, kg, key, end: int, out: list) -> None:
        if not self._live(kg, key, end):
            return
        for s, (e, acc) in self.backend.map_items(self.sessions, kg, key):
            if e == end:
                self._emit(out, key, s, e, acc)

    def _cleanup(self, kg, key, end: int) -> None:
        for s, (e, _acc) in self.backend.map_items(self.sessions, kg, key):
            if e == end:
                self.backend.map_delete(self.sessions, kg, key, s)

    def _drop_key(self, kg, key) -> None:
        for _s, (e, _acc) in self.backend.map_items(self.sessions, kg, key):
            self.fire_q.remove(kg, e - 1, key)
            self.clean_q.remove(kg, e - 1 + self.lateness, key)
        self.backend.map_clear(self.sessions, kg, key)


def create_window_operator(ctx, node) -> _WindowOperator:
    """The runtime operator of a ``WINDOW`` node (payload: :class:`~epochal.windows.api.WindowNode`)."""
    w = node.payload
    cls = SessionWindowOperator if isinstance(w.spec, SessionSpec) else PaneWindowOperator
    return cls(ctx, node.key_fn, w.spec, w.combiner, w.lateness, node.timed_in, node.timed, w.ttl,
               getattr(w, "queryable", False))
