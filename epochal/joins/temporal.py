"""Event-time temporal join of one key, pure: each probe row meets the version of a
changelog (a table's rows keyed like the probes) that was current at the probe's time.
Times are µs.

``state = [probes, versions]``: pending probe rows ``[t, value]`` and the table's versions
``[t, row]`` in time order (``row`` :data:`DELETED` for a deletion). With ``wm`` the
operator's watermark (late rows, ``t <= wm``, never get here):

1. :func:`add_probe` / :func:`add_version` keep an on-time row;
2. :func:`emit` when the watermark passes: every probe with ``t <= wm`` comes out with the
   latest version at or before ``t`` (a version at the probe's own time counts; of two
   versions at one time the one added later wins) — every such version has arrived,
   because a version still to come has ``t > wm``. No version, or a deletion: the probe
   comes out with ``None`` if the join is outer, else not at all. Versions older than the
   newest one at or before ``wm`` are dropped: no probe still to come can see them.

    >>> state = [[], []]
    >>> add_version(state, 5, "v1"); add_probe(state, 7, "p1"); add_version(state, 9, "v2")
    >>> emit(state, 8, outer=False)
    [(7, 'p1', 'v1')]
"""
from __future__ import annotations

import bisect

__all__ = ["DELETED", "add_probe", "add_version", "emit"]

#: the row of a version that deletes the key
DELETED = None


def add_probe(state: list, t: int, value) -> None:
    state[0].append([t, value])


def add_version(state: list, t: int, row) -> None:
    versions = state[1]
    i = bisect.bisect_right([v[0] for v in versions], t)
    versions.insert(i, [t, row])


def emit(state: list, wm: int, *, outer: bool) -> list:
    """``(t, probe, row)`` of every pending probe at ``t <= wm``, in time order; prunes."""
    probes, versions = state
    ready = sorted((p for p in probes if p[0] <= wm), key=lambda p: p[0])
    if not ready and len(versions) < 2:
        return []
    times = [v[0] for v in versions]
    out = []
    for t, value in ready:
        i = bisect.bisect_right(times, t) - 1
        row = versions[i][1] if i >= 0 else DELETED
        if row is not DELETED or outer:
            out.append((t, value, row))
    state[0] = [p for p in probes if p[0] > wm]
    current = bisect.bisect_right(times, wm) - 1
    if current > 0:
        state[1] = versions[current:]
    return out
