"""The vectorized event-time session window join of Arrow batches:
``a.key_by("k").window_join(b.key_by("k"), Session("30s"), how=...).apply(name)`` when both
inputs carry batches and event time in a column.

Semantics are the record path's (:mod:`epochal.joins.windowed`, sessions merged across both
sides): a row at ``t`` spans ``[t, t + gap)``; rows of one key, of either side, whose spans
overlap are one session ``[first t, last t + gap)``. When the watermark reaches a session's
``end - 1`` its left × right pairs come out, and for an outer side the session's rows
without a partner with nulls for the other side; its rows are dropped. A row still to come
(on time: ``t`` after the watermark, so at or after the fired session's end) cannot overlap
a fired session, and cannot bridge it to a later one, so a fired session is final.

What is vectorized is how sessions form: both sides' buffered rows are sorted once by
(key, time) and cut where the key changes or two neighbours are ``gap`` or more apart
(:func:`sessions`) — a session's rows sorted by time overlap exactly when each is less than
``gap`` after the one before; the due sessions' rows of both sides are then joined on their
session in one Arrow join (inner, left/right/full outer). This costs O(n log n) for the
buffered rows only when the watermark reaches the earliest a buffered session can end (the
exact ``end - 1`` of the sessions left after a firing, and ``t + gap - 1`` of a row added
since), so most watermarks cost nothing. A null key matches nothing: each such row is a
session of its own (an outer side's comes out alone).

The operator is :class:`~epochal.columnar.joins.ColumnJoinOperator` with its buffers,
incremental segment snapshots, floors and late rows; the output is the window join's — the
left columns, then the right ones without the key column, and ``window_start`` /
``window_end`` (the session's, ``timestamp[us, UTC]``).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from epochal.columnar.joins import _UTC, ARROW_HOW, T, ColumnJoinOperator, _column
from epochal.columnar.matching import key_codes

__all__ = ["ColumnSessionJoinOperator", "sessions"]

_NEVER = np.iinfo(np.int64).max


def sessions(codes: np.ndarray, t: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(session of each row, session starts, session ends)`` of rows with key codes
    ``codes`` at times ``t``: a row belongs to the session of the row of its key just before
    it in time if less than ``gap`` after it. Sessions are numbered by (key, start). Pure."""
    n = len(t)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    s = np.lexsort((t, codes))
    cs, ts = codes[s], t[s]
    new = np.ones(n, bool)
    new[1:] = (cs[1:] != cs[:-1]) | (ts[1:] - ts[:-1] >= gap)
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, n - 1)
    of = np.empty(n, np.int64)
    of[s] = np.cumsum(new) - 1
    return of, ts[first], ts[last] + gap


class ColumnSessionJoinOperator(ColumnJoinOperator):
    """The session window join of Arrow batches (module docstring)."""

    def on_watermark(self, watermark: int) -> list:
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        if watermark < min(self.due) or self._held(0, watermark) or self._held(1, watermark):
            return []
        return self._fire(watermark)

    def _fire(self, wm: int) -> list:
        spec = self.spec
        assert spec.gap is not None
        present = [(side, b) for side, b in enumerate(self.buffers) if b is not None and b.num_rows]
        if not present:
            return []
        sizes = [b.num_rows if b is not None else 0 for b in self.buffers]
        codes = np.concatenate(key_codes(*(_column(b, spec.keys[side]) for side, b in present)))
        t = np.concatenate([_column(b, T).to_numpy() for _, b in present])
        of, starts, ends = sessions(codes, t, spec.gap)
        fired = ends - 1 <= wm
        later = ends[~fired]
        if not fired.any():
            self.due = [int(later.min()) - 1] * 2
            return []
        due_rows: list[pa.Table | None] = [None, None]
        ids: list[np.ndarray] = [np.zeros(0, np.int64), np.zeros(0, np.int64)]
        offset = 0
        for side, buffer in enumerate(self.buffers):
            if not sizes[side]:
                continue
            assert buffer is not None
            mine = of[offset:offset + sizes[side]]
            offset += sizes[side]
            gone = fired[mine]
            if gone.any():
                due_rows[side] = buffer.filter(pa.array(gone))
                ids[side] = mine[gone]
                self._drop(side, buffer, gone, np.full(len(gone), _NEVER))
        self.due = [int(later.min()) - 1 if len(later) else _NEVER] * 2
        return self._join(due_rows, ids, starts, ends)

    def _join(self, rows: list, ids: list, starts: np.ndarray, ends: np.ndarray) -> list:
        """The fired sessions' output: their rows of both sides joined on the session."""
        how = ARROW_HOW[self.spec.outer]
        a = pa.table({"s": pa.array(ids[0], pa.int64()), "i0": pa.array(np.arange(len(ids[0])), pa.int64())})
        b = pa.table({"s": pa.array(ids[1], pa.int64()), "i1": pa.array(np.arange(len(ids[1])), pa.int64())})
        j = a.join(b, ["s"], join_type=how)
        if not j.num_rows:
            return []
        session = _column(j, "s").to_numpy()
        batch = self._assemble(rows, (_column(j, "i0"), _column(j, "i1")))
        batch = batch.append_column("window_start", pa.array(starts[session], pa.int64()).cast(_UTC))
        return [batch.append_column("window_end", pa.array(ends[session], pa.int64()).cast(_UTC))]
