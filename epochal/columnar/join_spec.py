"""What a columnar join node carries (its payload): which join, on which columns, with
which bounds or windows — read by :class:`~epochal.columnar.joins.ColumnJoinOperator` and
its temporal variant (:mod:`epochal.columnar.temporal_join`), built by
:mod:`epochal.columnar.join_build`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from epochal.windows.assigners import PaneSpec

__all__ = ["ColumnJoinSpec"]


@dataclass(frozen=True)
class ColumnJoinSpec:
    """The payload of a columnar join node (a ``KEYED_CO_PROCESS`` node carrying batches):
    an interval join (``lower`` / ``upper``), a window join (``panes``: tumbling or sliding;
    ``gap``: session windows, :mod:`epochal.columnar.session_join`) or a temporal join
    (``temporal``; side 0 the probes, side 1 the table's versions, ``deleted`` the boolean
    column of a version that marks the key deleted)."""

    keys: tuple  # (left key column, right key column)
    times: tuple  # (left ColumnTime, right ColumnTime)
    outer: tuple  # (outer left?, outer right?)
    lower: int = 0  # interval join bounds (µs)
    upper: int = 0
    panes: PaneSpec | None = None  # window join
    right_suffix: str = "_right"
    temporal: bool = False
    deleted: str | None = None
    gap: int | None = None  # session window join (µs)

    @property
    def windowed(self) -> bool:
        return self.panes is not None

    @property
    def windows(self) -> PaneSpec:
        """The window join's windows (an interval join has none)."""
        if self.panes is None:
            raise ValueError("an interval join has no windows")
        return self.panes

    @property
    def tracks_matched(self) -> tuple:
        """Per side, whether a buffered row carries whether it matched (an outer side of an
        interval join: it comes out alone at its expiry only if it never did)."""
        return self.outer if self.interval else (False, False)

    @property
    def interval(self) -> bool:
        return not (self.windowed or self.temporal or self.gap is not None)

    def expiry(self, side: int, t: np.ndarray) -> np.ndarray:
        """The watermark from which a ``side`` row at ``t`` can meet no further row
        (:func:`epochal.joins.interval.expiry`; a window row: its window's ``end - 1``; a
        temporal join's probe: its own time — a version is dropped only when superseded; a
        session row: the earliest its session can end, ``t + gap - 1``)."""
        if self.windowed:
            return t + (self.windows.size - 1)  # t is the window start here
        if self.temporal:
            return t
        if self.gap is not None:
            return t + (self.gap - 1)
        return t + self.upper if side == 0 else t - self.lower
