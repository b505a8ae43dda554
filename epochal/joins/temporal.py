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

**TTL** (``temporal_join(..., ttl=...)``): a key's table expires after ``ttl`` of inactivity —
no new version of the key for that long:

* event time (``ttl_us`` given to :func:`emit`): a probe at ``t`` sees the version current
  at ``t`` only if ``version t + ttl > t`` (the table as at ``t``: its newest activity before
  ``t`` is that version), and once the watermark reaches the current version's ``t + ttl``
  it is dropped (the operator has a timer there). So the outcome does not depend on the
  watermark's cadence.
* processing time: ``state[2]`` holds the wall clock (µs) of the newest version's arrival
  (:func:`touch`); :func:`expire_table` drops every version once ``state[2] + ttl <= now``
  (at a processing-time timer, and before each :func:`emit`).

    >>> state = [[], []]
    >>> add_version(state, 5, "v1"); add_probe(state, 7, "p1"); add_version(state, 9, "v2")
    >>> emit(state, 8, outer=False)
    [(7, 'p1', 'v1')]
"""
from __future__ import annotations

import bisect

__all__ = ["DELETED", "add_probe", "add_version", "emit", "expire_table", "touch"]

#: the row of a version that deletes the key
DELETED = None


def add_probe(state: list, t: int, value) -> None:
    state[0].append([t, value])


def add_version(state: list, t: int, row) -> None:
    versions = state[1]
    i = bisect.bisect_right([v[0] for v in versions], t)
    versions.insert(i, [t, row])


def touch(state: list, now: int) -> None:
    """Processing-time TTL: a version arrived at wall clock ``now`` (µs)."""
    if len(state) < 3:
        state.append(now)
    else:
        state[2] = now


def expire_table(state: list, ttl: int, now: int) -> bool:
    """Processing-time TTL: drop every version when the newest arrived ``ttl`` or more
    before ``now`` (µs); whether it did."""
    if len(state) > 2 and state[2] is not None and state[2] + ttl <= now:
        state[1] = []
        state[2] = None
        return True
    return False


def emit(state: list, wm: int, *, outer: bool, ttl_us: int | None = None) -> list:
    """``(t, probe, row)`` of every pending probe at ``t <= wm``, in time order; prunes.
    ``ttl_us``: event-time TTL (a version older than ``ttl_us`` at the probe's time is not
    seen, and the current one at ``wm`` is dropped once it expired)."""
    probes, versions = state[0], state[1]
    ready = sorted((p for p in probes if p[0] <= wm), key=lambda p: p[0])
    if not ready and len(versions) < 2 and (ttl_us is None or not versions):
        return []
    times = [v[0] for v in versions]
    out = []
    for t, value in ready:
        i = bisect.bisect_right(times, t) - 1
        row = versions[i][1] if i >= 0 and (ttl_us is None or times[i] + ttl_us > t) else DELETED
        if row is not DELETED or outer:
            out.append((t, value, row))
    state[0] = [p for p in probes if p[0] > wm]
    current = bisect.bisect_right(times, wm) - 1
    if ttl_us is not None and current >= 0 and times[current] + ttl_us <= wm:
        state[1] = versions[current + 1:]  # expired: no probe still to come (t > wm) sees it
    elif current > 0:
        state[1] = versions[current:]
    return out
