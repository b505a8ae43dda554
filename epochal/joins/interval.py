"""Event-time interval join of one key, pure: rows in, joined rows out. Times are µs.

A left row ``l`` and a right row ``r`` match when ``l.t + lower <= r.t <= l.t + upper``.
The operator (:class:`~epochal.joins.functions.IntervalJoinFunction`) keeps both sides'
rows of a key in ``buffers = [left rows, right rows]``, each row ``[t, value, matched]``,
and calls, with ``wm`` its watermark (rows with ``t <= wm`` are late and never get here):

1. :func:`add` for every on-time row: it is matched against the other side's buffer and
   kept, because later rows of the other side may match it too;
2. :func:`expire` when the watermark reaches a row's :func:`expiry`: no row of the other
   side still to come can match it (an on-time row has ``t > wm``). It is dropped; if it
   never matched and its side is outer, it comes out with ``None`` for the other side —
   the watermark decided it has no match, as in Spark's outer stream-stream joins.

Output rows are ``(t, left, right)``: a pair at the later of its two times, an unmatched
row at its expiry (never before its own time), so an output is never behind the watermark
that the operator forwards after it.

    >>> spec = IntervalSpec(lower=-5, upper=5, outer_left=True, outer_right=False)
    >>> buffers = [[], []]
    >>> add(spec, buffers, LEFT, 10, "l1"), add(spec, buffers, RIGHT, 13, "r1")
    ([], [(13, 'l1', 'r1')])
    >>> add(spec, buffers, LEFT, 30, "l2"), expire(spec, buffers, 40)
    ([], [(35, 'l2', None)])
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEFT", "RIGHT", "IntervalSpec", "add", "expire", "expiry"]

LEFT, RIGHT = 0, 1


@dataclass(frozen=True)
class IntervalSpec:
    lower: int
    upper: int
    outer_left: bool = False
    outer_right: bool = False

    def outer(self, side: int) -> bool:
        return self.outer_right if side else self.outer_left


def expiry(spec: IntervalSpec, side: int, t: int) -> int:
    """The watermark from which no on-time row of the other side can match a ``side`` row
    at ``t``: a right row ``r`` matches ``l`` only if ``r.t <= l.t + upper``, a left row
    ``l`` matches ``r`` only if ``l.t <= r.t - lower``."""
    return t + spec.upper if side == LEFT else t - spec.lower


def add(spec: IntervalSpec, buffers: list, side: int, t: int, value) -> list:
    """Match a new row against the other side's buffer, keep it; returns the pairs."""
    out = []
    lower, upper = spec.lower, spec.upper
    matched = False
    for row in buffers[1 - side]:
        ot = row[0]
        lt, rt = (t, ot) if side == LEFT else (ot, t)
        if lt + lower <= rt <= lt + upper:
            matched = row[2] = True
            pair = (value, row[1]) if side == LEFT else (row[1], value)
            out.append((max(lt, rt), *pair))
    buffers[side].append([t, value, matched])
    return out


def expire(spec: IntervalSpec, buffers: list, wm: int) -> list:
    """Drop the rows whose :func:`expiry` is ``<= wm``; returns the outer sides' unmatched
    ones as ``(t, left, None)`` / ``(t, None, right)``."""
    out = []
    for side in (LEFT, RIGHT):
        rows = buffers[side]
        if not rows:
            continue
        keep = []
        outer = spec.outer(side)
        for row in rows:
            due = expiry(spec, side, row[0])
            if due > wm:
                keep.append(row)
            elif outer and not row[2]:
                out.append((max(row[0], due), row[1], None) if side == LEFT else (max(row[0], due), None, row[1]))
        buffers[side] = keep
    return out
