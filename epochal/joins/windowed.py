"""Event-time window join of one key, pure: rows in, joined rows out. Times are µs.

Rows of both sides with the same key that fall into the same window pair up when the
window fires (Flink's window join); tumbling and sliding windows (:class:`PaneSpec`) and
session windows (:class:`SessionSpec`, merged across both sides). ``windows`` maps a
window start to ``[end, left values, right values]``. Rows at or behind the operator's
watermark are late and never get here, so no window a row belongs to has fired (each ends
after the row's time):

1. :func:`add` puts a row into every window holding it (merging sessions) and returns the
   ends of the windows created or grown, for their timers;
2. :func:`fire` when the watermark reaches ``end - 1``: every left × right pair of the
   window at ``end - 1``, and for outer sides the window's rows without partner.

    >>> from epochal.windows.assigners import PaneSpec
    >>> spec, windows = PaneSpec(10, 10), {}
    >>> add(spec, windows, LEFT, 3, "l"), add(spec, windows, RIGHT, 7, "r")
    ([10], [])
    >>> fire(windows, 0, outer_left=False, outer_right=False)
    [(9, 'l', 'r')]
"""
from __future__ import annotations

from epochal.joins.interval import LEFT, RIGHT
from epochal.windows.assigners import PaneSpec, SessionSpec

__all__ = ["LEFT", "RIGHT", "add", "fire"]


def add(spec, windows: dict, side: int, t: int, value) -> list:
    """Add an on-time row to its windows; the ends of the windows created (or, for
    sessions, the merged one), which need a timer at ``end - 1``."""
    if isinstance(spec, SessionSpec):
        return _add_session(spec, windows, side, t, value)
    new = []
    for start in spec.window_starts(t):
        w = windows.get(start)
        if w is None:
            end = start + spec.size
            w = windows[start] = [end, [], []]
            new.append(end)
        w[1 + side].append(value)
    return new


def _add_session(spec: SessionSpec, windows: dict, side: int, t: int, value) -> list:
    """Sessions ``[first t, last t + gap)``: a row overlapping others merges them."""
    start, end = t, t + spec.gap
    merged = [s for s, w in windows.items() if s < end and start < w[0]]
    rows = [[], []]
    for s in merged:
        w = windows.pop(s)
        start, end = min(start, s), max(end, w[0])
        rows[0] += w[1]
        rows[1] += w[2]
    rows[side].append(value)
    windows[start] = [end, *rows]
    return [end]  # the timers of the sessions merged into it stay; they find nothing due


def fire(windows: dict, start: int, *, outer_left: bool, outer_right: bool) -> list:
    """The pairs of the window starting at ``start`` (removed), at time ``end - 1``."""
    end, lefts, rights = windows.pop(start)
    t = end - 1
    out = [(t, left, right) for left in lefts for right in rights]
    if outer_left and not rights:
        out += [(t, left, None) for left in lefts]
    if outer_right and not lefts:
        out += [(t, None, right) for right in rights]
    return out


def due(windows: dict, wm: int) -> list:
    """Starts of the windows that fire at watermark ``wm`` (``end - 1 <= wm``), in time order."""
    return sorted(s for s, w in windows.items() if w[0] - 1 <= wm)


__all__ += ["due", "PaneSpec", "SessionSpec"]
