"""Processing-time windows on streams of Arrow batches: ``key_by("k").window(Tumbling("10s",
processing_time=True)).aggregate("w", n=count())`` — the record path's processing-time pane
windows (:class:`epochal.windows.operator.PaneWindowOperator` with ``processing_time``),
vectorized like the event-time ones (:mod:`epochal.columnar.windows`, whose state, panes and
firing this reuses).

Contract (the record path's): the rows of one ``process_batch`` call are assigned by the
wall clock read once for the call (µs) — every row of it lies in the same pane — and a
window fires when the wall clock passes its ``end - 1``, at a processing-time timer
(:meth:`ColumnProcessingWindowOperator.next_processing_time`, then
:meth:`~ColumnProcessingWindowOperator.on_processing_time`); no row is ever late (no
``.late()``, no ``allowed_lateness``, both refused when the graph is built, as on the record
path); the end of a bounded input (the ``MAX_TIME`` watermark) fires every open window.
Event-time watermarks are otherwise ignored. Results depend on when rows arrive, so a
restored job may put a replayed row in another window than the first attempt did; what is
exact is that a window whose firing belonged to a completed epoch never fires again: each
key group's ``"<op>/fired"`` says up to which wall-clock time its windows fired, and a
restored operator fires at once, at its first timer, every window that ended while the job
was down. A clock reading behind the last firing (the wall clock stepped back) counts as
just after it, so a row never lands in a window that fired.

The clock is :attr:`ColumnProcessingWindowOperator.clock` (``now_micros``), which tests
replace. Timers: :meth:`next_processing_time` is the first window end of the slide grid
after the last firing while any pane is stored or buffered (a firing with nothing due fires
nothing), so the runtime wakes the operator at most once per slide.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from epochal.columnar.panes import PANE
from epochal.columnar.windows import ColumnWindowOperator
from epochal.time.units import MAX_TIME, MIN_TIME, now_micros

__all__ = ["ColumnProcessingWindowOperator"]


class ColumnProcessingWindowOperator(ColumnWindowOperator):
    """Tumbling and sliding processing-time windows over Arrow batches (module docstring)."""

    def __init__(self, ctx, spec):
        super().__init__(ctx, spec)
        #: the wall clock (µs): the record path's ``now_micros``, replaceable in tests
        self.clock = now_micros
        #: no window holding a stored or buffered pane ends (``end - 1``) before this
        self._due = MAX_TIME

    def restore(self, state) -> None:
        super().restore(state)
        if self.blocks:  # windows that ended while the job was down fire at the first timer
            self._due = MIN_TIME

    def process_batch(self, records: list) -> list:
        now = max(self.clock(), self.watermark + 1)  # never into a window that fired
        pane = now - (now - self.offset) % self.pane
        added = False
        for batch in records:
            if not batch.num_rows:
                continue
            try:
                column = pa.array(np.full(batch.num_rows, pane, np.int64))
                self.buffer.add(batch.select(self.columns).add_column(1, PANE, column))
                added = True
            except Exception as exc:
                self.reject(f"<RecordBatch of {batch.num_rows} rows, columns {batch.schema.names}>", exc)
                continue
            if self.buffer.must_merge():
                self._merge()
            self.buffer.reject_failures(self)
        if added:  # the earliest window holding ``now`` ends first
            last = now - (now - self.offset) % self.slide
            first = last - ((self.size - (now - last) - 1) // self.slide) * self.slide
            self._due = min(self._due, first + self.size - 1)
        return []

    def next_processing_time(self) -> int | None:
        return None if self._due == MAX_TIME else self._due

    def on_processing_time(self, now: int) -> list:
        if now < self._due:
            return []
        return self._fire_until(max(now, self.watermark))

    def on_watermark(self, watermark: int) -> list:
        """Only the end of input: every open window fires."""
        return self._fire_until(MAX_TIME) if watermark >= MAX_TIME else []

    def _fire_until(self, t: int) -> list:
        previous = self.watermark
        self._merge()
        self.watermark = t
        out = self._fire(previous, t, t)
        if not self.blocks or t >= MAX_TIME:
            self._due = MAX_TIME
        else:  # the next window end of the slide grid after t
            self._due = (self._ends_before(t) + 1) * self.slide + self.offset + self.size - 1
        return out
