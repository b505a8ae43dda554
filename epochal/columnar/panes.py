"""The pane arithmetic of columnar windows (:mod:`epochal.columnar.windows`) and their
``local=True`` step, :class:`PaneLocal`: one partial row per (key, pane) of a batch, computed
in the producer's task before the shuffle (Spark's partial aggregate).

The hidden columns both share: :data:`PANE`, a row's pane start (µs) while rows are buffered
and stored, and :data:`STAMP`, the newest event time per (key, pane) — the window TTL's
hidden aggregation, and the time a local partial row carries.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from epochal.columnar.partials import PartialPlan
from epochal.columnar.time import ColumnTime
from epochal.windows.assigners import PaneSpec

__all__ = ["PANE", "STAMP", "PaneLocal", "pane_of"]

PANE = "\x00pane"  # the pane-start column while rows are buffered and stored
STAMP = "\x00ttl"  # with a ttl: the hidden aggregation, newest event time per (key, pane)


def pane_of(us: int, p: PaneSpec) -> int:
    """The start of the pane holding time ``us`` (as ``us - (us - offset) % pane`` per row)."""
    return us - (us - p.offset) % p.pane


class PaneLocal:
    """``<name>.local`` of a window ``aggregate(..., local=True)`` (a ``map_batches``
    function, chained into the producer's task): a batch → one partial row per (key, pane)
    of its rows — the key, the event-time column holding the pane's newest time (same type),
    the aggregations' partial columns (:class:`~epochal.columnar.partials.PartialPlan`).

    Why the window's result and lateness do not change: every row of a pane belongs to the
    same windows (a pane is ``gcd(size, slide)`` long and windows start on its grid), so the
    newest time puts the partial row in that pane and its last window is its rows' last
    window; the window combines partials as it combines its own. Stateless: a batch's
    partials leave with it (nothing is held across a watermark or a barrier), so each
    epoch's rows reach the window in that epoch, as without it. A batch with a row without a
    usable timestamp raises, naming the column (the task fails, or with dead letters the
    batch goes there)."""

    def __init__(self, key: str, time: ColumnTime, panes: PaneSpec, aggregations: dict):
        self.key, self.time, self.panes = key, time, panes
        self.aggregations = dict(aggregations)
        self._plan: PartialPlan | None = None

    def __getstate__(self):
        return {"key": self.key, "time": self.time, "panes": self.panes, "aggregations": self.aggregations}

    def __setstate__(self, state):
        self.__dict__.update(state, _plan=None)

    def _plan_of(self) -> PartialPlan:
        if self._plan is None:
            from epochal.columnar.aggregates import max as amax

            self._plan = PartialPlan(self.key, dict(self.aggregations, **{STAMP: amax(self.time.column)}),
                                     groups=(PANE,))
        return self._plan

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        plan = self._plan_of()
        p = self.panes
        bounds = self.time.bounds(batch)  # every timestamp usable: one min_max pass
        if bounds is not None and pane_of(bounds[0], p) == pane_of(bounds[1], p):
            # the batch lies in one pane (batches of a time-ordered stream mostly do)
            pane = np.full(batch.num_rows, pane_of(bounds[0], p), np.int64)
        else:
            us, valid = self.time.micros(batch)
            if valid is not None and not valid.all():
                raise ValueError(f"event-time column {self.time.column!r} has no usable timestamp in row "
                                 f"{int((~valid).argmax())}")
            pane = us - (us - p.offset) % p.pane
        rows = batch.select(plan.inputs[:1] + plan.inputs[2:]).add_column(1, PANE, pa.array(pane, pa.int64()))
        table = plan.of_raw([rows])
        # keyed by its own event-time column: a partial row's newest time is its key (one column)
        stamp = [] if self.key == self.time.column else [table.column(STAMP)]
        names = list(dict.fromkeys([self.key, self.time.column])) + plan.partial_names[:-1]
        columns = [table.column(self.key)] + stamp + [table.column(n) for n in plan.partial_names[:-1]]
        return pa.RecordBatch.from_arrays([c.combine_chunks() for c in columns], names=names)

