"""Deleting expired entries nobody reads: an incremental sweep in bounded steps.

A read deletes the expired entry it meets; keys that are never read again (an unbounded
key space: one session, device or user per key) would stay forever. The sweep visits one
*(state, key group)* position per visit, round robin over every TTL state of the operator
and every key group the task owns, and deletes what expired there (Flink's incremental
cleanup, at key-group granularity). The operator calls :meth:`Sweeper.step` after every
batch with a budget proportional to the batch (:data:`ENTRIES_PER_RECORD` entries looked
at per record processed), so the work is spread over processing and never stalls it for
more than one key group. For processing time a position is skipped until its oldest
entry can have expired (nothing written later expires sooner), so an operator whose state
is young pays almost nothing. With a key space that grows by one key per record the state
stays bounded at about ``(1 + 1/ENTRIES_PER_RECORD)`` times the live keys.

After a visit that deleted at least :data:`RECLAIM_MIN` entries the backend is asked to
:meth:`~epochal.backends.base.KeyedStateBackend.reclaim` that key group's range (RocksDB
compacts it, so disk and the next checkpoint shrink too; the heap frees on delete).

Task thread only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["ENTRIES_PER_RECORD", "RECLAIM_MIN", "SweepCursor", "Sweeper", "TtlTarget"]

ENTRIES_PER_RECORD = 4
RECLAIM_MIN = 1024
MIN_BUDGET = 256


class SweepCursor:
    """Round robin over ``n`` positions; pure. Each position is handed out once in every
    ``n`` consecutive :meth:`take` calls.

    >>> c = SweepCursor(3); [c.take() for _ in range(5)]
    [0, 1, 2, 0, 1]
    """

    __slots__ = ("n", "pos")

    def __init__(self, n: int):
        self.n, self.pos = n, 0

    def take(self) -> int:
        p = self.pos
        self.pos = (p + 1) % self.n
        return p


@dataclass(frozen=True)
class TtlTarget:
    """One TTL state to sweep: its kind (``"value"`` or ``"map"``), backend name, ttl and
    clock (in its stamps' unit, the same the state's handle uses), and whether every new stamp is at
    least the clock's reading at the time (``monotonic``: processing time; not event time,
    where a late record stamps an entry below the watermark)."""

    kind: str
    state: str
    ttl: int  # in the stamps' unit (ns for processing time, µs for event time)
    now: Callable[[], int]
    monotonic: bool = False


class Sweeper:
    """Bounded incremental deletion of expired entries of ``targets`` in ``key_groups``."""

    def __init__(self, backend, targets: list[TtlTarget], key_groups: range):
        self.backend, self.targets, self.key_groups = backend, list(targets), key_groups
        self.cursor = SweepCursor(max(1, len(self.targets) * len(key_groups)))
        self.deleted = 0  # entries deleted since the start (a metric)
        # per position, the clock before which nothing there can expire (monotonic targets
        # only): min(oldest surviving stamp, the visit's clock) + ttl — an entry written
        # after a visit is stamped at least at that visit's clock
        self._due = [None] * self.cursor.n

    def step(self, records: int) -> int:
        """Visit positions until ``records * ENTRIES_PER_RECORD`` entries (at least
        :data:`MIN_BUDGET`) were looked at or every position was visited once; returns
        the number of entries deleted."""
        if not self.targets or not len(self.key_groups):
            return 0
        budget = max(MIN_BUDGET, records * ENTRIES_PER_RECORD)
        scanned = deleted = visits = 0
        nkg = len(self.key_groups)
        while scanned < budget and visits < self.cursor.n:
            i = self.cursor.take()
            target, kg = self.targets[i // nkg], self.key_groups[i % nkg]
            visits += 1
            if target.monotonic:
                now, due = target.now(), self._due[i]
                if due is not None and now < due:
                    scanned += 1
                    continue
            seen, gone, oldest = self.sweep(target, kg)
            if target.monotonic:
                self._due[i] = min(oldest, now) + target.ttl
            scanned += seen + 1
            deleted += gone
        self.deleted += deleted
        return deleted

    def sweep(self, target: TtlTarget, kg: int) -> tuple[int, int, float]:
        """Delete the expired entries of ``target`` in ``kg``: ``(looked at, deleted,
        oldest surviving stamp or inf)``."""
        b, name, now, ttl = self.backend, target.state, target.now(), target.ttl
        seen = gone = 0
        oldest = float("inf")
        if target.kind == "value":
            for key, (_value, stamp) in b.value_items(name, kg):
                seen += 1
                if stamp + ttl <= now:
                    b.delete(name, kg, key)
                    gone += 1
                elif stamp < oldest:
                    oldest = stamp
        else:
            for key in b.map_keys(name, kg):
                for mk, (_value, stamp) in b.map_items(name, kg, key):
                    seen += 1
                    if stamp + ttl <= now:
                        b.map_delete(name, kg, key, mk)
                        gone += 1
                    elif stamp < oldest:
                        oldest = stamp
        if gone >= RECLAIM_MIN:
            b.reclaim(name, kg)
        return seen, gone, oldest
